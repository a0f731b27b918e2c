"""Fault containment: what feather does with a fault of its own (``docs/reliability.md``)."""

from __future__ import annotations

import logging
from collections import Counter

logger = logging.getLogger(__name__)


class FaultLog:
    """Counts faults per seam; the first of each seam is logged with its traceback."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.counts: Counter = Counter()

    def record(self, seam: str, exc: BaseException, then: str) -> None:
        self.counts[seam] += 1
        n = self.counts[seam]
        again = f" again ({n} so far; " if n > 1 else " ("
        message = f"{self.where}: fault in {seam}{again}{type(exc).__name__}: {exc}); {then}"
        logger.error("%s", message, exc_info=exc if n == 1 else None)

    @property
    def total(self) -> int:
        return sum(self.counts.values())
