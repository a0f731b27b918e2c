"""Optional batch trace, for any schedule policy: which requests ran together in each step.

Enabled by ``FEATHER_BATCH_TRACE=/path/file.jsonl`` in the server's environment; each
scheduler process appends one JSON line per forward step::

    {"t": <monotonic s>, "mode": "extend"|"decode", "rids": [...], "prefix_tokens": <int>}

``prefix_tokens`` is the longest prompt prefix common to every request of the step. The
end-to-end tests and the A/B benchmarks read it to compare how prefix-homogeneous the
batches of different policies are. Off by default: it costs O(batch x prefix) per step.
"""

from __future__ import annotations

import json
import os
import time

ENV = "FEATHER_BATCH_TRACE"


def common_prefix_len(prompts) -> int:
    if not prompts:
        return 0
    first = prompts[0]
    depth = min(len(p) for p in prompts)
    for other in prompts[1:]:
        i = 0
        while i < depth and other[i] == first[i]:
            i += 1
        depth = i
        if depth == 0:
            break
    return depth


class BatchTracer:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)

    def record(self, batch) -> None:
        if batch is None or not batch.reqs:
            return
        mode = batch.forward_mode
        kind = "decode" if mode.is_decode() else "extend" if mode.is_extend() else None
        if kind is None:
            return
        prompts = [r.origin_input_ids for r in batch.reqs]
        self._file.write(
            json.dumps(
                {
                    "t": time.monotonic(),
                    "mode": kind,
                    "rids": [r.rid for r in batch.reqs],
                    "prefix_tokens": common_prefix_len(prompts),
                }
            )
            + "\n"
        )


_tracer: BatchTracer | None = None


def get_next_batch_to_run_after(result, scheduler, *args, **kwargs):
    global _tracer
    path = os.environ.get(ENV)
    if path:
        if _tracer is None:
            _tracer = BatchTracer(path)
        _tracer.record(result.batch_to_run)
    return result


def read_trace(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
