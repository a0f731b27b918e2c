"""The regimes the stop/add decision is trained and judged in.

Training draws a fresh regime per episode (:func:`sample`): 1-64 prefix groups, 32-2,000
requests, prefixes of 128-2,048 tokens, either attention backend, a KV pool that holds the
whole workload or only 1-3 groups' prefixes with their requests, a batch cap from 16 to
4,096, arrivals all at once or Poisson at 0.6-1.5x the server's capacity, equal or
Zipf-distributed group sizes. :data:`HELDOUT` names fixed regimes, judged on seeds training
never draws; the first four are the ``bench-serving`` workloads' shapes.
"""

from __future__ import annotations

import math

import numpy as np

from feather_rl.simulator import Regime

HELDOUT: tuple[Regime, ...] = (
    Regime("memory-ample/feather", 4, 32, 1024, prefix_shared=True),
    Regime("memory-ample/torch_native", 4, 32, 1024, prefix_shared=False),
    Regime("memory-bound/feather", 32, 512, 1024, kv_groups=4, prefix_shared=True),
    Regime("memory-bound/torch_native", 32, 512, 1024, kv_groups=4, prefix_shared=False),
    Regime("no-sharing/feather", 128, 128, 0, question_len=512, prefix_shared=True),
    Regime("no-sharing/torch_native", 128, 128, 0, question_len=512, prefix_shared=False),
    Regime("online/feather", 32, 512, 1024, kv_groups=4, load=0.9, prefix_shared=True),
    Regime("many-groups/feather", 64, 2000, 512, kv_groups=3, prefix_shared=True),
    Regime("one-group/torch_native", 1, 256, 2048, prefix_shared=False),
    Regime("zipf-bound/feather", 16, 512, 1024, kv_groups=2, zipf=1.0, prefix_shared=True),
    Regime("batch-cap/torch_native", 8, 512, 512, max_running=32, prefix_shared=False),
    Regime("poisson-ample/feather", 16, 512, 512, load=1.2, prefix_shared=True),
)


def by_name(name: str) -> Regime:
    for regime in HELDOUT:
        if regime.name == name:
            return regime
    raise ValueError(f"unknown regime {name!r}; allowed: {', '.join(r.name for r in HELDOUT)}")


def _log_uniform(rng: np.random.Generator, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def sample(rng: np.random.Generator) -> Regime:
    """A training regime drawn from the ranges in the module docstring."""
    groups = _log_uniform(rng, 1, 64)
    requests = max(_log_uniform(rng, 32, 2000), groups)
    return Regime(
        name="train",
        groups=groups,
        requests=requests,
        prefix_len=int(rng.choice((128, 256, 512, 1024, 2048))),
        question_len=int(rng.choice((16, 32, 64, 128))),
        output_len=int(rng.choice((16, 32, 64))),
        prefix_shared=bool(rng.integers(2)),
        kv_groups=None if rng.random() < 0.4 else float(rng.uniform(1.0, 3.0)),
        max_running=int(rng.choice((16, 64, 256, 4096))),
        load=None if rng.random() < 0.5 else float(rng.uniform(0.6, 1.5)),
        zipf=0.0 if rng.random() < 0.5 else 1.0,
    )
