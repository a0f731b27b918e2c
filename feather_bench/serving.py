"""``feather-bench-serving``: SGLang's own benchmark client against each configuration's server.

For each workload, one ``python -m sglang.launch_server`` per schedule policy x attention backend
is started (one at a time, settings left at their defaults but for the policy, the backend and
what the workload itself sets), ``python -m sglang.bench_serving`` runs against it ``--repeats``
times (cache flushed before each run), and the server is stopped. bench_serving's own JSONL
lines are kept per run; the summary JSON holds the medians over repeats of bench_serving's
metrics, same-backend ratios, ratios against the best torch_native configuration, and a greedy
check of every configuration's outputs against the first one's.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from feather_bench.tools.machine import (
    cpu_label,
    describe,
    git_state,
    round_order,
    short_commit,
)
from feather_bench.tools.markdown import command_block, wrap
from feather_bench.tools.server import ServerError, SGLangServer, error_line, per_worker

STOCK_POLICIES = ("fcfs", "lpm", "dfs-weight")
BACKENDS = ("torch_native", "feather")
METRICS = (
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2e_latency_ms",
    "duration",
)
_GSP = (
    "--dataset-name",
    "generated-shared-prefix",
    "--gsp-question-len",
    "32",
    "--gsp-output-len",
    "32",
)


def _random_ids(input_len: int, output_len: int, range_ratio: str, prompts: int) -> tuple:
    """bench_serving's random-ids flags: nothing shared."""
    return (
        *("--dataset-name", "random-ids", "--random-input-len", str(input_len)),
        *("--random-output-len", str(output_len), "--random-range-ratio", range_ratio),
        *("--num-prompts", str(prompts)),
    )


# The memory-bound shape scaled to what a 2-core CPU serves in minutes: 16 groups x 12
# prompts (more than lpm's 128-request limit), 512-token prefixes, a pool of ~4 groups:
# 4 x (512 + 12 x 64) = 5,120 tokens.
_MEMORY_BOUND_CPU = (
    "16 groups x 12 prompts sharing 512-token prefixes, a KV pool of 5,120 tokens (~4 groups)",
    (
        *_GSP,
        "--gsp-num-groups",
        "16",
        "--gsp-prompts-per-group",
        "12",
        "--gsp-system-prompt-len",
        "512",
        "--num-prompts",
        "192",
    ),
    ("--max-total-tokens", "5120"),
)


# name -> (what it is, bench_serving arguments, server arguments)
WORKLOADS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "memory-ample": (
        "4 groups x 8 prompts sharing a 1,024-token system prompt, server defaults",
        (
            *_GSP,
            "--gsp-num-groups",
            "4",
            "--gsp-prompts-per-group",
            "8",
            "--gsp-system-prompt-len",
            "1024",
            "--num-prompts",
            "32",
        ),
        (),
    ),
    "memory-bound-cpu": _MEMORY_BOUND_CPU,
    # 4 groups' prefixes plus their 16 requests' own tokens: 4 x (1024 + 16 x 64) = 8,192
    "memory-bound": (
        "32 groups x 16 prompts sharing 1,024-token prefixes, a KV pool of 8,192 tokens (~4 groups)",
        (
            *_GSP,
            "--gsp-num-groups",
            "32",
            "--gsp-prompts-per-group",
            "16",
            "--gsp-system-prompt-len",
            "1024",
            "--num-prompts",
            "512",
        ),
        ("--max-total-tokens", "8192"),
    ),
    "no-sharing": (
        "128 prompts of 512 random token ids (bench_serving's random-ids), 32 output tokens, nothing shared",
        _random_ids(512, 32, "1.0", 128),
        (),
    ),
    "no-sharing-cpu": (
        "64 prompts of 256 random token ids, 32 output tokens (nothing shared)",
        _random_ids(256, 32, "1.0", 64),
        (),
    ),
    # bench_serving's own default lengths (--random-range-ratio 0.0): input 1-512, output 1-32.
    "no-sharing-varied-cpu": (
        "64 prompts of 1-512 random token ids, 1-32 output tokens (nothing shared)",
        _random_ids(512, 32, "0.0", 64),
        (),
    ),
    # The rate sits near the slowest policy's capacity on the project's CPU host: fcfs + feather
    # serves memory-bound-cpu at about 2.3 requests/s there, all requests sent at once.
    "online": (
        "memory-bound-cpu, requests arriving at 2 requests/s (Poisson)",
        (*_MEMORY_BOUND_CPU[1], "--request-rate", "2"),
        _MEMORY_BOUND_CPU[2],
    ),
}


def run_config(
    model: str,
    policy: str,
    backend: str,
    workload: str,
    args,
    out_dir: Path,
    run: int | None = None,
) -> dict:
    """Start one server, run bench_serving ``args.repeats`` times (only run number ``run`` if
    given), stop it; the medians of the runs so far."""
    _, bench_args, server_args = WORKLOADS[workload]
    name = f"{policy}+{backend}"
    extra = ["--attention-backend", backend, *server_args, *shlex.split(args.server_args)]
    if policy == "feather" and args.feather_args:
        extra += shlex.split(args.feather_args)
    with SGLangServer(
        model,
        schedule_policy=policy,
        extra_args=extra,
        log_path=server_log(out_dir, workload, name),
        **(
            {"ready_timeout_s": args.ready_timeout_s}
            if getattr(args, "ready_timeout_s", None)
            else {}
        ),
    ) as server:
        counts = out_dir / f"{workload}.{name}.prefill.json"  # per run, kept as the jsonl is
        log_at = [0]

        def before_run(repeat: int) -> None:
            log_at[0] = server.log_path.stat().st_size

        def after_run(repeat: int) -> None:
            done = json.loads(counts.read_text()) if repeat and counts.exists() else []
            counts.write_text(json.dumps(done + [prefill_tokens(server.log_path, log_at[0])]))

        jsonl = out_dir / f"{workload}.{name}.jsonl"
        try:
            runs = run_bench(
                server.url,
                model,
                bench_args,
                args,
                jsonl,
                workload + " " + name,
                before_run=before_run,
                after_run=after_run,
                runs=range(args.repeats) if run is None else [run],
            )
        except RunFailed as exc:
            # the runs measured before the failed one stand (their counts, their JSONL lines)
            measured = json.loads(counts.read_text()) if exc.run and counts.exists() else []
            if measured:
                exc.row = _config_row(
                    name, policy, backend, run, medians(jsonl, len(measured)), measured, extra
                )
            raise
    return _config_row(name, policy, backend, run, runs, json.loads(counts.read_text()), extra)


def _config_row(name, policy, backend, run, runs: dict, counts: list, server_args) -> dict:
    row = {"config": name, "policy": policy, "attention_backend": backend, "date": _now()}
    row.update(runs, interleaved=run is not None)
    row["prefill_tokens_runs"] = counts
    row["prefill_tokens"] = statistics.median(counts)
    row["server_args"] = server_args
    return row


class RunFailed(subprocess.CalledProcessError):
    """``sglang.bench_serving`` failed in run ``run`` (0-based); ``row``: the configuration's
    row over the runs measured before it (None: none were)."""

    def __init__(self, run: int, exc: subprocess.CalledProcessError) -> None:
        super().__init__(exc.returncode, exc.cmd, exc.output, exc.stderr)
        self.run, self.row = run, None


def server_log(out_dir: Path, workload: str, config: str) -> Path:
    """Where a configuration's server writes its log (every run of the workload appends)."""
    return out_dir / f"{workload}.{config}.server.log"


def without_flags(words, given) -> list[str]:
    """``words`` (a command line's flags, each with its values) without the flags ``given`` also
    sets: ``given`` comes after them and replaces them."""
    drop = {w.split("=", 1)[0] for w in given if w.startswith("--")}
    kept, keep = [], True
    for word in words:
        if word.startswith("--"):
            keep = word.split("=", 1)[0] not in drop
        if keep:
            kept.append(word)
    return kept


def bench_serving_args(workload_args, bench_args: str) -> list[str]:
    """The bench_serving flags a run uses: the workload's, those ``--bench-args`` sets replaced."""
    given = shlex.split(bench_args)
    return without_flags(workload_args, given) + given


def prefill_tokens(log_path: Path, start: int = 0) -> int:
    """Prompt tokens the server computed (its prefill lines' ``#new-token``, the bench_serving
    run's warm-up request included) in its log from byte ``start`` on."""
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    return per_worker(text, 1)[0]["new_tokens"]


def _jsonl_runs(jsonl: Path) -> list[dict]:
    """The runs ``python -m sglang.bench_serving --output-file`` appended to ``jsonl``."""
    return [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]


def _first_texts(row: dict) -> list[str] | None:
    """The first run's generated texts of ``row``: its own, or, for a row kept from an earlier
    run by ``--add``, read back from its bench_serving JSONL when that file is still there."""
    if row.get("generated_texts") is not None:
        return row["generated_texts"]
    jsonl = Path(row.get("jsonl") or "")
    if not jsonl.is_file():
        return None
    runs = _jsonl_runs(jsonl)
    return runs[0].get("generated_texts") if runs else None


def _provenance(result: dict) -> tuple[str, str | None]:
    """The day and commit a result (or a row kept by ``--add``) was measured on."""
    return result["date"][:10], result["git"]["commit"]


def run_bench(
    url: str,
    model: str,
    bench_args,
    args,
    jsonl: Path,
    label: str,
    before_run=None,
    after_run=None,
    runs=None,
) -> dict:
    """``python -m sglang.bench_serving`` against ``url``, runs ``runs`` (default: all
    ``args.repeats``; one warm-up request, then the cache flushed through ``url``); the medians
    of its metrics over every run in ``jsonl`` (emptied by run 0). ``before_run(repeat)`` and
    ``after_run(repeat)`` are called around each run."""
    runs = range(args.repeats) if runs is None else runs
    user_args = shlex.split(args.bench_args)
    if 0 in runs:
        jsonl.unlink(missing_ok=True)
    for repeat in runs:
        if before_run is not None:
            before_run(repeat)
        command = [
            sys.executable,
            "-m",
            "sglang.bench_serving",
            "--backend",
            "sglang",
            "--base-url",
            url,
            "--model",
            model,
            *without_flags(bench_args, user_args),
            "--seed",
            str(args.seed),
            "--flush-cache",
            "--warmup-requests",
            "1",
            "--output-details",
            "--output-file",
            str(jsonl),
            *user_args,
        ]
        print(f"[bench-serving] {label} run {repeat + 1}/{args.repeats}", flush=True)
        try:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
        except subprocess.CalledProcessError as exc:
            raise RunFailed(repeat, exc) from exc
        if after_run is not None:
            after_run(repeat)
    return medians(jsonl)


def medians(jsonl: Path, runs: int | None = None) -> dict:
    """The medians of bench_serving's metrics over the first ``runs`` runs in ``jsonl`` (all by
    default), their output throughputs, the first run's texts and the failed requests."""
    runs = _jsonl_runs(jsonl)[:runs]
    row = {"runs": len(runs), "jsonl": str(jsonl)}
    for key in METRICS:
        row[key] = statistics.median(r[key] for r in runs)
    row["output_throughput_runs"] = [r["output_throughput"] for r in runs]
    row["generated_texts"] = runs[0].get("generated_texts")
    row["errors"] = sum(1 for r in runs for e in r.get("errors", []) if e)
    return row


def summarize(rows: list[dict]) -> dict:
    """Ratios of output throughput: feather against the best stock policy on the same backend
    and everything against the best torch_native configuration; p99 TTFT against fcfs's."""
    by = {(r["policy"], r["attention_backend"]): r for r in rows}
    out = {}
    native = [r for r in rows if r["attention_backend"] == "torch_native"]
    best_native = max(native, key=lambda r: r["output_throughput"]) if native else None
    ref = _first_texts(rows[0])
    for r in rows:
        b = r["attention_backend"]
        stock = [by[(p, b)] for p in STOCK_POLICIES if (p, b) in by]
        best = max(stock, key=lambda s: s["output_throughput"]) if stock else None
        if best is not None:
            r["vs_best_stock_same_backend"] = r["output_throughput"] / best["output_throughput"]
            r["best_stock_same_backend"] = best["config"]
        if best_native is not None:
            r["vs_best_torch_native"] = r["output_throughput"] / best_native["output_throughput"]
        if ("fcfs", b) in by:
            r["p99_ttft_vs_fcfs"] = r["p99_ttft_ms"] / by[("fcfs", b)]["p99_ttft_ms"]
        texts = r.pop("generated_texts", None)
        if ref is not None and texts is not None:
            r["outputs_differing_from_first_config"] = sum(a != b for a, b in zip(ref, texts))
        else:  # a row kept by --add keeps what its own run found
            r.setdefault("outputs_differing_from_first_config", None)
    for (p, b), r in by.items():
        if p == "feather":
            out[f"feather+{b}_vs_best_stock_same_backend"] = r.get("vs_best_stock_same_backend")
    return out


def table(rows: list[dict]) -> str:
    head = (
        "| config | output tok/s (runs) | vs best stock, same backend | vs best torch_native | "
        "prefill tokens | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms | p99 TTFT vs fcfs | "
        "outputs differing |"
    )
    lines = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]

    def f(v, fmt="{:.2f}x"):
        return "-" if v is None else fmt.format(v)

    def spread(r):
        runs = r.get("output_throughput_runs") or [r["output_throughput"]]
        return f"{min(runs):.1f}-{max(runs):.1f}"

    for r in rows:
        lines.append(
            f"| {r['config']} | {r['output_throughput']:.1f} ({spread(r)}) | {f(r.get('vs_best_stock_same_backend'))} | "
            f"{f(r.get('vs_best_torch_native'))} | {f(r.get('prefill_tokens'), '{:,.0f}')} | "
            f"{r['median_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | "
            f"{r['median_tpot_ms']:.0f} / {r['p99_tpot_ms']:.0f} | {r['median_itl_ms']:.0f} / {r['p99_itl_ms']:.0f} | "
            f"{f(r.get('p99_ttft_vs_fcfs'))} | {f(r['outputs_differing_from_first_config'], '{}')} |"
        )
    return "\n".join(lines)


REPORT_HEAD = """# SGLang's own benchmark client against each configuration

Generated by `feather-bench-serving --report` from `results/bench_serving/*.json`; the runs:
`make bench-serving` (`feather-bench-serving --model models/SmolLM2-135M-Instruct ...`).

Method: for each workload, one `python -m sglang.launch_server` per schedule policy x attention
backend, started one at a time with SGLang's settings left at their defaults (on a CPU host the
feather's CPU runtime picks the device, `--disable-overlap-schedule` and the fastest dtype: bf16
on CPUs with bf16 instructions) except the policy, the backend and what the workload sets.
`python -m sglang.bench_serving` runs against each server `--repeats` times, the cache flushed
before each run; every figure is the median over the runs, from bench_serving's own JSONL.
Ratios: output throughput against the best stock policy (fcfs, lpm, dfs-weight) on the same
backend, and against the best torch_native configuration. "outputs differing": generated texts
that differ from the first configuration's (bf16 rounds at ~1e-2, so near-ties can flip).
"prefill tokens": prompt tokens the server computed in a run (its log's prefill batches, the
warm-up request included): what a policy's prefix reuse saved.
"""


def headline(results: list[dict]) -> str:
    """One row per workload: feather on each backend against the best stock policy there."""
    lines = [
        "| workload | feather vs best stock, feather backend | feather vs best stock, torch_native | "
        "feather + feather vs best torch_native | feather's p99 TTFT vs fcfs "
        "(feather / torch_native backend) |",
        "|---|---|---|---|---|",
    ]

    def cell(row, key, fmt="{:.2f}x"):
        return "-" if row is None or row.get(key) is None else fmt.format(row[key])

    for r in results:
        rows = {x["config"]: x for x in r["rows"]}
        ff, fn = rows.get("feather+feather"), rows.get("feather+torch_native")
        vs = lambda row: "" if row is None else f" ({row.get('best_stock_same_backend', '-')})"  # noqa: E731
        lines.append(
            f"| {r['workload']} | {cell(ff, 'vs_best_stock_same_backend')}{vs(ff)} | "
            f"{cell(fn, 'vs_best_stock_same_backend')}{vs(fn)} | {cell(ff, 'vs_best_torch_native')} | "
            f"{cell(ff, 'p99_ttft_vs_fcfs')} / {cell(fn, 'p99_ttft_vs_fcfs')} |"
        )
    return "\n".join(lines)


def runs_of(result: dict) -> str:
    """How many bench_serving runs each row is the median of."""
    counts = {row["config"]: row.get("runs", result["repeats"]) for row in result["rows"]}
    # the most common count; of two as common, the larger (the rows the comparison was built on)
    most = max(set(counts.values()), key=lambda n: (list(counts.values()).count(n), n))
    others = ", ".join(f"{n} for {c}" for c, n in counts.items() if n != most)
    # how the rows of the most common count ran (a row of one run takes no turns)
    interleaved = all(
        row.get("interleaved") for row in result["rows"] if counts[row["config"]] == most
    )
    per = (
        "runs, configurations taking turns, a server per run" if interleaved else "runs per server"
    )
    head = "one run per server" if most == 1 else f"medians of {most} {per}"
    return head + (f" ({others})" if others else "")


def report(out_dir: Path) -> str:
    """Every workload's table in ``out_dir``, with the command and the machine it ran on."""
    results = [
        json.loads((out_dir / f"{n}.json").read_text())
        for n in WORKLOADS
        if (out_dir / f"{n}.json").exists()
    ]
    parts = [REPORT_HEAD, "## Summary\n", headline(results), "\n## Per workload\n"]
    for r in results:
        name, m = r["workload"], r["machine"]
        server = " ".join(a for a in r["rows"][0]["server_args"][2:]) or "defaults"
        client = command_block(
            f"python -m sglang.bench_serving {' '.join(r['bench_serving_args'])} --seed {r['seed']} "
            "--flush-cache --warmup-requests 1"
        )
        where = wrap(
            f"Servers: `--schedule-policy P --attention-backend B` ({server}); {runs_of(r)}. "
            f"{cpu_label(m)}, {m['cores']} cores, "
            f"sglang {m['versions']['sglang']}, torch {m['versions']['torch']}, {r['date'][:10]}, "
            f"commit `{short_commit(r['git'], 'unknown')}`."
            + "".join(
                f" {row['config']}: an earlier run (`--add`), {row['date'][:10]}, commit "
                f"`{short_commit(row['git'], 'unknown')}`."
                for row in r["rows"]
                if "git" in row and _provenance(row) != _provenance(r)
            )
            + "".join(
                f" {f['config']} failed in run {f['run']} ({f['error']})."
                for f in r.get("failed", [])
            )
        )
        parts.append(
            f"### {name}: {r['description']}\n\n"
            + "\n".join(client)
            + f"\n\n{where}\n\n{table(r['rows'])}\n"
        )
    return "\n".join(parts)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="feather-bench-serving", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", help="model path or id, as for sglang.launch_server (required unless --report)"
    )
    p.add_argument(
        "--workloads",
        default="memory-ample,memory-bound-cpu,no-sharing-cpu",
        help=f"comma-separated, from: {', '.join(WORKLOADS)} (default: %(default)s)",
    )
    p.add_argument("--policies", default="fcfs,lpm,dfs-weight,feather", help="default: %(default)s")
    p.add_argument("--backends", default=",".join(BACKENDS), help="default: %(default)s")
    p.add_argument(
        "--repeats", type=int, default=2, help="bench_serving runs per configuration (default: 2)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--server-args", default="", help="extra flags for every server, e.g. '--dtype float32'"
    )
    p.add_argument(
        "--feather-args",
        default="",
        help="extra flags for feather's servers, e.g. '--feather-agent static'",
    )
    p.add_argument(
        "--bench-args", default="", help="extra flags for bench_serving, e.g. '--request-rate 4'"
    )
    p.add_argument("--out-dir", default="results/bench_serving", help="default: %(default)s")
    p.add_argument("--quiet", action="store_true", help="hide bench_serving's own output")
    p.add_argument(
        "--report",
        action="store_true",
        help="run nothing: print the tables of the JSON already in --out-dir, as markdown",
    )
    p.add_argument(
        "--add",
        action="store_true",
        help="keep the configurations of a workload's earlier JSON in --out-dir that this run "
        "does not repeat (same model, seed and bench_serving flags, a host alike), e.g. to add a "
        "backend",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="run the configurations in turn, one bench_serving run each on a fresh server, "
        "--repeats rounds, each round starting one configuration later, so that a host's drift "
        "falls on every configuration alike",
    )
    args = p.parse_args(argv)
    for field, allowed in (
        ("workloads", WORKLOADS),
        ("policies", (*STOCK_POLICIES, "feather")),
        ("backends", BACKENDS),
    ):
        values = [v for v in getattr(args, field).split(",") if v]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            p.error(
                f"--{field}: {', '.join(bad) or 'empty'} not allowed; choose from {', '.join(allowed)}"
            )
        setattr(args, field, values)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if not args.model and not args.report:
        p.error("--model is required (a model path or id)")
    return args


# What two hosts must share for one's figures to stand beside the other's in a table.
SAME_HOST = ("cpu", "cores", "arch", "gpu", "bf16_instructions", "amx", "versions")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def earlier_rows(
    path: Path, result: dict, configs: set[str], machine: dict | None = None
) -> list[dict]:
    """``--add``: the rows of ``path`` for configurations not in ``configs``; the earlier run
    must have measured the same thing (model, seed and bench_serving flags) on a host alike in
    :data:`SAME_HOST` (``machine``: this host's :func:`describe`, read when not given)."""
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    for key in ("model", "seed", "bench_serving_args"):
        if old.get(key) != result[key]:
            raise SystemExit(
                f"--add: {path} was measured with {key}={old.get(key)!r}, this run with "
                f"{result[key]!r}; rerun every configuration, or use another --out-dir"
            )
    before, now = old.get("machine") or {}, machine or describe()
    for key in SAME_HOST:
        if before.get(key) != now.get(key):
            raise SystemExit(
                f"--add: {path} was measured on another host ({key}={before.get(key)!r}, this "
                f"host {now.get(key)!r}); its figures do not compare with this host's: rerun "
                "every configuration, or use another --out-dir"
            )
    return [
        {"date": old["date"], "git": old["git"], **r}
        for r in old["rows"]
        if r["config"] not in configs
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out_dir)
    if args.report:
        print(report(out_dir))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    git = git_state()  # the code the servers run, as it is when they start
    failures = 0
    for workload in args.workloads:
        path = out_dir / f"{workload}.json"
        result = {
            "workload": workload,
            "description": WORKLOADS[workload][0],
            "bench_serving_args": bench_serving_args(WORKLOADS[workload][1], args.bench_args),
            "model": args.model,
            "repeats": args.repeats,
            "seed": args.seed,
        }
        pairs = [(p, b) for b in args.backends for p in args.policies]
        # --add keeps an earlier row for a configuration this run repeats until the repeat is
        # measured: a configuration that fails here keeps its earlier figures
        kept = earlier_rows(path, result, set()) if args.add else []  # refused before any run
        done: dict[str, dict] = {}
        failed: dict[str, dict] = {}
        for run in range(args.repeats) if args.interleave else [None]:
            for p, b in round_order(pairs, run or 0):
                name = f"{p}+{b}"
                if name in failed:  # its JSONL and counts stop at the failed run
                    continue
                try:
                    done[name] = run_config(args.model, p, b, workload, args, out_dir, run)
                except (ServerError, RunFailed) as exc:
                    at = getattr(exc, "run", run)  # a client run names its own
                    if getattr(exc, "row", None) is not None:  # the runs before it stand
                        done[name] = exc.row
                    failed[name] = failure(name, at, exc, server_log(out_dir, workload, name))
                    print(
                        f"[bench-serving] {workload} {name} failed, the other configurations go "
                        f"on: {failed[name]['error']}\n{exc}",
                        file=sys.stderr,
                        flush=True,
                    )
                # after every run, so that a job cut short keeps what it measured
                if kept or done:
                    rows = write_result(path, result, kept, done, pairs, failed, git)
        if kept or done:
            print(
                f"\n## {workload}: {WORKLOADS[workload][0]}\n\n{table(rows)}\n\nwritten: {path}",
                flush=True,
            )
        for f in failed.values():
            print(
                f"not measured: {workload} {f['config']} from run {f['run']} on ({f['error']}; "
                f"log: {f['server_log']})",
                file=sys.stderr,
                flush=True,
            )
        failures += len(failed)
    return 1 if failures else 0


def failure(config: str, run: int | None, exc: Exception, log: Path) -> dict:
    """What a failed configuration records: the run it failed in, the error in a line, its log."""
    if isinstance(exc, subprocess.CalledProcessError):
        error = f"sglang.bench_serving exited with status {exc.returncode}"
    else:  # ServerError: its message ends with the server log's tail
        error = error_line(str(exc)) or str(exc).strip().splitlines()[0]
    return {
        "config": config,
        "run": 1 if run is None else run + 1,
        "error": error,
        "server_log": str(log),
    }


def write_result(
    path: Path, result: dict, kept: list[dict], done: dict, pairs, failed: dict, git
) -> list[dict]:
    """``result`` with the rows measured (``done``, in ``pairs``' order) after those ``kept`` from
    an earlier run that this one has not measured again, and the configurations ``failed``; the
    rows written."""
    rows = [r for r in kept if r["config"] not in done]
    rows += [done[f"{p}+{b}"] for p, b in pairs if f"{p}+{b}" in done]
    rows = copy.deepcopy(rows)  # the summary takes their generated texts
    out = {**result, "date": _now(), "machine": describe(), "git": git}
    out.update(summary=summarize(rows), rows=rows)
    if failed:
        out["failed"] = list(failed.values())
    path.write_text(json.dumps(out, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
