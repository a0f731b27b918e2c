"""The server's learning agents: decision logic, online updates from observed batches,
trained policy files (numpy forward, start-up errors, decision latency), memory headroom."""

from __future__ import annotations

import statistics
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from feather_sglang.agents import Action, AgentState, make_agent
from feather_sglang.agents.features import OBS_FIELDS, observe
from feather_sglang.agents.online import CREDIT_STEPS, UCB_C, state_bin
from feather_sglang.config import FeatherConfig, FeatherConfigError

SHIPPED = sorted((Path(__file__).resolve().parents[2] / "feather_rl" / "agents").glob("ppo_*.zip"))


def _state(batch, before, after, waiting=0, queue=10, headroom=1.0):
    return AgentState(batch, before, after, waiting, queue, headroom)


def _run_batch(agent, tokens_per_step: int, step_s: float, steps: int = CREDIT_STEPS):
    for _ in range(steps):
        agent.on_step(tokens_per_step, step_s)


# ---- ucb ------------------------------------------------------------------------------------
def test_ucb_forced_add_untried_first_then_upper_confidence_bound():
    agent = make_agent(FeatherConfig(agent="ucb"))
    assert agent.decide(_state(0, 0, 12)) is Action.ADD  # empty batch
    assert agent.decide(_state(5, 10, 10)) is Action.ADD  # chain does not shrink
    assert agent.pending == []  # forced decisions are not learned from
    lossy = _state(5, 10, 2, waiting=3)
    assert agent.decide(lossy) is Action.ADD  # untried: ADD first
    agent.on_admit(lossy)
    _run_batch(agent, 6, 0.01)  # 600 tokens/s credited to the ADD
    assert agent.decide(lossy) is Action.STOP  # then STOP, still untried
    _run_batch(agent, 6, 0.02)  # 300 tokens/s credited to the STOP
    key = state_bin(lossy)
    assert agent.counts[key].tolist() == [1, 1] and agent.means[key].tolist() == pytest.approx(
        [300, 600]
    )
    # both tried: mean + c sqrt(ln(t+1)/n); equal counts -> the better mean wins
    assert agent.decide(lossy) is Action.ADD
    agent.counts[(*key, int(Action.ADD))] = (
        1000  # ADD well known, STOP barely: the bonus explores STOP
    )
    agent.means[(*key, int(Action.STOP))] = 600 - UCB_C * 0.5
    assert agent.decide(lossy) is Action.STOP


def test_ucb_credits_every_decision_of_the_batch_with_its_throughput():
    agent = make_agent(FeatherConfig(agent="ucb"))
    states = [_state(b, 10, 3, waiting=w) for b, w in ((4, 0), (9, 5), (13, 20))]
    for s in states:
        agent.decide(s)
        agent.on_admit(s)
    _run_batch(agent, 8, 0.004, steps=CREDIT_STEPS - 1)
    assert agent.credits == 0 and len(agent.pending) == 3  # not yet
    agent.on_step(8, 0.004)
    assert agent.credits == 1 and agent.pending == []
    for s in states:
        assert agent.means[(*state_bin(s), int(Action.ADD))] == pytest.approx(2000.0)
    # a batch that empties early is credited with what it ran
    agent.decide(states[0]), agent.on_admit(states[0])
    _run_batch(agent, 2, 0.01, steps=3)
    agent.on_batch_empty()
    assert agent.credits == 2 and agent.counts[(*state_bin(states[0]), int(Action.ADD))] == 2


def test_online_learner_rollback_forgets_only_the_plans_decisions():
    agent = make_agent(FeatherConfig(agent="qlearning"))
    s = _state(4, 10, 3)
    agent.on_admit(s)
    checkpoint = agent.checkpoint()
    agent.on_admit(s), agent.on_admit(s)
    agent.restore(checkpoint)
    assert len(agent.pending) == 1


# ---- qlearning ------------------------------------------------------------------------------
def test_qlearning_learns_from_observed_batches_and_turns_greedy():
    agent = make_agent(FeatherConfig(agent="qlearning"))
    lossy = _state(8, 12, 2, waiting=1)
    key = state_bin(lossy)
    for _ in range(200):  # STOP here has run fast batches, ADD slow ones
        action = agent.decide(lossy)
        if action is Action.ADD:
            agent.on_admit(lossy)
        _run_batch(agent, 8, 0.01 if action is Action.STOP else 0.04)
    q_stop, q_add = agent.q[(*key, int(Action.STOP))], agent.q[(*key, int(Action.ADD))]
    assert q_stop == pytest.approx(800, rel=0.05) and q_add == pytest.approx(200, rel=0.05)
    picks = [agent.decide(lossy) for _ in range(300)]
    assert picks.count(Action.STOP) / len(picks) > 0.85  # greedy but for epsilon


def test_qlearning_bootstraps_an_add_from_the_next_decision():
    agent = make_agent(FeatherConfig(agent="qlearning"))
    first, second = _state(4, 10, 3), _state(5, 3, 1)
    agent.q[(*state_bin(second), int(Action.ADD))] = 1000.0
    agent.learn([(state_bin(first), Action.ADD), (state_bin(second), Action.ADD)], 400.0)
    # first: (1 - 0.5) * 400 + 0.5 * max Q(second) = 700; step 1/n = 1 on the first visit
    assert agent.q[(*state_bin(first), int(Action.ADD))] == pytest.approx(700.0)


# ---- trained policy files -------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped() -> Path:
    assert SHIPPED, "no shipped PPO agent under feather_rl/agents/"
    return SHIPPED[0]


def test_shipped_agent_loads_through_config_and_matches_sb3(shipped):
    from stable_baselines3 import PPO

    config = FeatherConfig(agent=f"ppo:{shipped}")
    agent = make_agent(config)
    model = PPO.load(shipped, device="cpu")
    rng = np.random.default_rng(0)
    for _ in range(300):
        s = _state(
            int(rng.integers(1, 40)),
            int(rng.integers(0, 40)),
            int(rng.integers(0, 40)),
            int(rng.integers(0, 40)),
            int(rng.integers(0, 80)),
            float(rng.random()),
        )
        assert int(agent.decide(s)) == int(
            model.predict(observe(s, agent.model), deterministic=True)[0]
        )
    assert agent.decide(_state(0, 0, 9)) is Action.ADD  # never STOP on an empty batch


def test_decisions_run_without_torch_and_report_their_latency(shipped, capsys, monkeypatch):
    """A decision is numpy only (no torch call per pass); its latency is printed, not asserted
    (a timing on a shared 2-core machine is a benchmark's job, not a test's)."""
    import torch

    agent = make_agent(FeatherConfig(agent=f"ppo:{shipped}"))
    s = _state(9, 14, 6, waiting=3, queue=40, headroom=0.7)

    def no_torch(*args, **kwargs):
        raise AssertionError("a decision called into torch")

    monkeypatch.setattr(torch.nn.Module, "__call__", no_torch)
    monkeypatch.setattr(torch, "as_tensor", no_torch)
    monkeypatch.setattr(torch, "tensor", no_torch)
    for _ in range(200):
        agent.decide(s)
    times = []
    for _ in range(5000):
        t = time.perf_counter_ns()
        agent.decide(s)
        times.append(time.perf_counter_ns() - t)
    median_us = statistics.median(times) / 1000
    with capsys.disabled():
        print(
            f"\n  decision latency, ppo numpy forward (observe + 3 layers): median {median_us:.2f} us, "
            f"p99 {sorted(times)[int(0.99 * len(times))] / 1000:.2f} us"
        )


def test_bad_policy_files_fail_at_configuration_with_a_clear_message(shipped, tmp_path):
    from feather_rl.policy_file import set_meta

    def error(spec):
        with pytest.raises(FeatherConfigError) as e:
            FeatherConfig(agent=spec)
        return str(e.value)

    assert "no such file" in error(f"ppo:{tmp_path / 'missing.zip'}")
    (tmp_path / "text.zip").write_text("not a zip")
    assert "not a Stable-Baselines3 model file" in error(f"ppo:{tmp_path / 'text.zip'}")
    assert "holds a 'ppo' policy, not 'dqn'" in error(f"dqn:{shipped}")
    assert "needs a model file" in error("ppo")
    with zipfile.ZipFile(shipped) as zf:
        import json

        meta = json.loads(zf.read("feather_policy.json"))
    other = tmp_path / "other_layout.zip"
    other.write_bytes(shipped.read_bytes())
    set_meta(other, {**meta, "obs_fields": list(OBS_FIELDS[:-1]), "obs_version": 0})
    message = error(f"ppo:{other}")
    assert "incompatible observation layout" in message and "retrain" in message
    bare = tmp_path / "bare_sb3.zip"
    with zipfile.ZipFile(shipped) as src, zipfile.ZipFile(bare, "w") as dst:
        for name in src.namelist():
            if name != "feather_policy.json":
                dst.writestr(name, src.read(name))
    assert "has no feather_policy.json" in error(f"ppo:{bare}")
    # a member changed after feather-train wrote the file: its digest no longer matches
    tampered = tmp_path / "tampered.zip"
    with zipfile.ZipFile(shipped) as src, zipfile.ZipFile(tampered, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, data + b"\0" if name == "policy.optimizer.pth" else data)
    assert "do not match the manifest" in error(f"ppo:{tampered}")
    # non-finite weights, in a file whose manifest is right
    import io

    import torch

    nan = tmp_path / "nan.zip"
    with zipfile.ZipFile(shipped) as src, zipfile.ZipFile(nan, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "policy.pth":
                weights = torch.load(io.BytesIO(data), weights_only=True)
                key = next(
                    k for k in weights if k.startswith("action_net.") and k.endswith("weight")
                )
                weights[key][0, 0] = float("nan")
                buffer = io.BytesIO()
                torch.save(weights, buffer)
                data = buffer.getvalue()
            if name != "feather_policy.json":
                dst.writestr(name, data)
    set_meta(nan, meta)  # rewrites the manifest for the new members
    assert "non-finite weights" in error(f"ppo:{nan}")


# ---- memory headroom in the planner ---------------------------------------------------------
def test_planner_gives_the_agent_its_memory_headroom():
    from feather_sglang.planner import AdmissionPlanner

    seen = []
    planner = AdmissionPlanner(FeatherConfig(chunk_size=10))
    planner.agent.decide = lambda state: (seen.append(state.memory_headroom), Action.ADD)[1]
    for i in range(3):
        planner.on_enqueue(i, list(range(100 * i, 100 * i + 40)))  # 4 chunks each, nothing shared
    planner.plan(max_new=3, kv_free_tokens=500, kv_capacity_tokens=1000)
    assert seen == pytest.approx([0.5, 0.46, 0.42])  # each pick's 40 new tokens counted as used
    seen.clear()
    planner.end_pass([])
    planner.plan(max_new=1)
    assert seen == [1.0]  # unknown: 1.0
