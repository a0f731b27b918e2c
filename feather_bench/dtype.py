"""Which --dtype serves fastest on this CPU: the demo workload (feather, SmolLM2) once per dtype
per round, rounds interleaved, in one run; prints medians and ratios and writes JSON.

    python -m feather_bench.dtype [--rounds 2] [--dtypes bfloat16,float32,float16]
                                  [--json results/bench_dtype.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from feather_bench.demo import add_workload_args, machine, run_workload
from feather_bench.paths import RESULTS_DIR


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_workload_args(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", default="bfloat16,float32,float16")
    parser.add_argument("--json", default=str(RESULTS_DIR / "bench_dtype.json"))
    args = parser.parse_args()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    runs: dict[str, list[float]] = {d: [] for d in dtypes}
    RESULTS_DIR.mkdir(exist_ok=True)
    for r in range(args.rounds):
        for dtype in dtypes:
            print(f"round {r + 1}/{args.rounds}: --dtype {dtype}", flush=True)
            fig = run_workload(
                args, "feather", ["--dtype", dtype], RESULTS_DIR / f"bench_dtype-{dtype}.log"
            )
            runs[dtype].append(fig["output_tok_per_s"])
            print(f"  {fig['output_tok_per_s']:.1f} output tok/s", flush=True)
    best = max(dtypes, key=lambda d: statistics.median(runs[d]))
    rows = [
        {
            "dtype": d,
            "output_tok_per_s": runs[d],
            "median": statistics.median(runs[d]),
            "ratio_to_best": round(statistics.median(runs[d]) / statistics.median(runs[best]), 3),
        }
        for d in dtypes
    ]
    print(f"\n{'dtype':10} {'median out tok/s':>17} {'vs best':>8}   runs")
    for row in rows:
        print(
            f"{row['dtype']:10} {row['median']:17.1f} {row['ratio_to_best']:8.2f}   {row['output_tok_per_s']}"
        )
    print(f"fastest: {best}")
    Path(args.json).write_text(
        json.dumps({"machine": machine(), "rows": rows, "fastest": best}, indent=2)
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
