"""Fault containment, and fault injection for tests (``docs/reliability.md``)."""

from __future__ import annotations

import logging
import os
from collections import Counter

logger = logging.getLogger(__name__)

INJECT_ENV = "FEATHER_FAULT_INJECT"
ACK_ENV = "FEATHER_FAULT_INJECT_ACK"
ACK_PHRASE = "break-this-test-server"
SEAMS = ("plan", "rebuild", "enqueue", "abort", "pass_end", "step", "backend")


class InjectedFault(RuntimeError):
    """Raised at a seam by ``FEATHER_FAULT_INJECT``."""


class FaultInjector:
    """Raises :class:`InjectedFault` at the n-th call of each named seam."""

    def __init__(self, spec: str) -> None:
        self.at: dict[str, int] = {}
        for part in spec.split(","):
            seam, _, n = part.strip().partition(":")
            if seam not in SEAMS or not n.isdigit() or int(n) < 1:
                raise ValueError(
                    f"{INJECT_ENV}={spec!r}: expected SEAM:N[,SEAM:N] with SEAM one of "
                    f"{', '.join(SEAMS)} and N >= 1"
                )
            self.at[seam] = int(n)
        self.calls: Counter = Counter()

    @classmethod
    def from_env(cls) -> "FaultInjector | None":
        spec = os.environ.get(INJECT_ENV)
        if not spec:
            return None
        if os.environ.get(ACK_ENV) != ACK_PHRASE:
            logger.warning(
                f"{INJECT_ENV} is set but {ACK_ENV} does not hold the test phrase: fault injection "
                "stays off"
            )
            return None
        injector = cls(spec)
        logger.warning("feather FAULT INJECTION is on (%s=%s): for tests only", INJECT_ENV, spec)
        return injector

    def check(self, seam: str) -> None:
        if seam in self.at:
            self.calls[seam] += 1
            if self.calls[seam] == self.at[seam]:
                raise InjectedFault(f"injected fault at {seam} call {self.at[seam]}")


class FaultLog:
    """Counts faults per seam; the first of each seam is logged with its traceback."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.counts: Counter = Counter()
        self.injector = FaultInjector.from_env()

    def check(self, seam: str) -> None:
        if self.injector is not None:
            self.injector.check(seam)

    def record(self, seam: str, exc: BaseException, then: str) -> None:
        self.counts[seam] += 1
        n = self.counts[seam]
        again = f" again ({n} so far; " if n > 1 else " ("
        message = f"{self.where}: fault in {seam}{again}{type(exc).__name__}: {exc}); {then}"
        logger.error("%s", message, exc_info=exc if n == 1 else None)

    @property
    def total(self) -> int:
        return sum(self.counts.values())
