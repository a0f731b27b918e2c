"""Per-configuration figures of an A/B run, from the client's records and the batch trace."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import numpy as np

from feather_sglang.sglang_integration.trace import time_split

if TYPE_CHECKING:
    from feather_bench.ab.runner import RunResult
    from feather_bench.workloads import Workload

# The metrics of one run, in table order: (key, column header, format)
COLUMNS = [
    ("output_tok_s", "out tok/s", "{:.1f}"),
    ("total_tok_s", "total tok/s", "{:.0f}"),
    ("requests_s", "req/s", "{:.2f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.2f}"),
    ("ttft_p99_s", "TTFT p99 s", "{:.2f}"),
    ("e2e_p50_s", "e2e p50 s", "{:.2f}"),
    ("e2e_p99_s", "e2e p99 s", "{:.2f}"),
    ("saving_ratio_r", "R", "{:.3f}"),
    ("cache_hit_rate", "hit", "{:.3f}"),
    ("mean_decode_batch", "batch", "{:.1f}"),
    ("mean_decode_prefix_tokens", "shared depth", "{:.0f}"),
    ("mean_groups_per_decode", "groups/step", "{:.2f}"),
    ("sched_fraction", "sched %", "{:.3%}"),
    ("attention_fraction", "attn %", "{:.1%}"),
]


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def compute(result: "RunResult", workload: "Workload") -> dict:
    recs = result.records
    group_of = {r.rid: r.group for r in workload.requests}
    out_tokens = sum(len(r.output_ids) for r in recs)
    prompt_tokens = sum(r.prompt_tokens for r in recs)
    cached = sum(r.cached_tokens for r in recs)
    ttft = [r.ttft_s for r in recs]
    e2e = [r.e2e_s for r in recs]
    steps = result.trace
    decode = [e for e in steps if e["mode"] == "decode"]
    computed = sum(e["extend_tokens"] for e in steps if e["mode"] == "extend")
    sched = sum(e["sched_s"] for e in steps)
    step = sum(e["step_s"] for e in steps)
    extend_s, decode_s, attn = time_split(steps)
    span = result.makespan_s
    return {
        "requests": len(recs),
        "output_tokens": out_tokens,
        "makespan_s": round(span, 3),
        "output_tok_s": out_tokens / span,
        "total_tok_s": (out_tokens + prompt_tokens) / span,
        "requests_s": len(recs) / span,
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p99_s": _pct(ttft, 99),
        "e2e_p50_s": _pct(e2e, 50),
        "e2e_p99_s": _pct(e2e, 99),
        "prefill_tokens_logical": prompt_tokens,
        "prefill_tokens_computed": computed,
        # BatchLLM's token saving ratio R = 1 - computed / logical (from the steps that ran)
        "saving_ratio_r": 1 - computed / prompt_tokens if prompt_tokens else float("nan"),
        # what the radix cache served, as SGLang reports per request (cached_tokens)
        "cache_hit_rate": cached / prompt_tokens if prompt_tokens else float("nan"),
        "decode_steps": len(decode),
        "mean_decode_batch": statistics.mean(len(e["rids"]) for e in decode)
        if decode
        else float("nan"),
        "mean_decode_prefix_tokens": statistics.mean(e["prefix_tokens"] for e in decode)
        if decode
        else float("nan"),
        "mean_groups_per_decode": (
            statistics.mean(len({group_of.get(r, r) for r in e["rids"]}) for e in decode)
            if decode
            else float("nan")
        ),
        "sched_fraction": sched / (sched + step) if sched + step > 0 else float("nan"),
        # where the steps' time went: prefill (extend) and decode steps, and the attention
        # backend's share of both (the rest is the model's matmuls and the runtime around them)
        "extend_step_s": extend_s,
        "decode_step_s": decode_s,
        "attention_s": attn,
        "attention_fraction": attn / step if step > 0 else float("nan"),
    }


def median_of(runs: list[dict]) -> dict:
    """Per-key medians over repeated runs of one configuration (numbers only)."""
    keys = runs[0].keys()
    return {
        k: statistics.median(r[k] for r in runs)
        if isinstance(runs[0][k], (int, float))
        else runs[0][k]
        for k in keys
    }
