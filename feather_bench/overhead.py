"""Scheduling overhead per pass: feather's chunked hash tree against SGLang's lpm and dfs-weight.

    python -m feather_bench.overhead --quick --json results/bench_overhead_quick.json
    python -m feather_bench.overhead --json results/bench_overhead.json

Full run: W in {128, 1024, 4096} x T in {2K, 8K, 20K} tokens; ``--quick``: W in {128, 1024} x
T in {2K, 8K} with fewer repeats. ``--live`` also runs a real server with feather and reports
feather's logged share of step time.

One *cell* is a waiting queue of ``W`` real SGLang ``Req`` objects with ``T``-token prompts
in ``G`` prefix groups (prompt = its group's prefix of ~90% of ``T`` + a unique suffix), in
shuffled arrival order, and a running batch of ``B`` requests of group 0 whose prompts are
inserted in a real tree cache (what ``cache_unfinished_req`` leaves after their prefill).
Every policy is timed on the same queue (built once per cell), over the same tree cache:

- ``fcfs``, ``lpm``, ``dfs-weight``: SGLang's full ``SchedulePolicy.calc_priority`` (with
  the prefix matching it does). Above 128 waiting requests lpm silently becomes FCFS: that
  row says ``fell_back_to_fcfs: true``, and ``lpm-no-fallback`` times what lpm would do
  without the fallback (``_compute_prefix_matches(queue, LPM)`` + ``_sort_by_longest_prefix``).
- ``feather``: ``FeatherSchedulePolicy.calc_priority``, the real entry point the scheduler
  calls (sync of the running batch, the planner's picks from the CHT with the stop/add agent,
  each pick admitted into the CHT, the prefix-leader check, the queue reorder), through a
  stand-in for the few ``Scheduler`` attributes it reads. The static agent runs with its
  loss limits raised so that it never STOPs: a pass picks ``B`` requests (fewer only where
  the prefix leader ends the plan, see the ``picks`` / ``stop_reason`` keys). After each timed
  pass ``on_pass_end(None)`` rolls the plan back (timed apart as ``us_rollback``), so every
  repeat starts from the same state.
- ``feather-plan``: ``AdmissionPlanner.plan(B)`` alone (no prefix-leader check, no SGLang
  glue) + ``end_pass`` outside the timer: the CHT and agent work of a pass.

Per cell, on the CHT of the first tree cache: ``ChunkedHashTree.add_waiting(rid,
origin_input_ids)`` timed per request (``us_per_insert``), ``remove_waiting`` (abort),
``admit`` and ``finish``; the hashing alone, as ``add_waiting`` does it on SGLang's
``array('q')`` and through a zero-copy numpy view; and the best-candidate pick
(``best()`` + ``candidate_view()``) at the pass-start state.

Timings are medians of per-call ``perf_counter`` samples with the garbage collector off
during each timed call (as ``timeit`` does); objects built before timing are frozen
(``gc.freeze``) so collections do not walk them. Nothing is sent to a device: this is CPU
scheduling cost only.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import resource
import statistics
import sys
import time
import timeit
from array import array
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import (
    WAITING_PREFIX_REFRESH_INTERVAL,
    CacheAgnosticPolicy,
    CacheAwarePolicy,
    SchedulePolicy,
)
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import publish, reset_context
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

from feather_bench.argtypes import ints
from feather_bench.paths import RESULTS_DIR, model_dir
from feather_bench.tools.machine import git_state
from feather_sglang.chunk_hash import chunk_hashes
from feather_sglang.config import FeatherConfig
from feather_sglang.sglang_integration import policy as policy_mod
from feather_sglang.sglang_integration.args import CONFIG_ATTR
from feather_sglang.sglang_integration.policy import FeatherSchedulePolicy

# ---- the grid ------------------------------------------------------------------------------
FULL_WAITING = (128, 1024, 4096)
FULL_TOKENS = (2048, 8192, 20480)
QUICK_WAITING = (128, 1024)
QUICK_TOKENS = (2048, 8192)
GROUPS = 8
BATCH = 32  # running requests, and picks per pass
PREFIX_FRACTION = 0.9
# "unified": what sglang 0.5.23 builds by default (UnifiedRadixCache, Rust tree core where
# available); "radix": the Python RadixCache (``--radix-cache-impl`` style fallback).
CACHE_KINDS = ("unified", "radix")
DEFAULT_CACHE = "unified"

# Token id spaces: group prefixes and per-request suffixes never collide, and every suffix
# starts with a token no other prompt has there (so no radix node is split by a near-match).
_PREFIX_BASE = 1 << 32
_SUFFIX_BASE = 1 << 40

# A static agent that never says STOP: every pass picks up to BATCH requests.
NEVER_STOP = dict(static_max_loss=10**9, static_max_loss_crowded=10**9, max_wait_s=math.inf)

SGLANG_POLICIES = ("fcfs", "lpm", "lpm-no-fallback", "dfs-weight")


# ---- SGLang's process context and objects (as tests/integration/test_policy_sglang_objects) --
def publish_context() -> None:
    """SchedulePolicy.calc_priority reads the published config (disagg mode, eviction policy)."""
    reset_context()
    publish(ServerArgs(model_path="dummy", device="cpu"), role="scheduler")


def make_req(rid: str, tokens: array, max_new_tokens: int = 16) -> Req:
    """A real Req; ``tokens`` (``array('q')``) becomes ``origin_input_ids`` without a copy."""
    req = Req(
        rid=rid,
        origin_input_text="",
        origin_input_ids=tokens,
        sampling_params=SamplingParams(temperature=0, max_new_tokens=max_new_tokens),
    )
    req.time_stats.set_wait_queue_entry_time()
    return req


def make_tree_cache(kind: str, pool_tokens: int, max_context_len: int, max_running: int):
    """(tree cache, allocator). ``unified`` is what sglang 0.5.23's default factory builds
    for a plain model; ``radix`` the Python RadixCache."""
    allocator = TokenToKVPoolAllocator(pool_tokens, torch.float16, "cpu", None, False)
    if kind == "radix":
        cache = RadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=allocator,
                page_size=1,
            )
        )
    elif kind == "unified":
        cache = UnifiedRadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=ReqToTokenPool(
                    size=max_running,
                    max_context_len=max_context_len,
                    device="cpu",
                    enable_memory_saver=False,
                ),
                token_to_kv_pool_allocator=allocator,
                page_size=1,
                tree_components=(ComponentType.FULL,),
            )
        )
    else:
        raise ValueError(f"unknown tree cache kind {kind!r}; allowed: {', '.join(CACHE_KINDS)}")
    return cache, allocator


def cache_class_name(cache) -> str:
    name = type(cache).__name__
    core = getattr(cache, "tree_core", None)
    return f"{name}({type(core).__name__})" if core is not None else name


def cache_tokens(cache, allocator, tokens: array) -> None:
    """What the running request's prefill leaves in the tree: its prompt, KV slots held."""
    value = allocator.alloc(len(tokens))
    result = cache.insert(InsertParams(key=RadixKey(tokens), value=value))
    allocator.free(value[: result.prefix_len])  # the part already cached


class SchedulerStandIn:
    """What FeatherState reads from SGLang's Scheduler: server_args (a real ServerArgs),
    policy, chunked_req, max_prefill_tokens and get_num_allocatable_reqs (here: always
    ``max_new``). NOTE: the prefill token budget is set out of reach so that every policy picks
    a batch of the same size; in a server feather stops planning at the budget."""

    def __init__(self, tree_cache, config: FeatherConfig, max_new: int) -> None:
        self.server_args = ServerArgs(model_path="dummy", device="cpu", schedule_policy="feather")
        setattr(self.server_args, CONFIG_ATTR, config)  # as the --feather-* flags attach it
        self.chunked_req = None
        self.max_new = max_new
        self.max_prefill_tokens = 1 << 40
        # Scheduler.init_schedule_policy, then feather's AFTER hook on it.
        self.policy = FeatherSchedulePolicy("feather", tree_cache, False, False, False)
        policy_mod.init_schedule_policy_after(None, self)

    def get_num_allocatable_reqs(self, running_bs, *args, **kwargs) -> int:
        return self.max_new


# ---- one cell --------------------------------------------------------------------------------
@dataclass
class Cell:
    waiting: int
    prompt_tokens: int
    groups: int
    batch: int
    prefix_tokens: int
    arrival: list  # the waiting Reqs in (shuffled) arrival order
    running: list  # the running Reqs (group 0)
    group_of: dict  # rid -> group
    extra_prompts: list  # fresh prompts (array('q')) for the insert/remove timings


def build_cell(
    waiting: int, tokens: int, groups: int, batch: int, n_insert: int, seed: int
) -> Cell:
    prefix_len = round(PREFIX_FRACTION * tokens)
    suffix_len = tokens - prefix_len
    prefixes = [
        array("q", range(_PREFIX_BASE * (g + 1), _PREFIX_BASE * (g + 1) + prefix_len))
        for g in range(groups)
    ]
    counter = iter(range(1 << 30))

    def prompt(group: int) -> array:
        start = _SUFFIX_BASE + next(counter) * tokens
        return prefixes[group] + array("q", range(start, start + suffix_len))

    group_of = {}
    arrival = []
    for i in range(waiting):
        g = i % groups
        rid = f"w{i}-g{g}"
        group_of[rid] = g
        arrival.append(make_req(rid, prompt(g)))
    random.Random(seed).shuffle(arrival)
    running = []
    for j in range(batch):
        rid = f"r{j}-g0"
        group_of[rid] = 0
        running.append(make_req(rid, prompt(0)))
    rng = random.Random(seed + 1)
    extra = [prompt(rng.randrange(groups)) for _ in range(n_insert)]
    return Cell(waiting, tokens, groups, batch, prefix_len, arrival, running, group_of, extra)


def estimate_cell_bytes(
    waiting: int, tokens: int, batch: int, n_insert: int, n_caches: int, chunk: int
) -> int:
    """Rough resident size of one cell: the prompts (8 bytes a token) plus, per tree cache,
    a CHT (~250 bytes a chunk key: the key int, its list slot, reverse-index entries)."""
    prompt_bytes = (waiting + batch + n_insert) * tokens * 8
    chunks = (waiting + batch) * math.ceil(tokens / chunk)
    return prompt_bytes + n_caches * chunks * 250


# ---- timing ----------------------------------------------------------------------------------
def time_calls(
    fn: Callable[[], object],
    repeats: int,
    before: Optional[Callable[[], object]] = None,
    after: Optional[Callable[[], object]] = None,
) -> list[float]:
    """Microseconds of ``repeats`` calls of ``fn``, each timed alone with gc off;
    ``before``/``after`` run untimed around each call."""
    samples = []
    for _ in range(repeats):
        if before is not None:
            before()
        enabled = gc.isenabled()
        gc.disable()
        try:
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        finally:
            if enabled:
                gc.enable()
        if after is not None:
            after()
    return samples


def time_each(fn: Callable[[object], object], items) -> list[float]:
    """Microseconds of ``fn(item)`` for each item, each timed alone with gc off."""
    samples = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for item in items:
            start = time.perf_counter()
            fn(item)
            samples.append((time.perf_counter() - start) * 1e6)
    finally:
        if enabled:
            gc.enable()
    return samples


def time_loop(fn: Callable[[], object], number: int, repeats: int) -> list[float]:
    """timeit.repeat: microseconds per call of ``fn`` over ``number`` calls, ``repeats`` times."""
    return [t / number * 1e6 for t in timeit.Timer(fn).repeat(repeat=repeats, number=number)]


def med(samples: list[float]) -> float:
    return round(statistics.median(samples), 3)


# ---- measuring -------------------------------------------------------------------------------
@dataclass
class Settings:
    waiting: tuple = FULL_WAITING
    tokens: tuple = FULL_TOKENS
    groups: int = GROUPS
    batch: int = BATCH
    caches: tuple = CACHE_KINDS
    repeats: int = 7  # timed passes of the SGLang policies that match every request
    cheap_repeats: int = 21  # timed passes of the cheap rows (feather, fcfs, lpm fallback)
    n_insert: int = 200  # requests timed for insert / remove / admit / finish
    pick_number: int = 2000  # best-candidate picks per timeit repeat
    seed: int = 0
    max_rss_gb: float = 12.0
    quick: bool = False


def _rows_for_sglang(
    cell: Cell, kind: str, cache, running_batch, settings: Settings, log
) -> list[dict]:
    queue = list(cell.arrival)

    def restore() -> None:
        queue[:] = cell.arrival

    def head_from_running_group() -> int:
        return sum(1 for r in queue[: cell.batch] if cell.group_of[r.rid] == 0)

    rows = []
    for name in SGLANG_POLICIES:
        base = "lpm" if name == "lpm-no-fallback" else name
        policy = SchedulePolicy(base, cache, False, False, False)
        fell_back = False
        if name == "lpm-no-fallback":

            def call(policy=policy):
                deprioritized = policy._compute_prefix_matches(queue, CacheAwarePolicy.LPM)
                SchedulePolicy._sort_by_longest_prefix(queue, deprioritized)
        else:
            fell_back = policy._determine_active_policy(queue) != policy.policy

            def call(policy=policy):
                policy.calc_priority(queue, running_batch)

        cheap = name == "fcfs" or fell_back
        repeats = settings.cheap_repeats if cheap else settings.repeats
        restore()
        call()  # warm-up (also: the first call's waiting-prefix refresh)
        samples = time_calls(call, repeats, before=restore)
        extra = {}
        if name in ("fcfs", "lpm") and (fell_back or name == "fcfs"):
            extra["us_touch_amortized"] = _touch_amortized(policy, queue, restore)
        row = _row(
            cell,
            kind,
            name,
            samples,
            fell_back_to_fcfs=fell_back,
            picks_from_running_group=head_from_running_group(),
            **extra,
        )
        rows.append(row)
        log(
            f"    {kind:8s} {name:16s} {row['us_per_pass']:>14,.1f} us/pass"
            + ("  (fell back to FCFS)" if fell_back else "")
        )
    restore()
    return rows


def _touch_amortized(policy: SchedulePolicy, queue: list, restore) -> float:
    """A cache-agnostic pass (fcfs, lpm's fallback, feather) refreshes the LRU recency of
    up to 128 waiting prefixes once every WAITING_PREFIX_REFRESH_INTERVAL passes; the timed
    repeats miss that pass, so its cost per pass is reported apart: one refresh / interval."""
    restore()
    samples = []
    for _ in range(3):
        policy._waiting_prefix_refresh_calls = 0
        samples += time_calls(
            lambda: policy._touch_waiting_prefixes(CacheAgnosticPolicy.FCFS, queue), 1
        )
    return round(statistics.median(samples) / WAITING_PREFIX_REFRESH_INTERVAL, 3)


def _row(cell: Cell, kind: str, policy: str, samples: list[float], **extra) -> dict:
    return {
        "waiting": cell.waiting,
        "prompt_tokens": cell.prompt_tokens,
        "groups": cell.groups,
        "policy": policy,
        "us_per_pass": med(samples),
        "us_per_insert": extra.pop("us_per_insert", None),
        "fell_back_to_fcfs": extra.pop("fell_back_to_fcfs", False),
        "tree_cache": kind,
        "repeats": len(samples),
        "us_min": round(min(samples), 3),
        "us_max": round(max(samples), 3),
        **extra,
    }


def _feather_rows(
    cell: Cell, kind: str, cache, running_batch, settings: Settings, lifecycle: Optional[dict], log
) -> tuple[list[dict], dict]:
    config = FeatherConfig(**NEVER_STOP)
    scheduler = SchedulerStandIn(cache, config, max_new=cell.batch)
    policy = scheduler.policy
    state = policy.feather
    planner = state.planner
    cht = planner.cht
    queue = list(cell.arrival)

    def restore() -> None:
        # Arrival order again, with feather's queue slots in step (untimed): every timed pass
        # moves its plan to the front from where arrival put it.
        queue[:] = cell.arrival
        state._reindex(queue)

    # The arrivals, as Scheduler._add_request_to_queue's AFTER hook reports them (with the
    # queue index each lands at).
    enqueue_samples = time_each(
        lambda item: state.on_enqueue(item[1], item[0]), list(enumerate(queue))
    )
    # First pass: the running batch joins the CHT (sync_running); then roll the plan back.
    policy.calc_priority(queue, running_batch)
    state.on_pass_end(None)
    restore()
    gc.collect()
    gc.freeze()

    plans = []

    def one_pass() -> None:
        policy.calc_priority(queue, running_batch)

    rollback_samples = []

    def rollback() -> None:
        plans.append((sorted(state.plan_rids), planner.stats.stops.copy()))
        start = time.perf_counter()
        state.on_pass_end(None)
        rollback_samples.append((time.perf_counter() - start) * 1e6)

    before_stops = dict(planner.stats.stops)
    samples = time_calls(one_pass, settings.cheap_repeats, before=restore, after=rollback)
    picked = plans[-1][0]
    assert all(p[0] == picked for p in plans), "feather's plan changed between repeats"
    stop_reason = _last_stop(before_stops, planner.stats.stops)
    picks = len(picked)
    touch = _touch_amortized(policy, queue, restore)
    restore()

    # The planner alone: the CHT and agent work of a pass.
    plan_picks = []

    def plan_only() -> None:
        plan_picks.append(len(planner.plan(max_new=cell.batch).rids))

    plan_samples = time_calls(plan_only, settings.cheap_repeats, after=lambda: planner.end_pass(()))
    # The same with the prefix-leader check feather's calc_priority passes in (one tree-cache
    # match per pick with a non-zero deficit); feather's row minus this = SGLang glue
    # (running-batch sync, queue-length check, moving the plan to the queue front).
    leader_check = state._cached_prefix_tokens if state.radix_enabled else None
    leader_samples = time_calls(
        lambda: planner.plan(max_new=cell.batch, cached_prefix_tokens=leader_check),
        settings.cheap_repeats,
        after=lambda: planner.end_pass(()),
    )

    # The best-candidate pick at the pass-start state (peek + the agent's view; no update).
    def pick() -> None:
        cht.candidate_view(cht.best())

    pick_samples = time_loop(pick, settings.pick_number, settings.repeats)

    if lifecycle is None:
        lifecycle = _lifecycle(cell, cht)
    common = dict(
        us_per_insert=lifecycle["us_per_insert"],
        **{k: v for k, v in lifecycle.items() if k != "us_per_insert"},
    )
    row = _row(
        cell,
        kind,
        "feather",
        samples,
        picks=picks,
        picks_from_running_group=sum(1 for rid in picked if cell.group_of[rid] == 0),
        stop_reason=stop_reason,
        us_rollback=med(rollback_samples),
        us_plan_with_leader_check=med(leader_samples),
        us_glue=round(med(samples) - med(leader_samples), 3),
        us_touch_amortized=touch,
        us_per_pick=med(pick_samples),
        us_per_enqueue=med(enqueue_samples),
        agent=f"{config.agent} (loss limits {config.static_max_loss}: never STOPs)",
        prefix_leader=config.prefix_leader,
        **common,
    )
    plan_row = _row(
        cell,
        kind,
        "feather-plan",
        plan_samples,
        picks=plan_picks[-1],
        us_per_pick_in_plan=round(med(plan_samples) / max(plan_picks[-1], 1), 3),
        us_per_pick=med(pick_samples),
        **common,
    )
    log(
        f"    {kind:8s} {'feather':16s} {row['us_per_pass']:>14,.1f} us/pass  "
        f"({picks} picks, stop={stop_reason}, rollback {row['us_rollback']:,.1f} us)"
    )
    log(
        f"    {kind:8s} {'feather-plan':16s} {plan_row['us_per_pass']:>14,.1f} us/pass  "
        f"(pick {row['us_per_pick']:.2f} us, insert {lifecycle['us_per_insert']:,.1f} us, "
        f"plan+leader check {row['us_plan_with_leader_check']:,.1f} us)"
    )
    gc.unfreeze()
    return [row, plan_row], lifecycle


def _last_stop(before: dict, after: dict) -> str:
    grown = [k for k, v in after.items() if v > before.get(k, 0)]
    return ",".join(sorted(grown)) or "?"


def _lifecycle(cell: Cell, cht) -> dict:
    """Per-request costs on a CHT holding the cell's waiting queue and running batch."""
    chunk = cht.chunk_size
    rids = [f"ins{k}" for k in range(len(cell.extra_prompts))]
    pairs = list(zip(rids, cell.extra_prompts))
    insert = time_each(lambda p: cht.add_waiting(p[0], p[1]), pairs)
    remove = time_each(cht.remove_waiting, rids)
    for rid, tokens in pairs:
        cht.add_waiting(rid, tokens)
    admit = time_each(cht.admit, rids)
    finish = time_each(cht.finish, rids)
    hash_array = time_each(lambda t: chunk_hashes(t, chunk), cell.extra_prompts)
    hash_view = time_each(
        lambda t: chunk_hashes(np.frombuffer(t, dtype=np.int64), chunk), cell.extra_prompts
    )
    return {
        "us_per_insert": med(insert),
        "us_per_remove_waiting": med(remove),
        "us_per_admit": med(admit),
        "us_per_finish": med(finish),
        "us_hash_only": med(hash_array),
        "us_hash_numpy_view": med(hash_view),
        "insert_samples": len(insert),
    }


def run_cell(waiting: int, tokens: int, settings: Settings, log) -> list[dict]:
    t0 = time.perf_counter()
    cell = build_cell(
        waiting, tokens, settings.groups, settings.batch, settings.n_insert, settings.seed
    )
    log(
        f"  built {waiting} Reqs x {tokens} tokens in {time.perf_counter() - t0:.1f} s "
        f"(rss {rss_mb():,.0f} MB)"
    )
    rows = []
    lifecycle = None
    for kind in settings.caches:
        pool = 1 << max(16, math.ceil(math.log2(tokens * (settings.batch + 2))))
        cache, allocator = make_tree_cache(kind, pool, tokens + 64, settings.batch + 8)
        for req in cell.running:
            cache_tokens(cache, allocator, req.origin_input_ids)
        running_batch = ScheduleBatch(reqs=list(cell.running))
        rows += _rows_for_sglang(cell, kind, cache, running_batch, settings, log)
        feather_rows, lifecycle = _feather_rows(
            cell, kind, cache, running_batch, settings, lifecycle, log
        )
        rows += feather_rows
        for row in rows:
            if row["tree_cache"] == kind:
                row.setdefault("tree_cache_class", cache_class_name(cache))
        del cache, allocator, running_batch, feather_rows
        gc.collect()
    del cell
    gc.collect()
    return rows


# ---- the run ---------------------------------------------------------------------------------
def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine_info(settings: Settings) -> dict:
    from feather_bench.tools.machine import describe

    classes = {}
    for kind in settings.caches:
        cache, _ = make_tree_cache(kind, 1 << 16, 1024, 8)
        classes[kind] = cache_class_name(cache)
        del cache
    return {
        **describe("numpy"),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "tree_cache": classes[DEFAULT_CACHE] if DEFAULT_CACHE in classes else None,
        "tree_caches": classes,
        "default_tree_cache": DEFAULT_CACHE,
        "git": git_state(),
    }


def summarize(rows: list[dict], settings: Settings) -> dict:
    def find(w, t, policy, kind):
        for r in rows:
            if (r["waiting"], r["prompt_tokens"], r["policy"], r["tree_cache"]) == (
                w,
                t,
                policy,
                kind,
            ):
                return r
        return None

    cells = sorted(
        {(r["waiting"], r["prompt_tokens"]) for r in rows}, key=lambda c: (c[0] * c[1], c[0])
    )
    if not cells:
        return {
            "ratio_vs_dfs_weight_at_largest": None,
            "ratio_vs_lpm_at_largest": None,
            "insert_us_per_1k_tokens": None,
        }
    w, t = cells[-1]
    kinds = [
        k for k in (DEFAULT_CACHE, *settings.caches) if any(r["tree_cache"] == k for r in rows)
    ]
    kind = kinds[0]

    def ratios(kind, feather_policy="feather"):
        f = find(w, t, feather_policy, kind)
        d = find(w, t, "dfs-weight", kind)
        lpm = find(w, t, "lpm-no-fallback", kind)
        if f is None or d is None or lpm is None:
            return None, None
        return round(d["us_per_pass"] / f["us_per_pass"], 1), round(
            lpm["us_per_pass"] / f["us_per_pass"], 1
        )

    dfs_ratio, lpm_ratio = ratios(kind)
    largest_t = max(c[1] for c in cells)
    largest_w_at_t = max(c[0] for c in cells if c[1] == largest_t)
    ins = find(largest_w_at_t, largest_t, "feather", kind)
    insert_per_1k = round(ins["us_per_insert"] / (largest_t / 1000), 3) if ins else None
    pick_w = max(c[0] for c in cells)
    pick_row = find(pick_w, max(c[1] for c in cells if c[0] == pick_w), "feather", kind)
    by_cache = {}
    for k in kinds:
        d, lpm = ratios(k)
        dp, lp = ratios(k, "feather-plan")
        by_cache[k] = {
            "ratio_vs_dfs_weight": d,
            "ratio_vs_lpm": lpm,
            "ratio_vs_dfs_weight_plan_only": dp,
            "ratio_vs_lpm_plan_only": lp,
        }
    insert_per_10k_ms = insert_per_1k * 10 / 1000 if insert_per_1k is not None else None
    return {
        "ratio_vs_dfs_weight_at_largest": dfs_ratio,
        "ratio_vs_lpm_at_largest": lpm_ratio,
        "insert_us_per_1k_tokens": insert_per_1k,
        "largest_cell": {"waiting": w, "prompt_tokens": t},
        "tree_cache": kind,
        "feather_row": "feather (FeatherSchedulePolicy.calc_priority, rollback excluded)",
        "lpm_ratio_uses": "lpm-no-fallback (lpm's prefix matching + sort without the >128 FCFS fallback)",
        "by_tree_cache": by_cache,
        "pick_us_at_largest_waiting": {
            "waiting": pick_w,
            "us": pick_row["us_per_pick"] if pick_row else None,
        },
        "targets": {
            "per_pass_1000x_below_dfs_weight": None if dfs_ratio is None else dfs_ratio >= 1000,
            "per_pass_1000x_below_lpm_matching": None if lpm_ratio is None else lpm_ratio >= 1000,
            "insert_at_most_0.1ms_per_10k_tokens": None
            if insert_per_10k_ms is None
            else insert_per_10k_ms <= 0.1,
            "insert_ms_per_10k_tokens": None
            if insert_per_10k_ms is None
            else round(insert_per_10k_ms, 4),
            "pick_few_us_at_largest_waiting": None
            if pick_row is None
            else pick_row["us_per_pick"] < 10,
            "measured_at": {"waiting": w, "prompt_tokens": t},
            "full_grid_reached": (w, t) == (max(FULL_WAITING), max(FULL_TOKENS)),
        },
    }


def format_table(rows: list[dict]) -> str:
    header = f"{'cache':8s} {'W':>5s} {'T':>6s} {'policy':16s} {'us/pass':>14s} {'picks':>5s} {'us/insert':>10s} {'us/pick':>8s} fcfs-fallback"
    lines = [header, "-" * len(header)]
    for r in rows:
        picks = r.get("picks", r.get("picks_from_running_group", ""))
        lines.append(
            f"{r['tree_cache']:8s} {r['waiting']:>5d} {r['prompt_tokens']:>6d} {r['policy']:16s} "
            f"{r['us_per_pass']:>14,.1f} {picks!s:>5s} "
            f"{'' if r['us_per_insert'] is None else format(r['us_per_insert'], ',.1f'):>10s} "
            f"{'' if 'us_per_pick' not in r else format(r['us_per_pick'], '.2f'):>8s} "
            f"{'yes' if r['fell_back_to_fcfs'] else ''}"
        )
    return "\n".join(lines)


def run(settings: Settings, json_path: Optional[str], log=None) -> dict:
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    started = time.perf_counter()
    publish_context()
    machine = machine_info(settings)
    log(
        f"machine: {machine['cpu']}, {machine['cores']} cores, load {machine['loadavg_at_start']}, "
        f"sglang {machine['versions']['sglang']}, tree caches {machine['tree_caches']}"
    )
    chunk = FeatherConfig().chunk_size
    budget = settings.max_rss_gb * 2**30
    rows, skipped = [], []
    cells = [(w, t) for t in settings.tokens for w in settings.waiting]
    for index, (w, t) in enumerate(cells, 1):
        need = estimate_cell_bytes(
            w, t, settings.batch, settings.n_insert, len(settings.caches), chunk
        )
        if rss_mb() * 2**20 + need > budget:
            skipped.append(
                {
                    "waiting": w,
                    "prompt_tokens": t,
                    "estimated_gb": round(need / 2**30, 2),
                    "reason": f"would exceed --max-rss-gb {settings.max_rss_gb}",
                }
            )
            log(
                f"[{index}/{len(cells)}] W={w} T={t}: SKIPPED (estimated {need / 2**30:.1f} GB "
                f"over the {settings.max_rss_gb} GB budget)"
            )
            continue
        log(
            f"[{index}/{len(cells)}] W={w} T={t} (est. {need / 2**30:.2f} GB) "
            f"t+{time.perf_counter() - started:.0f}s"
        )
        rows += run_cell(w, t, settings, log)
    wall = time.perf_counter() - started
    summary = summarize(rows, settings)
    machine["peak_rss_mb"] = round(peak_rss_mb(), 1)
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result = {
        "machine": machine,
        "rows": rows,
        "summary": summary,
        "settings": {
            "quick": settings.quick,
            "waiting": list(settings.waiting),
            "prompt_tokens": list(settings.tokens),
            "groups": settings.groups,
            "batch": settings.batch,
            "prefix_fraction": PREFIX_FRACTION,
            "repeats": settings.repeats,
            "cheap_repeats": settings.cheap_repeats,
            "n_insert": settings.n_insert,
            "chunk_size": chunk,
            "seed": settings.seed,
            "feather_config": FeatherConfig(**NEVER_STOP).as_dict(),
            "statistic": "median of per-call perf_counter samples, gc off while timing",
        },
        "skipped": skipped,
        "wall_s": round(wall, 1),
    }
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="W in {128, 1024}, T in {2K, 8K}, fewer repeats (under a minute)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.add_argument(
        "--waiting", type=ints, help="comma-separated waiting-queue sizes (overrides the grid)"
    )
    parser.add_argument(
        "--tokens", type=ints, help="comma-separated prompt lengths in tokens (overrides the grid)"
    )
    parser.add_argument("--groups", type=int, help="prefix groups (default 8)")
    parser.add_argument(
        "--batch", type=int, help="running requests and picks per pass (default 32)"
    )
    parser.add_argument(
        "--caches", help="tree caches, comma-separated: unified (sglang's default), radix"
    )
    parser.add_argument("--repeats", type=int, help="timed passes of the matching policies")
    parser.add_argument(
        "--max-rss-gb", type=float, help="skip cells that would push RSS past this (default 12)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--live",
        metavar="MODEL_DIR",
        nargs="?",
        const=str(model_dir()),
        help="also run a real server with feather on MODEL_DIR (default: the SmolLM2 model) "
        "and report feather's logged share of step time",
    )
    args = parser.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING)
    import warnings

    warnings.filterwarnings("ignore")
    settings = Settings(seed=args.seed, quick=args.quick)
    if args.quick:
        settings.waiting, settings.tokens = QUICK_WAITING, QUICK_TOKENS
        settings.repeats, settings.cheap_repeats, settings.n_insert, settings.pick_number = (
            3,
            7,
            50,
            1000,
        )
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
    result = run(settings, None)
    if args.live:
        from feather_bench.live import run_live

        print(f"live server: feather on {args.live} ...", file=sys.stderr, flush=True)
        log_path = RESULTS_DIR / "bench_overhead_live_server.log"
        log_path.parent.mkdir(exist_ok=True)
        result["live_server"] = live = run_live(args.live, log_path)
        result["summary"]["live_share_of_step_time_pct_median"] = live[
            "share_of_step_time_pct_median"
        ]
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(format_table(result["rows"]))
    print()
    s = result["summary"]
    for key in (
        "ratio_vs_dfs_weight_at_largest",
        "ratio_vs_lpm_at_largest",
        "insert_us_per_1k_tokens",
    ):
        print(f"{key}: {s[key]}")
    print(
        f"largest cell: {s.get('largest_cell')} on {s.get('tree_cache')} "
        f"({result['machine']['tree_caches'].get(s.get('tree_cache'))})"
    )
    print(f"by tree cache: {s.get('by_tree_cache')}")
    print(f"pick at largest W: {s.get('pick_us_at_largest_waiting')}")
    print(f"targets: {s.get('targets')}")
    if "live_server" in result:
        live = result["live_server"]
        print(
            f"live server ({live['model']}, {live['requests']} requests, {live['log_lines']} log lines): "
            f"feather {live['ms_per_pass_median']} ms/pass, median {live['share_of_step_time_pct_median']}% "
            f"(max {live['share_of_step_time_pct_max']}%) of step time"
        )
    for skip in result["skipped"]:
        print(f"SKIPPED: {skip}")
    print(
        f"wall {time.perf_counter() - start:.1f} s, peak RSS {result['machine']['peak_rss_mb']:,.0f} MB"
        + (f", JSON: {args.json}" if args.json else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
