"""Stop/add agent: admit while the batch's predicted throughput does not fall
(``docs/design.md``, "The agents")."""

from __future__ import annotations

from feather_sglang.agents.base import Action, AgentState, ServerShape, StopAddAgent
from feather_sglang.agents.step_model import StepTimeModel

# Below 1.0 so that prediction noise does not refuse groups that break even.
MIN_THROUGHPUT_RATIO = 0.98


def group_gain(model: StepTimeModel, state: AgentState) -> tuple[int, float]:
    """(KV tokens the candidate and its group's followers that fit need, the batch's predicted
    throughput with them over without them) for a non-empty batch."""
    batch = state.batch_size
    k = max(1, min(state.group_waiting, state.free_slots))
    if state.kv_free_tokens >= 0 and state.own_tokens > 0:
        fit = 1 + max(state.kv_free_tokens - state.new_tokens, 0) // state.own_tokens
        k = min(k, fit)
    group_kv = state.new_tokens + (k - 1) * state.own_tokens
    now = model.attended(state.batch_unique_tokens, state.batch_tokens)
    extra = group_kv if model.prefix_shared else k * state.prompt_tokens
    before = model.throughput(batch, now)
    return group_kv, model.throughput(batch + k, now + extra) / before if before else 1.0


class ThroughputAgent(StopAddAgent):
    """ADD while the predicted decode throughput of the batch does not fall."""

    name = "throughput"
    wants_costs = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self.model = StepTimeModel(prefix_shared=True)

    def bind_server(self, server: ServerShape) -> None:
        if server.prefix_shared_attention != self.model.prefix_shared:
            self.model = StepTimeModel(prefix_shared=server.prefix_shared_attention)

    def decide(self, state: AgentState) -> Action:
        if state.batch_size == 0:
            return Action.ADD
        if 0 <= state.kv_free_tokens < state.new_tokens:
            return Action.STOP
        _, gain = group_gain(self.model, state)
        return Action.ADD if gain >= MIN_THROUGHPUT_RATIO else Action.STOP

    def on_decode_step(
        self, batch_size: int, unique_tokens: int, tokens: int, step_time_s: float
    ) -> None:
        self.model.observe(batch_size, self.model.attended(unique_tokens, tokens), step_time_s)

    def describe(self) -> str:
        a, b, c = self.model.coef
        return (
            f"step model: {1e3 * a:.1f} ms + {1e3 * b:.2f} ms/request + {1e6 * c:.2f} ms/1k tokens "
            f"({'prefix-shared' if self.model.prefix_shared else 'per-request'} attention, "
            f"{self.model.steps_seen} decode steps seen)"
        )

    # decide() changes nothing; the model changes only in on_decode_step, between passes.
    def checkpoint(self) -> object:
        return None

    def restore(self, checkpoint: object) -> None:
        pass
