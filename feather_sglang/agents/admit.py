"""The default stop/add agent: admit every candidate, in the CHT's order (why: ``docs/design.md``,
"The agents")."""

from __future__ import annotations

from feather_sglang.agents.base import Action, AgentState, StopAddAgent


class AdmitAgent(StopAddAgent):
    """Always ADD."""

    name = "admit"

    def decide(self, state: AgentState) -> Action:
        return Action.ADD

    def checkpoint(self) -> object:  # stateless
        return None

    def restore(self, checkpoint: object) -> None:
        pass
