"""The simulated server and ``feather/Serving-v0``: conservation, memory bounds, Gymnasium's checks."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import feather_rl
from feather_rl import calibrate, evaluate, regimes
from feather_rl.episodes import make
from feather_rl.serving_env import ServingEnv
from feather_rl.simulator import DEFAULT_CALIBRATION, Regime, Server, StepCosts, simulate
from feather_sglang.agents import Action, AgentState, StopAddAgent

SMALL = Regime("small", groups=3, requests=24, prefix_len=256, kv_groups=1.5)


class _CheckedServer(Server):
    """Asserts after every forward that the KV pool never holds more than its capacity."""

    def _decode(self) -> None:
        assert self._used() <= self.capacity
        super()._decode()


class _StopAfterOne(StopAddAgent):
    name = "stop-after-one"

    def decide(self, state: AgentState) -> Action:
        return Action.ADD if state.batch_size == 0 else Action.STOP


@pytest.mark.parametrize("agent", ["static", "always-add", "admit", "throughput"])
@pytest.mark.parametrize(
    "regime",
    [
        SMALL,
        regimes.by_name("memory-ample/torch_native"),
        Regime("poisson", 4, 40, 512, kv_groups=2.0, load=1.0, zipf=1.0),
    ],
)
def test_every_request_finishes_within_the_pool(agent, regime):
    server = _CheckedServer(regime, 3, make(agent))
    result = server.run()
    assert result.output_tokens == regime.requests * regime.output_len
    assert all(r.generated == r.output for r in server.requests.values())
    assert server.reserved == 0 and not server.running and not server.waiting
    assert sum(server.refs.values()) == 0 and server.planner.cht.num_waiting == 0
    assert result.output_throughput > 0 and result.p99_ttft_s >= result.mean_ttft_s * 0.99


def test_a_tight_pool_evicts_and_recomputes_prefixes():
    one_group = simulate(Regime("tight", 6, 60, 512, kv_groups=1.2), 0, make("always-add"))
    ample = simulate(Regime("ample", 6, 60, 512), 0, make("always-add"))
    assert ample.evicted_prefixes == 0 and one_group.evicted_prefixes >= 5
    # each group's prefix computed at least once, never more than once in an ample pool
    assert ample.prefill_tokens == 6 * 512 + 60 * 32


def test_a_stop_after_every_admission_still_serves_everything_but_slower():
    slow = simulate(SMALL, 1, _StopAfterOne(None))
    fast = simulate(SMALL, 1, make("always-add"))
    assert slow.output_tokens == fast.output_tokens
    assert slow.duration_s > 2 * fast.duration_s
    print(
        f"\n  one request at a time: {slow.output_throughput:.1f} tok/s, always-add {fast.output_throughput:.1f}"
    )


def test_same_seed_same_run():
    a, b = simulate(SMALL, 5, make("throughput")), simulate(SMALL, 5, make("throughput"))
    assert a.as_dict() == b.as_dict()


def test_serving_env_passes_check_env_and_returns_minus_relative_duration():
    env = gym.make(feather_rl.SERVING_ENV_ID).unwrapped
    assert isinstance(env, ServingEnv) and env.observation_space.shape == (12,)
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0, options={"regime": SMALL, "workload_seed": 4})
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(int(Action.ADD))
        assert env.observation_space.contains(obs) and reward <= 0
        total, steps = total + reward, steps + 1
        if terminated:
            break
    # always ADD reproduces the reference run: the return is -1
    assert (
        total == pytest.approx(-1.0, abs=1e-9)
        and info["result"].output_tokens == SMALL.requests * 32
    )
    # a reset mid-episode abandons the running server and starts over
    env.reset(seed=1)
    env.step(0)
    env.reset(seed=2)
    env.close()


def test_calibration_reads_step_models_and_prefills(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "[t] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, input throughput (token/s): 400.00\n"
        "[t] feather agent throughput: step model: 80.0 ms + 3.00 ms/request + 25.00 ms/1k tokens "
        "(prefix-shared attention, 100 decode steps seen)\n"
    )
    other = tmp_path / "other.log"
    other.write_text(
        "[t] feather agent throughput: step model: 90.0 ms + 7.00 ms/request + 20.00 ms/1k tokens "
        "(per-request attention, 70 decode steps seen)\n"
    )
    data = calibrate.calibrate([log, other])
    assert data["decode"]["prefix_shared"] == pytest.approx([0.08, 0.003, 25e-6])
    assert data["decode"]["per_request"] == pytest.approx([0.09, 0.007, 20e-6])
    assert data["prefill_per_token_s"] == pytest.approx(1 / 400)
    with pytest.raises(SystemExit, match="per_request"):
        calibrate.calibrate([log])
    # the shipped calibration loads
    costs = StepCosts.load()
    assert costs.decode_s(True, 8, 1000) > costs.decode_s(True, 1, 0) > 0


def test_serving_eval_summarises_geomeans(tmp_path, capsys):
    out = tmp_path / "eval.json"
    names = "memory-ample/feather,memory-bound/torch_native"
    assert (
        evaluate.main(
            [
                "--agents",
                "static,always-add,throughput",
                "--regimes",
                names,
                "--seeds",
                "2",
                "--trained",
                "throughput",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    s = data["summary"]
    rows = {(r["agent"], r["workload"]): r["mean_reward"] for r in data["rows"]}
    expected = np.exp(
        np.mean(np.log([rows["throughput", w] / rows["static", w] for w in names.split(",")]))
    )
    assert s["trained_vs_static"] == pytest.approx(expected, rel=1e-3)
    assert s["geomean_vs_always_add"]["always-add"] == 1.0
    assert "trained_vs_best_fixed" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        evaluate.main(["--regimes", "nope"])


def test_eval_prices_with_the_costs_it_is_given(tmp_path, capsys):
    """--costs: the simulator runs on that calibration, and the JSON records it."""
    shipped = json.loads(DEFAULT_CALIBRATION.read_text())
    slow = dict(
        shipped,
        decode={k: [3 * x for x in v] for k, v in shipped["decode"].items()},
        prefill_fixed_s=3 * shipped["prefill_fixed_s"],
        prefill_per_token_s=3 * shipped["prefill_per_token_s"],
    )
    slow_path = tmp_path / "slow.json"
    slow_path.write_text(json.dumps(slow))
    common = ["--agents", "static,always-add", "--regimes", "memory-ample/feather", "--seeds", "1"]
    means = {}
    for name, extra in (("shipped", []), ("slow", ["--costs", str(slow_path)])):
        out = tmp_path / f"{name}.json"
        assert evaluate.main([*common, *extra, "--json", str(out)]) == 0
        data = json.loads(out.read_text())
        means[name] = next(r["mean_reward"] for r in data["rows"] if r["agent"] == "always-add")
        assert (
            data["provenance"]["step_costs"]["decode"]
            == (slow if name == "slow" else shipped)["decode"]
        )
    # every step three times as long (same seeded noise, all requests at once): a third the tokens/s
    assert means["slow"] == pytest.approx(means["shipped"] / 3, rel=1e-3)
    capsys.readouterr()


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "cannot read step costs"),
        ("not json", "cannot read step costs"),
        ('{"decode": {}}', "not a step-cost calibration"),
        (
            '{"decode": {"prefix_shared": [1, 2, 3]}, "prefill_fixed_s": 0, "prefill_per_token_s": 0}',
            "'decode' must map",
        ),
        (
            '{"decode": {"prefix_shared": [1, 2, 3], "per_request": [1, -2, 3]}, '
            '"prefill_fixed_s": 0, "prefill_per_token_s": 0}',
            "finite and >= 0",
        ),
    ],
)
def test_bad_step_costs_are_refused_with_the_reason(tmp_path, capsys, text, message):
    path = tmp_path / "costs.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=message):
        StepCosts.load(path)
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["--costs", str(path), "--seeds", "1"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_costs_are_refused_outside_the_serving_env():
    with pytest.raises(SystemExit):
        evaluate.main(["--env", "batch", "--costs", str(DEFAULT_CALIBRATION)])
