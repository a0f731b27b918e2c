"""The observation layout shared by the RL environment and the agents that read it.

One float32 vector per candidate, every entry normalised to about [0, 1] (chunk loss to
[-1, 1]); the Gymnasium environment (``feather_rl``) emits exactly this vector and a trained
policy file records ``OBS_FIELDS`` and ``OBS_VERSION``, so a file trained on another layout
is refused when the server starts, never mid-serving.

===== =============== ============================================ ==========================
index name            meaning                                      normalised as
===== =============== ============================================ ==========================
0     batch_size      requests in the batch without the candidate  / BATCH_SCALE, clip [0, 1]
1     chunk_loss      chunks_before - chunks_after (< 0: grows)    / CHUNK_SCALE, clip [-1, 1]
2     chunks_before   shared-chain depth now, chunks               / CHUNK_SCALE, clip [0, 1]
3     chunks_after    shared-chain depth if the candidate joins    / CHUNK_SCALE, clip [0, 1]
4     waiting         waiting requests sharing the new depth       / WAITING_SCALE, clip [0, 1]
5     queue_len       requests waiting in all                      / WAITING_SCALE, clip [0, 1]
6     memory_headroom KV capacity still free (fraction)            as is, clip [0, 1]
===== =============== ============================================ ==========================
"""

from __future__ import annotations

import numpy as np

from feather_sglang.agents.base import AgentState

OBS_FIELDS = (
    "batch_size", "chunk_loss", "chunks_before", "chunks_after", "waiting", "queue_len", "memory_headroom",
)
OBS_VERSION = 1
OBS_DIM = len(OBS_FIELDS)

# NOTE: scales cover the batches a 2-core CPU or one GPU forms with feather's 50-token chunks:
# 64 running requests, 64 chunks (3200 tokens) of shared prefix, 64 waiting requests; larger
# values saturate at 1 (the policy still sees "large").
BATCH_SCALE = 64.0
CHUNK_SCALE = 64.0
WAITING_SCALE = 64.0

OBS_LOW = np.array([0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=np.float32)
OBS_HIGH = np.ones(OBS_DIM, dtype=np.float32)


def observe(state: AgentState) -> np.ndarray:
    """The observation vector of ``state``: float32, shape (OBS_DIM,)."""
    return np.array(
        (
            min(state.batch_size / BATCH_SCALE, 1.0),
            min(max(state.delta / CHUNK_SCALE, -1.0), 1.0),
            min(state.chunks_before / CHUNK_SCALE, 1.0),
            min(state.chunks_after / CHUNK_SCALE, 1.0),
            min(state.waiting / WAITING_SCALE, 1.0),
            min(state.queue_len / WAITING_SCALE, 1.0),
            min(max(state.memory_headroom, 0.0), 1.0),
        ),
        dtype=np.float32,
    )


def layout() -> dict:
    """What a trained policy file records about the observations it was trained on."""
    return {
        "obs_version": OBS_VERSION, "obs_fields": list(OBS_FIELDS),
        "scales": {"batch": BATCH_SCALE, "chunk": CHUNK_SCALE, "waiting": WAITING_SCALE},
    }
