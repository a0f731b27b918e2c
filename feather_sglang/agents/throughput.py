"""Admit while the batch's predicted decode throughput does not fall (``docs/design.md``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from feather_sglang.agents.base import Action, AgentState, ServerShape, StatelessAgent

# Priors for prefix-shared attention (True) or not, measured on a CPU (docs/design.md).
PRIORS = {True: (0.06, 1e-3, 1.5e-5), False: (0.06, 1e-3, 9e-6)}
# What the prior is worth, in average observed steps, per coefficient.
PRIOR_WEIGHT = 0.5
FORGET = 0.995
REFIT_EVERY = 16


@dataclass
class StepTimeModel:
    """Predicts a decode step's seconds; ``observe`` refines it from measured steps."""

    prefix_shared: bool
    coef: np.ndarray = field(default=None)  # (fixed_s, per_request_s, per_token_s)
    steps_seen: int = 0

    def __post_init__(self) -> None:
        self.prior = np.array(PRIORS[self.prefix_shared], dtype=np.float64)
        if self.coef is None:
            self.coef = self.prior.copy()
        # Scaled so that the prior's coefficients are all 1 (a well-conditioned ridge).
        self._scale = self.prior.copy()
        self._xtx, self._xty = np.zeros((3, 3)), np.zeros(3)
        self._weight = 0.0  # forgotten count of the steps in _xtx

    def attended(self, unique_tokens: int, tokens: int) -> int:
        return unique_tokens if self.prefix_shared else tokens

    def step_s(self, batch: int, attended_tokens: int) -> float:
        a, b, c = self.coef
        return a + b * batch + c * attended_tokens

    def throughput(self, batch: int, attended_tokens: int) -> float:
        """Output tokens per second of a decode step of ``batch`` requests."""
        return batch / self.step_s(batch, attended_tokens) if batch else 0.0

    def observe(self, batch: int, attended_tokens: int, seconds: float) -> None:
        if batch <= 0 or not seconds > 0:
            return
        x = np.array((1.0, batch, attended_tokens)) * self._scale
        self._xtx = FORGET * self._xtx + np.outer(x, x)
        self._xty = FORGET * self._xty + x * seconds
        self._weight = FORGET * self._weight + 1.0
        self.steps_seen += 1
        if self.steps_seen % REFIT_EVERY:
            return
        # Refit: ridge toward the prior (ones), each held as strongly as PRIOR_WEIGHT average steps.
        reg = np.diag(PRIOR_WEIGHT * np.maximum(np.diag(self._xtx) / self._weight, 1e-12))
        scaled = np.linalg.solve(self._xtx + reg, self._xty + reg @ np.ones(3))
        self.coef = np.maximum(scaled, 0.05) * self._scale  # never a negative or vanishing cost


# Below 1.0 so that prediction noise does not refuse groups that break even.
MIN_THROUGHPUT_RATIO = 0.98


def group_gain(model: StepTimeModel, state: AgentState) -> tuple[int, float]:
    """(KV tokens the candidate's group needs, throughput with it / without it); batch > 0."""
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


class ThroughputAgent(StatelessAgent):
    """ADD while the batch's predicted decode throughput does not fall."""

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
