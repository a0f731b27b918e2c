"""``--attention-backend feather``: torch_native with prefix-shared decode and extend attention.

Decode reads each group's shared prefix KV once for all the group's requests and merges it
with each request's own suffix by log-sum-exp: on CPU tensors with the vectorised torch path
(:mod:`feather_kernels.prefix_shared_cpu`), on CUDA tensors with the fused Triton kernel
(:mod:`feather_kernels.prefix_shared_triton`). Extend (prefill over a cached prefix) attends
each group's cached prefix once for all its new tokens, plus causally within each request's
own tokens, merged the same way: on CPU with :mod:`feather_kernels.prefix_shared_extend_cpu`,
on CUDA with the same Triton launch, each new token one query. Groups are found once per
forward batch from the requests' leading KV slot ids (a radix-cache hit gives sharing requests
the same slot ids) and reused by every layer (:mod:`feather_kernels.dispatch`).
Cross-attention, sliding-window layers, and batches with nothing shared run torch_native's own
code.

NOTE: the Triton path has run under ``TRITON_INTERPRET=1`` only (no GPU was available to
this project yet); ``scripts/gpu_check.sh`` tests it on a GPU.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from feather_kernels.dispatch import (
    decode_impl,
    plan_decode_batch,
    plan_extend_batch,
    run_decode,
    run_extend,
)
from feather_sglang.sglang_integration.faults import FaultLog

logger = logging.getLogger(__name__)
BACKEND_NAME = "feather"


class FeatherAttnBackend(TorchNativeAttnBackend):
    def __init__(self, model_runner) -> None:
        super().__init__(model_runner)
        self._decode_plan = None
        self._extend_plan = None
        # NOTE: a fault in the prefix-shared paths turns them off for good: torch_native's
        # code, the reference these paths match, serves every later step (and redoes the
        # failed one, which overwrites the whole output).
        self.faults = FaultLog("feather attention backend")
        self.fallen_back = False
        device = torch.device(self.device)  # set by TorchNativeAttnBackend
        logger.info(
            "feather attention backend: prefix-shared decode and extend (%s path)",
            decode_impl(device),
        )

    def init_forward_metadata(self, forward_batch) -> None:
        super().init_forward_metadata(forward_batch)
        self._decode_plan = self._extend_plan = None
        if forward_batch.encoder_lens is not None or self.fallen_back:
            return
        try:
            self._plan(forward_batch)
        except Exception as exc:  # noqa: BLE001 - torch_native serves instead
            self._fall_back(exc)

    def _fall_back(self, exc: Exception) -> None:
        self._decode_plan = self._extend_plan = None
        self.fallen_back = True
        self.faults.record("backend", exc, "torch_native's attention serves from now on")

    def _plan(self, forward_batch) -> None:
        if forward_batch.forward_mode.is_extend() and forward_batch.extend_prefix_lens is not None:
            # None when nothing is shared: torch_native's per-request path.
            self._extend_plan = plan_extend_batch(
                self.req_to_token_pool.req_to_token,
                forward_batch.req_pool_indices,
                forward_batch.extend_prefix_lens,
                forward_batch.extend_seq_lens,
            )
        elif forward_batch.forward_mode.is_decode():
            # None when nothing is shared: torch_native's per-request path.
            self._decode_plan = plan_decode_batch(
                self.req_to_token_pool.req_to_token,
                forward_batch.req_pool_indices,
                forward_batch.seq_lens,
            )

    def _run_sdpa_forward_decode(
        self,
        query,
        output,
        k_cache,
        v_cache,
        req_to_token,
        req_pool_indices,
        seq_lens,
        encoder_lens=None,
        scaling=None,
        enable_gqa=False,
        causal=False,
        is_cross_attn=False,
        sliding_window_size=None,
    ):
        plan = self._decode_plan
        if (
            plan is None
            or encoder_lens is not None
            or is_cross_attn
            or sliding_window_size is not None
        ):
            return super()._run_sdpa_forward_decode(
                query,
                output,
                k_cache,
                v_cache,
                req_to_token,
                req_pool_indices,
                seq_lens,
                encoder_lens,
                scaling=scaling,
                enable_gqa=enable_gqa,
                causal=causal,
                is_cross_attn=is_cross_attn,
                sliding_window_size=sliding_window_size,
            )
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        try:
            self.faults.check("backend")
            run_decode(
                plan,
                query,
                output,
                k_cache,
                v_cache,
                req_to_token,
                req_pool_indices,
                seq_lens,
                scale,
            )
        except Exception as exc:  # noqa: BLE001
            self._fall_back(exc)
            return self._run_sdpa_forward_decode(
                query,
                output,
                k_cache,
                v_cache,
                req_to_token,
                req_pool_indices,
                seq_lens,
                encoder_lens,
                scaling,
                enable_gqa,
                causal,
                is_cross_attn,
                sliding_window_size,
            )
        return output

    def _run_sdpa_forward_extend(
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
        encoder_lens=None,
        scaling=None,
        enable_gqa=False,
        causal=False,
        is_cross_attn=False,
        sliding_window_size=None,
    ):
        plan = self._extend_plan
        if (
            plan is None
            or not causal
            or encoder_lens is not None
            or is_cross_attn
            or sliding_window_size is not None
        ):
            return super()._run_sdpa_forward_extend(
                query,
                output,
                k_cache,
                v_cache,
                req_to_token,
                req_pool_indices,
                seq_lens,
                extend_prefix_lens,
                extend_seq_lens,
                encoder_lens,
                scaling=scaling,
                enable_gqa=enable_gqa,
                causal=causal,
                is_cross_attn=is_cross_attn,
                sliding_window_size=sliding_window_size,
            )
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        try:
            self.faults.check("backend")
            run_extend(
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
            )
        except Exception as exc:  # noqa: BLE001
            self._fall_back(exc)
            return self._run_sdpa_forward_extend(
                query,
                output,
                k_cache,
                v_cache,
                req_to_token,
                req_pool_indices,
                seq_lens,
                extend_prefix_lens,
                extend_seq_lens,
                encoder_lens,
                scaling,
                enable_gqa,
                causal,
                is_cross_attn,
                sliding_window_size,
            )
        return output


def register(registry_module) -> None:
    """Run once ``sglang.srt.layers.attention.attention_registry`` is imported."""
    if BACKEND_NAME not in registry_module.ATTENTION_BACKENDS:
        registry_module.register_attention_backend(BACKEND_NAME)(
            lambda runner: FeatherAttnBackend(runner)
        )
