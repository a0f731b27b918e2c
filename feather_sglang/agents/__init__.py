"""Stop/add agents by name (``admit``, ``throughput``, ``static``, ``ucb``, ``qlearning``, or
``name:PATH`` for agents loaded from a file); agents register with :func:`register_agent`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from feather_sglang.agents.admit import AdmitAgent
from feather_sglang.agents.base import Action, AgentState, ServerShape, StopAddAgent
from feather_sglang.agents.learned import DQNAgent, PolicyFileError, PPOAgent
from feather_sglang.agents.qlearning import QLearningAgent
from feather_sglang.agents.static import StaticRuleAgent
from feather_sglang.agents.throughput import ThroughputAgent
from feather_sglang.agents.ucb import UCBAgent

if TYPE_CHECKING:
    from feather_sglang.config import FeatherConfig

_AGENTS: dict[str, type[StopAddAgent]] = {}


def register_agent(cls: type[StopAddAgent]) -> type[StopAddAgent]:
    _AGENTS[cls.name] = cls
    return cls


def agent_names() -> list[str]:
    return sorted(_AGENTS)


def agent_classes() -> list[type[StopAddAgent]]:
    """The registered agent classes, in registration order."""
    return list(_AGENTS.values())


def agent_choices() -> list[str]:
    """What ``--feather-agent`` accepts, for messages: names, and ``name:PATH`` forms."""
    return [f"{n}:PATH" if getattr(_AGENTS[n], "takes_path", False) else n for n in agent_names()]


def _lookup(spec: str) -> tuple[type[StopAddAgent], str | None]:
    name, colon, path = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    cls = _AGENTS.get(name)
    if cls is None:
        raise ValueError(f"unknown agent {spec!r}; allowed: {', '.join(agent_choices())}")
    if getattr(cls, "takes_path", False) != bool(colon):
        if colon:
            raise ValueError(f"agent {name!r} takes no file; allowed: {', '.join(agent_choices())}")
        raise ValueError(f"agent {name!r} needs a model file: {name}:PATH")
    if colon and not path:
        raise ValueError(f"agent {name!r} needs a model file: {name}:PATH")
    return cls, path or None


def validate_agent(spec: str) -> str:
    """Check an agent spec, loading a model file if it names one; ValueError says what is wrong."""
    cls, path = _lookup(spec)
    if path is not None:
        cls.validate(path)  # PolicyFileError (a ValueError) with the file and the problem
    return spec


def make_agent(config: "FeatherConfig") -> StopAddAgent:
    cls, _ = _lookup(config.agent)
    return cls(config)


for _cls in (
    AdmitAgent,
    ThroughputAgent,
    StaticRuleAgent,
    UCBAgent,
    QLearningAgent,
    PPOAgent,
    DQNAgent,
):
    register_agent(_cls)

__all__ = [
    "Action",
    "AdmitAgent",
    "AgentState",
    "ServerShape",
    "StopAddAgent",
    "ThroughputAgent",
    "StaticRuleAgent",
    "UCBAgent",
    "QLearningAgent",
    "PPOAgent",
    "DQNAgent",
    "PolicyFileError",
    "agent_choices",
    "agent_classes",
    "agent_names",
    "make_agent",
    "register_agent",
    "validate_agent",
]
