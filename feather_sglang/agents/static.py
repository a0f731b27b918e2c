"""The paper's static stop/add rule (values from the public code derived from its fork)."""

from __future__ import annotations

from feather_sglang.agents.base import Action, AgentState, StopAddAgent


class StaticRuleAgent(StopAddAgent):
    """Admit the first request and the second; admit while the shared chain shrinks by at most
    ``static_max_loss`` chunks (``static_max_loss_crowded`` when at least
    ``static_crowd_threshold`` waiting requests share the new depth); and admit anything
    while the batch is below a floor that starts at 1 and grows by one with each homogeneous
    admission (loss 0) up to ``static_floor_max``.

    NOTE: the floor keeps a batch that has proven homogeneous from running nearly empty:
    once it has shrunk below the size its group reached, mixing is cheaper than idling.

    NOTE: a batch of one request has no *shared* chain: its depth is the request's own prompt,
    and the best candidate is the waiting request that overlaps it most, so no one could ever
    join that depth. Stopping there ran every request alone when nothing was shared (0.75x of
    fcfs on the no-sharing workload); admitting the second request keeps feather equal to FCFS
    when nothing is shared, as the paper reports, and changes nothing when a group exists (its
    members are the best candidates and lose nothing).
    """

    name = "static"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.floor = 1

    def decide(self, state: AgentState) -> Action:
        if state.batch_size <= 1 or state.batch_size < self.floor:
            return Action.ADD
        crowded = state.waiting >= self.config.static_crowd_threshold
        limit = self.config.static_max_loss_crowded if crowded else self.config.static_max_loss
        # state.loss, inline (a hot path): a negative delta (a gain) is a loss of 0.
        return Action.ADD if state.chunks_before - state.chunks_after <= limit else Action.STOP

    def on_admit(self, state: AgentState) -> None:
        if state.batch_size > 0 and state.chunks_before <= state.chunks_after:  # loss == 0
            self.floor = min(self.floor + 1, self.config.static_floor_max)

    def on_batch_empty(self) -> None:
        self.floor = 1
