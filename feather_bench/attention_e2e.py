"""End-to-end: the same shared-prefix batch on a real server with ``--attention-backend
feather`` and with ``torch_native``, same policy, rounds interleaved; medians and the ratio."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import requests as http


def attention_flops(
    prompts: list[list[int]], max_new_tokens: int, layers: int, heads: int, head_dim: int
) -> int:
    """The fewest attention FLOPs (``Q Kᵀ`` and ``probs V``) that generating ``max_new_tokens``
    for each of ``prompts`` (token ids) takes when every shared prompt prefix is computed once.

    A query at position ``t`` (1-based) attends ``t`` keys: ``4 * heads * head_dim * t`` FLOPs
    per layer. Computed are each prompt's positions past its longest common prefix with an
    earlier prompt (every node of the prompts' trie once, whatever the order), then the
    ``max_new_tokens - 1`` decode steps (the first new token comes from the prefill)."""

    def keys(first: int, last: int) -> int:  # sum of t for t in first+1..last
        return (last * (last + 1) - first * (first + 1)) // 2

    total = 0
    for i, ids in enumerate(prompts):
        cached = max((len(os.path.commonprefix([ids, other])) for other in prompts[:i]), default=0)
        cached = min(cached, len(ids) - 1)  # the last prompt token is always computed
        total += keys(cached, len(ids)) + keys(len(ids), len(ids) + max_new_tokens - 1)
    return 4 * heads * head_dim * layers * total


def attention_floor(
    model: str, prompts: list[str], max_new_tokens: int, gemm_peak_gflops: float
) -> dict:
    """:func:`attention_flops` of ``prompts`` on ``model`` (its tokenizer and config.json), and
    the seconds they take at ``gemm_peak_gflops``: a floor under any exact attention backend."""
    from transformers import AutoTokenizer

    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = [tokenizer.encode(p) for p in prompts]
    flops = attention_flops(ids, max_new_tokens, config["num_hidden_layers"], heads, head_dim)
    return {
        "attention_gflops": round(flops / 1e9, 2),
        "gemm_peak_gflops": round(gemm_peak_gflops, 1),
        "attention_floor_s": round(flops / (gemm_peak_gflops * 1e9), 3),
    }


def run_server_comparison(
    model: str,
    log_dir: Path,
    rounds: int = 2,
    requests: int = 32,
    prefix_repeat: int = 40,
    max_new_tokens: int = 32,
    policy: str = "fcfs",
    dtype: str = "float32",
    groups: int = 1,
    repeats: int = 2,
    gemm_peak_gflops: float | None = None,
) -> dict:
    """Total time of ``requests`` greedy requests sharing one ~740-token system prompt (a
    warmed-up server with an empty cache: the first request computes the prefix), per backend,
    split by the batch trace into extend, decode and attention time; outputs must agree.

    Each of ``rounds`` (backends interleaved) starts a fresh server per backend and runs the
    batch ``repeats`` times on it, the radix cache flushed before each (``/flush_cache``: the
    same cold-prefix work every time), so the medians are over ``rounds * repeats`` runs: one
    run's total varies by up to ~30% on this shared 2-core machine. ``groups`` > 1 splits the
    requests over that many system prompts (of ~700-800 tokens, all starting "You are a"),
    arriving shuffled, so that the policy's batches mix groups.

    With ``gemm_peak_gflops`` (the GEMM rate in ``dtype`` at the servers' thread count) the
    result also carries :func:`attention_floor` under ``attention_at_gemm_peak``, with the ratio
    feather would reach if its attention took only that floor (its ``speedup_bound``)."""
    if groups < 1 or requests % groups:
        raise ValueError(f"groups must be >= 1 and divide requests ({requests}), got {groups}")
    if rounds < 1 or repeats < 1:
        raise ValueError(f"rounds and repeats must be >= 1, got {rounds} and {repeats}")
    from feather_bench.tools.server import SGLangServer
    from feather_bench.tools.trace import ENV, read_trace, time_split
    from feather_bench.tools.workload import compare_greedy, generate_all, shared_prefix_prompts

    prompts = shared_prefix_prompts(groups, requests // groups, repeat=prefix_repeat)
    times: dict[str, list[float]] = {"feather": [], "torch_native": []}
    parts: dict[str, list[dict]] = {b: [] for b in times}
    outputs = {}
    problems: list[str] = []
    trace_dir = Path(tempfile.mkdtemp(prefix="feather-attn-e2e-"))
    for r in range(rounds):
        for backend in times:
            args = ["--attention-backend", backend, "--dtype", dtype]
            log_path = Path(log_dir) / f"attention-{backend}-{dtype}.log"
            trace_path = trace_dir / f"{backend}-{dtype}-{r}.jsonl"
            with SGLangServer(
                model, policy, args, log_path=log_path, env={ENV: str(trace_path)}
            ) as server:
                for k in range(repeats):
                    http.post(server.url + "/flush_cache", timeout=60).raise_for_status()
                    start = time.monotonic()
                    out = generate_all(server.url, prompts, max_new_tokens)
                    end = time.monotonic()
                    times[backend].append(end - start)
                    if backend in outputs:  # every later run against this backend's first
                        problems += [
                            f"{backend} round {r + 1} run {k + 1} vs its first: {p}"
                            for p in compare_greedy(out, outputs[backend])
                        ]
                    outputs.setdefault(backend, out)
                    # NOTE: the trace's "t" is time.monotonic() in the server, the same clock as ours
                    extend_s, decode_s, attention_s = time_split(
                        [e for e in read_trace(trace_path) if start <= e["t"] <= end]
                    )
                    parts[backend].append(
                        {"extend_s": extend_s, "decode_s": decode_s, "attention_s": attention_s}
                    )
                    print(
                        f"  round {r + 1}, run {k + 1}: {backend}: {times[backend][-1]:.1f} s (steps: extend "
                        f"{extend_s:.1f} s, decode {decode_s:.1f} s; attention {attention_s:.1f} s of them)",
                        flush=True,
                    )
    problems += [
        f"feather vs torch_native: {p}"
        for p in compare_greedy(outputs["feather"], outputs["torch_native"])
    ]
    med = {b: statistics.median(t) for b, t in times.items()}
    split = {
        b: {k: round(statistics.median(p[k] for p in ps), 3) for k in ps[0]}
        for b, ps in parts.items()
    }
    # What feather's backend could still gain: its total with every second of attention removed.
    floor = med["feather"] - split["feather"]["attention_s"]
    at_peak = None
    if gemm_peak_gflops:
        # ... and with its attention taking only the FLOPs it must do, at the GEMM peak
        at_peak = attention_floor(
            model, [text for _, text in prompts], max_new_tokens, gemm_peak_gflops
        )
        at_peak["speedup_bound"] = round(
            med["torch_native"] / (floor + at_peak["attention_floor_s"]), 2
        )
    return {
        "model": model,
        "policy": policy,
        "dtype": dtype,
        "requests": requests,
        "groups": groups,
        "max_new_tokens": max_new_tokens,
        "rounds": rounds,
        "repeats_per_server": repeats,
        "seconds": times,
        "median_s": med,
        "speedup_total_time": round(med["torch_native"] / med["feather"], 2),
        "median_split_s": split,
        "speedup_bound_if_attention_were_free": round(med["torch_native"] / floor, 2)
        if floor > 0
        else None,
        "attention_at_gemm_peak": at_peak,
        "greedy_problems": problems,
    }
