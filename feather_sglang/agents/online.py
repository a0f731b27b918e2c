"""The online learners ``ucb`` (the paper's bandit) and ``qlearning`` (``docs/design.md``)."""

from __future__ import annotations

import math
import random
from abc import abstractmethod

import numpy as np

from feather_sglang.agents.base import Action, AgentState, StopAddAgent

# The paper's bandit's state bins: batch // 4 up to 10, loss in [-5, 5], waiting // 4 up to 10.
BATCH_BIN = 4
BATCH_BINS = 11
LOSS_CLAMP = 5
WAITING_BIN = 4
WAITING_BINS = 11
TABLE_SHAPE = (BATCH_BINS, 2 * LOSS_CLAMP + 1, WAITING_BINS, 2)

CREDIT_STEPS = 16
# The public code derived from the paper's fork (rewards in GPU tokens/s).
UCB_C = 200.0
# The paper publishes no Q-learning; these are ours (docs/design.md, "The agents").
QL_GAMMA = 0.5
QL_ALPHA_MIN = 0.05
QL_EPSILON_MIN = 0.02  # epsilon = 1 / sqrt(1 + visits of the state), floored
QL_SEED = 0


def state_bin(state: AgentState) -> tuple[int, int, int]:
    """(batch bin, chunk-loss bin, waiting bin): indexes into a ``TABLE_SHAPE`` table."""
    return (
        min(state.batch_size // BATCH_BIN, BATCH_BINS - 1),
        min(max(state.delta, -LOSS_CLAMP), LOSS_CLAMP) + LOSS_CLAMP,
        min(state.waiting // WAITING_BIN, WAITING_BINS - 1),
    )


def forced_add(state: AgentState) -> bool:
    """ADD without asking the learner: the batch is empty or the chain does not shrink."""
    return state.batch_size == 0 or state.delta <= 0


class OnlineLearner(StopAddAgent):
    """Credits pending decisions with the throughput of the steps that follow them."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.pending: list[tuple[tuple[int, int, int], Action]] = []
        self.window_tokens, self.window_seconds, self.window_steps = 0, 0.0, 0
        self.credits = 0  # batches credited so far

    @abstractmethod
    def choose(self, key: tuple[int, int, int]) -> Action: ...

    @abstractmethod
    def learn(self, decisions: list, reward: float) -> None:
        """Credit ``decisions`` ((binned state, action) pairs) with ``reward`` tokens/s."""

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

    # Only ``pending`` changes between a plan and its end: the checkpoint is its length.
    def checkpoint(self) -> object:
        return len(self.pending)

    def restore(self, checkpoint: object) -> None:
        del self.pending[checkpoint:]


class UCBAgent(OnlineLearner):
    """Per binned state and action: visit count n and mean reward."""

    name = "ucb"

    def __init__(self, config, c: float = UCB_C) -> None:
        super().__init__(config)
        self.c = c
        self.counts, self.means = np.zeros(TABLE_SHAPE), np.zeros(TABLE_SHAPE)
        self.t = 0

    def choose(self, key) -> Action:
        counts, means = self.counts[key], self.means[key]
        n_stop, n_add = counts[Action.STOP], counts[Action.ADD]
        if n_add == 0:
            return Action.ADD
        if n_stop == 0:
            return Action.STOP
        bonus = self.c * math.sqrt(math.log(self.t + 1))
        add = means[Action.ADD] + bonus / math.sqrt(n_add)
        stop = means[Action.STOP] + bonus / math.sqrt(n_stop)
        return Action.ADD if add >= stop else Action.STOP

    def learn(self, decisions, reward: float) -> None:
        for key, action in decisions:
            index = (*key, int(action))
            self.counts[index] += 1
            self.t += 1
            self.means[index] += (reward - self.means[index]) / self.counts[index]


class QLearningAgent(OnlineLearner):
    """Q(s, a) over binned states, epsilon-greedy, ties to ADD."""

    name = "qlearning"

    def __init__(self, config, seed: int = QL_SEED) -> None:
        super().__init__(config)
        self.q, self.visits = np.zeros(TABLE_SHAPE), np.zeros(TABLE_SHAPE)
        self.rng = random.Random(seed)

    def choose(self, key) -> Action:
        q, visits = self.q[key], self.visits[key]
        epsilon = max(QL_EPSILON_MIN, 1.0 / math.sqrt(1.0 + visits.sum()))
        if self.rng.random() < epsilon:
            return Action(self.rng.randrange(2))
        return Action.ADD if q[Action.ADD] >= q[Action.STOP] else Action.STOP

    def learn(self, decisions, reward: float) -> None:
        last = len(decisions) - 1
        for i, (key, action) in enumerate(decisions):
            index = (*key, int(action))
            if action is Action.STOP or i == last:
                target = reward
            else:
                next_q = float(np.max(self.q[decisions[i + 1][0]]))
                target = (1 - QL_GAMMA) * reward + QL_GAMMA * next_q
            self.visits[index] += 1
            alpha = max(QL_ALPHA_MIN, 1.0 / self.visits[index])
            self.q[index] += alpha * (target - self.q[index])
