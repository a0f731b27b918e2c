"""The feather policy driven with SGLang's own scheduling objects (CPU, no model, no server).

Real here: ``Req`` (real ``origin_input_ids`` arrays and ``SamplingParams``), ``RadixCache``
-- and, where parametrized, ``UnifiedRadixCache``, the tree sglang 0.5.23 actually builds --
over a real ``TokenToKVPoolAllocator`` (the running requests' tokens are inserted, so
``match_kv_cache`` sees real hits), ``ScheduleBatch`` (built with its dataclass constructor,
see :meth:`MiniScheduler._get_new_batch_prefill_raw`), ``ServerArgs``, SGLang's
``SchedulePolicy`` / ``PrefillAdder`` and feather's policy, planner, CHT, agent, adder
subclass and scheduler hook functions.

Stand-in: only the *scheduler* (:class:`MiniScheduler`). It carries what feather reads from
SGLang's ``Scheduler`` (``server_args`` -- a real ``ServerArgs`` --, ``policy``,
``waiting_queue``, ``chunked_req``, ``get_num_allocatable_reqs``) and replays the part of
``Scheduler._get_new_batch_prefill_raw`` (sglang 0.5.23) that feather takes part in:
``calc_priority``, then the admission loop over the waiting queue with the PrefillAdder
class the scheduler hook returns, wrapped in feather's AROUND hook so ``on_pass_end`` is
called exactly as in the server. Running a batch = inserting its requests' prompt tokens
into the radix cache (what ``cache_unfinished_req`` does after the prefill) and moving them
into the running batch (``ScheduleBatch.merge_batch`` needs device tensors, so the ``reqs``
list is extended directly).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from array import array

import pytest
import torch
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
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

from feather_sglang.cht import MemoryFootprint, RequestState
from feather_sglang.config import FeatherConfig
from feather_sglang.sglang_integration import policy as policy_mod
from feather_sglang.sglang_integration.policy import FeatherSchedulePolicy

EMPTY = MemoryFootprint(0, 0, 0, 0, 0, 0)
CHUNK = FeatherConfig().chunk_size  # 50 tokens
# A group prefix of 8 chunks: another group's request shortens the batch's shared prefix by
# 8 chunks, more than the static agent's crowded limit (7), so the agent STOPs before it.
PREFIX_TOKENS = 8 * CHUNK
SUFFIX_TOKENS = 60  # unique per request: 2 more chunks (50 + 10 tokens)
GROUPS = 3
PER_GROUP = 6


# ---- SGLang's process context ------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def sglang_context():
    """SchedulePolicy.calc_priority reads the published config (disagg mode, eviction policy)."""
    reset_context()
    publish(ServerArgs(model_path="dummy", device="cpu"), role="scheduler")
    yield
    reset_context()


# ---- requests ----------------------------------------------------------------------------
def prompt(group: int, index: int) -> list[int]:
    prefix = [10_000 * (group + 1) + i for i in range(PREFIX_TOKENS)]
    suffix = [1_000_000 + 1_000 * (group * 100 + index) + j for j in range(SUFFIX_TOKENS)]
    return prefix + suffix


def make_req(rid: str, tokens, max_new_tokens: int = 16, **kwargs) -> Req:
    return Req(
        rid=rid,
        origin_input_text="",
        origin_input_ids=array("q", tokens),
        sampling_params=SamplingParams(temperature=0, max_new_tokens=max_new_tokens),
        **kwargs,
    )


def group_of(rid: str) -> int:
    return int(rid[1:].split("-")[0])


def grouped_reqs(groups: int = GROUPS, per_group: int = PER_GROUP, seed: int = 0) -> list[Req]:
    reqs = [make_req(f"g{g}-{m}", prompt(g, m)) for g in range(groups) for m in range(per_group)]
    random.Random(seed).shuffle(reqs)
    return reqs


def rids(reqs) -> list[str]:
    return [r.rid for r in reqs]


# ---- the scheduler stand-in -------------------------------------------------------------
@dataclasses.dataclass
class PassRecord:
    order: list[str]  # waiting-queue rids right after calc_priority
    plan: frozenset  # feather's plan for the pass (empty for stock policies)
    admitted: list[str]  # what the PrefillAdder took
    refused: tuple | None  # (rid, AddReqResult) that ended the admission loop, if any


class MiniScheduler:
    """What feather reads from sglang's Scheduler, plus its prefill pass (see module doc)."""

    def __init__(
        self,
        policy: str = "feather",
        config: FeatherConfig | None = None,
        disable_radix: bool = False,
        max_running_requests: int = 64,
        pool_tokens: int = 1 << 16,
        max_prefill_tokens: int = 16384,
        chunked_prefill_size: int | None = None,
        cache: str = "radix",
    ) -> None:
        self.server_args = ServerArgs(model_path="dummy", device="cpu", schedule_policy=policy)
        # NOTE: the paper's static rule unless a test says otherwise: its decisions are known
        # exactly from the chunk counts, which is what these tests of the seams check.
        self.server_args._feather_config = config or FeatherConfig(
            agent="static"
        )  # as --feather-* attach it
        self.page_size = 1
        self.allocator = TokenToKVPoolAllocator(pool_tokens, torch.float16, "cpu", None, False)
        self.token_to_kv_pool_allocator = self.allocator  # the Scheduler's name for it
        self.max_total_num_tokens = pool_tokens
        if cache == "radix":
            self.tree_cache = RadixCache(
                CacheInitParams(
                    disable=disable_radix,
                    req_to_token_pool=None,
                    token_to_kv_pool_allocator=self.allocator,
                    page_size=self.page_size,
                )
            )
        else:  # what sglang 0.5.23's default_radix_cache_factory builds for a plain model
            self.tree_cache = UnifiedRadixCache(
                CacheInitParams(
                    disable=disable_radix,
                    req_to_token_pool=ReqToTokenPool(
                        size=max_running_requests,
                        max_context_len=1024,
                        device="cpu",
                        enable_memory_saver=False,
                    ),
                    token_to_kv_pool_allocator=self.allocator,
                    page_size=self.page_size,
                    tree_components=(ComponentType.FULL,),
                )
            )
        self.max_running_requests = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.adder_max_prefill_tokens: int | None = None  # None: the adder gets max_prefill_tokens
        self.chunked_prefill_size = chunked_prefill_size
        self.new_token_ratio = 0.7
        self.waiting_queue: list[Req] = []
        self.running_batch = ScheduleBatch(reqs=[])
        self.chunked_req: Req | None = None
        self.passes: list[PassRecord] = []
        # Scheduler.init_schedule_policy, then feather's AFTER hook on it.
        self.policy = FeatherSchedulePolicy(policy, self.tree_cache, False, False, False)
        policy_mod.init_schedule_policy_after(None, self)

    @property
    def feather(self):
        return self.policy.feather

    # Scheduler.get_num_allocatable_reqs without PP / beam search: free request rows.
    def get_num_allocatable_reqs(self, running_bs, *args, **kwargs) -> int:
        return self.max_running_requests - running_bs

    def get_prefill_adder_class(self):
        return policy_mod.get_prefill_adder_class_around(lambda _self: PrefillAdder, self)

    # Scheduler._add_request_to_queue (NULL disaggregation) with feather's AFTER hook.
    def add_request(self, req: Req, is_retracted: bool = False) -> None:
        self.waiting_queue.append(req)
        req.time_stats.set_wait_queue_entry_time()
        policy_mod.add_request_to_queue_after(None, self, req, is_retracted)

    def _get_new_batch_prefill_raw(self):
        running_batch = self.running_batch
        if not self.waiting_queue and self.chunked_req is None:
            return None, running_batch
        if self.get_num_allocatable_reqs(len(running_batch.reqs)) <= 0 and self.chunked_req is None:
            return None, running_batch
        self.policy.calc_priority(self.waiting_queue, running_batch)
        plan = self.feather.plan_rids if self.feather is not None else frozenset()
        record = PassRecord(rids(self.waiting_queue), frozenset(plan), [], None)
        self.passes.append(record)
        adder = self.get_prefill_adder_class()(
            self.page_size,
            self.tree_cache,
            self.allocator,
            running_batch,
            self.new_token_ratio,
            self.adder_max_prefill_tokens or self.max_prefill_tokens,
            self.chunked_prefill_size,
            max_running_requests=self.max_running_requests,
            waiting_queue_len=len(self.waiting_queue),
        )
        if self.chunked_req is not None:  # the next chunk of a chunked prefill goes first
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting_queue:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            if len(adder.can_run_list) >= self.get_num_allocatable_reqs(len(running_batch.reqs)):
                break
            req.init_next_round_input(self.tree_cache)
            res = adder.add_one_req(
                req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None
            )
            if res != AddReqResult.CONTINUE:
                if not (adder.can_run_list and adder.can_run_list[-1] is req):
                    record.refused = (req.rid, res)
                break
        can_run = adder.can_run_list
        record.admitted = rids(can_run)
        if not can_run:
            return None, running_batch
        taken = set(can_run)
        self.waiting_queue = [r for r in self.waiting_queue if r not in taken]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        # ScheduleBatch.init_new needs a req_to_token pool and a model config; the dataclass
        # constructor gives the same object with the fields feather and the tests read.
        return ScheduleBatch(reqs=list(can_run), chunked_req=self.chunked_req), running_batch

    def prefill_pass(self) -> PassRecord | None:
        """One scheduling pass; returns its record (None if no calc_priority was needed)."""
        before = len(self.passes)
        new_batch, _ = policy_mod.get_new_batch_prefill_raw_around(
            MiniScheduler._get_new_batch_prefill_raw, self
        )
        self.last_new_batch = new_batch
        return self.passes[-1] if len(self.passes) > before else None

    # ---- the forward step, as far as the radix cache and the running batch see it ------
    def cache_tokens(self, tokens) -> None:
        tokens = array("q", tokens)
        value = self.allocator.alloc(len(tokens))
        result = self.tree_cache.insert(InsertParams(key=RadixKey(tokens), value=value))
        self.allocator.free(value[: result.prefix_len])  # the part already cached

    def run(self, new_batch: ScheduleBatch | None) -> None:
        """The prefill ran: its requests' prompts are cached and they decode from now on."""
        if new_batch is None:
            return
        for req in new_batch.reqs:
            if req is self.chunked_req:
                # Scheduler.stash_chunked_request -> checkpoint_kv_cache
                self.cache_tokens(req.origin_input_ids[: req.extend_end])
                req.prefix_len = req.extend_end
            else:
                self.cache_tokens(req.origin_input_ids)
                self.running_batch.reqs.append(req)

    def step(self) -> PassRecord | None:
        record = self.prefill_pass()
        self.run(self.last_new_batch)
        return record

    def finish(self, *finished: str) -> None:
        gone = set(finished)
        self.running_batch.reqs = [r for r in self.running_batch.reqs if r.rid not in gone]

    def abort_waiting(self, rid: str, hooked: bool = True) -> None:
        """Scheduler.abort_request on a waiting request: popped, then
        ``_release_aborted_request(req)`` with feather's AFTER hook (``hooked=False``: a removal
        feather is not told about)."""
        (i,) = [i for i, r in enumerate(self.waiting_queue) if r.rid == rid]
        req = self.waiting_queue.pop(i)
        if hooked:
            policy_mod.release_aborted_request_after(None, self, req)

    def retract(self, rid: str) -> Req:
        """ScheduleBatch.retract_decode + _add_request_to_queue(req, is_retracted=True)."""
        (req,) = [r for r in self.running_batch.reqs if r.rid == rid]
        self.running_batch.reqs.remove(req)
        self.add_request(req, is_retracted=True)
        return req

    # ---- what feather's planner believes --------------------------------------------------
    def state(self, rid: str) -> RequestState | None:
        cht = self.feather.planner.cht
        return cht.state(rid) if rid in cht else None

    def footprint(self) -> MemoryFootprint:
        return self.feather.planner.cht.memory_footprint()


def leader_cycle(sched: MiniScheduler, reqs: list[Req]):
    """Enqueue ``reqs``, run the prefix-leader pass; return (leader rid, its group's rids)."""
    for r in reqs:
        sched.add_request(r)
    first = sched.step()
    assert first.admitted and len(first.admitted) == 1, first
    leader = first.admitted[0]
    return leader, {r.rid for r in reqs if group_of(r.rid) == group_of(leader)} - {leader}


# ---- 1. stock policies -------------------------------------------------------------------
STOCK_ARRIVALS = [(2, 0), (0, 1), (1, 1), (2, 1), (0, 2), (3, 0), (1, 2), (2, 2)]


def stock_world(policy_cls, policy: str):
    """A radix cache with a few prefixes cached, a running batch and a mixed queue."""
    allocator = TokenToKVPoolAllocator(1 << 15, torch.float16, "cpu", None, False)
    cache = RadixCache(CacheInitParams(False, None, allocator, 1))
    cached = [prompt(0, 99), prompt(1, 99)[: PREFIX_TOKENS // 2], list(range(5, 45))]
    for tokens in cached:
        value = allocator.alloc(len(tokens))
        res = cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value))
        allocator.free(value[: res.prefix_len])
    queue = []
    for i, (g, m) in enumerate(STOCK_ARRIVALS):
        queue.append(
            make_req(
                f"g{g}-{m}",
                prompt(g, m),
                max_new_tokens=8 + 7 * ((i * 5) % 8),
                routing_key=f"k{g % 2}",
            )
        )
    queue.append(make_req("x-0", list(range(5, 80)), max_new_tokens=3, routing_key="k0"))
    running = ScheduleBatch(
        reqs=[
            make_req("run-0", prompt(0, 98), routing_key="k1"),
            make_req("run-1", prompt(1, 98), routing_key="k1"),
        ]
    )
    return policy_cls(policy, cache, False, False, False), queue, running


@pytest.mark.parametrize(
    "policy", ["lpm", "fcfs", "dfs-weight", "lof", "random", "routing-key", "hrrn"]
)
def test_stock_policies_order_exactly_like_sglang(policy):
    # NOTE: once SGLang's plugin loader has run in this process (an Engine test), the REPLACE
    # hook has rebound the name SchedulePolicy in every module, this one included; the stock
    # class is the one feather's subclass derives from.
    stock = FeatherSchedulePolicy.__bases__[0]
    assert (stock.__module__, stock.__name__) == (
        "sglang.srt.managers.schedule_policy",
        "SchedulePolicy",
    )
    theirs, their_queue, their_running = stock_world(stock, policy)
    ours, our_queue, our_running = stock_world(FeatherSchedulePolicy, policy)
    assert ours.feather is None
    assert ours.policy == theirs.policy
    random.seed(1234)
    theirs.calc_priority(their_queue, their_running, processed_tokens=5000)
    random.seed(1234)
    ours.calc_priority(our_queue, our_running, processed_tokens=5000)
    assert rids(our_queue) == rids(their_queue)
    # Same side effects on the requests (the matched prefixes the adder will use).
    assert [r.prefix_len for r in our_queue] == [r.prefix_len for r in their_queue]
    arrival_order = [f"g{g}-{m}" for g, m in STOCK_ARRIVALS] + ["x-0"]
    if policy in ("lpm", "dfs-weight", "lof", "routing-key"):  # the inputs made a difference
        assert rids(our_queue) != arrival_order


def test_feather_policy_keeps_fcfs_underneath():
    sched = MiniScheduler("feather")
    assert (
        sched.policy.policy == SchedulePolicy("fcfs", sched.tree_cache, False, False, False).policy
    )
    assert sched.feather is not None and sched.feather.scheduler is sched
    assert sched.feather.radix_enabled
    assert issubclass(sched._feather_adder_class, PrefillAdder)
    assert sched.get_prefill_adder_class() is sched._feather_adder_class


def _unshared_prompts(lengths) -> list[list[int]]:
    rng = random.Random(11)
    return [[rng.randrange(10**6, 10**8) for _ in range(n)] for n in lengths]


def _unshared_schedule(policy: str, max_running: int, prefill_tokens: int) -> list[list[str]]:
    """What each pass admits when 48 prompts of 256 tokens that share nothing (bench_serving's
    random-ids at --random-range-ratio 1.0) arrive in waves, some running requests finishing
    between passes."""
    sched = MiniScheduler(
        policy,
        config=FeatherConfig(),  # the default agent
        max_running_requests=max_running,
        max_prefill_tokens=prefill_tokens,
    )
    rng = random.Random(12)
    prompts = _unshared_prompts([256] * 48)
    admitted, arrived = [], 0
    while arrived < len(prompts) or sched.waiting_queue:
        for i in range(arrived, min(arrived + rng.randrange(1, 12), len(prompts))):
            sched.add_request(make_req(f"r{i}", prompts[i], max_new_tokens=rng.randrange(4, 64)))
            arrived = i + 1
        record = sched.step()
        admitted.append(record.admitted if record else [])
        sched.finish(*rids(sched.running_batch.reqs[: rng.randrange(0, 4)]))
    return admitted


@pytest.mark.parametrize("max_running,prefill_tokens", [(6, 16384), (64, 700)])
def test_nothing_shared_same_lengths_feather_admits_what_fcfs_admits(max_running, prefill_tokens):
    # Equal deficits: feather's order is the arrival order, so its batches are fcfs's, pass by
    # pass, whether the batch cap or the prefill budget binds.
    fcfs = _unshared_schedule("fcfs", max_running, prefill_tokens)
    assert sum(map(len, fcfs)) == 48 and max(map(len, fcfs)) > 1
    assert _unshared_schedule("feather", max_running, prefill_tokens) == fcfs


def test_nothing_shared_feather_admits_the_least_new_prefill_first():
    sched = MiniScheduler("feather", config=FeatherConfig(), max_running_requests=8)
    lengths = [random.Random(i).randrange(20, 600) for i in range(24)]
    for i, tokens in enumerate(_unshared_prompts(lengths)):
        sched.add_request(make_req(f"r{i}", tokens))
    deficit = {f"r{i}": sched.feather.planner.cht.deficit(f"r{i}") for i in range(24)}
    record = sched.step()
    expected = sorted(deficit, key=lambda rid: (deficit[rid], int(rid[1:])))[:8]
    assert record.admitted == expected
    assert len(set(deficit.values())) > 8  # the lengths made a difference


# ---- 2. prefix leader, then the rest of its group ---------------------------------------
CACHES = pytest.mark.parametrize("cache", ["radix", "unified"])


@CACHES
def test_prefix_leader_then_its_group_only(cache):
    sched = MiniScheduler("feather", cache=cache)
    reqs = grouped_reqs()
    for r in reqs:
        sched.add_request(r)
    assert sched.feather.planner.num_waiting == GROUPS * PER_GROUP

    first = sched.prefill_pass()
    # Nothing cached, nothing running: one request of the earliest arrival's group is planned
    # alone (it computes the group prefix once), and the real adder stops right after it.
    assert first.plan == {reqs[0].rid}
    assert first.order[0] == reqs[0].rid
    assert first.order[1:] == rids(reqs[1:])  # the rest keeps its order
    assert first.admitted == [reqs[0].rid]
    assert first.refused == (reqs[1].rid, AddReqResult.OTHER)
    assert sched.feather.plan_rids == frozenset()  # on_pass_end cleared the plan
    assert sched.feather.planner.stats.stops == {"prefix-leader": 1}
    leader = reqs[0].rid
    group = {r.rid for r in reqs if group_of(r.rid) == group_of(leader)} - {leader}
    assert sched.state(leader) is RequestState.RUNNING
    sched.run(sched.last_new_batch)

    # The leader's prompt is in the radix cache now: its group mates match the whole prefix.
    mate = next(r for r in sched.waiting_queue if r.rid in group)
    assert sched.feather._cached_prefix_tokens(mate.rid) == PREFIX_TOKENS

    queue_before = rids(sched.waiting_queue)
    second = sched.prefill_pass()
    assert second.plan == group  # every mate, and nobody else (the agent STOPs)
    assert set(second.order[: len(group)]) == group
    # The plan moved to the front by swaps (O(plan), not O(W)): the others are all still
    # there, not necessarily in their old order (none of them is admitted this pass).
    assert sorted(second.order[len(group) :]) == sorted(
        rid for rid in queue_before if rid not in group
    )
    assert sched.feather.planner.stats.stops == {"prefix-leader": 1, "agent": 1}
    # The real adder took exactly the plan (each with a 400-token cache hit) and stopped at
    # the first request of another group.
    assert set(second.admitted) == group
    assert second.refused is not None and second.refused[1] is AddReqResult.OTHER
    assert group_of(second.refused[0]) != group_of(leader)
    assert all(r.prefix_len == PREFIX_TOKENS for r in sched.last_new_batch.reqs)
    sched.run(sched.last_new_batch)
    assert all(group_of(rid) != group_of(leader) for rid in rids(sched.waiting_queue))

    # Nothing more of this group waits: the next group starts (again with a leader) once the
    # first group's requests finish.
    sched.finish(*rids(sched.running_batch.reqs))
    third = sched.step()
    assert len(third.plan) == 1 and third.admitted == list(third.plan)
    assert group_of(third.admitted[0]) != group_of(leader)
    # Arrivals and admissions kept feather's queue slots in step: no pass paid an O(W) reindex.
    assert sched.feather.reindexes == 0


def test_waiting_queue_is_reordered_in_place():
    sched = MiniScheduler("feather")
    leader, group = leader_cycle(sched, grouped_reqs(seed=3))
    queue = sched.waiting_queue
    before = list(queue)
    sched.policy.calc_priority(queue, sched.running_batch)
    assert queue is sched.waiting_queue  # same list object, reordered
    assert sorted(rids(queue)) == sorted(rids(before)) and len(queue) == len(before)
    assert set(rids(queue)[: len(group)]) == group == set(sched.feather.plan_rids)
    sched.feather.on_pass_end(None)

    # Reordered behind feather's back (same requests): its slots no longer match, which the
    # identity check catches; one O(W) reindex, then the plan is at the front again.
    queue.reverse()
    reindexes = sched.feather.reindexes
    sched.policy.calc_priority(queue, sched.running_batch)
    assert sched.feather.reindexes == reindexes + 1
    assert set(rids(queue)[: len(group)]) == group == set(sched.feather.plan_rids)
    assert all(
        sched.feather._slot[r.rid] - sched.feather._slot_base == i for i, r in enumerate(queue)
    )
    sched.feather.on_pass_end(None)


def test_adder_refuses_unplanned_request_before_touching_budgets():
    sched = MiniScheduler("feather")
    reqs = grouped_reqs()
    for r in reqs:
        sched.add_request(r)
    sched.policy.calc_priority(sched.waiting_queue, sched.running_batch)
    planned = sched.waiting_queue[0]
    unplanned = sched.waiting_queue[1]
    assert planned.rid in sched.feather.plan_rids and unplanned.rid not in sched.feather.plan_rids
    adder = sched.get_prefill_adder_class()(
        1, sched.tree_cache, sched.allocator, sched.running_batch, 0.7, 16384, None
    )
    budget = (adder.rem_total_tokens, adder.rem_input_tokens)
    unplanned.init_next_round_input(sched.tree_cache)
    assert adder.add_one_req(unplanned, False, None) is AddReqResult.OTHER
    assert adder.can_run_list == [] and (adder.rem_total_tokens, adder.rem_input_tokens) == budget
    planned.init_next_round_input(sched.tree_cache)
    assert adder.add_one_req(planned, False, None) is AddReqResult.CONTINUE
    assert adder.can_run_list == [planned] and adder.rem_input_tokens < budget[1]
    sched.feather.on_pass_end(ScheduleBatch(reqs=[planned]))
    assert sched.state(planned.rid) is RequestState.RUNNING


# ---- 3. starvation bound -----------------------------------------------------------------
def starvation_scenario(config: FeatherConfig | None):
    """Group 0 runs (leader + mates); an old group-1 request waits behind fresh group-0 ones."""
    sched = MiniScheduler("feather", config=config)
    leader = make_req("g0-0", prompt(0, 0))
    sched.add_request(leader)
    assert sched.step().admitted == ["g0-0"]
    old = make_req("g1-0", prompt(1, 0))
    sched.add_request(old)
    time.sleep(0.15)
    for m in range(1, PER_GROUP):
        sched.add_request(make_req(f"g0-{m}", prompt(0, m)))
    return sched, sched.step()


@pytest.mark.parametrize("agent", ["admit", "throughput"])
@pytest.mark.parametrize("pool_tokens, admits_other", [(1 << 16, True), (1_300, False)])
def test_another_prompt_is_admitted_only_when_the_pool_holds_it(pool_tokens, admits_other, agent):
    """SGLang's own pool, cache and adder, same queue: after the leader's group, a 900-token
    prompt sharing nothing. With room for it the second pass admits it too; with a pool of
    1,300 tokens (the group holds 460 + 5 x 60: 800 left, which the CHT counts in chunks of 50)
    it is not admitted: the default agent (admit) plans it and SGLang's adder refuses it for
    memory (the plan's rest rolls back), the throughput agent STOPs before it."""
    sched = MiniScheduler("feather", config=FeatherConfig(agent=agent), pool_tokens=pool_tokens)
    other = make_req("g9-0", [7_000_000 + i for i in range(900)])
    leader, group = leader_cycle(sched, grouped_reqs(groups=1) + [other])
    second = sched.step()
    assert group <= set(second.admitted)
    assert ("g9-0" in second.admitted) is admits_other
    stops = sched.feather.planner.stats.stops.get("agent", 0)
    if agent == "throughput":
        assert stops == (0 if admits_other else 1)
    else:
        assert stops == 0 and ("g9-0" in second.plan)
        if not admits_other:
            assert second.refused == ("g9-0", AddReqResult.NO_TOKEN)
            assert sched.state("g9-0") is RequestState.WAITING


def test_agent_alone_stops_before_the_other_group():
    sched, record = starvation_scenario(None)  # default max_wait_s: 60 s
    assert record.plan == {f"g0-{m}" for m in range(1, PER_GROUP)}
    assert "g1-0" not in record.admitted and rids(sched.waiting_queue) == ["g1-0"]


def test_starved_request_is_planned_first():
    sched, record = starvation_scenario(FeatherConfig(max_wait_s=0.1))
    assert sched.feather.planner.config.max_wait_s == 0.1  # read from server_args
    assert record.order[0] == "g1-0"
    assert "g1-0" in record.plan and record.admitted[0] == "g1-0"
    assert sched.feather.planner.stats.starved == 1
    assert sched.state("g1-0") is RequestState.RUNNING


# ---- 4. finish / abort / retract ---------------------------------------------------------
def test_finished_requests_are_forgotten_and_memory_returns_to_baseline():
    sched = MiniScheduler("feather")
    reqs = grouped_reqs()
    for r in reqs:
        sched.add_request(r)
    seen = set()
    for _ in range(40):
        record = sched.step()
        if record is not None:
            seen.update(record.admitted)
        # Every request that ran a step finishes (oldest half first, like short outputs).
        running = rids(sched.running_batch.reqs)
        sched.finish(*running[: max(1, len(running) // 2)])
        if not sched.waiting_queue and not sched.running_batch.reqs:
            break
    assert seen == {r.rid for r in reqs}
    assert sched.prefill_pass() is None  # nothing to do: calc_priority is not even called
    # The scheduler skips calc_priority with an empty queue; the next pass that runs one
    # forgets the last finished requests.
    sched.policy.calc_priority(sched.waiting_queue, sched.running_batch)
    sched.feather.on_pass_end(None)
    assert sched.footprint() == EMPTY
    assert sched.feather.reqs == {}
    assert sched.feather.planner._waiting_since == {} and sched.feather.planner._enqueue_seq == {}


def test_aborted_waiting_request_is_reconciled_next_pass():
    sched = MiniScheduler("feather")
    leader, group = leader_cycle(sched, grouped_reqs())
    victim = sorted(group)[0]
    other = next(r.rid for r in sched.waiting_queue if r.rid not in group)
    sched.abort_waiting(victim)
    sched.abort_waiting(other, hooked=False)  # one removal feather was not told about
    resyncs = sched.feather.resyncs
    record = sched.step()
    assert sched.feather.resyncs == resyncs + 1
    assert victim not in record.plan and victim not in record.order
    assert record.plan == group - {victim}
    assert victim not in sched.feather.planner.cht and other not in sched.feather.planner.cht
    assert victim not in sched.feather.reqs and other not in sched.feather.reqs
    assert sched.feather.planner.num_waiting == len(sched.waiting_queue)
    # Steady state again: no further resyncs.
    sched.finish(*rids(sched.running_batch.reqs))
    sched.step()
    assert sched.feather.resyncs == resyncs + 1


def test_retracted_request_waits_again_and_is_replanned():
    sched = MiniScheduler("feather")
    leader, group = leader_cycle(sched, grouped_reqs())
    sched.step()  # the group joins the leader
    victim = sorted(group)[-1]
    assert sched.state(victim) is RequestState.RUNNING
    retracted = sched.retract(victim)
    assert sched.state(victim) is RequestState.WAITING
    assert sched.feather.planner.num_waiting == len(sched.waiting_queue)
    # Its group still runs, its prefix is cached: it fits the batch best and is re-planned.
    record = sched.step()
    assert sched.feather.resyncs == 0
    assert record.order[0] == victim and victim in record.plan
    assert victim in record.admitted
    assert retracted in sched.running_batch.reqs
    assert sched.state(victim) is RequestState.RUNNING


def test_request_finishing_in_its_prefill_is_forgotten():
    # max_new_tokens=1 requests finish in the prefill step and never join the running batch.
    sched = MiniScheduler("feather")
    leader, group = leader_cycle(sched, grouped_reqs())
    record = sched.prefill_pass()
    assert set(record.admitted) == group  # admitted, then finished before decoding
    assert all(sched.state(rid) is RequestState.RUNNING for rid in group)
    sched.step()
    assert all(sched.state(rid) is None and rid not in sched.feather.reqs for rid in group)
    assert sched.state(leader) is RequestState.RUNNING


def test_running_request_requeued_without_the_hook_is_reconciled():
    # sglang's scheduler_pp_mixin.process_retract_queue puts requests back with
    # waiting_queue.extend(...), bypassing _add_request_to_queue (and feather's hook).
    sched = MiniScheduler("feather")
    leader, group = leader_cycle(sched, grouped_reqs())
    sched.step()
    victim = next(r for r in sched.running_batch.reqs if r.rid in group)
    sched.running_batch.reqs.remove(victim)
    sched.waiting_queue.append(victim)
    record = sched.step()
    assert sched.feather.resyncs == 0 and sched.feather.adopted == 1  # found at the queue's tail
    assert victim.rid in record.plan
    assert sched.state(victim.rid) is RequestState.RUNNING


# ---- 5. rollback -------------------------------------------------------------------------
def test_planned_but_not_admitted_requests_roll_back():
    sched = MiniScheduler("feather")
    leader, group = leader_cycle(sched, grouped_reqs())
    sched.policy.calc_priority(sched.waiting_queue, sched.running_batch)
    planned = list(sched.feather.plan_rids)
    assert set(planned) == group
    assert all(sched.state(rid) is RequestState.RUNNING for rid in planned)
    taken = [r for r in sched.waiting_queue if r.rid in group][:2]
    sched.feather.on_pass_end(ScheduleBatch(reqs=taken))
    left = group - set(rids(taken))
    assert all(sched.state(r.rid) is RequestState.RUNNING for r in taken)
    assert all(sched.state(rid) is RequestState.WAITING for rid in left)
    assert sched.feather.planner.stats.rolled_back == len(left)
    sched.waiting_queue = [r for r in sched.waiting_queue if r not in taken]
    sched.run(ScheduleBatch(reqs=taken))
    assert sched.feather.planner.num_waiting == len(sched.waiting_queue)
    record = sched.step()
    assert left <= record.plan and left <= set(record.admitted)
    assert sched.feather.resyncs == 0
    assert all(sched.state(rid) is RequestState.RUNNING for rid in left)


def test_rollback_does_not_inflate_the_agent_floor():
    sched = MiniScheduler("feather")
    leader, group = leader_cycle(sched, grouped_reqs())
    sched.policy.calc_priority(sched.waiting_queue, sched.running_batch)
    taken = [r for r in sched.waiting_queue if r.rid in group][:2]
    sched.feather.on_pass_end(ScheduleBatch(reqs=taken))
    sched.waiting_queue = [r for r in sched.waiting_queue if r not in taken]
    sched.run(ScheduleBatch(reqs=taken))
    record = sched.step()
    # Had the adder taken all five at once, the batch would be the same six group requests
    # and the agent would STOP before any other group (floor 5 <= batch 6, loss 8 > 7).
    left = group - set(rids(taken))
    assert record.plan == left
    assert sched.feather.planner.agent.floor == PER_GROUP - 1


def test_plan_respects_the_prefill_token_budget():
    # A real budget: 2 mates' extends (60 tokens each) fit in 150 input tokens. The planner
    # estimates each mate's new tokens from its chunks missing in the running batch (2 x 50)
    # and stops planning there, so nothing has to be rolled back.
    sched = MiniScheduler("feather", max_prefill_tokens=150)
    leader, group = leader_cycle(sched, grouped_reqs())
    record = sched.step()
    assert record.plan < group and len(record.plan) == 2
    assert set(record.admitted) == record.plan
    assert sched.feather.planner.stats.rolled_back == 0
    again = sched.step()
    assert again.plan <= group - record.plan and set(again.admitted) == again.plan


def test_adder_out_of_budget_rolls_back_the_rest_of_the_plan():
    # The plan is made for a larger budget than the adder has (as when the estimate is off):
    # the adder stops at the budget and the unadmitted rest of the plan goes back to waiting.
    sched = MiniScheduler("feather", max_prefill_tokens=16384)  # what the planner sees ...
    sched.adder_max_prefill_tokens = 150  # ... and what the real adder gets
    leader, group = leader_cycle(sched, grouped_reqs())
    record = sched.step()
    assert record.plan == group
    assert len(record.admitted) == 2 and record.refused is not None
    assert record.refused[0] in group  # the budget, not the plan, stopped the adder
    left = group - set(record.admitted)
    assert all(sched.state(rid) is RequestState.WAITING for rid in left)
    assert sched.feather.planner.num_waiting == len(sched.waiting_queue)


def test_unconsumed_plan_is_rolled_back_next_pass():
    sched = MiniScheduler("feather")
    leader, group = leader_cycle(sched, grouped_reqs())
    sched.policy.calc_priority(sched.waiting_queue, sched.running_batch)  # no on_pass_end
    assert set(sched.feather.plan_rids) == group
    record = sched.step()
    assert record.plan == group and set(record.admitted) == group
    assert sched.feather.planner.stats.rolled_back == len(group)


def test_admitted_plan_without_on_pass_end_is_not_replanned():
    sched = MiniScheduler("feather")
    leader, group = leader_cycle(sched, grouped_reqs())
    sched.policy.calc_priority(sched.waiting_queue, sched.running_batch)
    taken = [r for r in sched.waiting_queue if r.rid in sched.feather.plan_rids]
    # The scheduler admitted the plan, but no on_pass_end came.
    sched.waiting_queue = [r for r in sched.waiting_queue if r not in taken]
    sched.run(ScheduleBatch(reqs=taken))
    sched.policy.calc_priority(sched.waiting_queue, sched.running_batch)
    running = set(rids(sched.running_batch.reqs))
    assert not running & set(rids(sched.waiting_queue))
    assert all(sched.state(rid) is RequestState.RUNNING for rid in running)


# ---- 6. radix cache disabled -------------------------------------------------------------
@CACHES
def test_radix_cache_disabled_still_plans_homogeneous_batches(caplog, cache):
    with caplog.at_level(logging.WARNING, logger=policy_mod.__name__):
        sched = MiniScheduler("feather", disable_radix=True, cache=cache)
    assert sched.tree_cache.disable and not sched.feather.radix_enabled
    assert any("radix cache disabled" in rec.getMessage() for rec in caplog.records)
    reqs = grouped_reqs()
    for r in reqs:
        sched.add_request(r)
    record = sched.step()
    first_group = group_of(reqs[0].rid)
    # No prefix leader: the whole group of the first arrival at once, nothing else.
    assert record.plan == {r.rid for r in reqs if group_of(r.rid) == first_group}
    assert set(record.admitted) == record.plan
    assert "prefix-leader" not in sched.feather.planner.stats.stops
    assert all(r.prefix_len == 0 for r in sched.last_new_batch.reqs)
    sched.finish(*rids(sched.running_batch.reqs))
    record = sched.step()
    assert len({group_of(rid) for rid in record.plan}) == 1 and len(record.plan) == PER_GROUP


def test_radix_cache_disabled_with_simulated_cache():
    cache = RadixCache.create_simulated(disable=True)
    policy = FeatherSchedulePolicy("feather", cache, False, False, False)
    sched = MiniScheduler("feather")
    policy.feather.attach(sched)
    assert not policy.feather.radix_enabled
    queue = grouped_reqs()
    for r in queue:
        policy.feather.on_enqueue(r)
    policy.calc_priority(queue, ScheduleBatch(reqs=[]))
    assert len(policy.feather.plan_rids) == PER_GROUP
    assert {group_of(rid) for rid in policy.feather.plan_rids} == {group_of(queue[0].rid)}
    assert set(rids(queue[:PER_GROUP])) == policy.feather.plan_rids


# ---- 7. chunked request ------------------------------------------------------------------
@CACHES
def test_chunked_request_counts_as_running(cache):
    # 200-token chunks: the 460-token leader takes three passes (200 + 200 + 60).
    sched = MiniScheduler("feather", chunked_prefill_size=4 * CHUNK, cache=cache)
    reqs = grouped_reqs()
    for r in reqs:
        sched.add_request(r)
    first = sched.step()
    leader = first.admitted[0]
    # The real adder chunked the leader: it is the scheduler's chunked_req, outside the
    # running batch (the scheduler keeps it out of the merge until its last chunk).
    assert sched.chunked_req is not None and sched.chunked_req.rid == leader
    assert sched.running_batch.reqs == []
    group = {r.rid for r in reqs if group_of(r.rid) == group_of(leader)} - {leader}
    cht = sched.feather.planner.cht

    second = sched.step()  # the middle chunk uses the whole chunk budget
    assert sched.chunked_req is not None and sched.chunked_req.rid == leader
    assert second.admitted == [leader]
    assert sched.state(leader) is RequestState.RUNNING  # not forgotten
    assert leader in sched.feather.reqs and cht.num_running == 1
    # Deficits are relative to the chunked request: a mate misses only its own 2 chunks.
    waiting_mates = [rid for rid in group if sched.state(rid) is RequestState.WAITING]
    assert waiting_mates and all(cht.deficit(rid) == 2 for rid in waiting_mates)
    assert second.plan and second.plan <= group

    third = sched.step()  # the last chunk; the leader joins the running batch after it
    assert third.admitted[0] == leader
    # A mate may have been chunked in turn with what was left of the chunk budget.
    assert sched.chunked_req is None or sched.chunked_req.rid in group
    assert third.plan and third.plan <= group and set(third.admitted[1:]) <= group
    assert leader in rids(sched.running_batch.reqs)
    assert sched.state(leader) is RequestState.RUNNING

    sched.finish(leader)
    sched.step()
    assert sched.state(leader) is None and leader not in sched.feather.reqs


# ---- 8. fault containment ----------------------------------------------------------------
@pytest.fixture
def inject(monkeypatch):
    """Fault injection in this process, with the hooks the ``feather-fault-inject`` plugin
    registers in a server: ``inject("plan:2")``."""
    import pkgutil

    from feather_bench.tools import fault_inject

    def on(spec: str) -> None:
        for target, around in fault_inject.hooks(spec):
            path, name = target.rsplit(".", 1)
            owner = pkgutil.resolve_name(path)
            original = getattr(owner, name)
            monkeypatch.setattr(
                owner, name, lambda *a, _o=original, _h=around, **k: _h(_o, *a, **k)
            )

    return on


def drain(sched: MiniScheduler, passes: int = 40) -> list[str]:
    """Run passes, finishing the running batch after each, until nothing is left; the
    admission order."""
    order = []
    for _ in range(passes):
        if not sched.waiting_queue and not sched.running_batch.reqs:
            break
        record = sched.step()
        if record is not None:
            order += record.admitted
        sched.finish(*rids(sched.running_batch.reqs))
    policy_mod.on_idle_after(None, sched)  # the scheduler's idle loop
    return order


def test_injection_needs_the_acknowledgement(monkeypatch, caplog):
    from feather_bench.tools import fault_inject

    monkeypatch.setenv(fault_inject.INJECT_ENV, "plan:1")
    monkeypatch.delenv(fault_inject.ACK_ENV, raising=False)
    with caplog.at_level(logging.WARNING):
        assert fault_inject.spec_from_env() is None
    assert "fault injection stays off" in caplog.text
    monkeypatch.setenv(fault_inject.ACK_ENV, "yes")
    assert fault_inject.spec_from_env() is None
    monkeypatch.setenv(fault_inject.ACK_ENV, fault_inject.ACK_PHRASE)
    assert fault_inject.spec_from_env() == "plan:1"
    with pytest.raises(ValueError, match="SEAM:N"):
        fault_inject.parse("plan:0")


def test_a_fault_in_a_pass_is_logged_rebuilt_and_serving_goes_on(inject, caplog):
    inject("plan:2")
    sched = MiniScheduler("feather")
    reqs = grouped_reqs()
    for r in reqs:
        sched.add_request(r)
    with caplog.at_level(logging.WARNING):
        order = drain(sched)
    assert sorted(order) == sorted(rids(reqs))  # every request admitted once
    f = sched.feather
    assert f.faults.counts["plan"] == 1 and f.rebuilds == 1 and not f.stood_down
    assert "fault in plan (InjectedFault" in caplog.text and "Traceback" in caplog.text
    assert "state rebuilt from the scheduler" in caplog.text
    assert f.planner.cht.num_waiting == 0 and f.planner.cht.num_running == 0


def test_a_fault_in_the_rebuild_stands_feather_down_to_fcfs(inject, caplog):
    inject("plan:2,rebuild:1")
    sched = MiniScheduler("feather")
    reqs = grouped_reqs()
    for r in reqs:
        sched.add_request(r)
    sched.step()  # the prefix leader
    queue_before = rids(sched.waiting_queue)
    with caplog.at_level(logging.WARNING):
        record = sched.step()
    assert sched.feather.stood_down and "feather stands down" in caplog.text
    # fcfs: the queue in its order, everything the pool and the cap allow admitted
    assert record.plan == frozenset() and record.admitted == queue_before
    assert sorted(
        drain(sched) + record.admitted + [r.rid for r in reqs if r.rid not in queue_before]
    ) == sorted(rids(reqs))


def test_a_failing_hook_is_contained_and_repaired_by_the_next_pass(inject):
    inject("enqueue:3")
    sched = MiniScheduler("feather")
    reqs = grouped_reqs()
    for r in reqs:
        sched.add_request(r)  # the third enqueue hook fails: feather never heard of it
    assert sched.feather._dirty and sched.feather.faults.counts["enqueue"] == 1
    order = drain(sched)
    assert sorted(order) == sorted(rids(reqs)) and sched.feather.rebuilds == 1


def test_unhooked_add_and_abort_between_passes_do_not_take_the_server_down():
    """One request queued without the enqueue hook and another popped by an abort: the queue's
    length still matches what feather tracks."""
    sched = MiniScheduler("feather")
    reqs = grouped_reqs()
    for r in reqs[:-1]:
        sched.add_request(r)
    sched.step()
    sched.abort_waiting(sched.waiting_queue[-1].rid)
    sched.waiting_queue.append(reqs[-1])  # e.g. a PP/disaggregation path's extend(...)
    order = drain(sched)
    assert reqs[-1].rid in order
    assert sched.feather.planner.cht.num_waiting == 0 and not sched.feather.stood_down


def test_a_hooked_abort_costs_no_resync_and_an_unhooked_append_is_adopted_from_the_tail():
    sched = MiniScheduler("feather")
    reqs = grouped_reqs()
    for r in reqs[:-1]:
        sched.add_request(r)
    sched.step()
    sched.abort_waiting(sched.waiting_queue[3].rid)
    sched.waiting_queue.append(reqs[-1])  # queued without the enqueue hook
    sched.step()
    assert (
        sched.feather.resyncs == 0
        and sched.feather.adopted == 1
        and sched.feather.faults.total == 0
    )


def test_aborts_from_the_middle_of_the_queue_cost_no_reindex(monkeypatch):
    """Each abort shifts the requests behind it: feather finds its plan by searching the span
    the aborts shifted (O(aborts)), and only rebuilds every slot once that span is too wide."""
    monkeypatch.setattr(policy_mod, "CHECK_INVARIANTS", True)
    sched = MiniScheduler("feather")
    for r in grouped_reqs(seed=5):
        sched.add_request(r)
    sched.policy.calc_priority(sched.waiting_queue, sched.running_batch)
    sched.feather.on_pass_end(None)
    base = sched.feather.reindexes
    for victim in (1, 4, 2):  # from the front half, so most of the queue shifts
        sched.abort_waiting(sched.waiting_queue[victim].rid)
    record = sched.step()
    assert record.admitted and sched.feather.reindexes == base and sched.feather.resyncs == 0
    slot, slot_base = sched.feather._slot, sched.feather._slot_base
    for i, r in enumerate(sched.waiting_queue):  # every slot is exact or within the shift
        assert 0 <= slot[r.rid] - slot_base - i <= 3

    monkeypatch.setattr(policy_mod, "MAX_SHIFT_SEARCH", 1)
    sched.abort_waiting(sched.waiting_queue[0].rid)
    sched.abort_waiting(sched.waiting_queue[0].rid)
    sched.step()
    assert sched.feather.reindexes == base + 1 and sched.feather.faults.total == 0


def test_a_reused_rid_is_a_new_request():
    sched = MiniScheduler("feather")
    first = make_req("g0-0", prompt(0, 0))
    sched.add_request(first)
    sched.step()
    sched.finish("g0-0")
    again = make_req("g0-0", prompt(1, 0))  # same rid, another prompt
    sched.add_request(again)
    assert sched.feather.reused_rids == 1 and sched.feather.reqs["g0-0"] is again
    sched.add_request(make_req("g1-1", prompt(1, 1)))
    # the CHT holds the new prompt's keys: it shares group 1's prefix, not group 0's
    assert sched.feather.planner.cht.waiting_share("g0-0")[1] == 2
    record = sched.step()
    assert "g0-0" in record.admitted and sched.feather.faults.total == 0


# ---- 9. churn: every way the queue and the batch change, checked after every pass -------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

OPS = (
    "arrive",
    "arrive",
    "arrive",
    "step",
    "step",
    "finish",
    "abort",
    "unhooked_abort",
    "unhooked_requeue",
    "retract",
    "reuse_rid",
)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 10**6)), min_size=180, max_size=220))
def test_churn_keeps_feather_exact(monkeypatch_module, ops):
    """Arrivals, aborts (told and untold), requeues without the hook, retractions, finishes,
    reused rids and chunked prefills in any order: no fault, the invariants hold after every
    pass, and once everything has drained and the scheduler idled feather holds nothing."""
    sched = MiniScheduler("feather", chunked_prefill_size=300, max_running_requests=6)
    serial, done = [0], []

    def new_req(rid=None, n=0):
        serial[0] += 1
        return make_req(rid or f"g{n % 4}-{serial[0]}", prompt(n % 4, serial[0]), max_new_tokens=4)

    for op, n in ops:
        running = [r for r in sched.running_batch.reqs]
        waiting = [r for r in sched.waiting_queue]
        if op == "arrive":
            sched.add_request(new_req(n=n))
        elif op == "step":
            sched.step()
        elif op == "finish" and running:
            r = running[n % len(running)]
            sched.finish(r.rid)
            done.append(r.rid)
        elif op in ("abort", "unhooked_abort") and waiting:
            r = waiting[n % len(waiting)]
            sched.abort_waiting(r.rid, hooked=op == "abort")
            done.append(r.rid)
        elif op == "unhooked_requeue" and running:
            r = running[n % len(running)]
            sched.running_batch.reqs.remove(r)
            sched.waiting_queue.append(r)  # e.g. a PP retract queue's extend(...)
        elif op == "retract" and running:
            sched.retract(running[n % len(running)].rid)
        elif op == "reuse_rid" and done:
            rid = done.pop(n % len(done))
            sched.add_request(new_req(rid=rid, n=n))
        assert sched.feather.faults.total == 0, dict(sched.feather.faults.counts)
    for _ in range(400):  # drain
        if not sched.waiting_queue and not sched.running_batch.reqs and sched.chunked_req is None:
            break
        sched.step()
        sched.finish(*rids(sched.running_batch.reqs))
    policy_mod.on_idle_after(None, sched)
    assert sched.feather.faults.total == 0, dict(sched.feather.faults.counts)
    assert not sched.waiting_queue and sched.feather.reqs == {}
    assert sched.footprint() == EMPTY


@pytest.fixture(scope="module")
def monkeypatch_module():
    """FEATHER_CHECK_INVARIANTS for the churn test: the check runs in every pass."""
    mp = pytest.MonkeyPatch()
    mp.setattr(policy_mod, "CHECK_INVARIANTS", True)
    yield mp
    mp.undo()
