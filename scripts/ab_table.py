#!/usr/bin/env python
"""One Markdown table of feather-ab results, a row per workload (the README's A/B table).

    .venv/bin/python scripts/ab_table.py results/ab/*.json
"""

from __future__ import annotations

import json
import sys

from feather_bench.ab.runner import Common

DEFAULT_KV_POOL = Common.max_total_tokens  # feather-ab's --max-total-tokens default


def fmt(x, spec="{:.2f}"):
    return "n/a" if x is None else spec.format(x)


def main(paths: list[str]) -> None:
    print("| workload | best baseline (torch_native) | feather + feather | speedup | policy alone (same backend) "
          "| feather vs fcfs, same backend: throughput / TTFT p99 | groups per decode step, fcfs / feather "
          "| greedy outputs | feather's attention share / speedup if attention were free |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        r = json.load(open(path))
        rows = {row["config"]: row for row in r["rows"]}
        s = r["summary"]
        base = rows.get(s.get("best_baseline"))
        top = rows.get(s.get("best_feather"))
        fcfs = rows.get(f"fcfs + {top['attention_backend']}") if top else None
        w = r["workload"]
        kv = r.get("common", {}).get("max_total_tokens")
        pool = f", KV pool {kv} tok" if kv and kv != DEFAULT_KV_POOL else ""
        print(
            f"| {w['name']} ({w['requests']} req, {w['prompt_tokens']} prompt tok, {w['output_tokens']} out tok{pool}) "
            f"| {s.get('best_baseline')}: {fmt(base and base['output_tok_s'], '{:.1f}')} tok/s "
            f"| {s.get('best_feather')}: {fmt(top and top['output_tok_s'], '{:.1f}')} tok/s "
            f"| **{fmt(s.get('speedup_vs_best_baseline'))}x** "
            f"| {fmt(s.get('policy_speedup_same_backend'))}x vs {s.get('policy_speedup_same_backend_vs')} "
            f"| {fmt(s.get('output_tok_s_vs_fcfs_same_backend'))}x / {fmt(s.get('ttft_p99_vs_fcfs_same_backend'))}x "
            f"| {fmt(fcfs and fcfs['mean_groups_per_decode'])} / {fmt(top and top['mean_groups_per_decode'])} "
            f"| {'identical' if r['greedy_outputs_identical'] else 'MISMATCH'} "
            f"| {fmt(s.get('attention_fraction_of_best_feather'), '{:.0%}')} / "
            f"{fmt(s.get('speedup_bound_if_attention_were_free'), '{:.2f}x')} |"
        )


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
