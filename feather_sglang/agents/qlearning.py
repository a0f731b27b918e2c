"""Tabular Q-learning over the bandit's state bins, learning online inside the server."""

from __future__ import annotations

import math
import random

import numpy as np

from feather_sglang.agents.base import Action
from feather_sglang.agents.online import OnlineLearner, new_table

# The paper publishes no Q-learning; these are ours (docs/design.md, "The agents").
QL_GAMMA = 0.5
QL_ALPHA_MIN = 0.05
# Exploration: epsilon = 1 / sqrt(1 + visits of the state), floored.
QL_EPSILON_MIN = 0.02
QL_SEED = 0


class QLearningAgent(OnlineLearner):
    """Q(s, a) over binned states (``online.state_bin``), epsilon-greedy, ties to ADD."""

    name = "qlearning"

    def __init__(self, config, seed: int = QL_SEED) -> None:
        super().__init__(config)
        self.q = new_table()
        self.visits = new_table()
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
                target = (1 - QL_GAMMA) * reward + QL_GAMMA * float(
                    np.max(self.q[decisions[i + 1][0]])
                )
            self.visits[index] += 1
            alpha = max(QL_ALPHA_MIN, 1.0 / self.visits[index])
            self.q[index] += alpha * (target - self.q[index])
