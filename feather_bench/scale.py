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
- **bytes per prompt token** after the W enqueues (``tracemalloc``; the prompts are SGLang's,
  not counted): the CHT's own (what ``cht.py`` and ``chunk_hash.py`` allocate) and all of
  feather's (with the policy's and planner's per-request records), with 256-token prompts
  (three quarters of them the group's prefix) and, once more for the fresh queue, with 2,048-token prompts: feather's cost per request is
  mostly fixed, so its cost per token falls as prompts grow.

Prints p50/p99 microseconds per pass, twice: the whole ``calc_priority`` call, and feather's own
part of it (keeping in step with the queue and batch, planning, reordering). The difference is
SGLang's own per-pass work that stock fcfs does too (every 32nd pass refreshes the LRU recency of
the queue's first 128 prefixes). Writes JSON with the machine, versions, date and commit.
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
LONG_PROMPT_TOKENS = 2048
BATCH = 32  # requests a pass may admit
PASSES = 200
ABORTS = 50
CHT_FILES = ("feather_sglang/cht.py", "feather_sglang/chunk_hash.py")


def _quantiles(samples: list[float], prefix: str = "") -> dict:
    q = statistics.quantiles(samples, n=100)
    return {
        f"{prefix}p50_us": round(statistics.median(samples), 1),
        f"{prefix}p99_us": round(q[98], 1),
    }


def _requests(make_req, w: int, shared: bool, prompt_tokens: int) -> list:
    prefix_tokens = prompt_tokens * 3 // 4
    prefixes = [
        array("q", range(10_000_000 * (g + 1), 10_000_000 * (g + 1) + prefix_tokens))
        for g in range(64)
    ]
    reqs = []
    for i in range(w):
        own = array(
            "q", range(1_000_000_000 + i * prompt_tokens, 1_000_000_000 + (i + 1) * prompt_tokens)
        )
        tokens = prefixes[i % 64] + own[: prompt_tokens - prefix_tokens] if shared else own
        reqs.append(make_req(f"w{i}", tokens))
    random.Random(w).shuffle(reqs)
    return reqs


def scenario(w: int, kind: str, prompt_tokens: int = PROMPT_TOKENS) -> dict:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    from feather_bench.overhead import SchedulerStandIn, make_req, make_tree_cache, publish_context
    from feather_sglang.config import FeatherConfig
    from feather_sglang.sglang_integration import policy as policy_mod

    publish_context()
    cache, _ = make_tree_cache("radix", 1 << 16, prompt_tokens + 64, BATCH)
    now = [0.0]
    config = FeatherConfig(max_wait_s=10.0)
    scheduler = SchedulerStandIn(cache, config, max_new=BATCH)
    state = scheduler.policy.feather
    state.planner.clock = lambda: now[0]
    queue = scheduler.waiting_queue = []
    running = ScheduleBatch(reqs=[])
    reqs = _requests(make_req, w, kind != "starved no-sharing", prompt_tokens)
    tracemalloc.start(2)  # two frames: a dataclass's generated __init__ and its caller
    for req in reqs:
        queue.append(req)
        policy_mod.add_request_to_queue_after(None, scheduler, req)
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    feather_bytes = sum(t.size for t in snapshot.traces)
    cht_files = [tracemalloc.Filter(True, f"*/{f}", all_frames=True) for f in CHT_FILES]
    cht_bytes = sum(t.size for t in snapshot.filter_traces(cht_files).traces)
    del snapshot
    if kind == "starved no-sharing":
        now[0] = 100.0  # every request has waited past --feather-max-wait-s
    # NOTE: the W requests' objects moved out of the collector's way, as SGLang's freeze_gc
    # API (POST /freeze_gc) does in a server, so that a pass's time is feather's own, not that
    # of a full collection over every request object.
    gc.collect()
    gc.freeze()
    samples, own, hooks = [], [], []
    rng = random.Random(1)
    for _ in range(ABORTS if kind == "after an abort" else PASSES):
        if kind == "after an abort":
            victim = queue.pop(rng.randrange(len(queue)))
            start = time.perf_counter()
            policy_mod.release_aborted_request_after(None, scheduler, victim)
            hooks.append((time.perf_counter() - start) * 1e6)
        before = state.sched_seconds
        start = time.perf_counter()
        scheduler.policy.calc_priority(queue, running)
        samples.append((time.perf_counter() - start) * 1e6)
        own.append((state.sched_seconds - before) * 1e6)
        state.on_pass_end(None)  # nothing admitted: the plan rolls back
    gc.unfreeze()
    assert state.faults.total == 0, dict(state.faults.counts)
    return {
        "waiting": w,
        "scenario": kind,
        "prompt_tokens": prompt_tokens,
        "passes": len(samples),
        **_quantiles(samples),
        **_quantiles(own, "feather_"),
        **(_quantiles(hooks, "abort_hook_") if hooks else {}),
        "resyncs": state.resyncs,
        "reindexes": state.reindexes,
        "cht_bytes_per_prompt_token": round(cht_bytes / (w * prompt_tokens), 3),
        "feather_bytes_per_prompt_token": round(feather_bytes / (w * prompt_tokens), 3),
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

    kinds = [
        ("fresh", PROMPT_TOKENS),
        ("starved no-sharing", PROMPT_TOKENS),
        ("after an abort", PROMPT_TOKENS),
        ("fresh", LONG_PROMPT_TOKENS),
    ]
    cells = [(w, kind, tokens) for w in sizes for kind, tokens in kinds]
    rows = [scenario(*cell) for cell in tqdm(cells, desc="feather-bench-scale", file=sys.stderr)]
    print(
        f"{'waiting':>8} {'scenario':<20} {'prompt':>6} {'pass p50 us':>12} {'pass p99 us':>12} "
        f"{'feather p50':>12} {'feather p99':>12} {'reindexes':>9} {'CHT B/token':>12} {'all B/token':>12}"
    )
    for r in rows:
        print(
            f"{r['waiting']:>8} {r['scenario']:<20} {r['prompt_tokens']:>6} {r['p50_us']:>12,.1f} {r['p99_us']:>12,.1f} "
            f"{r['feather_p50_us']:>12,.1f} {r['feather_p99_us']:>12,.1f} {r['reindexes']:>9} "
            f"{r['cht_bytes_per_prompt_token']:>12.3f} {r['feather_bytes_per_prompt_token']:>12.3f}"
        )
    out = {
        "rows": rows,
        "settings": {"prefix_share": 0.75, "batch": BATCH, "passes": PASSES, "aborts": ABORTS},
        "provenance": record(),
    }
    write_json(args.json, out)
    print(f"feather-bench-scale: -> {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
