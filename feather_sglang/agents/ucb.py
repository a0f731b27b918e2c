"""The paper's UCB contextual bandit, learning online from the batches the server runs."""

from __future__ import annotations

import math

from feather_sglang.agents.base import Action
from feather_sglang.agents.online import OnlineLearner, new_table

# The public code derived from the paper's fork (rewards in GPU tokens/s).
UCB_C = 200.0


class UCBAgent(OnlineLearner):
    """Per binned state (``online.state_bin``) and action: visit count n and mean reward."""

    name = "ucb"

    def __init__(self, config, c: float = UCB_C) -> None:
        super().__init__(config)
        self.c = c
        self.counts = new_table()
        self.means = new_table()
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
