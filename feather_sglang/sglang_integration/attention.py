"""``--attention-backend feather``: torch_native with prefix-shared decode and extend attention
(how it works: ``docs/attention-backend.md``)."""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from feather_kernels import dispatch
from feather_sglang.sglang_integration.faults import FaultLog

logger = logging.getLogger(__name__)
BACKEND_NAME = "feather"


class FeatherAttnBackend(TorchNativeAttnBackend):
    def __init__(self, model_runner) -> None:
        super().__init__(model_runner)
        self._decode_plan = self._extend_plan = None
        # A fault in the prefix-shared paths turns them off for good (torch_native's code serves).
        self.faults = FaultLog("feather attention backend")
        self.fallen_back = False
        logger.info(
            "feather attention backend: prefix-shared decode and extend (%s path)",
            dispatch.decode_impl(torch.device(self.device)),  # set by TorchNativeAttnBackend
        )

    def init_forward_metadata(self, forward_batch) -> None:
        super().init_forward_metadata(forward_batch)
        self._decode_plan = self._extend_plan = None
        batch = forward_batch
        if batch.encoder_lens is not None or self.fallen_back:
            return
        try:  # each plan is None when nothing is shared: torch_native's per-request path
            table = self.req_to_token_pool.req_to_token
            if batch.forward_mode.is_extend() and batch.extend_prefix_lens is not None:
                self._extend_plan = dispatch.plan_extend_batch(
                    table, batch.req_pool_indices, batch.extend_prefix_lens, batch.extend_seq_lens
                )
            elif batch.forward_mode.is_decode():
                self._decode_plan = dispatch.plan_decode_batch(
                    table, batch.req_pool_indices, batch.seq_lens
                )
        except Exception as exc:  # noqa: BLE001 - torch_native serves instead
            self._fall_back(exc)

    def _fall_back(self, exc: Exception) -> None:
        self._decode_plan = self._extend_plan = None
        self.fallen_back = True
        self.faults.record("backend", exc, "torch_native's attention serves from now on")

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
        shared = encoder_lens is None and not is_cross_attn and sliding_window_size is None
        return self._attend(
            self._decode_plan if shared else None,
            dispatch.run_decode,
            super()._run_sdpa_forward_decode,
            (query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens),
            encoder_lens,
            scaling=scaling,
            enable_gqa=enable_gqa,
            causal=causal,
            is_cross_attn=is_cross_attn,
            sliding_window_size=sliding_window_size,
        )

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
        shared = (
            causal and encoder_lens is None and not is_cross_attn and sliding_window_size is None
        )
        args = query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens
        return self._attend(
            self._extend_plan if shared else None,
            dispatch.run_extend,
            super()._run_sdpa_forward_extend,
            (*args, extend_prefix_lens, extend_seq_lens),
            encoder_lens,
            scaling=scaling,
            enable_gqa=enable_gqa,
            causal=causal,
            is_cross_attn=is_cross_attn,
            sliding_window_size=sliding_window_size,
        )

    def _attend(self, plan, run, stock, args, encoder_lens, scaling, **flags):
        """The prefix-shared path ``run`` with ``plan``; torch_native's ``stock`` where there is no
        plan, or after a fault. ``args`` start with the query and the output."""
        if plan is None:
            return stock(*args, encoder_lens, scaling=scaling, **flags)
        scale = scaling if scaling is not None else args[0].shape[-1] ** -0.5
        try:
            self.faults.check("backend")
            run(plan, *args, scale)
        except Exception as exc:  # noqa: BLE001
            self._fall_back(exc)
            return stock(*args, encoder_lens, scaling=scaling, **flags)
        return args[1]


def register(registry_module) -> None:
    """Run once ``sglang.srt.layers.attention.attention_registry`` is imported."""
    if BACKEND_NAME not in registry_module.ATTENTION_BACKENDS:
        registry_module.register_attention_backend(BACKEND_NAME)(
            lambda runner: FeatherAttnBackend(runner)
        )
