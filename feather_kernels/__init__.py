"""Prefix-shared decode and extend attention over SGLang's KV pool layout.

Three implementations of the same operation, one file each:

* :mod:`feather_kernels.groups` - which requests share leading KV slots.
* :mod:`feather_kernels.reference` - plain torch, one request at a time (the oracle).
* :mod:`feather_kernels.prefix_shared_cpu` - vectorised torch: each group's shared prefix
  once as a matrix product, each request's own suffix batched, merged by log-sum-exp.
* :mod:`feather_kernels.prefix_shared_extend_cpu` - the same for extend (prefill on a
  cached prefix): all the group's new tokens against the shared prefix at once, plus each
  request's own tokens causally.
* :mod:`feather_kernels.prefix_shared_triton` - one Triton launch with horizontal fusion
  (prefix programs and suffix programs) plus a small merge kernel; extend runs through it with
  each new token as one query. Imported lazily: importing this package never imports triton.
* :mod:`feather_kernels.dispatch` - which path runs (Triton on CUDA tensors, torch
  elsewhere), with one plan per forward batch reused by every layer: what
  ``--attention-backend feather`` calls.

The import name is ``feather_kernels``, not ``kernels``: sglang depends on a PyPI package
called ``kernels`` that a top-level ``kernels`` here would shadow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from feather_kernels.groups import MIN_SHARED_PREFIX, PrefixGroup, find_prefix_groups
from feather_kernels.prefix_shared_cpu import (
    DecodePlan,
    merge_state,
    plan_decode,
    prefix_shared_decode,
)
from feather_kernels.prefix_shared_extend_cpu import find_extend_groups, prefix_shared_extend
from feather_kernels.reference import decode_attention_reference, extend_attention_reference

if TYPE_CHECKING:
    from feather_kernels.prefix_shared_triton import (
        prefix_shared_decode_triton,
        prefix_shared_extend_triton,
    )

__all__ = [
    "DecodePlan",
    "MIN_SHARED_PREFIX",
    "PrefixGroup",
    "decode_attention_reference",
    "extend_attention_reference",
    "find_extend_groups",
    "find_prefix_groups",
    "merge_state",
    "plan_decode",
    "prefix_shared_decode",
    "prefix_shared_extend",
    "prefix_shared_decode_triton",
    "prefix_shared_extend_triton",
]


def __getattr__(name: str) -> Any:
    # NOTE: the Triton module is imported on first use only, so that `import feather_kernels`
    # works without triton and TRITON_INTERPRET can still be set by whoever imports it first.
    if name in ("prefix_shared_decode_triton", "prefix_shared_extend_triton"):
        from feather_kernels import prefix_shared_triton

        return getattr(prefix_shared_triton, name)
    raise AttributeError(f"module 'feather_kernels' has no attribute {name!r}")
