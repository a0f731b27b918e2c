"""``--attention-backend feather``: prefix-shared torch_native (``docs/attention-backend.md``)."""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from feather_kernels import dispatch
from feather_sglang.sglang_integration.faults import FaultLog

logger = logging.getLogger(__name__)
BACKEND_NAME = "feather"
# Positional tensors of torch_native's _run_sdpa_forward_decode/_extend before ``encoder_lens``.
DECODE_TENSORS, EXTEND_TENSORS = 7, 9


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

    def _run_sdpa_forward_decode(self, *args, **kwargs):
        stock = super()._run_sdpa_forward_decode
        return self._attend(
            self._decode_plan, dispatch.run_decode, stock, DECODE_TENSORS, args, kwargs
        )

    def _run_sdpa_forward_extend(self, *args, **kwargs):
        stock = super()._run_sdpa_forward_extend
        plan = self._extend_plan if kwargs.get("causal") else None
        return self._attend(plan, dispatch.run_extend, stock, EXTEND_TENSORS, args, kwargs)

    def _attend(self, plan, run, stock, n: int, args: tuple, kwargs: dict):
        """``run`` with ``plan`` on the first ``n`` arguments, else (or after a fault) ``stock``."""
        encoder_lens = args[n] if len(args) > n else kwargs.get("encoder_lens")
        if (
            plan is None
            or len(args) > n + 1  # a flag passed by position: not how SGLang calls it
            or encoder_lens is not None
            or kwargs.get("is_cross_attn")
            or kwargs.get("sliding_window_size") is not None
        ):
            return stock(*args, **kwargs)
        scaling = kwargs.get("scaling")
        try:
            run(plan, *args[:n], scaling if scaling is not None else args[0].shape[-1] ** -0.5)
        except Exception as exc:  # noqa: BLE001
            self._fall_back(exc)
            return stock(*args, **kwargs)
        return args[1]


def register(registry_module) -> None:
    """Run once ``sglang.srt.layers.attention.attention_registry`` is imported."""
    if BACKEND_NAME not in registry_module.ATTENTION_BACKENDS:
        registry_module.register_attention_backend(BACKEND_NAME)(FeatherAttnBackend)
