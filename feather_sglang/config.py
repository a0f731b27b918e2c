"""feather's configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

import dataclasses
from typing import Any

from feather_sglang import agents
from feather_sglang.options import (
    FeatherConfigError,
    boolean,
    flag,
    int_at_least,
    non_negative,
    opt,
    positive_seconds,
)

__all__ = ["FeatherConfig", "FeatherConfigError", "MIN_CHUNK_SIZE"]

MIN_CHUNK_SIZE = 8  # the default chunk and its floor: docs/design.md, "Chunk hashes"


def _agent_name(name: str, value: Any) -> str:
    """An agent name, or ``ppo:PATH`` / ``dqn:PATH`` whose file is loaded and checked here."""
    try:
        return agents.validate_agent(value)
    except ValueError as exc:
        raise FeatherConfigError(f"{flag(name)}: {exc}") from None


_OWN = {
    "chunk_size": opt(
        50,
        int_at_least(MIN_CHUNK_SIZE),
        f"Tokens per chunk of the chunked hash tree (>= {MIN_CHUNK_SIZE}). Prefix sharing is seen "
        "at this granularity.",
    ),
    "agent": opt(
        "admit",
        _agent_name,
        "Stop/add agent deciding when to stop admitting into the running batch, in the CHT's "
        "order: admit (every candidate; SGLang's admission stops where memory does: measured "
        "best), throughput (admits while the batch's predicted decode throughput, from a "
        "step-time model of this server's backend refined by its own step times, does not "
        "fall), static (the paper's rule), ucb (contextual bandit, learns online), qlearning "
        "(tabular, learns online), ppo:PATH or dqn:PATH (a policy trained with feather-train, "
        "e.g. feather_rl/agents/ppo_serving.zip).",
    ),
}
_LAST = {
    "max_wait_s": opt(
        60.0,
        positive_seconds,
        "Starvation bound: once the oldest request has waited longer than this many seconds "
        "(and --feather-max-wait-ratio times the recent wait), its prefix group's waiting "
        "requests are admitted first, oldest first, one group at a time (> 0; 'inf' disables).",
    ),
    "max_wait_ratio": opt(
        2.0,
        non_negative,
        "Starvation bound, relative part: a request must also outwait this many times the "
        "recent wait of admitted requests, so a queue all wait in alike (a batch sent at once, a "
        "slow server) keeps feather's order (>= 0; 0: the seconds alone).",
    ),
    "cached_groups": opt(
        8,
        int_at_least(0),
        "When the next pick would start a prefix group the running batch does not hold, this "
        "many waiting groups' leading requests are matched against the radix cache and the one "
        "with the fewest tokens left to compute goes first (>= 0; 0: the chunked hash tree's "
        "order alone).",
    ),
    "prefix_leader": opt(
        True,
        boolean,
        "When a chosen request's shared prefix is not in the radix cache yet, admit it alone "
        "first so the rest of its group reuse its KV next pass (true/false).",
    ),
}


class _FeatherConfig:
    """Options of the ``feather`` schedule policy: feather's own, then each agent's."""

    __slots__ = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](f.name, getattr(self, f.name)))
        for cls in agents.AGENTS.values():
            cls.check_options(self)

    @classmethod
    def options(cls) -> list[tuple[str, dataclasses.Field]]:
        """(command-line flag, field) for every option."""
        return [(flag(f.name), f) for f in dataclasses.fields(cls)]

    @classmethod
    def from_prefixed(cls, values: dict[str, Any]) -> "FeatherConfig":
        """Build from ``feather_<field>`` keys (argparse dests or Engine kwargs); None = default."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in values.items():
            name = key.removeprefix("feather_")
            if name == key:
                continue
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


_OPTIONS = _OWN | {k: v for cls in agents.AGENTS.values() for k, v in cls.options.items()} | _LAST
FeatherConfig = dataclasses.make_dataclass(
    "FeatherConfig",
    [(name, type(f.default), f) for name, f in _OPTIONS.items()],
    bases=(_FeatherConfig,),
    frozen=True,
    slots=True,
)
FeatherConfig.__module__ = __name__
FeatherConfig.__doc__ = _FeatherConfig.__doc__
