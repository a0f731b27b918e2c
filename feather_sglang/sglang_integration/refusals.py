"""Server configurations feather refuses at start-up (``docs/reliability.md``)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

# Agents that use no step times: the ones every tensor-parallel rank is sure to take alike.
RANK_SAFE_AGENTS = ("admit", "static")


def policy_refusals(server_args, agent: str | None = None) -> list[str]:
    """Why ``--schedule-policy feather`` cannot run with these arguments and ``agent``."""
    out = []
    tp = getattr(server_args, "tp_size", 1) or 1
    if tp > 1 and agent is not None and agent.split(":")[0] not in RANK_SAFE_AGENTS:
        out.append(
            f"--feather-agent {agent} learns from the step times each tensor-parallel rank measures on "
            f"its own clock, so with --tp-size {server_args.tp_size} the ranks could admit different "
            f"batches; allowed with --tp-size > 1: {', '.join(RANK_SAFE_AGENTS)}"
        )
    if getattr(server_args, "enable_priority_scheduling", False):
        out.append(
            "--schedule-policy feather cannot be combined with --enable-priority-scheduling: feather "
            "orders the queue by shared prefix (with a starvation bound, --feather-max-wait-s); "
            "SGLang's priority scheduling works with fcfs or lof only"
        )
    if (getattr(server_args, "pp_size", 1) or 1) > 1:
        out.append(
            f"--schedule-policy feather does not support pipeline parallelism (--pp-size "
            f"{server_args.pp_size}): SGLang queues requests there without the hooks feather keeps "
            "its queue with; allowed: --pp-size 1 (tensor and data parallelism are fine)"
        )
    mode = getattr(server_args, "disaggregation_mode", "null")
    if mode not in (None, "null"):
        out.append(
            f"--schedule-policy feather does not support PD disaggregation (--disaggregation-mode {mode}); "
            "allowed: --disaggregation-mode null"
        )
    if getattr(server_args, "dllm_algorithm", None):
        out.append(
            f"--schedule-policy feather does not support diffusion language models (--dllm-algorithm "
            f"{server_args.dllm_algorithm}); use it with autoregressive models"
        )
    return out


def backend_refusals(server_args) -> list[str]:
    """Why ``--attention-backend feather`` cannot run with these arguments and their model."""
    out = []
    kv = str(getattr(server_args, "kv_cache_dtype", "auto") or "auto")
    if kv.startswith(("fp8", "fp4")):
        out.append(
            f"--attention-backend feather does not support --kv-cache-dtype {kv}; allowed: auto, "
            "bfloat16, float16, float32"
        )
    if getattr(server_args, "speculative_algorithm", None):
        out.append(
            f"--attention-backend feather does not support speculative decoding (--speculative-algorithm "
            f"{server_args.speculative_algorithm}): its verify masks are not implemented"
        )
    return out + model_refusals(local_hf_config(server_args.model_path))


def model_refusals(hf_config: dict | None) -> list[str]:
    """Attention features of a model (its config.json) that feather's backend does not implement."""
    if not hf_config:
        return []
    out = []
    if hf_config.get("attn_logit_softcapping"):
        out.append(
            f"--attention-backend feather does not implement attention logit soft-capping "
            f"(this model's attn_logit_softcapping={hf_config['attn_logit_softcapping']}); "
            "use SGLang's own backends for it"
        )
    if (
        hf_config.get("model_type") == "gpt_oss"
        or hf_config.get("attention_sinks")
        or hf_config.get("sink_size")
    ):
        out.append(
            "--attention-backend feather does not implement attention sinks (this model has them); "
            "use SGLang's own backends for it"
        )
    return out


def local_hf_config(model_path: str | None) -> dict | None:
    """The model's config.json when ``model_path`` is a local directory; None otherwise."""
    try:
        return json.loads((Path(model_path) / "config.json").read_text()) if model_path else None
    except (OSError, ValueError):
        return None


def missing_hooks() -> list[str]:
    """The scheduler seams whose hooks SGLang's HookRegistry did not apply (it only logs that)."""
    from feather_sglang.sglang_integration.policy import SCHEDULER_HOOKS, FeatherSchedulePolicy

    module = "sglang.srt.managers.scheduler"
    scheduler = importlib.import_module(module)
    missing = (
        [] if scheduler.SchedulePolicy is FeatherSchedulePolicy else [f"{module}.SchedulePolicy"]
    )
    for method in SCHEDULER_HOOKS:
        if not hasattr(getattr(scheduler.Scheduler, method, None), "__wrapped__"):
            missing.append(f"{module}.Scheduler.{method}")
    return missing
