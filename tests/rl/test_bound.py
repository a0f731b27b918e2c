"""feather_rl.bound: no agent's noise-free run beats the bound, and the bound is reached where
nothing can be decided differently."""

from __future__ import annotations

import json
import random

import pytest

from feather_rl import evaluate, regimes
from feather_rl.bound import capacity, min_duration_s
from feather_rl.episodes import make
from feather_rl.simulator import Regime, Server, StepCosts, max_throughput
from feather_sglang.agents import Action, AgentState, StopAddAgent
from feather_sglang.config import FeatherConfig

COSTS = StepCosts.load()


class _StopAfterOne(StopAddAgent):
    """One request per batch: the slowest sane policy."""

    name = "stop-after-one"

    def decide(self, state: AgentState) -> Action:
        return Action.ADD if state.batch_size == 0 else Action.STOP


class _Coin(StopAddAgent):
    """A coin toss for every candidate of a non-empty batch."""

    name = "coin"

    def __init__(self, config: FeatherConfig, seed: int) -> None:
        super().__init__(config)
        self.rng = random.Random(seed)

    def decide(self, state: AgentState) -> Action:
        if state.batch_size == 0:
            return Action.ADD
        return Action(self.rng.randrange(2))


def _noise_free(regime: Regime, seed: int, agent: StopAddAgent) -> float:
    return Server(regime, seed, agent, COSTS, noise_sigma=0.0).run().output_throughput


@pytest.mark.parametrize("agent", ["static", "always-add", "throughput", "coin", "one"])
@pytest.mark.parametrize(
    "regime",
    [
        regimes.by_name("memory-ample/feather"),
        regimes.by_name("memory-ample/torch_native"),
        Regime("bound-tight", 6, 60, 512, kv_groups=1.2),
        Regime("bound-cap", 4, 64, 256, max_running=8, prefix_shared=False),
        Regime("bound-poisson", 4, 40, 512, kv_groups=2.0, load=1.2, zipf=1.0),
        Regime("bound-nosharing", 16, 16, 0, question_len=128),
    ],
    ids=lambda r: r.name if isinstance(r, Regime) else r,
)
def test_no_agent_exceeds_the_bound(agent, regime):
    for seed in (0, 1):
        policy = {"one": _StopAfterOne(FeatherConfig()), "coin": _Coin(FeatherConfig(), seed)}.get(
            agent
        ) or make(agent, seed)
        assert _noise_free(regime, seed, policy) <= max_throughput(regime, seed, COSTS) * (1 + 1e-9)


def test_the_bound_is_reached_where_there_is_nothing_to_decide():
    # one request: one prefill of its prompt, then output - 1 decode steps of batch 1
    one = Regime("one", 1, 1, 256)
    assert _noise_free(one, 0, make("always-add")) == pytest.approx(
        max_throughput(one, 0, COSTS), rel=1e-9
    )
    # one group that fits at once: always-add's run is within a few percent of the bound
    group = Regime("group", 1, 32, 1024)
    assert _noise_free(group, 0, make("always-add")) >= 0.95 * max_throughput(group, 0, COSTS)


def test_the_bound_falls_with_a_tighter_pool_and_a_lower_cap():
    ample = Regime("a", 8, 256, 512)
    assert min_duration_s(ample, COSTS) < min_duration_s(
        Regime("t", 8, 256, 512, kv_groups=1.0), COSTS
    )
    assert min_duration_s(ample, COSTS) < min_duration_s(
        Regime("c", 8, 256, 512, max_running=16), COSTS
    )


def test_feather_eval_reports_the_bound(tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert (
        evaluate.main(
            [
                "--agents",
                "static,always-add",
                "--regimes",
                "memory-ample/feather",
                "--seeds",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert "no agent can exceed" in capsys.readouterr().out
    data = json.loads(out.read_text())
    bound = [r for r in data["rows"] if r["agent"] == evaluate.BOUND]
    assert len(bound) == 1 and data["summary"]["bound_vs_always_add"] >= 1.0
    assert "No agent can exceed" in evaluate.serving_markdown(data, str(out))


@pytest.mark.parametrize("name", ["memory-bound/feather", "memory-ample/feather"])
def test_capacity_is_the_rate_the_best_agent_nearly_reaches(name):
    # a Poisson load is a fraction of capacity(): load 1.0 must be saturation, not twice it
    regime = regimes.by_name(name)
    served = _noise_free(regime, 0, make("always-add")) / regime.output_len  # requests/s
    assert served <= capacity(regime, COSTS) * (1 + 1e-9)
    assert served >= 0.9 * capacity(regime, COSTS)
