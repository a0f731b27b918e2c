"""Stop/add agents by name. Later agents register here with :func:`register_agent`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from feather_sglang.agents.base import Action, AgentState, StopAddAgent
from feather_sglang.agents.static import StaticRuleAgent

if TYPE_CHECKING:
    from feather_sglang.config import FeatherConfig

_AGENTS: dict[str, type[StopAddAgent]] = {}


def register_agent(cls: type[StopAddAgent]) -> type[StopAddAgent]:
    _AGENTS[cls.name] = cls
    return cls


def agent_names() -> list[str]:
    return sorted(_AGENTS)


def make_agent(config: "FeatherConfig") -> StopAddAgent:
    try:
        cls = _AGENTS[config.agent]
    except KeyError:
        raise ValueError(f"unknown agent {config.agent!r}; allowed: {', '.join(agent_names())}") from None
    return cls(config)


register_agent(StaticRuleAgent)

__all__ = ["Action", "AgentState", "StopAddAgent", "StaticRuleAgent", "agent_names", "make_agent", "register_agent"]
