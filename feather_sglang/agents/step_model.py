"""A decode step's time as a function of what the batch holds, refined online.

    step_s = fixed_s + per_request_s * batch + per_token_s * attended_tokens

``attended_tokens`` is what attention reads per step: with a prefix-shared backend
(``--attention-backend feather``) each group's shared prefix once plus every request's own
tokens; with any other backend every request's whole prompt. ``fixed_s`` is the weight reads
and the runtime, the same whatever the batch holds.

The prior coefficients are set per backend kind; the scheduler's own step times refine them:
a ridge regression pulled toward the prior (so a few steps of one batch shape cannot move
what that shape says nothing about), solved every ``REFIT_EVERY`` decode steps over an
exponentially forgotten history (``FORGET`` per step) so that a change of load is followed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# NOTE: priors from the project's CPU machine (SmolLM2-135M, 30 layers, 2 threads): a batch-32
# decode step spends 60-140 ms in weight reads and the runtime; torch_native's per-request loop
# costs ~9 us per KV token per step (~0.3 us a layer); feather's backend ~15 us per prefix
# token, all of a group's queries against it, once per group. Elsewhere the online fit takes over.
PRIORS = {
    True: (0.06, 1e-3, 1.5e-5),  # prefix-shared attention
    False: (0.06, 1e-3, 9e-6),
}
# What the prior is worth, in average observed steps, per coefficient: little, so that
# varied steps decide; it matters only along what the steps seen cannot tell apart.
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
        # Features are scaled so that the prior's coefficients are all 1: a well-conditioned
        # ridge whatever the units.
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
        # Ridge toward the prior in scaled units (the prior is the vector of ones there), each
        # coefficient held as strongly as PRIOR_WEIGHT average steps of its own feature.
        reg = np.diag(PRIOR_WEIGHT * np.maximum(np.diag(self._xtx) / self._weight, 1e-12))
        scaled = np.linalg.solve(self._xtx + reg, self._xty + reg @ np.ones(3))
        self.coef = np.maximum(scaled, 0.05) * self._scale  # never a negative or vanishing cost
