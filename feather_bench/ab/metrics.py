"""Per-configuration figures of an A/B run, from the client's records and the batch trace.

The serving figures carry ``sglang.bench_serving``'s names and units (``output_throughput`` in
tokens/s, ``mean_ttft_ms``, ``p99_itl_ms``, ``duration`` in s, ...) and are computed as it
computes them, so a feather-ab JSON row and a bench_serving JSONL line can be read side by
side. Feather's own figures (prefill saving R, prefix groups per decode step, the attention
share of step time, per-worker load behind ``--dp-size``) keep their own names.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import numpy as np

from feather_bench.tools.trace import time_split

if TYPE_CHECKING:
    from feather_bench.ab.client import RequestRecord
    from feather_bench.ab.runner import RunResult
    from feather_bench.workloads import Workload

# The metrics of one run, in table order: (key, column header, format)
COLUMNS = [
    ("output_throughput", "out tok/s", "{:.1f}"),
    ("total_throughput", "total tok/s", "{:.0f}"),
    ("request_throughput", "req/s", "{:.2f}"),
    ("median_ttft_ms", "TTFT p50 ms", "{:.0f}"),
    ("p99_ttft_ms", "TTFT p99 ms", "{:.0f}"),
    ("median_itl_ms", "ITL p50 ms", "{:.1f}"),
    ("median_e2e_latency_ms", "e2e p50 ms", "{:.0f}"),
    ("p99_e2e_latency_ms", "e2e p99 ms", "{:.0f}"),
    ("saving_ratio_r", "R", "{:.3f}"),
    ("cache_hit_rate", "hit", "{:.3f}"),
    ("mean_decode_batch", "batch", "{:.1f}"),
    ("mean_decode_prefix_tokens", "shared depth", "{:.0f}"),
    ("mean_groups_per_decode", "groups/step", "{:.2f}"),
    ("sched_fraction", "sched %", "{:.3%}"),
    ("attention_fraction", "attn %", "{:.1%}"),
]

# bench_serving's latency statistics: (name, seconds per request or per token) -> ms
LATENCY_STATS = ("mean", "median", "std", "p90", "p95", "p99")


def _stat(kind: str, values: list[float]) -> float:
    # NOTE: as bench_serving, an empty list counts as [0] (no streamed tokens, one token only)
    v = values or [0.0]
    if kind == "mean":
        return float(np.mean(v))
    if kind == "median":
        return float(np.median(v))
    if kind == "std":
        return float(np.std(v))
    return float(np.percentile(v, int(kind[1:])))


def latency_ms(name: str, seconds: list[float]) -> dict:
    """``{mean_NAME_ms, median_NAME_ms, std_, p90_, p95_, p99_}`` of ``seconds``, in ms."""
    return {f"{k}_{name}_ms": _stat(k, seconds) * 1000 for k in LATENCY_STATS}


def serving_metrics(records: list["RequestRecord"], duration_s: float) -> dict:
    """bench_serving's figures from the client's records: throughputs over ``duration_s``, TTFT,
    TPOT ((e2e - TTFT) / (output tokens - 1), for requests of more than one token), ITL (every
    inter-token gap of every request) and e2e latency."""
    out_tokens = sum(len(r.output_ids) for r in records)
    in_tokens = sum(r.prompt_tokens for r in records)
    tpots = [
        (r.e2e_s - r.ttft_s) / (len(r.output_ids) - 1) for r in records if len(r.output_ids) > 1
    ]
    return {
        "duration": duration_s,
        "completed": len(records),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(records) / duration_s,
        "input_throughput": in_tokens / duration_s,
        "output_throughput": out_tokens / duration_s,
        "total_throughput": (in_tokens + out_tokens) / duration_s,
        **latency_ms("e2e_latency", [r.e2e_s for r in records]),
        **latency_ms("ttft", [r.ttft_s for r in records]),
        **latency_ms("tpot", tpots),
        **latency_ms("itl", [g for r in records for g in r.itl_s]),
        "concurrency": sum(r.e2e_s for r in records) / duration_s,
    }


def _mean_groups(decode_steps: list[dict], group_of: dict) -> float:
    if not decode_steps:
        return float("nan")
    return statistics.mean(len({group_of.get(r, r) for r in e["rids"]}) for e in decode_steps)


def worker_metrics(
    records: list["RequestRecord"], steps: list[dict], group_of: dict, dp_size: int
) -> dict:
    """Per data-parallel worker: requests served (from each response's ``meta_info.dp_rank``),
    the load spread (max - min) / mean over all ``dp_size`` workers, and, with a batch trace,
    prefix groups per decode step on each worker (a step's requests all run on one worker)."""
    ranks = list(range(dp_size))
    counts = {k: 0 for k in ranks}
    rank_of = {}
    for r in records:
        if r.dp_rank is not None:
            counts[int(r.dp_rank)] = counts.get(int(r.dp_rank), 0) + 1
            rank_of[r.rid] = int(r.dp_rank)
    values = list(counts.values())
    mean = statistics.mean(values) if values else 0.0
    out = {
        "dp_size": dp_size,
        "requests_per_worker": {str(k): v for k, v in sorted(counts.items())},
        "requests_without_dp_rank": len(records) - len(rank_of),
        "load_spread": (max(values) - min(values)) / mean if mean else float("nan"),
    }
    decode = [e for e in steps if e["mode"] == "decode"]
    if decode:
        per = {}
        for k in sorted(counts):
            mine = [e for e in decode if e["rids"] and rank_of.get(e["rids"][0]) == k]
            per[str(k)] = {
                "decode_steps": len(mine),
                "mean_decode_batch": statistics.mean(len(e["rids"]) for e in mine)
                if mine
                else float("nan"),
                "mean_groups_per_decode": _mean_groups(mine, group_of),
            }
        out["per_worker_homogeneity"] = per
    return out


def compute(result: "RunResult", workload: "Workload", dp_size: int = 1) -> dict:
    recs = result.records
    group_of = {r.rid: r.group or r.rid for r in workload.requests}
    prompt_tokens = sum(r.prompt_tokens for r in recs)
    cached = sum(r.cached_tokens for r in recs)
    steps = result.trace
    decode = [e for e in steps if e["mode"] == "decode"]
    computed = sum(e["extend_tokens"] for e in steps if e["mode"] == "extend")
    sched = sum(e["sched_s"] for e in steps)
    step = sum(e["step_s"] for e in steps)
    extend_s, decode_s, attn = time_split(steps)
    out = serving_metrics(recs, result.makespan_s)
    out.update(
        {
            "prefill_tokens_logical": prompt_tokens,
            "prefill_tokens_computed": computed,
            # BatchLLM's token saving ratio R = 1 - computed / logical (from the steps that ran)
            "saving_ratio_r": 1 - computed / prompt_tokens
            if prompt_tokens and steps
            else float("nan"),
            # what the radix cache served, as SGLang reports per request (cached_tokens)
            "cache_hit_rate": cached / prompt_tokens if prompt_tokens else float("nan"),
            "decode_steps": len(decode),
            "mean_decode_batch": statistics.mean(len(e["rids"]) for e in decode)
            if decode
            else float("nan"),
            "mean_decode_prefix_tokens": statistics.mean(e["prefix_tokens"] for e in decode)
            if decode
            else float("nan"),
            "mean_groups_per_decode": _mean_groups(decode, group_of),
            "sched_fraction": sched / (sched + step) if sched + step > 0 else float("nan"),
            # where the steps' time went: prefill (extend) and decode steps, and the attention
            # backend's share of both (the rest is the model's matmuls and the runtime around them)
            "extend_step_s": extend_s,
            "decode_step_s": decode_s,
            "attention_s": attn,
            "attention_fraction": attn / step if step > 0 else float("nan"),
        }
    )
    if dp_size > 1:
        out["workers"] = worker_metrics(recs, steps, group_of, dp_size)
    return out


def median_of(runs: list[dict]) -> dict:
    """Per-key medians over repeated runs of one configuration (numbers only; anything else,
    such as the per-worker breakdown, is the first run's)."""
    keys = runs[0].keys()
    return {
        k: statistics.median(r[k] for r in runs)
        if isinstance(runs[0][k], (int, float)) and not isinstance(runs[0][k], bool)
        else runs[0][k]
        for k in keys
    }
