"""Stop/add agents by name (``name:PATH`` for one loaded from a file); the package's API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from feather_sglang.agents.base import (  # noqa: F401
    Action,
    AdmitAgent,
    AgentState,
    ServerShape,
    StopAddAgent,
)
from feather_sglang.agents.learned import DQNAgent, PolicyFileError, PPOAgent  # noqa: F401
from feather_sglang.agents.online import QLearningAgent, UCBAgent
from feather_sglang.agents.static import StaticRuleAgent
from feather_sglang.agents.throughput import ThroughputAgent

if TYPE_CHECKING:
    from feather_sglang.config import FeatherConfig

# The rules and online learners, then the agents that serve a trained policy file.
_BUILT_IN = (AdmitAgent, ThroughputAgent, StaticRuleAgent, UCBAgent, QLearningAgent)
AGENTS: dict[str, type[StopAddAgent]] = {cls.name: cls for cls in (*_BUILT_IN, PPOAgent, DQNAgent)}


def agent_names() -> list[str]:
    return sorted(AGENTS)


def _lookup(spec: str) -> tuple[type[StopAddAgent], str | None]:
    name, colon, path = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    cls = AGENTS.get(name)
    allowed = ", ".join(f"{n}:PATH" if AGENTS[n].takes_path else n for n in agent_names())
    if cls is None:
        raise ValueError(f"unknown agent {spec!r}; allowed: {allowed}")
    if colon and not cls.takes_path:
        raise ValueError(f"agent {name!r} takes no file; allowed: {allowed}")
    if cls.takes_path and not path:
        raise ValueError(f"agent {name!r} needs a model file: {name}:PATH")
    return cls, path or None


def validate_agent(spec: str) -> str:
    """Check an agent spec, loading a model file if it names one; ValueError says what is wrong."""
    cls, path = _lookup(spec)
    if path is not None:
        cls.validate(path)  # PolicyFileError (a ValueError) with the file and the problem
    return spec


def make_agent(config: "FeatherConfig") -> StopAddAgent:
    return _lookup(config.agent)[0](config)
