"""The default stop/add agent: admit while the batch's predicted throughput does not fall.

A candidate is judged together with the waiting requests of its prefix group that could
follow it this pass (``group_waiting``, at most the free slots): they share its prefix, so the
question is whether the batch runs faster with that group than without it.

1. Memory: if the group's KV (the candidate's new tokens plus its followers' own tokens) does
   not fit in what the KV pool has free or evictable, STOP: admitting it would evict cached
   prefixes of other groups, or split the group, and the running batch will free memory soon.
   A batch that is empty always admits (STOP would run nothing).
2. Throughput: with :class:`~feather_sglang.agents.step_model.StepTimeModel` (prefix-shared
   attention reads a new group's prefix once; per-request attention reads every prompt), ADD
   when ``(B + k) / step(B + k)`` is at least ``B / step(B)``.

With a KV pool that holds everything and no batch cap, (2) nearly always admits: a step's fixed
cost (weights, runtime) is shared by more requests. STOP comes from memory, and from attention
that would cost more per request than the batch's average step.
"""

from __future__ import annotations

from feather_sglang.agents.base import Action, AgentState, ServerShape, StopAddAgent
from feather_sglang.agents.step_model import StepTimeModel

# NOTE: a group is worth admitting if it keeps at least this share of the batch's predicted
# throughput: below 1.0 so that prediction noise does not refuse groups that break even.
MIN_THROUGHPUT_RATIO = 0.98


def group_gain(model: StepTimeModel, state: AgentState) -> tuple[int, float]:
    """(the KV tokens the candidate and the followers of its group that fit need, the batch's
    predicted throughput with them over without them) for a non-empty batch.

    The followers counted are the group's waiting requests, at most the free slots and at most
    what the KV pool holds beside the candidate (all of them where the pool is unknown)."""
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
    """ADD while the predicted decode throughput of the batch does not fall (module docstring)."""

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

    # NOTE: decide() changes nothing; the model changes only in on_decode_step, between passes.
    def checkpoint(self) -> object:
        return None

    def restore(self, checkpoint: object) -> None:
        pass
