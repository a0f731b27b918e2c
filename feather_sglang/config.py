"""feather's configuration: one frozen dataclass, validated on construction.

Every field is reachable three ways, all validated by the same functions:
``--feather-<field>`` on the command line (``python -m sglang.launch_server``,
``sglang serve``), ``feather_<field>=`` keyword arguments to ``sglang.Engine``,
and ``FeatherConfig(<field>=...)`` in code.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable


class FeatherConfigError(ValueError):
    """A feather option has a value feather cannot run with; the message says what is allowed."""


def _option(name: str) -> str:
    return "--feather-" + name.replace("_", "-")


def _int_at_least(low: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        try:
            as_int = int(value)
            if isinstance(value, float) and value != as_int:
                raise ValueError
            if isinstance(value, bool):
                raise ValueError
        except (TypeError, ValueError):
            raise FeatherConfigError(
                f"{_option(name)} must be an integer >= {low}, got {value!r}"
            ) from None
        if as_int < low:
            raise FeatherConfigError(f"{_option(name)} must be an integer >= {low}, got {as_int}")
        return as_int

    return check


def _positive_seconds(name: str, value: Any) -> float:
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        raise FeatherConfigError(
            f"{_option(name)} must be a number of seconds > 0 (or 'inf' to disable), got {value!r}"
        ) from None
    if math.isnan(as_float) or as_float <= 0:
        raise FeatherConfigError(
            f"{_option(name)} must be a number of seconds > 0 (or 'inf' to disable), got {value!r}"
        )
    return as_float


def _agent_name(name: str, value: Any) -> str:
    """An agent name, or ``ppo:PATH`` / ``dqn:PATH`` whose file is loaded and checked here, so a
    bad file stops start-up instead of failing mid-serving."""
    from feather_sglang.agents import validate_agent

    try:
        return validate_agent(value)
    except ValueError as exc:
        raise FeatherConfigError(f"{_option(name)}: {exc}") from None


def _boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise FeatherConfigError(f"{_option(name)} must be true or false, got {value!r}")


def _opt(default, check, help: str):
    return field(default=default, metadata={"check": check, "help": help})


MIN_CHUNK_SIZE = 8


@dataclass(frozen=True, slots=True)
class FeatherConfig:
    """Options of the ``feather`` schedule policy (see README for the why of each default)."""

    # NOTE: 50 tokens per chunk is the value in the public code derived from the paper's
    # fork; smaller chunks see finer prefix differences but cost more keys per request.
    # NOTE: the CHT keeps one key per chunk per distinct path, so its memory per prompt token
    # grows as chunks shrink; the floor bounds that, whatever the waiting queue holds.
    chunk_size: int = _opt(
        50, _int_at_least(MIN_CHUNK_SIZE),
        f"Tokens per chunk of the chunked hash tree (>= {MIN_CHUNK_SIZE}). Prefix sharing is seen at this "
        "granularity.",
    )
    agent: str = _opt(
        "admit", _agent_name,
        "Stop/add agent deciding when to stop admitting into the running batch, in the CHT's order: "
        "admit (every candidate; SGLang's admission stops where memory does: measured best), throughput (admits while the "
        "batch's predicted decode throughput, from a step-time model of this server's backend refined by "
        "its own step times, does not fall), static (the paper's rule), ucb (contextual bandit, learns "
        "online), qlearning (tabular, learns online), ppo:PATH or dqn:PATH (a policy trained with "
        "feather-train, e.g. feather_rl/agents/ppo_serving.zip).",
    )
    # The static rule (paper's heuristic): admit the first request; admit while the shared
    # prefix shrinks by at most `static_max_loss` chunks (`static_max_loss_crowded` when at
    # least `static_crowd_threshold` waiting requests share the new depth); admit anything
    # while the batch is below a floor that grows by one per homogeneous admission up to
    # `static_floor_max`.
    static_max_loss: int = _opt(
        5, _int_at_least(0), "Static rule: largest shared-prefix loss, in chunks, that still admits (>= 0)."
    )
    static_max_loss_crowded: int = _opt(
        7, _int_at_least(0),
        "Static rule: largest loss, in chunks, admitted when many waiting requests share the new depth (>= 0).",
    )
    static_crowd_threshold: int = _opt(
        10, _int_at_least(1),
        "Static rule: waiting requests sharing the new depth that count as 'many' (>= 1).",
    )
    static_floor_max: int = _opt(
        10, _int_at_least(1),
        "Static rule: the batch-size floor below which anything is admitted grows up to this (>= 1).",
    )
    max_wait_s: float = _opt(
        60.0, _positive_seconds,
        "Starvation bound: once the oldest request has waited longer than this many seconds, "
        "the requests of its prefix group that have are admitted first whatever the batch "
        "holds, one group at a time (> 0; 'inf' disables).",
    )
    prefix_leader: bool = _opt(
        True, _boolean,
        "When a chosen request's shared prefix is not in the radix cache yet, admit it alone "
        "first so the rest of its group reuse its KV next pass (true/false).",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            checked = f.metadata["check"](f.name, getattr(self, f.name))
            object.__setattr__(self, f.name, checked)
        if self.static_max_loss_crowded < self.static_max_loss:
            raise FeatherConfigError(
                f"--feather-static-max-loss-crowded ({self.static_max_loss_crowded}) must be >= "
                f"--feather-static-max-loss ({self.static_max_loss})"
            )

    # ---- the three ways in -------------------------------------------------------------
    @classmethod
    def options(cls) -> list[tuple[str, dataclasses.Field]]:
        """(command-line flag, field) for every option."""
        return [(_option(f.name), f) for f in dataclasses.fields(cls)]

    @classmethod
    def from_prefixed(cls, values: dict[str, Any]) -> "FeatherConfig":
        """Build from ``feather_<field>`` keys (argparse dests or Engine kwargs); None = default."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in values.items():
            if not key.startswith("feather_"):
                continue
            name = key[len("feather_"):]
            if name not in known:
                raise FeatherConfigError(
                    f"unknown feather option {key!r}; allowed: "
                    + ", ".join("feather_" + k for k in sorted(known))
                )
            if value is not None:
                kwargs[name] = value
        return cls(**kwargs)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
