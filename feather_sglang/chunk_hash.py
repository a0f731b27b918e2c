"""Cumulative per-chunk hashes of a token sequence, the CHT's keys (``docs/design.md``)."""

from __future__ import annotations

import array
import struct
from collections.abc import Iterable

import numpy as np
import xxhash

# Seed of chunk 0: non-zero, so chunk 0's hash is not the plain unseeded xxh3 of its bytes.
CHUNK_HASH_ROOT_SEED = 0x6665617468657221  # b"feather!"

# Keys keep xxh3-64's low 60 bits: CPython holds an int below 2**60 in 32 bytes, not 36.
KEY_MASK = (1 << 60) - 1

_TOKEN_DTYPE = np.dtype("<i8")
_TOKEN_BYTES = _TOKEN_DTYPE.itemsize


def token_bytes(token_ids: Iterable[int] | np.ndarray) -> bytes | memoryview:
    """The token ids as one buffer of little-endian int64 (an ``array('q')`` read in place)."""
    if isinstance(token_ids, array.array):
        empty = not token_ids
        token_ids = (
            np.empty(0, _TOKEN_DTYPE) if empty else np.frombuffer(token_ids, token_ids.typecode)
        )
    if isinstance(token_ids, np.ndarray):
        if token_ids.ndim != 1:
            raise ValueError(f"token_ids must be 1-D, got shape {token_ids.shape}")
        if token_ids.dtype.kind not in "iu":
            raise ValueError(f"token_ids must hold integers, got dtype {token_ids.dtype}")
        tokens = np.ascontiguousarray(token_ids, dtype=_TOKEN_DTYPE)
        return memoryview(tokens).cast("B")
    if not isinstance(token_ids, (list, tuple)):
        token_ids = list(token_ids)
    try:
        return struct.Struct(f"<{len(token_ids)}q").pack(*token_ids)
    except struct.error as exc:
        raise ValueError(f"token_ids must be int64-representable integers: {exc}") from None


def chunk_hashes(token_ids: Iterable[int] | np.ndarray, chunk_size: int) -> list[int]:
    """Cumulative 60-bit hashes of ``token_ids``' chunks: entry ``i`` covers chunks ``0..i``."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 token, got {chunk_size}")
    return hash_chunks_from(token_bytes(token_ids), chunk_size, 0, CHUNK_HASH_ROOT_SEED)


def hash_chunk(buffer: bytes | memoryview, chunk_size: int, index: int, seed: int) -> int:
    """The cumulative hash of chunk ``index`` of ``buffer``; ``seed``: chunk ``index - 1``'s."""
    chunk_bytes = chunk_size * _TOKEN_BYTES
    start = index * chunk_bytes
    return xxhash.xxh3_64_intdigest(buffer[start : start + chunk_bytes], seed=seed) & KEY_MASK


def hash_chunks_from(buffer: bytes | memoryview, chunk_size: int, first: int, seed: int) -> list:
    """The cumulative hashes of ``buffer``'s chunks from ``first``; ``seed``: ``first - 1``'s."""
    chunk_bytes = chunk_size * _TOKEN_BYTES
    digest, hashes, previous = xxhash.xxh3_64_intdigest, [], seed
    for start in range(first * chunk_bytes, len(buffer), chunk_bytes):  # one xxh3 call a chunk
        previous = digest(buffer[start : start + chunk_bytes], seed=previous) & KEY_MASK
        hashes.append(previous)
    return hashes
