"""A feather option: a dataclass field with its check and its help (:func:`opt`)."""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any, Callable


class FeatherConfigError(ValueError):
    """A feather option has a value feather cannot run with; the message says what is allowed."""


def flag(name: str) -> str:
    return "--feather-" + name.replace("_", "-")


def int_at_least(low: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        try:
            as_int = int(value)
            if isinstance(value, bool) or (isinstance(value, float) and value != as_int):
                raise ValueError
        except (TypeError, ValueError):
            raise FeatherConfigError(
                f"{flag(name)} must be an integer >= {low}, got {value!r}"
            ) from None
        if as_int < low:
            raise FeatherConfigError(f"{flag(name)} must be an integer >= {low}, got {as_int}")
        return as_int

    return check


def _as_float(value: Any) -> float:
    """``value`` as a float; NaN (which fails every bound check) where it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def positive_seconds(name: str, value: Any) -> float:
    as_float = _as_float(value)
    if not as_float > 0:  # NaN too
        raise FeatherConfigError(
            f"{flag(name)} must be a number of seconds > 0 (or 'inf' to disable), got {value!r}"
        )
    return as_float


def non_negative(name: str, value: Any) -> float:
    as_float = _as_float(value)
    if not 0 <= as_float < math.inf:  # NaN too
        raise FeatherConfigError(f"{flag(name)} must be a number >= 0, got {value!r}")
    return as_float


def boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise FeatherConfigError(f"{flag(name)} must be true or false, got {value!r}")


def opt(default, check, help: str):
    """An option: its field's type is its default's."""
    return field(default=default, metadata={"check": check, "help": help})


def int_opt(default: int, low: int, help: str):
    """An integer option of at least ``low``; its help ends with that bound."""
    return opt(default, int_at_least(low), f"{help} (>= {low}).")
