from __future__ import annotations

import math

import pytest

from feather_sglang.agents import Action, AgentState, StaticRuleAgent, agent_names, make_agent
from feather_sglang.config import FeatherConfig, FeatherConfigError


def test_defaults_are_the_papers_values():
    c = FeatherConfig()
    assert (c.chunk_size, c.agent, c.static_max_loss, c.static_max_loss_crowded) == (
        50,
        "admit",
        5,
        7,
    )
    assert (c.static_crowd_threshold, c.static_floor_max, c.prefix_leader) == (10, 10, True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"chunk_size": 0}, "--feather-chunk-size must be an integer >= 8, got 0"),
        ({"chunk_size": 2.5}, "--feather-chunk-size must be an integer >= 8, got 2.5"),
        ({"chunk_size": "x"}, "--feather-chunk-size must be an integer >= 8, got 'x'"),
        (
            {"agent": "nope"},
            "--feather-agent: unknown agent 'nope'; allowed: admit, dqn:PATH, ppo:PATH, qlearning, static, throughput, ucb",
        ),
        ({"max_wait_s": -1}, "--feather-max-wait-s must be a number of seconds > 0"),
        ({"max_wait_s": 0}, "--feather-max-wait-s must be a number of seconds > 0"),
        ({"max_wait_s": float("nan")}, "--feather-max-wait-s must be a number of seconds > 0"),
        ({"max_wait_ratio": -1}, "--feather-max-wait-ratio must be a number >= 0, got -1"),
        ({"max_wait_ratio": "inf"}, "--feather-max-wait-ratio must be a number >= 0, got 'inf'"),
        ({"max_wait_ratio": "x"}, "--feather-max-wait-ratio must be a number >= 0, got 'x'"),
        ({"static_max_loss": -1}, "--feather-static-max-loss must be an integer >= 0, got -1"),
        ({"static_floor_max": 0}, "--feather-static-floor-max must be an integer >= 1, got 0"),
        ({"prefix_leader": "maybe"}, "--feather-prefix-leader must be true or false, got 'maybe'"),
        (
            {"static_max_loss": 8},
            "--feather-static-max-loss-crowded (7) must be >= --feather-static-max-loss (8)",
        ),
    ],
)
def test_bad_values_say_what_is_allowed(kwargs, message):
    with pytest.raises(FeatherConfigError) as err:
        FeatherConfig(**kwargs)
    assert message in str(err.value)


def test_from_prefixed_parses_strings_and_rejects_unknown_keys():
    c = FeatherConfig.from_prefixed(
        {
            "feather_chunk_size": "64",
            "feather_max_wait_s": "inf",
            "feather_prefix_leader": "false",
            "feather_agent": None,
        }
    )
    assert (
        c.chunk_size == 64
        and math.isinf(c.max_wait_s)
        and c.prefix_leader is False
        and c.agent == "admit"
    )
    with pytest.raises(FeatherConfigError, match="unknown feather option 'feather_chunksize'"):
        FeatherConfig.from_prefixed({"feather_chunksize": 3})


def test_options_are_the_cli_flags():
    flags = [flag for flag, _ in FeatherConfig.options()]
    assert (
        "--feather-chunk-size" in flags
        and "--feather-max-wait-s" in flags
        and "--feather-agent" in flags
    )


def _state(batch, before, after, waiting=0, queue=10):
    return AgentState(
        batch_size=batch, chunks_before=before, chunks_after=after, waiting=waiting, queue_len=queue
    )


def test_static_rule():
    agent = make_agent(FeatherConfig(agent="static"))
    assert isinstance(agent, StaticRuleAgent)
    assert agent_names() == ["admit", "dqn", "ppo", "qlearning", "static", "throughput", "ucb"]
    assert agent.decide(_state(0, 0, 40)) is Action.ADD  # first request always
    assert agent.decide(_state(1, 9, 0)) is Action.ADD  # a lone request's chain is not shared
    assert agent.decide(_state(3, 20, 15)) is Action.ADD  # loss 5 <= 5
    assert agent.decide(_state(3, 20, 14)) is Action.STOP  # loss 6 > 5
    assert agent.decide(_state(3, 20, 14, waiting=10)) is Action.ADD  # crowded: loss 6 <= 7
    assert agent.decide(_state(3, 20, 12, waiting=10)) is Action.STOP  # loss 8 > 7


def test_static_floor_grows_with_homogeneous_admissions_and_resets():
    agent = make_agent(FeatherConfig(agent="static", static_floor_max=3))
    assert agent.floor == 1
    for batch in (1, 2, 3, 4):
        agent.on_admit(_state(batch, 20, 20))  # loss 0: homogeneous
    assert agent.floor == 3  # capped
    assert agent.decide(_state(2, 20, 0)) is Action.ADD  # below the floor: anything goes
    assert agent.decide(_state(3, 20, 0)) is Action.STOP
    agent.on_admit(_state(3, 20, 10))  # a lossy admission does not grow it
    assert agent.floor == 3
    agent.on_batch_empty()
    assert agent.floor == 1


def test_agent_state_delta_and_loss():
    s = _state(1, 3, 8)
    assert s.delta == -5 and s.loss == 0
    assert _state(1, 8, 3).loss == 5
