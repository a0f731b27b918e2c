"""A decode step's time as a function of what the batch holds, refined online from measured
steps (the model and its fit: ``docs/design.md``, "The agents")."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Priors per backend kind (prefix-shared or not), measured on a CPU (docs/design.md).
PRIORS = {
    True: (0.06, 1e-3, 1.5e-5),  # prefix-shared attention
    False: (0.06, 1e-3, 9e-6),
}
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
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
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
        if self.steps_seen % REFIT_EVERY == 0:
            self.refit()

    def refit(self) -> None:
        # Ridge toward the prior (ones), each held as strongly as PRIOR_WEIGHT average steps.
        reg = np.diag(PRIOR_WEIGHT * np.maximum(np.diag(self._xtx) / self._weight, 1e-12))
        scaled = np.linalg.solve(self._xtx + reg, self._xty + reg @ np.ones(3))
        self.coef = np.maximum(scaled, 0.05) * self._scale  # never a negative or vanishing cost
