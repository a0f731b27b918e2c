"""The observation layout shared by the RL environments and the agents that read it.

One float32 vector per candidate, every entry normalised to [0, 1] (chunk loss to [-1, 1]);
the Gymnasium environments (``feather_rl``) emit exactly this vector and a trained policy
file records ``OBS_FIELDS`` and ``OBS_VERSION``, so a file trained on another layout is
refused when the server starts, never mid-serving.

===== ================ =========================================== ==========================
index name             meaning                                     normalised as
===== ================ =========================================== ==========================
0     batch_fill       batch size / (batch size + free slots)      as is
1     chunk_loss       chunks_before - chunks_after (< 0: grows)   / CHUNK_SCALE, clip [-1, 1]
2     chunks_before    shared-chain depth now, chunks              log1p / log1p(CHUNK_SCALE)
3     chunks_after     shared-chain depth if the candidate joins   log1p / log1p(CHUNK_SCALE)
4     waiting          waiting requests sharing the new depth      log1p / log1p(COUNT_SCALE)
5     queue_len        requests waiting in all                     log1p / log1p(COUNT_SCALE)
6     memory_headroom  KV capacity still free (fraction)           as is, clip [0, 1]
7     group_kv_need    the group's KV / KV free or evictable       / 2, clip [0, 1] (> 0.5: no fit)
8     group_share      followers that fit: min(group, free) / free as is
9     predicted_gain   throughput with the group / without it      (gain - 0.5), clip [0, 1]
10    prefix_shared    the backend reads a shared prefix once      0 or 1
11    own_fraction     candidate's own tokens / its prompt          as is
===== ================ =========================================== ==========================

``predicted_gain`` comes from the agent's step-time model
(:func:`feather_sglang.agents.throughput.group_gain`), refined online from the server's
measured decode steps: the policy learns when the model's prediction is worth following.
"""

from __future__ import annotations

import math

import numpy as np

from feather_sglang.agents.base import AgentState
from feather_sglang.agents.step_model import StepTimeModel
from feather_sglang.agents.throughput import group_gain

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

# NOTE: chunk depths up to 1024 chunks (51K tokens at 50 per chunk) and counts up to 4096
# requests keep their resolution on a log scale; larger values saturate at 1.
CHUNK_SCALE = 1024.0
COUNT_SCALE = 4096.0
_LOG_CHUNK = math.log1p(CHUNK_SCALE)
_LOG_COUNT = math.log1p(COUNT_SCALE)

OBS_LOW = np.zeros(OBS_DIM, dtype=np.float32)
OBS_LOW[1] = -1.0
OBS_HIGH = np.ones(OBS_DIM, dtype=np.float32)


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


def layout() -> dict:
    """What a trained policy file records about the observations it was trained on."""
    return {
        "obs_version": OBS_VERSION,
        "obs_fields": list(OBS_FIELDS),
        "scales": {"chunk": CHUNK_SCALE, "count": COUNT_SCALE},
    }
