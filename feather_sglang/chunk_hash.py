"""Cumulative per-chunk hashes of a token sequence, the keys of the Chunked Hash Tree
(``docs/design.md``, "Chunk hashes")."""

from __future__ import annotations

import array
import struct
from collections.abc import Iterable

import numpy as np
import xxhash

# Seed of chunk 0: non-zero, so chunk 0's hash is not the plain unseeded xxh3 of its bytes.
CHUNK_HASH_ROOT_SEED = 0x6665617468657221  # b"feather!"

_TOKEN_DTYPE = np.dtype("<i8")
_TOKEN_BYTES = _TOKEN_DTYPE.itemsize


def token_bytes(token_ids: Iterable[int] | np.ndarray) -> bytes | memoryview:
    """The token ids as one buffer of little-endian int64, 8 bytes a token (SGLang's
    ``array('q')`` is read in place); ``np.frombuffer(token_bytes(ids), "<i8")`` views it."""
    if isinstance(token_ids, array.array):
        token_ids = (
            np.frombuffer(token_ids, dtype=token_ids.typecode)
            if token_ids
            else np.empty(0, _TOKEN_DTYPE)
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
    """Cumulative 64-bit hashes of ``token_ids`` (ints, or a 1-D integer numpy array) cut into
    chunks of ``chunk_size`` >= 1 tokens: ``ceil(n / chunk_size)`` of them, entry ``i`` covering
    chunks ``0..i``."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 token, got {chunk_size}")
    return hash_chunks_from(token_bytes(token_ids), chunk_size, 0, CHUNK_HASH_ROOT_SEED)


def hash_chunk(buffer: bytes | memoryview, chunk_size: int, index: int, seed: int) -> int:
    """The cumulative hash of chunk ``index`` of ``buffer`` given ``seed``, the hash of chunk
    ``index - 1`` (``CHUNK_HASH_ROOT_SEED`` for chunk 0)."""
    chunk_bytes = chunk_size * _TOKEN_BYTES
    start = index * chunk_bytes
    return xxhash.xxh3_64_intdigest(buffer[start : start + chunk_bytes], seed=seed)


def hash_chunks_from(
    buffer: bytes | memoryview, chunk_size: int, first: int, seed: int
) -> list[int]:
    """The cumulative hashes of chunks ``first, first + 1, ...`` of ``buffer`` (from
    :func:`token_bytes`), given ``seed``: the hash of chunk ``first - 1``
    (``CHUNK_HASH_ROOT_SEED`` when ``first`` is 0). ``chunk_hashes`` is ``first = 0``."""
    chunk_bytes = chunk_size * _TOKEN_BYTES
    digest = xxhash.xxh3_64_intdigest
    hashes: list[int] = []
    previous = seed
    # One xxh3 call per chunk, not per token.
    for start in range(first * chunk_bytes, len(buffer), chunk_bytes):
        previous = digest(buffer[start : start + chunk_bytes], seed=previous)
        hashes.append(previous)
    return hashes
