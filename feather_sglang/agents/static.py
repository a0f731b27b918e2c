"""The paper's static stop/add rule (values from the public code derived from its fork)."""

from __future__ import annotations

from feather_sglang.agents.base import Action, AgentState, StopAddAgent
from feather_sglang.options import FeatherConfigError, int_opt


class StaticRuleAgent(StopAddAgent):
    """Admit while the chain shrinks by a few chunks at most, or the batch is below a floor."""

    name = "static"
    options = {
        "static_max_loss": int_opt(
            5, 0, "Static rule: largest shared-prefix loss, in chunks, that still admits"
        ),
        "static_max_loss_crowded": int_opt(
            7,
            0,
            "Static rule: largest loss, in chunks, admitted when many waiting requests share the "
            "new depth",
        ),
        "static_crowd_threshold": int_opt(
            10, 1, "Static rule: waiting requests sharing the new depth that count as 'many'"
        ),
        "static_floor_max": int_opt(
            10,
            1,
            "Static rule: the batch-size floor below which anything is admitted grows up to this",
        ),
    }

    @staticmethod
    def check_options(config) -> None:
        if config.static_max_loss_crowded < config.static_max_loss:
            raise FeatherConfigError(
                f"--feather-static-max-loss-crowded ({config.static_max_loss_crowded}) must be >= "
                f"--feather-static-max-loss ({config.static_max_loss})"
            )

    def __init__(self, config) -> None:
        super().__init__(config)
        self.floor = 1

    def decide(self, state: AgentState) -> Action:
        if state.batch_size <= 1 or state.batch_size < self.floor:
            return Action.ADD
        crowded = state.waiting >= self.config.static_crowd_threshold
        limit = self.config.static_max_loss_crowded if crowded else self.config.static_max_loss
        # state.loss, inline (a hot path).
        return Action.ADD if state.chunks_before - state.chunks_after <= limit else Action.STOP

    def on_admit(self, state: AgentState) -> None:
        if state.batch_size > 0 and state.chunks_before <= state.chunks_after:  # loss == 0
            self.floor = min(self.floor + 1, self.config.static_floor_max)

    def on_batch_empty(self) -> None:
        self.floor = 1
