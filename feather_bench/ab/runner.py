"""Run one workload under one configuration, on a fresh SGLang each time.

Offline mode runs ``sglang.Engine`` in a child process (``python -m feather_bench.ab.worker``)
so that every configuration starts from the same state and nothing of one run (memory, radix
cache, hooks) leaks into the next; online mode starts a real ``sglang.launch_server`` and
sends the requests over HTTP at their arrival times. Both warm the model up on a short
unrelated prompt, flush the cache, then send the workload, with ``FEATHER_BATCH_TRACE``
recording every step (see ``feather_bench/tools/trace.py``). With ``--base-url`` nothing is
started: the workload goes to a server already running, whose batch trace is read only if the
caller names its file.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from feather_bench.ab.client import RequestRecord
from feather_bench.tools.trace import ENV as TRACE_ENV
from feather_bench.tools.trace import read_trace
from feather_bench.workloads import Workload, write_workload_file

WARMUP_TOKENS = 32
# the attention backend named "default": no --attention-backend, SGLang chooses its own
DEFAULT_BACKEND = "default"


@dataclass(frozen=True)
class ABConfig:
    """One configuration of the comparison: a schedule policy, an attention backend and, for
    feather, its stop/add agent."""

    policy: str
    attention_backend: str
    agent: Optional[str] = None

    @property
    def name(self) -> str:
        policy = f"{self.policy}[{self.agent}]" if self.agent else self.policy
        return f"{policy} + {self.attention_backend}"

    @property
    def file_stem(self) -> str:
        """The name as a file name: ``feather_ppo_agents_x.zip__feather``."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name.replace(" + ", "__"))

    def engine_kwargs(self) -> dict:
        kw = {"schedule_policy": self.policy}
        if self.attention_backend != DEFAULT_BACKEND:
            kw["attention_backend"] = self.attention_backend
        if self.agent:
            kw["feather_agent"] = self.agent
        return kw

    def server_args(self) -> list[str]:
        args = []
        if self.attention_backend != DEFAULT_BACKEND:
            args += ["--attention-backend", self.attention_backend]
        if self.agent:
            args += ["--feather-agent", self.agent]
        return args


@dataclass(frozen=True)
class Common:
    """What every configuration shares: model, memory budget, numerics, seed."""

    model_path: str
    dtype: str = "float32"
    max_total_tokens: int = 65536
    max_running_requests: int = 16
    seed: int = 0
    threads: Optional[int] = None  # OMP_NUM_THREADS of the SGLang processes; None: torch's default
    extra_engine_kwargs: dict = field(default_factory=dict)  # offline: --server-args, parsed
    extra_server_args: tuple[str, ...] = ()  # online: --server-args, passed through as given

    def env(self) -> dict:
        return {"OMP_NUM_THREADS": str(self.threads)} if self.threads else {}

    def engine_kwargs(self) -> dict:
        return {
            "model_path": self.model_path,
            "dtype": self.dtype,
            "max_total_tokens": self.max_total_tokens,
            "max_running_requests": self.max_running_requests,
            "random_seed": self.seed,
            "log_level": "error",
            **self.extra_engine_kwargs,
        }

    def server_args(self) -> list[str]:
        args = [
            "--dtype",
            self.dtype,
            "--max-total-tokens",
            str(self.max_total_tokens),
            "--max-running-requests",
            str(self.max_running_requests),
            "--random-seed",
            str(self.seed),
        ]
        return [*args, *self.extra_server_args]


@dataclass
class RunResult:
    config: ABConfig
    records: list[RequestRecord]
    makespan_s: float
    trace: list[dict]  # the workload's steps only (warm-up excluded)
    log_path: Optional[str] = None
    server_info: Optional[dict] = None  # GET /server_info of the server that ran it (online)


def warmup_ids(workload: Workload) -> list[int]:
    # NOTE: token ids no request starts with, so the warm-up leaves nothing useful in the cache
    first = {r.input_ids[0] for r in workload.requests}
    tok = next(t for t in range(100, 100000) if t not in first)
    return [tok] * WARMUP_TOKENS


def _trace_after(path: Path, start: float) -> list[dict]:
    if not path.exists():
        return []
    return [e for e in read_trace(path) if e["t"] >= start]


def run_offline(workload: Workload, config: ABConfig, common: Common, workdir: Path) -> RunResult:
    """One configuration through ``sglang.Engine`` in a child process."""
    workdir.mkdir(parents=True, exist_ok=True)
    stem = config.file_stem
    wl_path, out_path = workdir / "workload.jsonl", workdir / f"{stem}.out.json"
    trace_path, log_path = workdir / f"{stem}.trace.jsonl", workdir / f"{stem}.log"
    write_workload_file(workload, wl_path)
    for p in (trace_path, out_path):
        p.unlink(missing_ok=True)
    spec = {
        "engine_kwargs": {**common.engine_kwargs(), **config.engine_kwargs()},
        "workload": str(wl_path),
        "out": str(out_path),
        "desc": config.name,
    }
    spec_path = workdir / f"{stem}.spec.json"
    spec_path.write_text(json.dumps(spec))
    progress_fd = os.dup(
        sys.stderr.fileno()
    )  # the progress bar to our terminal, the rest to the log
    env = {
        **os.environ,
        **common.env(),
        TRACE_ENV: str(trace_path),
        "FEATHER_AB_PROGRESS_FD": str(progress_fd),
    }
    try:
        with open(log_path, "w") as log:
            # its own process group, so that an interrupted comparison also stops the engine's
            # scheduler and detokenizer processes instead of leaving them running
            proc = subprocess.Popen(
                [sys.executable, "-m", "feather_bench.ab.worker", str(spec_path)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(progress_fd,),
                start_new_session=True,
            )
            try:
                proc.wait()
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
    finally:
        os.close(progress_fd)
    if proc.returncode != 0 or not out_path.exists():
        from feather_bench.tools.server import error_line

        why = error_line(log_path.read_text(errors="replace"))
        raise RuntimeError(
            f"{config.name}: the engine run failed (exit code {proc.returncode})"
            + (f": {why}" if why else "")
            + f"; see {log_path}"
        )
    out = json.loads(out_path.read_text())
    records = [RequestRecord(**r) for r in out["records"]]
    return RunResult(
        config,
        records,
        out["makespan_s"],
        _trace_after(trace_path, out["start_monotonic"]),
        str(log_path),
    )


def run_online(workload: Workload, config: ABConfig, common: Common, workdir: Path) -> RunResult:
    """One configuration through a real ``sglang.launch_server`` over HTTP."""

    from feather_bench.ab.client import drive_server, server_info
    from feather_bench.tools.server import SGLangServer

    workdir.mkdir(parents=True, exist_ok=True)
    stem = config.file_stem
    trace_path, log_path = workdir / f"{stem}.trace.jsonl", workdir / f"{stem}.server.log"
    trace_path.unlink(missing_ok=True)
    server = SGLangServer(
        common.model_path,
        config.policy,
        [*common.server_args(), *config.server_args()],
        log_path=log_path,
        env={**common.env(), TRACE_ENV: str(trace_path)},
    )
    with server:
        warm_up(server.url, workload)
        flush_cache(server.url)
        info = server_info(server.url)
        start = time.monotonic()
        records, makespan = asyncio.run(drive_server(workload, server.url, config.name))
    return RunResult(
        config, records, makespan, _trace_after(trace_path, start), str(log_path), info
    )


def warm_up(url: str, workload: Workload) -> None:
    """One short request no workload prompt starts with: the first step's one-time costs are
    then not in the figures, and the cache holds nothing the workload can use."""
    import requests

    r = requests.post(
        url + "/generate",
        json={
            "input_ids": warmup_ids(workload),
            "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        },
        timeout=600,
    )
    r.raise_for_status()


def run_base_url(
    workload: Workload,
    config: ABConfig,
    url: str,
    flush: bool,
    trace_path: Optional[Path] = None,
) -> RunResult:
    """The workload against a server already running at ``url`` (nothing is started or
    stopped). ``flush``: POST /flush_cache after the warm-up, so the run starts from an empty
    radix cache; ``trace_path``: the server's ``FEATHER_BATCH_TRACE`` file, if it writes one."""
    from feather_bench.ab.client import drive_server, server_info

    warm_up(url, workload)
    if flush:
        flush_cache(url)
    info = server_info(url)
    start = time.monotonic()
    records, makespan = asyncio.run(drive_server(workload, url, config.name))
    steps = []
    if trace_path is not None:
        # NOTE: the trace may also hold other clients' requests: keep the steps of ours only
        ours = {r.rid for r in workload.requests}
        steps = [e for e in _trace_after(trace_path, start) if ours.intersection(e["rids"])]
    return RunResult(config, records, makespan, steps, None, info)


def flush_cache(url: str, wait_s: float = 30.0) -> None:
    """POST /flush_cache, retried while SGLang answers 400 because the request just answered is
    still leaving its batch ("Cache not flushed because there are pending requests")."""
    import requests

    deadline = time.monotonic() + wait_s
    while True:
        r = requests.post(url + "/flush_cache", timeout=60)
        if r.status_code != 400 or time.monotonic() > deadline:
            r.raise_for_status()
            return
        time.sleep(0.2)


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="feather-ab-"))
