"""``feather-bench-abort-storm``: a live feather server under clients that give up.

    feather-bench-abort-storm --model models/SmolLM2-135M-Instruct --requests 1000 --cycles 10

Each cycle sends ``--requests`` shared-prefix requests from ``--concurrency`` clients to one
``--schedule-policy feather`` server (``--policy fcfs``: a stock one, the memory baseline) with
a small ``--max-queued-requests``:

- ``--disconnect`` of the clients (30%) give up at a random time (0.2-6 s), while queued or
  while decoding, so SGLang aborts their requests;
- ``--reuse`` of the requests (5%) reuse the rid of an earlier request of the cycle;
- the queue cap turns some requests away at once (HTTP 503).

After each cycle it waits for SGLang's idle check (a leaked KV slot stops the server), checks
``/health_generate``, reads feather's idle log line (requests and CHT nodes still tracked) and
the scheduler process's resident memory, all of it and the part outside its large mappings: the
KV pool is allocated at start-up but its pages become resident only as requests first write
them, which shows as growth in the early cycles under any policy. Prints a table and writes
JSON with the machine, versions, date and commit; exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import requests
from tqdm import tqdm

IDLE_WAIT_S = 4.0  # SGLang's idle memory check runs once the scheduler has had nothing to do
IDLE_LINE = re.compile(r"feather: idle, tracking (\d+) requests, (\d+) CHT nodes")


# A mapping at least this large holds one big tensor (the KV pool's buffers, the weights): glibc
# gives every allocation over 32 MiB a mapping of its own, and its per-thread arenas are 64 MiB.
LARGE_MAPPING_BYTES = 96 * 2**20


def scheduler_rss_mb(server) -> tuple[float, float]:
    """Resident memory of the server's scheduler process(es), in MB: all of it, and the part
    outside mappings of ``LARGE_MAPPING_BYTES`` or more (what Python objects and small buffers
    use; the KV pool's pages count as resident only once first written)."""
    total = small = 0
    for proc in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if "scheduler" in " ".join(proc.cmdline()) or "scheduler" in proc.name():
                total += proc.memory_info().rss
                small += sum(
                    m.rss for m in proc.memory_maps(grouped=False) if m.size < LARGE_MAPPING_BYTES
                )
        except psutil.NoSuchProcess:
            continue
    return total / 2**20, small / 2**20


def run_cycle(url: str, prompts, cycle: int, args, rng: random.Random) -> Counter:
    """One cycle's requests; returns how they ended (200, 503, disconnected, error:...)."""
    plans = []
    for i, (rid, text) in enumerate(prompts):
        if i and rng.random() < args.reuse:
            rid = prompts[rng.randrange(i)][0]  # the rid of an earlier request of this cycle
        timeout = rng.uniform(0.2, 6.0) if rng.random() < args.disconnect else 900.0
        plans.append((f"{rid}-c{cycle}", text, timeout))

    def one(plan):
        rid, text, timeout = plan
        try:
            r = requests.post(
                url + "/generate",
                timeout=timeout,
                json={
                    "rid": rid,
                    "text": text,
                    "sampling_params": {
                        "max_new_tokens": args.max_new_tokens,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                },
            )
            return r.status_code
        except requests.exceptions.Timeout:
            return "disconnected"
        except requests.RequestException as exc:
            return f"error: {type(exc).__name__}"

    with cf.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        return Counter(pool.map(one, plans))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feather-bench-abort-storm",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model", default="models/SmolLM2-135M-Instruct", help="model path (default: %(default)s)"
    )
    ap.add_argument(
        "--requests", type=int, default=1000, help="requests per cycle (default: %(default)s)"
    )
    ap.add_argument("--cycles", type=int, default=10, help="default: %(default)s")
    ap.add_argument(
        "--groups", type=int, default=20, help="prefix groups per cycle (default: %(default)s)"
    )
    ap.add_argument(
        "--concurrency", type=int, default=96, help="clients at once (default: %(default)s)"
    )
    ap.add_argument(
        "--disconnect",
        type=float,
        default=0.3,
        help="share of clients that give up (default: %(default)s)",
    )
    ap.add_argument(
        "--reuse",
        type=float,
        default=0.05,
        help="share of requests reusing a rid (default: %(default)s)",
    )
    ap.add_argument(
        "--max-queued-requests",
        type=int,
        default=32,
        help="server's queue cap (default: %(default)s)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=8, help="default: %(default)s")
    ap.add_argument(
        "--policy",
        default="feather",
        choices=("feather", "fcfs", "lpm"),
        help="--schedule-policy of the server; a stock one gives the baseline of the memory "
        "figures (default: %(default)s)",
    )
    ap.add_argument("--server-args", default="", help="more SGLang server flags, as one string")
    ap.add_argument(
        "--json", default="results/reliability/abort_storm.json", help="default: %(default)s"
    )
    args = ap.parse_args(argv)
    for name in (
        "requests",
        "cycles",
        "groups",
        "concurrency",
        "max_queued_requests",
        "max_new_tokens",
    ):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("disconnect", "reuse"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            ap.error(f"--{name} must be a share between 0 and 1, got {getattr(args, name)}")

    from feather_bench.tools.server import SGLangServer
    from feather_bench.tools.workload import shared_prefix_prompts
    from feather_rl.provenance import record, write_json

    per_group = -(-args.requests // args.groups)
    prompts = shared_prefix_prompts(groups=args.groups, per_group=per_group, repeat=4)[
        : args.requests
    ]
    server_args = [
        "--max-queued-requests",
        str(args.max_queued_requests),
        *args.server_args.split(),
    ]
    rng = random.Random(0)
    rows, failures = [], []
    log_path = Path(args.json).with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    server = SGLangServer(args.model, args.policy, server_args, log_path=log_path)
    with server:
        rss_start, small_start = scheduler_rss_mb(server)
        for cycle in tqdm(range(args.cycles), desc="abort storm", file=sys.stderr):
            start = time.monotonic()
            outcomes = run_cycle(server.url, prompts, cycle, args, rng)
            seconds = time.monotonic() - start
            time.sleep(IDLE_WAIT_S)
            healthy = (
                server.alive()
                and requests.get(server.url + "/health_generate", timeout=120).status_code == 200
            )
            idle = IDLE_LINE.findall(server.log_text())
            tracked = tuple(int(x) for x in idle[-1]) if idle else None
            feather_ok = args.policy != "feather" or tracked == (0, 0)
            rss, small = scheduler_rss_mb(server)
            rows.append(
                {
                    "cycle": cycle + 1,
                    "seconds": round(seconds, 1),
                    "outcomes": {str(k): v for k, v in sorted(outcomes.items(), key=str)},
                    "healthy": healthy,
                    "idle_tracked": tracked,
                    "scheduler_rss_mb": round(rss, 1),
                    "scheduler_small_rss_mb": round(small, 1),
                }
            )
            if not healthy or not feather_ok:
                failures.append(f"cycle {cycle + 1}: healthy={healthy}, idle line {tracked}")
                break
    log = server.log_path.read_text(errors="replace")
    for marker in ("Scheduler hit an exception", "fault in", "memory leak detected"):
        if marker in log:
            failures.append(f"the server log has {marker!r}")
    rss = [r["scheduler_rss_mb"] for r in rows]
    small = [r["scheduler_small_rss_mb"] for r in rows]
    summary = {
        "scheduler_rss_start_mb": round(rss_start, 1),
        "scheduler_rss_growth_mb": round(rss[-1] - rss[0], 1) if rss else None,
        "scheduler_rss_growth_from_start_mb": round(rss[-1] - rss_start, 1) if rss else None,
        "scheduler_small_rss_start_mb": round(small_start, 1),
        "scheduler_small_rss_growth_mb": round(small[-1] - small[0], 1) if small else None,
        "large_mapping_bytes": LARGE_MAPPING_BYTES,
        "failures": failures,
    }
    print(
        f"{'cycle':>5} {'s':>6} {'200':>5} {'503':>5} {'gave up':>8} {'other':>6} "
        f"{'idle tracked':>13} {'sched RSS MB':>13} {'outside large':>13}"
    )
    for r in rows:
        o = r["outcomes"]
        other = sum(v for k, v in o.items() if k not in ("200", "503", "disconnected"))
        print(
            f"{r['cycle']:>5} {r['seconds']:>6.1f} {o.get('200', 0):>5} {o.get('503', 0):>5} "
            f"{o.get('disconnected', 0):>8} {other:>6} {str(r['idle_tracked']):>13} "
            f"{r['scheduler_rss_mb']:>13.1f} {r['scheduler_small_rss_mb']:>13.1f}"
        )
    print(
        f"scheduler RSS: {summary['scheduler_rss_growth_mb']} MB from after the first cycle to after "
        f"the last ({summary['scheduler_rss_growth_from_start_mb']} MB from start-up); outside "
        f"mappings of {LARGE_MAPPING_BYTES >> 20} MiB or more (the KV pool, the weights): "
        f"{summary['scheduler_small_rss_growth_mb']} MB"
    )
    write_json(
        args.json,
        {"rows": rows, "summary": summary, "settings": vars(args), "provenance": record()},
    )
    print(f"feather-bench-abort-storm: -> {args.json}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
