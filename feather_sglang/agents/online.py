"""What the online learners (``ucb``, ``qlearning``) share: state bins and throughput credit.

Both learn inside the server from the batches it runs. A decision (ADD or STOP on a candidate)
is kept pending until the batch it shaped has run: the throughput of the forward steps that
follow (tokens per second: the sum of the steps' batch sizes over the sum of their times) is
credited to every pending decision, as the paper credits final batch size / batch time to every
decision of that batch. Credit is given after ``CREDIT_STEPS`` steps, or earlier when the batch
empties.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np

from feather_sglang.agents.base import Action, AgentState, StopAddAgent

# State bins of the paper's bandit (public code derived from its fork): batch size // 4 capped
# at 10, chunk loss clamped to [-5, 5], waiting // 4 capped at 10.
BATCH_BIN = 4
BATCH_BINS = 11
LOSS_CLAMP = 5
WAITING_BIN = 4
WAITING_BINS = 11
TABLE_SHAPE = (BATCH_BINS, 2 * LOSS_CLAMP + 1, WAITING_BINS, 2)

# NOTE: 16 decode steps is the length of the shortest batches the A/B workloads run (16 output
# tokens): long enough to average out one slow step, short enough that the credit reaches the
# decisions while their batch still runs.
CREDIT_STEPS = 16


def state_bin(state: AgentState) -> tuple[int, int, int]:
    """(batch bin, chunk-loss bin, waiting bin): indexes into a ``TABLE_SHAPE`` table."""
    return (
        min(state.batch_size // BATCH_BIN, BATCH_BINS - 1),
        min(max(state.delta, -LOSS_CLAMP), LOSS_CLAMP) + LOSS_CLAMP,
        min(state.waiting // WAITING_BIN, WAITING_BINS - 1),
    )


def forced_add(state: AgentState) -> bool:
    """ADD without asking the learner: the batch is empty (STOP would run nothing) or the
    candidate does not shrink the shared chain (the paper's bandit does the same)."""
    return state.batch_size == 0 or state.delta <= 0


class OnlineLearner(StopAddAgent):
    """Keeps decisions pending and credits them with the throughput of the steps that follow.

    Subclasses implement ``choose`` (a learned decision for a binned state) and ``learn``
    (update from one batch's decisions and its throughput in tokens/s).
    """

    def __init__(self, config) -> None:
        super().__init__(config)
        self.pending: list[tuple[tuple[int, int, int], Action]] = []
        self.window_tokens = 0
        self.window_seconds = 0.0
        self.window_steps = 0
        self.credits = 0  # batches credited so far

    @abstractmethod
    def choose(self, key: tuple[int, int, int]) -> Action: ...

    @abstractmethod
    def learn(
        self, decisions: list[tuple[tuple[int, int, int], Action]], reward: float
    ) -> None: ...

    def decide(self, state: AgentState) -> Action:
        if forced_add(state):
            return Action.ADD
        key = state_bin(state)
        action = self.choose(key)
        if action is Action.STOP:
            self.pending.append((key, Action.STOP))
        return action

    def on_admit(self, state: AgentState) -> None:
        if not forced_add(state):
            self.pending.append((state_bin(state), Action.ADD))

    def on_step(self, batch_size: int, step_time_s: float) -> None:
        if not self.pending:
            return
        self.window_tokens += batch_size
        self.window_seconds += step_time_s
        self.window_steps += 1
        if self.window_steps >= CREDIT_STEPS:
            self._credit()

    def on_batch_empty(self) -> None:
        self._credit()

    def _credit(self) -> None:
        if self.pending and self.window_seconds > 0:
            self.learn(self.pending, self.window_tokens / self.window_seconds)
            self.credits += 1
        if self.window_seconds > 0 or not self.pending:
            self.pending = []
        self.window_tokens, self.window_seconds, self.window_steps = 0, 0.0, 0

    # NOTE: the planner checkpoints every pass; only ``pending`` changes between a plan and its
    # end (tables change in on_step), so the checkpoint is its length, not a copy of the tables.
    def checkpoint(self) -> object:
        return len(self.pending)

    def restore(self, checkpoint: object) -> None:
        del self.pending[checkpoint:]


def new_table() -> np.ndarray:
    return np.zeros(TABLE_SHAPE, dtype=np.float64)
