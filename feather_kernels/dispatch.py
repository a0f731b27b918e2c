"""Which prefix-shared implementation runs, driven the way an attention backend drives it: one
plan per forward batch (:func:`plan_decode_batch`, :func:`plan_extend_batch`), reused by every
layer (:func:`run_decode`, :func:`run_extend`). The vectorised torch paths on CPU tensors, the
fused Triton kernel on CUDA tensors (extend: each new token as one query of the decode launch,
see :class:`feather_kernels.prefix_shared_triton.TritonExtendPlan`); ``FEATHER_ATTENTION_IMPL``
forces either (tests run the Triton path on CPU tensors under ``TRITON_INTERPRET=1``). Free of
SGLang, so a GPU machine without SGLang can test it (``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from feather_kernels.groups import PrefixGroup, find_prefix_groups
from feather_kernels.prefix_shared_cpu import plan_decode, prefix_shared_decode
from feather_kernels.prefix_shared_extend_cpu import find_extend_groups, prefix_shared_extend

# Forces the Triton decode kernel on any device ("triton") or the torch path ("torch");
# unset: Triton on CUDA tensors, torch elsewhere. Tests run the Triton path on CPU tensors
# under TRITON_INTERPRET=1 with it.
IMPL_ENV = "FEATHER_ATTENTION_IMPL"


def decode_impl(device: torch.device) -> str:
    """ "triton" or "torch": which decode implementation runs on ``device``."""
    forced = os.environ.get(IMPL_ENV, "").strip().lower()
    if forced not in ("", "triton", "torch"):
        raise ValueError(f"{IMPL_ENV}={forced!r}: allowed values are 'triton', 'torch' or unset")
    return forced or ("triton" if device.type == "cuda" else "torch")


@dataclass
class TritonDecode:
    """One decode batch's groups for the fused Triton kernel; its work tables (which need the
    layer's head counts) are built by the first layer and reused by the others."""

    groups: list[PrefixGroup]
    plan: Optional[object] = None

    def run(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, scale):
        from feather_kernels.prefix_shared_triton import (
            plan_decode_triton,
            prefix_shared_decode_triton,
        )

        if self.plan is None:
            self.plan = plan_decode_triton(
                req_to_token,
                req_pool_indices,
                seq_lens,
                query.shape[1] // k_cache.shape[1],
                self.groups,
            )
        return prefix_shared_decode_triton(
            query,
            k_cache,
            v_cache,
            req_to_token,
            req_pool_indices,
            seq_lens,
            scale,
            out=output,
            plan=self.plan,
        )


def plan_decode_batch(req_to_token, req_pool_indices, seq_lens):
    """What the backend keeps for one decode batch: a CPU :class:`DecodePlan`, a
    :class:`TritonDecode`, or None when no requests share a prefix (torch_native's loop)."""
    if decode_impl(req_to_token.device) == "triton":
        groups = find_prefix_groups(req_to_token, req_pool_indices, seq_lens)
        return TritonDecode(groups) if any(g.prefix_len > 0 for g in groups) else None
    plan = plan_decode(req_to_token, req_pool_indices, seq_lens)
    return plan if plan.prefix else None


def run_decode(
    plan, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, scale
):
    """One layer's decode attention into ``output`` with a plan from :func:`plan_decode_batch`."""
    if isinstance(plan, TritonDecode):
        return plan.run(
            query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, scale
        )
    return prefix_shared_decode(
        query,
        k_cache,
        v_cache,
        req_to_token,
        req_pool_indices,
        seq_lens,
        scale,
        out=output,
        plan=plan,
    )


@dataclass
class TritonExtend:
    """One extend batch's groups for the Triton launch; its plan (which needs the layer's head
    counts) is built by the first layer and reused by the others."""

    groups: list[PrefixGroup]
    plan: Optional[object] = None

    def run(
        self,
        query,
        output,
        k_cache,
        v_cache,
        req_to_token,
        req_pool_indices,
        seq_lens,
        extend_prefix_lens,
        extend_seq_lens,
        scale,
    ):
        from feather_kernels.prefix_shared_triton import (
            plan_extend_triton,
            prefix_shared_extend_triton,
        )

        if self.plan is None:
            self.plan = plan_extend_triton(
                req_to_token,
                req_pool_indices,
                extend_prefix_lens,
                extend_seq_lens,
                query.shape[1] // k_cache.shape[1],
                self.groups,
            )
        return prefix_shared_extend_triton(
            query,
            k_cache,
            v_cache,
            req_to_token,
            req_pool_indices,
            seq_lens,
            extend_prefix_lens,
            extend_seq_lens,
            scale,
            out=output,
            plan=self.plan,
        )


def plan_extend_batch(req_to_token, req_pool_indices, extend_prefix_lens, extend_seq_lens):
    """What the backend keeps for one extend batch: the groups (torch path), a
    :class:`TritonExtend`, or None where nothing is shared (torch_native's loop)."""
    groups = find_extend_groups(req_to_token, req_pool_indices, extend_prefix_lens)
    if not any(g.prefix_len > 0 for g in groups):
        return None
    return TritonExtend(groups) if decode_impl(req_to_token.device) == "triton" else groups


def run_extend(
    plan,
    query,
    output,
    k_cache,
    v_cache,
    req_to_token,
    req_pool_indices,
    seq_lens,
    extend_prefix_lens,
    extend_seq_lens,
    scale,
):
    """One layer's extend attention into ``output`` with a plan from :func:`plan_extend_batch`."""
    if isinstance(plan, TritonExtend):
        return plan.run(
            query,
            output,
            k_cache,
            v_cache,
            req_to_token,
            req_pool_indices,
            seq_lens,
            extend_prefix_lens,
            extend_seq_lens,
            scale,
        )
    return prefix_shared_extend(
        query,
        k_cache,
        v_cache,
        req_to_token,
        req_pool_indices,
        seq_lens,
        extend_prefix_lens,
        extend_seq_lens,
        scale,
        groups=plan,
        out=output,
    )
