"""``feather-bench-dp``: feather on every data-parallel worker, routed by prefix group or round robin.

    feather-bench-dp --model models/SmolLM2-135M-Instruct --json results/dp/dp.json

For each ``--load-balance-method`` (round_robin, SGLang's default; prefix_group, feather's), one
``python -m sglang.launch_server --schedule-policy feather --dp-size N`` is started (settings
otherwise at their defaults; on a CPU host feather's CPU runtime gives each worker its share
of the cores and a fixed KV pool), ``python -m sglang.bench_serving`` runs the shared-prefix
workload ``--repeats`` times against it (cache flushed before each run), and the server's log
gives each worker's share: requests admitted, prompt tokens computed and tokens served from the
radix cache (SGLang's ``Prefill batch`` lines, tagged ``DPn``). Prints a table and writes JSON
with the machine, versions, date and commit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from feather_bench.tools.server import per_worker

METHODS = ("round_robin", "prefix_group")


def spread(counts: list[int]) -> float:
    """(max - min) / mean of the workers' request counts."""
    mean = sum(counts) / len(counts)
    return (max(counts) - min(counts)) / mean if mean else 0.0


def workload_arguments(ap: argparse.ArgumentParser) -> None:
    """The model, the shared-prefix workload and the repeats, as feather-bench-dp and
    feather-bench-router take them (same defaults, so that the two measure the same thing)."""
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct", help="default: %(default)s")
    ap.add_argument("--groups", type=int, default=16, help="default: %(default)s")
    ap.add_argument("--prompts-per-group", type=int, default=8, help="default: %(default)s")
    ap.add_argument("--system-prompt-len", type=int, default=1024, help="default: %(default)s")
    ap.add_argument("--output-len", type=int, default=32, help="default: %(default)s")
    ap.add_argument("--repeats", type=int, default=2, help="default: %(default)s")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--server-args", default="", help="more SGLang server flags, as one string")


def gsp_bench_args(args: argparse.Namespace) -> tuple[str, ...]:
    """bench_serving's generated-shared-prefix arguments for ``workload_arguments``' values."""
    from feather_bench import serving

    return (
        *serving._GSP[:2],
        "--gsp-question-len",
        "32",
        "--gsp-output-len",
        str(args.output_len),
        "--gsp-num-groups",
        str(args.groups),
        "--gsp-prompts-per-group",
        str(args.prompts_per_group),
        "--gsp-system-prompt-len",
        str(args.system_prompt_len),
        "--num-prompts",
        str(args.groups * args.prompts_per_group),
    )


def ratios_and_table(rows: list[dict], key: str) -> str:
    """Sets each row's ``vs_round_robin`` (output throughput over the ``round_robin`` row's) and
    returns the table: throughput, latencies and each worker's requests and prompt tokens."""
    base = next((r for r in rows if r[key] == "round_robin"), None)
    for r in rows:
        r["vs_round_robin"] = r["output_throughput"] / base["output_throughput"] if base else None
    lines = [
        f"{key:<14} {'out tok/s':>10} {'vs rr':>6} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12} "
        f"{'requests per worker':>20} {'spread':>7} {'prompt tokens computed':>23}"
    ]
    for r in rows:
        counts = "/".join(str(w["requests"]) for w in r["workers"])
        computed = "/".join(str(w["new_tokens"]) for w in r["workers"])
        ratio = "-" if r["vs_round_robin"] is None else f"{r['vs_round_robin']:.2f}x"
        lines.append(
            f"{r[key]:<14} {r['output_throughput']:>10.1f} {ratio:>6} {r['median_ttft_ms']:>12.0f} "
            f"{r['median_tpot_ms']:>12.0f} {counts:>20} {r['request_spread']:>7.1%} {computed:>23}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feather-bench-dp",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    workload_arguments(ap)
    ap.add_argument("--dp-size", type=int, default=2, help="workers (default: %(default)s)")
    ap.add_argument("--methods", default=",".join(METHODS), help="default: %(default)s")
    ap.add_argument(
        "--attention-backend", default="torch_native", help="every worker's (default: %(default)s)"
    )
    ap.add_argument("--json", default="results/dp/dp.json", help="default: %(default)s")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS) - {"total_requests", "total_tokens"})
    if unknown:
        ap.error(
            f"--methods: unknown {unknown}; allowed: {', '.join(METHODS)}, total_requests, total_tokens"
        )
    if args.dp_size < 2 or args.repeats < 1:
        ap.error("--dp-size must be >= 2 and --repeats >= 1")

    from feather_bench import serving
    from feather_rl.provenance import record, write_json

    out_dir = Path(args.json).parent
    bench_args = gsp_bench_args(args)
    serving.WORKLOADS["dp"] = ("data-parallel workload", bench_args, ())
    rows = []
    for method in methods:
        run_args = argparse.Namespace(
            repeats=args.repeats,
            seed=args.seed,
            quiet=True,
            bench_args="",
            feather_args="",
            server_args=f"--dp-size {args.dp_size} --load-balance-method {method} --sleep-on-idle "
            f"{args.server_args}",
            ready_timeout_s=900,  # every worker loads the model on its share of the cores
        )
        method_dir = out_dir / method
        method_dir.mkdir(parents=True, exist_ok=True)
        backend = args.attention_backend
        row = serving.run_config(args.model, "feather", backend, "dp", run_args, method_dir)
        log = (method_dir / f"dp.feather+{backend}.server.log").read_text(errors="replace")
        workers = per_worker(log, args.dp_size, skip=1)
        row.update(
            method=method, workers=workers, request_spread=spread([w["requests"] for w in workers])
        )
        row.pop("generated_texts", None)
        rows.append(row)
    print(ratios_and_table(rows, "method"))
    write_json(
        args.json,
        {
            "rows": rows,
            "bench_serving_args": list(bench_args),
            "settings": vars(args),
            "provenance": record(),
        },
    )
    print(f"feather-bench-dp: -> {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
