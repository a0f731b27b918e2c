"""A dispatched batch, what determines its decode throughput, and one measurement of it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from feather_sglang.chunk_hash import chunk_hashes

# NOTE: the same 50-token chunks as the scheduler's CHT: sharing finer than a chunk is not what
# the radix cache reuses across a group anyway (it matches whole pages of a prefix).
SHARING_CHUNK = 50


@dataclass(frozen=True, slots=True)
class BatchKey:
    """What the decode throughput of a batch depends on (given model, backend and machine).

    batch_size:     requests decoding together.
    mean_prompt:    mean prompt length, tokens (the KV each decode step reads, per request).
    shared_frac:    1 - distinct prompt tokens / all prompt tokens, at SHARING_CHUNK granularity:
                    0 when no two prompts share a chunk, (n-1)/n for n identical prompts. It sees
                    every group of a mixed batch, not only the prefix common to all.
    """

    batch_size: int
    mean_prompt: float
    shared_frac: float

    @classmethod
    def of(cls, prompts: list[tuple[int, ...]] | tuple[tuple[int, ...], ...]) -> "BatchKey":
        total = sum(len(p) for p in prompts)
        distinct: dict[
            tuple[int, int], int
        ] = {}  # (level, cumulative hash) -> tokens in that chunk
        for p in prompts:
            for level, key in enumerate(chunk_hashes(p, SHARING_CHUNK)):
                distinct[(level, key)] = min(SHARING_CHUNK, len(p) - level * SHARING_CHUNK)
        shared = 1.0 - sum(distinct.values()) / total if total else 0.0
        return cls(len(prompts), total / max(len(prompts), 1), round(max(shared, 0.0), 4))

    def coords(self) -> tuple[float, float, float]:
        """Where the key sits for nearest-neighbour lookups: log2 batch size, log2 mean prompt
        length (a doubling is one unit on both), and 4 x shared fraction (0.25 apart is one unit)."""
        return (
            math.log2(max(self.batch_size, 1)),
            math.log2(max(self.mean_prompt, 1.0)),
            4.0 * self.shared_frac,
        )


@dataclass(frozen=True, slots=True)
class Measurement:
    """Decode throughput of one batch: ``decode_tokens`` output tokens of all its requests in
    ``decode_s`` seconds, once every request had its first token."""

    key: BatchKey
    decode_tokens: int
    decode_s: float
    output_len: int  # max_new_tokens of each request
    backend: str

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s

    def to_json(self) -> dict:
        return {
            **asdict(self.key),
            "decode_tokens": self.decode_tokens,
            "decode_s": round(self.decode_s, 6),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "output_len": self.output_len,
            "backend": self.backend,
        }

    @classmethod
    def from_json(cls, obj: dict) -> "Measurement":
        key = BatchKey(int(obj["batch_size"]), float(obj["mean_prompt"]), float(obj["shared_frac"]))
        return cls(
            key,
            int(obj["decode_tokens"]),
            float(obj["decode_s"]),
            int(obj["output_len"]),
            obj["backend"],
        )
