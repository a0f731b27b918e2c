"""Send a workload to SGLang (an in-process ``sglang.Engine`` or a server over HTTP), streaming,
and record per request what a user sees: time to first token, the gaps between later tokens,
end-to-end latency, the output tokens with their top-2 log-probabilities (for the
greedy-equality check), cached tokens and, behind ``--dp-size N``, the worker that served it.

Timings follow ``sglang.bench_serving``'s client: TTFT is the time to the first streamed chunk
that carries output, and a chunk that brings k new tokens after a gap g adds k inter-token
latencies of g / k each."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Callable, Optional, TextIO

from tqdm import tqdm

if TYPE_CHECKING:
    from feather_bench.workloads import Workload, WorkloadRequest


@dataclass
class RequestRecord:
    rid: str
    prompt_tokens: int
    cached_tokens: int
    output_ids: list[int]
    top2: list[list[list[float]]]  # per output position: [[logprob, token id], ...] best first
    submit_s: float  # seconds from the run's start
    ttft_s: float  # from submission to the first output token
    e2e_s: float  # from submission to the last output token
    itl_s: list[float] = field(default_factory=list)  # inter-token latencies after the first
    dp_rank: Optional[int] = None  # the data-parallel worker that served it (--dp-size > 1)

    def to_json(self) -> dict:
        return asdict(self)


def sampling_params(req: "WorkloadRequest") -> dict:
    # NOTE: greedy with EOS ignored, as sglang's offline throughput benchmark: every
    # configuration then generates exactly the same number of tokens.
    return {"max_new_tokens": req.max_new_tokens, "temperature": 0, "ignore_eos": True}


async def _one(req, stream_fn, t0: float, bar: tqdm) -> RequestRecord:
    if req.arrival_s:
        await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.perf_counter()))
    submit = time.perf_counter()
    first = None
    last = None
    itl: list[float] = []
    seen, most_recent = 0, submit
    async for chunk in stream_fn(req):
        now = time.perf_counter()
        n = int(chunk["meta_info"].get("completion_tokens", 0))
        if n > seen:
            if first is None:
                first = now
            else:
                itl += [(now - most_recent) / (n - seen)] * (n - seen)
            seen, most_recent = n, now
        last = chunk
    end = time.perf_counter()
    bar.update(1)
    meta = last["meta_info"]
    ids = [int(t[1]) for t in meta["output_token_logprobs"]]
    top2 = [[[float(lp), int(tid)] for lp, tid, *_ in pos] for pos in meta["output_top_logprobs"]]
    return RequestRecord(
        rid=req.rid,
        prompt_tokens=int(meta["prompt_tokens"]),
        cached_tokens=int(meta.get("cached_tokens", 0)),
        output_ids=ids,
        top2=top2,
        submit_s=submit - t0,
        ttft_s=(first or end) - submit,
        e2e_s=end - submit,
        itl_s=itl,
        dp_rank=meta.get("dp_rank"),
    )


async def drive(
    workload: "Workload",
    stream_fn: Callable[["WorkloadRequest"], AsyncIterator[dict]],
    desc: str,
    progress: Optional[TextIO] = None,
) -> tuple[list[RequestRecord], float]:
    """Submit every request (at its ``arrival_s`` if set, else at once); returns the records
    and the makespan in seconds (first submission to last completion). A tqdm bar of finished
    requests goes to ``progress`` (default stderr)."""
    with tqdm(
        total=len(workload.requests),
        desc=desc,
        unit="req",
        leave=False,
        dynamic_ncols=True,
        file=progress,
    ) as bar:
        t0 = time.perf_counter()
        records = await asyncio.gather(*(_one(r, stream_fn, t0, bar) for r in workload.requests))
        makespan = time.perf_counter() - t0
    return list(records), makespan


def engine_stream_fn(engine):
    async def stream(req):
        gen = await engine.async_generate(
            input_ids=list(req.input_ids),
            sampling_params=sampling_params(req),
            rid=req.rid,
            return_logprob=True,
            top_logprobs_num=2,
            stream=True,
        )
        async for chunk in gen:
            yield chunk

    return stream


def http_stream_fn(url: str, session):
    async def stream(req):
        body = {
            "rid": req.rid,
            "input_ids": list(req.input_ids),
            "sampling_params": sampling_params(req),
            "return_logprob": True,
            "top_logprobs_num": 2,
            "stream": True,
        }
        async with session.post(url + "/generate", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(
                    f"{url}/generate answered {resp.status} for {req.rid}: {await resp.text()}"
                )
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                yield json.loads(data)

    return stream


async def drive_server(
    workload: "Workload", url: str, desc: str, timeout_s: Optional[float] = None
):
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        return await drive(workload, http_stream_fn(url, session), desc)


def server_info(url: str, timeout_s: float = 30) -> dict:
    """The server's configuration as SGLang reports it (``GET /server_info``, or the older
    ``/get_server_info``)."""
    import requests

    for path in ("/server_info", "/get_server_info"):
        r = requests.get(url + path, timeout=timeout_s)
        if r.status_code != 404:
            r.raise_for_status()
            info = r.json()
            # a disaggregated deployment answers per role; the decode side runs the batches
            return (
                info["decode"][0] if "decode" in info and isinstance(info["decode"], list) else info
            )
    raise RuntimeError(f"{url} has neither /server_info nor /get_server_info: is it SGLang?")


SERVER_INFO_KEYS = (
    "schedule_policy",
    "attention_backend",
    "dp_size",
    "tp_size",
    "load_balance_method",
    "version",
    "model_path",
    "served_model_name",
    "dtype",
    "max_total_num_tokens",
    "max_running_requests",
    "random_seed",
)


def server_summary(info: dict) -> dict:
    """The fields of ``/server_info`` a comparison is read by (missing ones are None)."""
    out = {k: info.get(k) for k in SERVER_INFO_KEYS}
    out["model"] = info.get("served_model_name") or info.get("model_path")
    return out
