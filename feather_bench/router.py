"""``feather-bench-router``: feather on separate servers behind sglang-router or smg, by policy.

    feather-bench-router --model models/SmolLM2-135M-Instruct --json results/router/router.json
    feather-bench-router --router smg --policies round_robin,cache_aware,prefix_hash \
        --model models/SmolLM2-135M-Instruct --json results/router/smg.json

``--workers`` servers ``python -m sglang.launch_server --schedule-policy feather`` are started at
the same time (settings otherwise at their defaults). On a CPU host each one gets what
feather's CPU runtime gives each rank of ``--dp-size N``: its share of the cores
(``SGLANG_CPU_OMP_THREADS_BIND``, and ``OMP_NUM_THREADS`` set to the share's size, which is what
limits torch's threads where SGLang's CPU kernels are absent) and a 65,536-token KV pool unless
``--server-args`` sets ``--max-total-tokens``. For each policy in ``--policies``, one
``python -m sglang_router.launch_router --policy P --worker-urls ...`` (``--router smg``:
``python -m smg.launch_router``) is started in front of them, and
``python -m sglang.bench_serving --base-url ROUTER`` runs feather-bench-dp's shared-prefix
workload (same arguments and defaults) ``--repeats`` times through it. Before each
run every worker's cache is flushed (``POST /flush_cache`` to each worker); bench_serving then
sends one warm-up request and flushes through the router, which forwards the flush to every
worker. Each worker's own log, from that flush on, gives its share: requests admitted, prompt
tokens computed and tokens served from its radix cache (SGLang's ``Prefill batch`` lines). The
workers' ``/health`` answers without generating (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0``),
so the router's health checks add no request to these counts. Prints a table like
feather-bench-dp's and writes JSON with the machine, versions, date and commit.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

# Each router's policies for a regular (not prefill/decode) deployment; "manual" needs a routing
# key in every request, and smg's "passthrough" a worker named by the client, so they are left out.
POLICIES = {
    "sglang-router": ("round_robin", "cache_aware", "random", "power_of_two"),
    "smg": (
        "round_robin",
        "cache_aware",
        "prefix_hash",
        "consistent_hashing",
        "least_load",
        "random",
        "power_of_two",
    ),
}
# smg writes an SSE comment (": ping") into a stream after 15 s of upstream silence, and
# bench_serving's sglang client parses every line as JSON: a request queued that long would fail
# in the client. The flag turns the keep-alive off unless --router-args sets it.
ROUTER_ARGS = {"sglang-router": (), "smg": ("--sse-keepalive-secs", "0")}
FLUSHED = "Cache flushed successfully!"  # SGLang's scheduler, after /flush_cache
READY_TIMEOUT_S = 900  # every worker loads the model on its share of the cores


def router_args(router: str, given: str) -> list[str]:
    """The router's flags: ``given`` (one string), after ``ROUTER_ARGS``' unless it sets them."""
    extra, defaults = shlex.split(given), ROUTER_ARGS[router]
    return extra if not defaults or defaults[0] in extra else [*defaults, *extra]


def worker_env(index: int, workers: int) -> dict[str, str]:
    """Environment of worker ``index`` of ``workers``: no generation on ``/health`` (the router's
    health checks), and on a host without an accelerator its share of the cores, as the CPU
    runtime splits them among the ranks of ``--dp-size`` (it pins the worker to them)."""
    import feather_cpu

    env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
    if feather_cpu.accelerator_present():
        return env
    binding = feather_cpu.threads_binding(workers, sorted(os.sched_getaffinity(0)))
    if binding:  # None with fewer cores than workers
        env[feather_cpu.THREADS_BIND_ENV] = binding.split("|")[index]
    return env


def worker_server_args(server_args: str) -> list[str]:
    """Every worker's extra flags: ``server_args``, ``--sleep-on-idle`` (an idle SGLang
    scheduler otherwise polls its sockets on a full core, which starves the other servers of
    one host), and on a CPU host the CPU runtime's per-rank KV pool unless ``server_args``
    sizes it."""
    import feather_cpu

    extra = shlex.split(server_args)
    if "--sleep-on-idle" not in extra:
        extra.append("--sleep-on-idle")
    sized = any(a == "--max-total-tokens" or a.startswith("--max-total-tokens=") for a in extra)
    if not sized and not feather_cpu.accelerator_present():
        extra += ["--max-total-tokens", str(feather_cpu.MULTI_RANK_KV_TOKENS)]
    return extra


def flush_workers(urls: list[str], attempts: int = 10) -> None:
    """``POST /flush_cache`` to every worker (SGLang refuses while requests are in flight, so a
    refusal is retried a few times)."""
    import requests

    for url in urls:
        for attempt in range(attempts):
            r = requests.post(url + "/flush_cache", timeout=120)
            if r.status_code == 200:
                break
            time.sleep(1.0)
        else:
            raise RuntimeError(f"{url}/flush_cache: {r.status_code} {r.text[:200]}")


def log_since(path: Path, offset: int) -> str:
    """A log file's text from byte ``offset`` on."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def log_counts(text: str) -> dict:
    """Requests, prompt tokens computed and cached tokens in one worker's log ``text``, from its
    last cache flush on (what came before, bench_serving's warm-up request, is left out);
    ``flushed`` says whether a flush was found."""
    from feather_bench.tools.server import per_worker

    flushed = FLUSHED in text
    counts = per_worker(text.rpartition(FLUSHED)[2] if flushed else text, 1)[0]
    counts.pop("worker")
    return {**counts, "flushed": flushed}


def run_policy(policy: str, servers, bench_args, args, out_dir: Path) -> dict:
    """One router with ``policy`` in front of ``servers``; bench_serving through it; the
    medians and each worker's counts summed over the runs."""
    from feather_bench import serving
    from feather_bench.dp import spread
    from feather_bench.tools.server import SGLangRouter

    urls = [s.url for s in servers]
    offsets = [0] * len(servers)
    workers = [
        {"worker": i, "url": u, "requests": 0, "new_tokens": 0, "cached_tokens": 0}
        for i, u in enumerate(urls)
    ]
    unflushed = []

    def before(repeat: int) -> None:
        flush_workers(urls)
        offsets[:] = [s.log_path.stat().st_size for s in servers]

    def after(repeat: int) -> None:
        for i, s in enumerate(servers):
            counts = log_counts(log_since(s.log_path, offsets[i]))
            if not counts.pop("flushed"):
                unflushed.append((repeat, i))
            for key, value in counts.items():
                workers[i][key] += value

    run_args = argparse.Namespace(
        repeats=args.repeats, seed=args.seed, quiet=True, bench_args=args.bench_args
    )
    router = SGLangRouter(
        urls,
        policy,
        router_args(args.router, args.router_args),
        log_path=out_dir / f"{policy}.router.log",
        router=args.router,
    )
    with router:
        row = serving.run_bench(
            router.url,
            args.model,
            bench_args,
            run_args,
            out_dir / f"{policy}.jsonl",
            f"{args.router} {policy}",
            before,
            after,
        )
    row.pop("generated_texts", None)
    row.update(
        policy=policy,
        router_args=router.args[3:],
        workers=workers,
        request_spread=spread([w["requests"] for w in workers]),
        requests_counted=sum(w["requests"] for w in workers),
        requests_sent=args.repeats * args.groups * args.prompts_per_group,
        # (repeat, worker) whose log showed no flush after bench_serving's warm-up: there the
        # warm-up request is counted too
        runs_without_flush=unflushed,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    from feather_bench.dp import gsp_bench_args, ratios_and_table, workload_arguments

    ap = argparse.ArgumentParser(
        prog="feather-bench-router",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    workload_arguments(ap)
    ap.add_argument("--workers", type=int, default=2, help="servers (default: %(default)s)")
    ap.add_argument(
        "--router",
        choices=tuple(POLICIES),
        default="sglang-router",
        help="the router's package (default: %(default)s)",
    )
    allowed = "; ".join(f"{r}: {', '.join(p)}" for r, p in POLICIES.items())
    ap.add_argument(
        "--policies",
        default="round_robin,cache_aware",
        help=f"the router's policies, comma-separated ({allowed}) (default: %(default)s)",
    )
    ap.add_argument("--router-args", default="", help="more router flags, as one string")
    ap.add_argument("--bench-args", default="", help="more bench_serving flags, as one string")
    ap.add_argument("--json", default="results/router/router.json", help="default: %(default)s")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    unknown = sorted(set(policies) - set(POLICIES[args.router]))
    if unknown or not policies:
        ap.error(
            f"--policies: unknown to {args.router}: {unknown or 'empty'}; allowed: "
            f"{', '.join(POLICIES[args.router])}"
        )
    if args.workers < 2 or args.repeats < 1:
        ap.error("--workers must be >= 2 and --repeats >= 1")

    from importlib.metadata import version

    from feather_bench.tools.server import SGLangServer
    from feather_rl.provenance import record, write_json

    out_dir = Path(args.json).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    bench_args = gsp_bench_args(args)
    server_args = worker_server_args(args.server_args)
    envs = [worker_env(i, args.workers) for i in range(args.workers)]
    servers = [
        SGLangServer(
            args.model,
            "feather",
            server_args,
            log_path=out_dir / f"worker{i}.server.log",
            ready_timeout_s=READY_TIMEOUT_S,
            env=envs[i],
        )
        for i in range(args.workers)
    ]
    rows = []
    try:
        for s in servers:
            s.launch()
        for s in servers:
            s.wait_ready()
        print(f"[bench-router] {args.workers} workers: {', '.join(s.url for s in servers)}")
        for policy in policies:
            rows.append(run_policy(policy, servers, bench_args, args, out_dir))
    finally:
        for s in servers:
            s.stop()
    print(ratios_and_table(rows, "policy"))
    for r in rows:
        if r["requests_counted"] != r["requests_sent"] or r["runs_without_flush"]:
            print(
                f"feather-bench-router: {r['policy']}: {r['requests_counted']} requests in the "
                f"workers' logs, {r['requests_sent']} sent; runs without a flush: "
                f"{r['runs_without_flush']}",
                file=sys.stderr,
            )
    write_json(
        args.json,
        {
            "rows": rows,
            "bench_serving_args": list(bench_args),
            "worker_server_args": ["--schedule-policy", "feather", *server_args],
            "worker_env": envs,
            "settings": vars(args),
            "router": args.router,
            "provenance": record(**{args.router.replace("-", "_"): version(args.router)}),
        },
    )
    print(f"feather-bench-router: -> {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
