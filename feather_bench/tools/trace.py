"""Reading the batch trace a server writes with ``FEATHER_BATCH_TRACE`` (its format:
``docs/benchmarks.md``, "The batch trace")."""

from __future__ import annotations

import json


def time_split(steps: list[dict]) -> tuple[float, float, float]:
    """(extend steps' time, decode steps' time, attention time within both) of trace entries."""
    extend = sum(e["step_s"] for e in steps if e["mode"] == "extend")
    decode = sum(e["step_s"] for e in steps if e["mode"] == "decode")
    return extend, decode, sum(e.get("attn_s", 0.0) for e in steps)


def read_trace(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
