"""Median timings for the benchmark scripts."""

from __future__ import annotations

import statistics
import time


def medians_ms(*fns, repeats: int) -> tuple[float, ...]:
    """Medians (ms) of each of ``fns``, timed alternately call by call after one warm-up call
    each, so that a load change on a shared machine hits every side alike rather than one of
    them."""
    for fn in fns:  # warm-up (oneDNN builds its kernels for the shapes)
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, t in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            t.append((time.perf_counter() - t0) * 1e3)
    return tuple(statistics.median(t) for t in times)
