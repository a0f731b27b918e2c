"""argparse value types the tools share."""

from __future__ import annotations


def ints(text: str) -> tuple[int, ...]:
    """``"128,1024"`` -> ``(128, 1024)``."""
    return tuple(int(x) for x in text.split(",") if x)
