"""The observation of the RL environments and the trained agents (``docs/rl.md``)."""

from __future__ import annotations

import math

import numpy as np

from feather_sglang.agents.base import AgentState
from feather_sglang.agents.throughput import StepTimeModel, group_gain

OBS_FIELDS = (
    "batch_fill",
    "chunk_loss",
    "chunks_before",
    "chunks_after",
    "waiting",
    "queue_len",
    "memory_headroom",
    "group_kv_need",
    "group_share",
    "predicted_gain",
    "prefix_shared",
    "own_fraction",
)
OBS_VERSION = 2
OBS_DIM = len(OBS_FIELDS)

# Log scales up to 1024 chunks and 4096 requests; larger values saturate at 1.
CHUNK_SCALE = 1024.0
COUNT_SCALE = 4096.0
_LOG_CHUNK = math.log1p(CHUNK_SCALE)
_LOG_COUNT = math.log1p(COUNT_SCALE)


def observe(state: AgentState, model: StepTimeModel) -> np.ndarray:
    """The observation vector of ``state`` under ``model``: float32, shape (OBS_DIM,)."""
    batch, free = state.batch_size, max(state.free_slots, 1)
    if batch:
        group_kv, gain = group_gain(model, state)
    else:
        group_kv, gain = state.new_tokens, 1.5
    kv_free = state.kv_free_tokens
    need = 0.0 if kv_free < 0 else min(group_kv / max(kv_free, 1) / 2.0, 1.0)
    return np.array(
        (
            batch / (batch + free),
            min(max(state.delta / CHUNK_SCALE, -1.0), 1.0),
            min(math.log1p(state.chunks_before) / _LOG_CHUNK, 1.0),
            min(math.log1p(state.chunks_after) / _LOG_CHUNK, 1.0),
            min(math.log1p(state.waiting) / _LOG_COUNT, 1.0),
            min(math.log1p(state.queue_len) / _LOG_COUNT, 1.0),
            min(max(state.memory_headroom, 0.0), 1.0),
            need,
            min(state.group_waiting, free) / free,
            min(max(gain - 0.5, 0.0), 1.0),
            1.0 if model.prefix_shared else 0.0,
            state.own_tokens / state.prompt_tokens if state.prompt_tokens else 1.0,
        ),
        dtype=np.float32,
    )
