#!/usr/bin/env python
"""Scheduling overhead per pass: feather against SGLang's lpm and dfs-weight.

    .venv/bin/python scripts/bench_overhead.py --quick --json results/bench_overhead_quick.json
    .venv/bin/python scripts/bench_overhead.py --json results/bench_overhead.json

Builds waiting queues of SGLang's real ``Req`` objects (W waiting, T-token prompts, G prefix
groups, shuffled arrival) over real tree caches holding a running batch's prompts, and times
one scheduling pass of each policy: SGLang's ``SchedulePolicy.calc_priority`` (fcfs, lpm,
dfs-weight, and lpm's matching without its >128 FCFS fallback) and feather's
``calc_priority``; plus feather's per-request insert/remove costs. What each row measures:
``feather_bench/overhead.py``. Full run: W in {128, 1024, 4096} x T in {2K, 8K, 20K}
tokens; ``--quick``: W in {128, 1024} x T in {2K, 8K} with fewer repeats.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="W in {128, 1024}, T in {2K, 8K}, fewer repeats (under a minute)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.add_argument("--waiting", type=_ints, help="comma-separated waiting-queue sizes (overrides the grid)")
    parser.add_argument("--tokens", type=_ints, help="comma-separated prompt lengths in tokens (overrides the grid)")
    parser.add_argument("--groups", type=int, help="prefix groups (default 8)")
    parser.add_argument("--batch", type=int, help="running requests and picks per pass (default 32)")
    parser.add_argument("--caches", help="tree caches, comma-separated: unified (sglang's default), radix")
    parser.add_argument("--repeats", type=int, help="timed passes of the matching policies")
    parser.add_argument("--max-rss-gb", type=float, help="skip cells that would push RSS past this (default 12)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--live", metavar="MODEL_DIR", nargs="?", const=os.path.join(REPO, "models", "SmolLM2-135M-Instruct"),
                        help="also run a real server with feather on MODEL_DIR (default: the SmolLM2 model) "
                             "and report feather's logged share of step time")
    args = parser.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING)
    import warnings

    warnings.filterwarnings("ignore")
    from feather_bench import overhead as bench

    settings = bench.Settings(seed=args.seed, quick=args.quick)
    if args.quick:
        settings.waiting, settings.tokens = bench.QUICK_WAITING, bench.QUICK_TOKENS
        settings.repeats, settings.cheap_repeats, settings.n_insert, settings.pick_number = 3, 7, 50, 1000
    if args.waiting:
        settings.waiting = args.waiting
    if args.tokens:
        settings.tokens = args.tokens
    if args.groups:
        settings.groups = args.groups
    if args.batch:
        settings.batch = args.batch
    if args.caches:
        settings.caches = tuple(c.strip() for c in args.caches.split(",") if c.strip())
    if args.repeats:
        settings.repeats = args.repeats
    if args.max_rss_gb:
        settings.max_rss_gb = args.max_rss_gb

    start = time.perf_counter()
    result = bench.run(settings, None)
    if args.live:
        import json
        from pathlib import Path

        from feather_bench.live import run_live

        print(f"live server: feather on {args.live} ...", file=sys.stderr, flush=True)
        log_path = Path(REPO) / "results" / "bench_overhead_live_server.log"
        log_path.parent.mkdir(exist_ok=True)
        result["live_server"] = live = run_live(args.live, log_path)
        result["summary"]["live_share_of_step_time_pct_median"] = live["share_of_step_time_pct_median"]
    if args.json:
        import json

        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(bench.format_table(result["rows"]))
    print()
    s = result["summary"]
    for key in ("ratio_vs_dfs_weight_at_largest", "ratio_vs_lpm_at_largest", "insert_us_per_1k_tokens"):
        print(f"{key}: {s[key]}")
    print(f"largest cell: {s.get('largest_cell')} on {s.get('tree_cache')} "
          f"({result['machine']['tree_caches'].get(s.get('tree_cache'))})")
    print(f"by tree cache: {s.get('by_tree_cache')}")
    print(f"pick at largest W: {s.get('pick_us_at_largest_waiting')}")
    print(f"targets: {s.get('targets')}")
    if "live_server" in result:
        live = result["live_server"]
        print(f"live server ({live['model']}, {live['requests']} requests, {live['log_lines']} log lines): "
              f"feather {live['ms_per_pass_median']} ms/pass, median {live['share_of_step_time_pct_median']}% "
              f"(max {live['share_of_step_time_pct_max']}%) of step time")
    for skip in result["skipped"]:
        print(f"SKIPPED: {skip}")
    print(f"wall {time.perf_counter() - start:.1f} s, peak RSS {result['machine']['peak_rss_mb']:,.0f} MB"
          + (f", JSON: {args.json}" if args.json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
