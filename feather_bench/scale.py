"""``feather-bench-scale``: feather's cost per scheduling pass at 10K-50K waiting requests.

    feather-bench-scale --waiting 10000,50000 --json results/scale/scale.json

Through the policy's own entry point (``SchedulePolicy.calc_priority`` with feather's hooks,
SGLang's ``Req`` objects and ``ServerArgs``), for each queue size W:

- **fresh**: W requests in 64 prefix groups, none starved; a pass plans a batch and is rolled
  back (``on_pass_end(None)``), repeated;
- **starved no-sharing**: W requests sharing nothing, every one past ``--feather-max-wait-s``
  (an injected clock), so each pass serves the starved backlog group by group;
- **after an abort**: a waiting request aborted as SGLang does (popped, then
  ``_release_aborted_request`` with feather's hook), then the next pass, repeated;
- **CHT bytes per prompt token** after the W enqueues (``tracemalloc``; the prompts are
  SGLang's, not counted).

Prints p50/p99 microseconds per pass and writes JSON with the machine, versions, date and commit.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from array import array

from tqdm import tqdm

PROMPT_TOKENS = 256
PREFIX_TOKENS = 192
BATCH = 32  # requests a pass may admit
PASSES = 200
ABORTS = 50


def _quantiles(samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=100)
    return {
        "p50_us": round(statistics.median(samples), 1),
        "p99_us": round(q[98], 1),
        "passes": len(samples),
    }


def _requests(make_req, w: int, shared: bool) -> list:
    prefixes = [
        array("q", range(10_000_000 * (g + 1), 10_000_000 * (g + 1) + PREFIX_TOKENS))
        for g in range(64)
    ]
    reqs = []
    for i in range(w):
        own = array(
            "q", range(1_000_000_000 + i * PROMPT_TOKENS, 1_000_000_000 + (i + 1) * PROMPT_TOKENS)
        )
        tokens = prefixes[i % 64] + own[: PROMPT_TOKENS - PREFIX_TOKENS] if shared else own
        reqs.append(make_req(f"w{i}", tokens))
    random.Random(w).shuffle(reqs)
    return reqs


def scenario(w: int, kind: str) -> dict:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    from feather_bench.overhead import SchedulerStandIn, make_req, make_tree_cache, publish_context
    from feather_sglang.config import FeatherConfig
    from feather_sglang.sglang_integration import policy as policy_mod

    publish_context()
    cache, _ = make_tree_cache("radix", 1 << 16, PROMPT_TOKENS + 64, BATCH)
    now = [0.0]
    config = FeatherConfig(max_wait_s=10.0)
    scheduler = SchedulerStandIn(cache, config, max_new=BATCH)
    state = scheduler.policy.feather
    state.planner.clock = lambda: now[0]
    queue = scheduler.waiting_queue = []
    running = ScheduleBatch(reqs=[])
    reqs = _requests(make_req, w, shared=kind != "starved no-sharing")
    tracemalloc.start()
    for req in reqs:
        queue.append(req)
        policy_mod.add_request_to_queue_after(None, scheduler, req)
    cht_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    if kind == "starved no-sharing":
        now[0] = 100.0  # every request has waited past --feather-max-wait-s
    # NOTE: the W requests' objects moved out of the collector's way, as SGLang's freeze_gc
    # API (POST /freeze_gc) does in a server, so that a pass's time is feather's own, not that
    # of a full collection over every request object.
    gc.collect()
    gc.freeze()
    samples = []
    rng = random.Random(1)
    for _ in range(ABORTS if kind == "after an abort" else PASSES):
        if kind == "after an abort":
            victim = queue.pop(rng.randrange(len(queue)))
            policy_mod.release_aborted_request_after(None, scheduler, victim)
        start = time.perf_counter()
        scheduler.policy.calc_priority(queue, running)
        samples.append((time.perf_counter() - start) * 1e6)
        state.on_pass_end(None)  # nothing admitted: the plan rolls back
    gc.unfreeze()
    assert state.faults.total == 0, dict(state.faults.counts)
    return {
        "waiting": w,
        "scenario": kind,
        **_quantiles(samples),
        "resyncs": state.resyncs,
        "cht_bytes_per_prompt_token": round(cht_bytes / (w * PROMPT_TOKENS), 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feather-bench-scale",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--waiting",
        default="10000,50000",
        help="queue sizes, comma-separated (default: %(default)s)",
    )
    ap.add_argument(
        "--json", default="results/scale/scale.json", help="output JSON (default: %(default)s)"
    )
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.waiting.split(",")]
    except ValueError:
        ap.error(f"--waiting: expected integers separated by commas, got {args.waiting!r}")
    if any(w < 100 for w in sizes):
        ap.error("--waiting: each size must be >= 100")
    from feather_rl.provenance import record, write_json

    kinds = ("fresh", "starved no-sharing", "after an abort")
    rows = [
        scenario(w, kind)
        for w, kind in tqdm(
            [(w, k) for w in sizes for k in kinds], desc="feather-bench-scale", file=sys.stderr
        )
    ]
    print(
        f"{'waiting':>8} {'scenario':<20} {'p50 us/pass':>12} {'p99 us/pass':>12} {'resyncs':>8} {'CHT B/token':>12}"
    )
    for r in rows:
        print(
            f"{r['waiting']:>8} {r['scenario']:<20} {r['p50_us']:>12,.1f} {r['p99_us']:>12,.1f} {r['resyncs']:>8} "
            f"{r['cht_bytes_per_prompt_token']:>12.3f}"
        )
    out = {
        "rows": rows,
        "settings": {
            "prompt_tokens": PROMPT_TOKENS,
            "prefix_tokens": PREFIX_TOKENS,
            "batch": BATCH,
            "passes": PASSES,
            "aborts": ABORTS,
        },
        "provenance": record(),
    }
    write_json(args.json, out)
    print(f"feather-bench-scale: -> {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
