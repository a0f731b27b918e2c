"""The paper's UCB contextual bandit, learning online from the batches the server runs."""

from __future__ import annotations

import math

from feather_sglang.agents.base import Action
from feather_sglang.agents.online import OnlineLearner, new_table

# NOTE: c = 200 is the value in the public code derived from the paper's fork, where rewards
# are tokens/s on a GPU (hundreds to thousands); it keeps exploring while two actions' mean
# throughputs differ by less than about c * sqrt(ln t / n).
UCB_C = 200.0


class UCBAgent(OnlineLearner):
    """Per binned state (see ``online.state_bin``) and action: visit count n and mean reward.

    Decision: forced ADD when the batch is empty or the chain does not shrink; otherwise an
    untried action first (ADD, then STOP), else the action with the larger
    ``mean + c * sqrt(ln(t + 1) / n)``, t the number of decisions credited so far. Reward:
    the throughput (tokens/s) of the steps after the decision, credited to every decision of
    that batch.
    """

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
