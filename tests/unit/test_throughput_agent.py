"""The default agent (admit: ADD while the KV pool holds the candidate) and the throughput agent
(ADD/STOP from the batch's predicted throughput and the pool's room)."""

from __future__ import annotations

import pytest

from feather_sglang.agents import Action, AdmitAgent, AgentState, ServerShape, ThroughputAgent
from feather_sglang.agents.throughput import REFIT_EVERY, StepTimeModel
from feather_sglang.config import FeatherConfig
from feather_sglang.planner import AdmissionPlanner

CHUNK = 50


def group_prompt(group: int, i: int, prefix_tokens: int = 1000, own: int = 50) -> list[int]:
    return [100_000 * (group + 1) + t for t in range(prefix_tokens)] + [7 + i] * own


def planner(kv_shape: ServerShape | None = None, agent: str | None = None) -> AdmissionPlanner:
    config = (
        FeatherConfig(chunk_size=CHUNK)
        if agent is None
        else FeatherConfig(chunk_size=CHUNK, agent=agent)
    )
    p = AdmissionPlanner(config)
    if kv_shape is not None:
        p.agent.bind_server(kv_shape)
    return p


def two_groups(p: AdmissionPlanner, per_group: int = 8) -> None:
    for g in range(2):
        for i in range(per_group):
            p.on_enqueue(f"g{g}-{i}", group_prompt(g, i))


def test_admit_is_the_default_agent():
    assert FeatherConfig().agent == "admit"
    assert isinstance(planner().agent, AdmitAgent)
    assert isinstance(planner(agent="throughput").agent, ThroughputAgent)


@pytest.mark.parametrize("prefix_shared", [True, False])
def test_same_queue_ample_pool_adds_tight_pool_stops(prefix_shared, agent="throughput"):
    """The decision changes with memory pressure alone: one queue, two pools."""
    shape = ServerShape(
        prefix_shared_attention=prefix_shared, max_running_requests=64, kv_capacity_tokens=0
    )
    ample, tight = planner(shape, agent), planner(shape, agent)
    for p in (ample, tight):
        two_groups(p)
    # group 0 (8 x 1,050 tokens, 1,000 shared) needs ~1,400 KV tokens; group 1 as much again
    plan = ample.plan(max_new=64, kv_free_tokens=700_000, kv_capacity_tokens=700_000)
    assert sorted(plan.rids) == sorted(f"g{g}-{i}" for g in range(2) for i in range(8))
    plan = tight.plan(max_new=64, kv_free_tokens=2_000, kv_capacity_tokens=2_000)
    assert sorted(plan.rids) == [f"g0-{i}" for i in range(8)]
    assert plan.stop_reason == "agent"


def test_empty_batch_always_admits_even_without_room():
    p = planner(agent="throughput")
    two_groups(p, per_group=2)
    plan = p.plan(max_new=64, kv_free_tokens=10, kv_capacity_tokens=10)
    assert plan.rids[0] == "g0-0"


def test_attention_heavier_than_the_batch_stops():
    """Per-request attention: a long unshared prompt costs more per step than the batch's average."""
    agent = ThroughputAgent(FeatherConfig())
    agent.bind_server(ServerShape(False, 64, 100_000))
    short = AgentState(
        8,
        0,
        0,
        0,
        1,
        group_waiting=1,
        new_tokens=20_000,
        own_tokens=20_000,
        prompt_tokens=20_000,
        batch_unique_tokens=800,
        batch_tokens=800,
        free_slots=10,
    )
    assert agent.decide(short) is Action.STOP
    assert (
        agent.decide(short._replace(prompt_tokens=100, new_tokens=100, own_tokens=100))
        is Action.ADD
    )


def test_step_model_learns_measured_costs():
    """Steps generated from other coefficients pull the fit toward them."""
    model = StepTimeModel(prefix_shared=True)
    truth = (0.02, 4e-3, 3e-5)
    for i in range(40 * REFIT_EVERY):
        batch, tokens = 1 + i % 32, 500 * (1 + (i * 7) % 20)
        model.observe(batch, tokens, truth[0] + truth[1] * batch + truth[2] * tokens)

    def true_step(batch, tokens):
        return truth[0] + truth[1] * batch + truth[2] * tokens

    for batch, tokens in ((1, 500), (8, 4000), (32, 10_000), (16, 2_000)):
        assert model.step_s(batch, tokens) == pytest.approx(true_step(batch, tokens), rel=0.1)
    assert StepTimeModel(prefix_shared=True).step_s(32, 10_000) != pytest.approx(
        true_step(32, 10_000), rel=0.1
    )


def test_the_starvation_bound_holds_whatever_the_agent_says():
    """A tight pool makes the agent STOP before group 1; once g1-0 has waited longer than
    --feather-max-wait-s it is admitted all the same."""
    now = [0.0]
    p = AdmissionPlanner(
        FeatherConfig(chunk_size=CHUNK, max_wait_s=10, agent="throughput"), clock=lambda: now[0]
    )
    two_groups(p, per_group=4)
    plan = p.plan(max_new=64, kv_free_tokens=1_500, kv_capacity_tokens=1_500)
    assert plan.stop_reason == "agent" and {r[:2] for r in plan.rids} == {"g0"}
    p.end_pass(plan.rids)
    now[0] = 11.0
    plan = p.plan(max_new=64, kv_free_tokens=0, kv_capacity_tokens=1_500)
    assert plan.rids[:4] == [f"g1-{i}" for i in range(4)] and plan.starved == 4
