"""Tensor-parallel ranks plan alike: two planners (two ranks) fed the same events, with clocks
that disagree by an offset, a drift and a lag, admit the same requests every pass once the starvation
bound reads the first rank's clock (``SharedClock``); with their own clocks they do not."""

from __future__ import annotations

import random

from feather_sglang.config import FeatherConfig
from feather_sglang.planner import AdmissionPlanner, SharedClock
from feather_sglang.sglang_integration.refusals import policy_refusals

CHUNK = 8
MAX_WAIT_S = 1.0


class RankClocks:
    """Simulated time, read by each rank with its own offset, drift and lag (a rank reaches the
    same point of a pass a little earlier or later than another)."""

    def __init__(self):
        self.t = 0.0
        self.lag = random.Random(99)

    def local(self, rank: int):
        if rank == 0:
            return lambda: self.t
        return lambda: self.t * 1.01 + 0.35 + self.lag.uniform(0.0, 0.2)


def prompt(group: int, i: int) -> list[int]:
    return [1000 * (group + 1) + t for t in range(6 * CHUNK)] + [7, i, i, 9]


def run_ranks(shared: bool, agent: str = "admit", seed: int = 0) -> list[list[list[str]]]:
    """Each rank's plans, pass by pass, for one random script of arrivals, passes and finishes."""
    clocks = RankClocks()
    rank0 = clocks.local(0)

    def broadcast(values):  # what SGLang's broadcast does: every rank gets the first rank's value
        return [rank0()]

    planners = []
    for rank in range(2):
        local = clocks.local(rank)
        clock = SharedClock(broadcast, local) if shared else local
        config = FeatherConfig(chunk_size=CHUNK, agent=agent, max_wait_s=MAX_WAIT_S)
        planners.append((AdmissionPlanner(config, clock=clock), clock))
    rng = random.Random(seed)
    plans: list[list[list[str]]] = [[], []]
    running: list[str] = []
    n = 0
    for _ in range(120):
        clocks.t += rng.uniform(0.05, 0.4)
        for _ in range(rng.randrange(7)):  # arrivals, in many groups, faster than admissions
            rid, n = f"g{rng.randrange(12)}-{n}", n + 1
            for planner, _ in planners:
                planner.on_enqueue(rid, prompt(int(rid[1:].split("-")[0]), n))
        done = [r for r in running if rng.random() < 0.3]
        running = [r for r in running if r not in done]
        decided = []
        for rank, (planner, clock) in enumerate(planners):
            if shared:
                clock.tick()
            for rid in done:
                planner.forget(rid)
            plan = planner.plan(max_new=3)
            planner.end_pass(plan.rids)
            plans[rank].append(list(plan.rids))
            decided.append(plan.rids)
        running += decided[0]
    return plans


def test_ranks_with_the_first_ranks_clock_plan_alike():
    for seed in range(5):
        plans = run_ranks(shared=True, seed=seed)
        assert plans[0] == plans[1]
        assert sum(map(len, plans[0])) > 100  # the script did admit requests, starved ones too


def test_ranks_with_their_own_clocks_diverge():
    # The hazard the shared clock removes: a starvation deadline passes on one rank first.
    assert any(
        run_ranks(shared=False, seed=seed)[0] != run_ranks(shared=False, seed=seed)[1]
        for seed in range(5)
    )


def test_agents_that_time_steps_are_refused_with_tensor_parallelism():
    class Args:
        tp_size, pp_size = 2, 1

    assert policy_refusals(Args(), "admit") == [] and policy_refusals(Args(), "static") == []
    (problem,) = policy_refusals(Args(), "throughput")
    assert "--tp-size 2" in problem and "admit, static" in problem
    assert policy_refusals(type("One", (), {"tp_size": 1, "pp_size": 1})(), "throughput") == []
