"""The planner (one scheduling pass, SGLang-free) with a fake clock."""

from __future__ import annotations

import pytest

from feather_sglang.config import FeatherConfig
from feather_sglang.planner import AdmissionPlanner

CHUNK = 8


def prompt(group: int, i: int, prefix_chunks: int = 10) -> list[int]:
    return [1000 * (group + 1) + t for t in range(prefix_chunks * CHUNK)] + [7, 7, i, i]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


def planner_with(clock, **overrides):
    """A planner with the paper's static rule (these tests are about the planner's mechanics)."""
    return AdmissionPlanner(
        FeatherConfig(chunk_size=CHUNK, **{"agent": "static", **overrides}), clock=clock
    )


def arrive(planner, rids):
    for rid in rids:
        g, i = rid.split("-")
        planner.on_enqueue(rid, prompt(int(g[1:]), int(i)))


def test_empty_batch_admits_one_group_then_stops_at_the_next(clock):
    p = planner_with(clock)
    arrive(p, ["g0-0", "g1-0", "g0-1", "g1-1", "g0-2"])
    plan = p.plan(max_new=10)
    assert plan.rids == ["g0-0", "g0-1", "g0-2"]  # best: earliest arrival, then its group
    assert plan.stop_reason == "agent"  # g1 would cut the shared chain from 10 chunks to 0
    p.end_pass(plan.rids)
    assert p.cht.num_running == 3 and p.num_waiting == 2


def test_limit_and_rollback(clock):
    p = planner_with(clock)
    arrive(p, ["g0-0", "g0-1", "g0-2"])
    plan = p.plan(max_new=2)
    assert plan.rids == ["g0-0", "g0-1"] and plan.stop_reason == "limit"
    p.end_pass(["g0-0"])  # the scheduler took only one (token budget)
    assert p.cht.num_running == 1 and p.num_waiting == 2
    assert p.plan(max_new=5).rids == ["g0-1", "g0-2"]


def test_unconsumed_plan_is_rolled_back_by_the_next_plan(clock):
    p = planner_with(clock)
    arrive(p, ["g0-0", "g0-1"])
    p.plan(max_new=5)
    assert p.cht.num_running == 2
    plan = p.plan(max_new=5)  # no end_pass in between: the first plan is undone first
    assert plan.rids == ["g0-0", "g0-1"]


def test_starvation_bound_admits_the_old_request_first(clock):
    p = planner_with(clock, max_wait_s=10)
    arrive(p, ["g0-0", "g0-1"])
    p.end_pass(p.plan(max_new=10).rids)  # g0 runs
    arrive(p, ["g1-0"])
    clock.now = 5
    arrive(p, ["g0-2"])
    plan = p.plan(max_new=10)
    assert plan.rids == ["g0-2"] and plan.starved == 0  # g1 would break the chain: STOP
    p.end_pass(plan.rids)
    clock.now = 11  # g1-0 has now waited 11 s > 10 s
    plan = p.plan(max_new=10)
    assert plan.rids == ["g1-0"] and plan.starved == 1


def admit_one_per_second(p, clock, seconds):
    """A pass a second, admitting one request each; the admitted ids, the starved ones."""
    admitted, starved = [], 0
    for _ in range(seconds):
        clock.now += 1
        plan = p.plan(max_new=1)
        p.end_pass(plan.rids)
        admitted += plan.rids
        starved += plan.starved
    return admitted, starved


def queue_all_wait_in(clock, **overrides):
    """g0-0 runs; g1-0, then g0-1 to g0-39, all sent at once, wait behind it."""
    p = planner_with(clock, max_wait_s=20, **overrides)
    arrive(p, ["g0-0"])
    p.end_pass(p.plan(max_new=1).rids)
    arrive(p, ["g1-0"] + [f"g0-{i}" for i in range(1, 40)])
    return p


def test_a_queue_every_request_waits_in_alike_keeps_the_chts_order(clock):
    # Every request has waited as long as the oldest, g1-0, when it is admitted: nobody is
    # passed over by younger requests, so the bound leaves g0 to run on past 20 s.
    admitted, starved = admit_one_per_second(queue_all_wait_in(clock), clock, 39)
    assert admitted == [f"g0-{i}" for i in range(1, 40)] and starved == 0


def test_with_no_relative_part_the_seconds_alone_starve_that_queue(clock):
    p = queue_all_wait_in(clock, max_wait_ratio=0)
    admitted, starved = admit_one_per_second(p, clock, 39)
    # g1-0 at 21 s, past the 20 s bound; from then on every g0 request has waited past it too.
    assert admitted.index("g1-0") == 20 and starved == len(admitted) - 20


def test_a_request_passed_over_by_younger_ones_starves_at_the_seconds_bound(clock):
    p = planner_with(clock, max_wait_s=20)
    arrive(p, ["g0-0", "g1-0"])
    admitted = []
    for i in range(1, 40):  # a g0 request arrives each second and is admitted at once
        plan = p.plan(max_new=1)
        p.end_pass(plan.rids)
        admitted += plan.rids
        clock.now += 1
        arrive(p, [f"g0-{i}"])
    # The recent wait is about a second: 2 x 1 s < 20 s, so the seconds bound decides.
    assert admitted.index("g1-0") == 21 and p.stats.starved == 1


def test_a_request_the_agent_holds_back_starves_at_the_seconds_bound(clock):
    p = queue_all_wait_in(clock)
    admit_one_per_second(p, clock, 39)  # g0 is admitted; g1-0 waited as long as every g0 one
    clock.now += 1
    plan = p.plan(max_new=10)
    assert plan.rids == [] and plan.stop_reason == "agent"  # the static rule: g1 breaks g0's chain
    clock.now += 1  # the agent held g1-0 back: past 20 s, it goes first
    plan = p.plan(max_new=10)
    assert plan.rids == ["g1-0"] and plan.starved == 1


def test_a_starved_backlog_is_admitted_group_by_group_not_oldest_first(clock):
    p = planner_with(clock, max_wait_s=10, max_wait_ratio=0)  # the seconds alone
    arrive(p, ["g0-0", "g1-0", "g0-1", "g1-1", "g0-2", "g1-2"])
    clock.now = 100  # every request has waited 100 s > 10 s
    plan = p.plan(max_new=2)
    # The oldest request's group first; oldest first across groups would be g0-0, g1-0.
    assert plan.rids == ["g0-0", "g0-1"] and plan.starved == 2
    p.end_pass(plan.rids)
    plan = p.plan(max_new=2)
    # g0 is finished before the next group starts, although g1-0 is older than g0-2.
    assert plan.rids == ["g0-2", "g1-0"] and plan.starved == 2
    p.end_pass(plan.rids)
    assert p.plan(max_new=5).rids == ["g1-1", "g1-2"]


def test_a_starved_group_is_admitted_whole_before_the_next_starved_group(clock):
    p = planner_with(clock, max_wait_s=10, max_wait_ratio=0)  # the seconds alone
    arrive(p, ["g0-0", "g1-0", "g2-0"])
    clock.now = 5
    arrive(p, ["g0-1", "g1-1"])
    clock.now = 12  # g0-0, g1-0 and g2-0 waited 12 s, g0-1 and g1-1 7 s
    plan = p.plan(max_new=1)
    assert plan.rids == ["g0-0"] and plan.starved == 1
    p.end_pass(plan.rids)
    # g0-1 has not waited past the bound, but it shares g0's prefix, computed now: it goes
    # before g1's starved g1-0, rather than starve later and compute the prefix again.
    plan = p.plan(max_new=2)
    assert plan.rids == ["g0-1", "g1-0"] and plan.starved == 2
    p.end_pass(plan.rids)
    plan = p.plan(max_new=2)
    assert plan.rids == ["g1-1", "g2-0"] and plan.starved == 2


def test_a_starved_group_with_an_uncached_prefix_computes_it_once_first(clock):
    p = planner_with(clock, max_wait_s=10)
    arrive(p, ["g0-0", "g0-1", "g0-2"])
    clock.now = 100
    plan = p.plan(max_new=3, cached_prefix_tokens=lambda rid: 0)
    assert plan.rids == ["g0-0"] and plan.starved == 1 and plan.stop_reason == "prefix-leader"
    p.end_pass(plan.rids)
    plan = p.plan(max_new=3, cached_prefix_tokens=lambda rid: 10 * CHUNK)
    assert plan.rids == ["g0-1", "g0-2"] and plan.starved == 2


def test_a_starved_request_that_left_is_skipped(clock):
    p = planner_with(clock, max_wait_s=10)
    arrive(p, ["g0-0", "g0-1", "g0-2"])
    clock.now = 100
    p.end_pass(p.plan(max_new=1).rids)
    p.forget("g0-1")  # aborted while its group was being served
    assert p.plan(max_new=5).rids == ["g0-2"]


def test_prefix_leader_admits_one_of_an_uncached_group(clock):
    p = planner_with(clock)
    arrive(p, ["g0-0", "g0-1", "g0-2"])
    plan = p.plan(max_new=10, cached_prefix_tokens=lambda rid: 0)
    assert plan.rids == ["g0-0"] and plan.stop_reason == "prefix-leader"
    p.end_pass(plan.rids)
    cached = 10 * CHUNK  # the leader's prefill put the shared prefix in the radix cache
    plan = p.plan(max_new=10, cached_prefix_tokens=lambda rid: cached)
    assert plan.rids == ["g0-1", "g0-2"]


def test_prefix_leader_off(clock):
    p = planner_with(clock, prefix_leader=False)
    arrive(p, ["g0-0", "g0-1"])
    assert p.plan(max_new=10, cached_prefix_tokens=lambda rid: 0).rids == ["g0-0", "g0-1"]


def test_sync_running_forgets_finished_and_memory_returns_to_baseline(clock):
    p = planner_with(clock)
    arrive(p, ["g0-0", "g0-1", "g1-0"])
    p.end_pass(p.plan(max_new=10).rids)
    gone = p.sync_running({})  # everything running finished
    assert sorted(gone) == ["g0-0", "g0-1"]
    assert p.plan(max_new=10).rids == ["g1-0"]
    p.end_pass(["g1-0"])
    p.sync_running({})
    assert p.num_waiting == 0 and p.cht.num_running == 0
    fp = p.cht.memory_footprint()
    assert (fp.requests, fp.working_set_keys, fp.reverse_index_keys) == (0, 0, 0)


def test_retraction_and_abort_reconciliation(clock):
    p = planner_with(clock)
    arrive(p, ["g0-0", "g0-1"])
    p.end_pass(p.plan(max_new=10).rids)
    p.on_enqueue("g0-1", prompt(0, 1))  # retracted by the scheduler under memory pressure
    assert p.num_waiting == 1 and p.cht.num_running == 1
    arrive(p, ["g1-0"])
    gone = p.sync_waiting({"g0-1": lambda: prompt(0, 1)})  # g1-0 was aborted while waiting
    assert gone == ["g1-0"] and p.num_waiting == 1


def test_token_budget_stops_planning_once_reached(clock):
    p = planner_with(clock, prefix_leader=False)
    arrive(p, ["g0-0", "g0-1", "g0-2", "g0-3"])
    first = p.plan(max_new=10, token_budget=1)  # the first pick always goes in
    assert first.rids == ["g0-0"] and first.stop_reason == "budget"
    p.end_pass(first.rids)
    # the rest share g0-0's 10 prefix chunks: each misses only its last chunk (4 tokens)
    plan = p.plan(max_new=10, token_budget=2 * CHUNK)
    assert plan.rids == ["g0-1", "g0-2"] and plan.stop_reason == "budget"


def test_prefix_leader_lookup_only_for_a_new_group(clock):
    p = planner_with(clock)
    arrive(p, ["g0-0", "g0-1", "g0-2"])
    lookups = []

    def cached(rid):
        lookups.append(rid)
        return 10 * CHUNK

    p.end_pass(p.plan(max_new=1).rids)  # g0-0 runs: the group's prefix is in the batch
    assert p.plan(max_new=10, cached_prefix_tokens=cached).rids == ["g0-1", "g0-2"]
    assert lookups == []  # their shared part is held by the running batch: no radix lookup


def test_a_waiting_group_the_radix_cache_holds_goes_before_an_earlier_uncached_one(clock):
    p = planner_with(clock, agent="admit")
    arrive(p, ["g0-0", "g0-1", "g1-0", "g1-1"])
    cached = {"g1-0": 10 * CHUNK, "g1-1": 10 * CHUNK}  # g1's prefix ran before and stayed cached
    plan = p.plan(max_new=2, cached_prefix_tokens=lambda rid: cached.get(rid, 0))
    assert plan.rids == ["g1-0", "g1-1"]
    assert p.stats.cached_picks == 1  # the first pick; its group then runs and leads the CHT
    p.end_pass(plan.rids)
    # off: the chunked hash tree's order alone (g0 arrived first)
    q = planner_with(clock, agent="admit", cached_groups=0, prefix_leader=False)
    arrive(q, ["g0-0", "g0-1", "g1-0", "g1-1"])
    plan = q.plan(max_new=2, cached_prefix_tokens=lambda rid: cached.get(rid, 0))
    assert plan.rids == ["g0-0", "g0-1"]


def test_the_cached_group_lookup_happens_only_when_a_new_group_would_start(clock):
    p = planner_with(clock, agent="admit", prefix_leader=False)
    arrive(p, ["g0-0", "g0-1", "g1-0"])
    lookups = []

    def cached(rid):
        lookups.append(rid)
        return 0

    p.end_pass(p.plan(max_new=1, cached_prefix_tokens=cached).rids)  # g0 starts: one lookup
    assert lookups == ["g0-0", "g1-0"]
    lookups.clear()
    assert p.plan(max_new=1, cached_prefix_tokens=cached).rids == ["g0-1"]
    assert lookups == []  # g0 runs: its members extend the batch without a lookup
