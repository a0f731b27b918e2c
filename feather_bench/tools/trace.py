"""The batch trace: ``FEATHER_BATCH_TRACE=FILE`` makes a server write a JSON line per forward
step, for any schedule policy (its format: ``docs/benchmarks.md``, "The batch trace"), and the
benchmarks read it back.

The writer is an SGLang general plugin of its own (entry point ``feather-batch-trace``), apart
from the feather plugin: it hooks the scheduler only where the variable is set.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time

ENV = "FEATHER_BATCH_TRACE"
logger = logging.getLogger(__name__)


def common_prefix_len(prompts) -> int:
    depth = min(map(len, prompts), default=0)
    for other in prompts[1:]:
        depth = next((i for i in range(depth) if other[i] != prompts[0][i]), depth)
    return depth


class BatchTracer:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)
        self.sched_s = 0.0  # the last get_next_batch_to_run, waiting for its step
        self.attn_s = 0.0  # attention time of the step being run

    def record(self, batch, step_s: float) -> None:
        """A line for ``batch``'s step; a failure turns the trace off, never the server."""
        if self._file is None or batch is None or not batch.reqs:
            return
        try:
            mode = batch.forward_mode
            kind = "decode" if mode.is_decode() else "extend" if mode.is_extend() else None
            if kind is None:
                return
            line = {
                "t": time.monotonic(),
                "pid": os.getpid(),  # one scheduler per rank writes to the same file
                "mode": kind,
                "rids": [r.rid for r in batch.reqs],
                "prefix_tokens": common_prefix_len([r.origin_input_ids for r in batch.reqs]),
                "extend_tokens": int(batch.extend_num_tokens or 0) if kind == "extend" else 0,
                "sched_s": round(self.sched_s, 7),
                "step_s": round(step_s, 7),
                "attn_s": round(self.attn_s, 7),
            }
            self._file.write(json.dumps(line) + "\n")
            self.sched_s = self.attn_s = 0.0
        except Exception:  # noqa: BLE001
            logger.exception("feather batch trace failed; trace off")
            self._file = None


def check_path() -> str | None:
    """What is wrong with ``FEATHER_BATCH_TRACE`` at start-up (None: nothing)."""
    path = os.environ.get(ENV)
    try:
        if path:
            open(path, "a").close()
    except OSError as e:
        return f"{ENV}={path}: cannot append to it ({e.strerror}); set it to a writable file or unset it"
    return None


@functools.cache
def tracer() -> BatchTracer | None:
    """This process's tracer, opened at the first call; None without ``FEATHER_BATCH_TRACE``."""
    path = os.environ.get(ENV)
    try:
        return BatchTracer(path) if path else None
    except OSError as e:  # the path went bad after start-up: no trace, no crash
        logger.error("%s=%s: cannot append to it (%s); batch trace off", ENV, path, e.strerror)
        return None


def _adds_elapsed_to(field: str):
    """An AROUND hook that adds the wrapped call's wall time to the tracer's ``field``."""

    def around(original, obj, *args, **kwargs):
        started = time.perf_counter()
        result = original(obj, *args, **kwargs)
        t = tracer()
        if t is not None:
            setattr(t, field, getattr(t, field) + time.perf_counter() - started)
        return result

    return around


# Around ``Scheduler.get_next_batch_to_run``: passes that chose nothing add to the next step's.
get_next_batch_to_run_around = _adds_elapsed_to("sched_s")
# Around torch_native's ``forward_decode``/``forward_extend`` (one layer's call). Wall time: the
# compute time only where the backend runs synchronously (CPU).
attention_forward_around = _adds_elapsed_to("attn_s")


_SCHED = "sglang.srt.managers.scheduler.Scheduler"
# feather's backend inherits both from torch_native's: one hook times either
_NATIVE = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"


def run_batch_around(original, scheduler, batch, *args, **kwargs):
    """Around ``Scheduler.run_batch``: the step's line."""
    started = time.perf_counter()
    result = original(scheduler, batch, *args, **kwargs)
    t = tracer()
    if t is not None:
        t.record(batch, time.perf_counter() - started)
    return result


def register() -> None:
    """SGLang general-plugin entry point: the trace's hooks where ``FEATHER_BATCH_TRACE`` is set;
    a path that cannot be written stops the server at start-up (exit code 2)."""
    if not os.environ.get(ENV):
        return
    problem = check_path()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{_SCHED}.run_batch", run_batch_around, HookType.AROUND)
    HookRegistry.register(
        f"{_SCHED}.get_next_batch_to_run", get_next_batch_to_run_around, HookType.AROUND
    )
    for method in ("forward_decode", "forward_extend"):
        HookRegistry.register(f"{_NATIVE}.{method}", attention_forward_around, HookType.AROUND)


def time_split(steps: list[dict]) -> tuple[float, float, float]:
    """(extend steps' time, decode steps' time, attention time within both) of trace entries."""
    extend = sum(e["step_s"] for e in steps if e["mode"] == "extend")
    decode = sum(e["step_s"] for e in steps if e["mode"] == "decode")
    return extend, decode, sum(e.get("attn_s", 0.0) for e in steps)


def read_trace(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
