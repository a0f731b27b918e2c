"""Synthetic decode batches in SGLang's KV pool layout, for tests and benchmarks.

Builds what a radix-cache hit leaves behind: groups of requests whose ``req_to_token`` rows
start with the same slot ids, followed by each request's own slots; rows are placed at
shuffled pool rows and the batch order interleaves groups. Slot ids are either scattered at
random over the pool (``layout="scattered"``) or laid out as SGLang's token allocator hands
them out on a fresh server (``layout="allocator"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Slot id layouts of make_decode_batch (see its docstring).
LAYOUTS = ("scattered", "allocator")


@dataclass(frozen=True)
class DecodeBatch:
    """One layer's pool and one decode step's batch.

    q ``[B, Hq, D]``; k_buffer ``[S, Hkv, D]``; v_buffer ``[S, Hkv, Dv]``; req_to_token
    ``[R, L]`` int32; req_pool_indices ``[B]`` int64; seq_lens ``[B]`` int64; ``groups``: per
    requested group, the sorted batch indices and its shared prefix length.
    """

    q: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    groups: list[tuple[list[int], int]]

    @property
    def args(self) -> tuple:
        return (
            self.q,
            self.k_buffer,
            self.v_buffer,
            self.req_to_token,
            self.req_pool_indices,
            self.seq_lens,
            self.scale,
        )


def make_decode_batch(
    group_sizes: list[int],
    prefix_lens: list[int],
    suffix_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_rows: int = 3,
    spare_slots: int = 64,
    shuffle: bool = True,
    layout: str = "scattered",
) -> DecodeBatch:
    """Build a batch of ``sum(group_sizes)`` requests.

    Group ``g`` has ``group_sizes[g]`` requests sharing ``prefix_lens[g]`` leading slots;
    ``suffix_lens`` gives each request's own tokens, group by group (total per request
    must be ``>= 1``). Unused ``req_to_token`` entries hold random valid slot ids, so reading
    past ``seq_len`` changes the result rather than going unnoticed.

    ``layout``: ``"scattered"``, every slot id at random over the pool (the hardest case for
    reads); or ``"allocator"``, as SGLang's ``TokenToKVPoolAllocator`` (page size 1) lays out
    such a batch on a fresh server, where it hands out the head of its sorted free list: each
    group's prefix in one block of consecutive ids (prefilled once), then one id per request
    per decode step, so that own tokens interleave across the batch; id 0 stays unused (SGLang's
    padding slot).
    """
    assert len(group_sizes) == len(prefix_lens)
    B = sum(group_sizes)
    assert len(suffix_lens) == B
    gen = torch.Generator().manual_seed(seed)
    n_slots = sum(prefix_lens) + sum(suffix_lens) + spare_slots
    if layout == "scattered":
        perm = torch.randperm(n_slots, generator=gen).to(torch.int32)
    elif layout == "allocator":
        perm = _allocator_order(group_sizes, prefix_lens, suffix_lens, n_slots)
    else:
        raise ValueError(
            f"layout={layout!r}: allowed values are " + " and ".join(repr(name) for name in LAYOUTS)
        )
    max_len = max(p for p in prefix_lens) + max(suffix_lens) + 8
    R = B + spare_rows
    req_to_token = torch.randint(0, n_slots, (R, max_len), generator=gen, dtype=torch.int32)
    rows = torch.randperm(R, generator=gen)[:B]
    order = torch.randperm(B, generator=gen) if shuffle else torch.arange(B)
    seq_lens = torch.empty(B, dtype=torch.int64)
    req_pool_indices = torch.empty(B, dtype=torch.int64)
    groups: list[tuple[list[int], int]] = []
    used, r = 0, 0
    for size, P in zip(group_sizes, prefix_lens):
        prefix = perm[used : used + P]
        used += P
        members = []
        for _ in range(size):
            b = int(order[r])
            n = suffix_lens[r]
            assert P + n >= 1, "a decode request has at least one token"
            row = int(rows[r])
            req_to_token[row, :P] = prefix
            req_to_token[row, P : P + n] = perm[used : used + n]
            used += n
            seq_lens[b] = P + n
            req_pool_indices[b] = row
            members.append(b)
            r += 1
        groups.append((sorted(members), P))
    Dv = head_dim
    k_buffer = torch.randn(n_slots, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_buffer = torch.randn(n_slots, num_kv_heads, Dv, generator=gen).to(dtype)
    q = torch.randn(B, num_q_heads, head_dim, generator=gen).to(dtype)
    return DecodeBatch(
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, head_dim**-0.5, groups
    )


def _allocator_order(
    group_sizes: list[int], prefix_lens: list[int], suffix_lens: list[int], n_slots: int
) -> torch.Tensor:
    """Slot ids in the order :func:`make_decode_batch` consumes them (each group's prefix, then
    its members' own tokens, member by member) for the ``"allocator"`` layout."""
    prefixes, nxt = [], 1
    for P in prefix_lens:
        prefixes.append(torch.arange(nxt, nxt + P, dtype=torch.int32))
        nxt += P
    # Decode step t hands one id to every request that has more than t own tokens.
    own = [torch.empty(n, dtype=torch.int32) for n in suffix_lens]
    for t in range(max(suffix_lens, default=0)):
        for r, n in enumerate(suffix_lens):
            if t < n:
                own[r][t] = nxt
                nxt += 1
    assert nxt <= n_slots, "the pool needs at least one spare slot (id 0)"
    order, r = [], 0
    for size, prefix in zip(group_sizes, prefixes):
        order.append(prefix)
        order += own[r : r + size]
        r += size
    return torch.cat(order)


@dataclass(frozen=True)
class ExtendBatch:
    """One layer's pool and one extend step: ``q`` ``[T, Hq, D]`` (new tokens in batch order);
    ``extend_prefix_lens`` / ``extend_seq_lens`` ``[B]`` int64; the rest as
    :class:`DecodeBatch` (``seq_lens = extend_prefix_lens + extend_seq_lens``)."""

    q: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    extend_prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    scale: float
    groups: list[tuple[list[int], int]]

    @property
    def args(self) -> tuple:
        return (
            self.q,
            self.k_buffer,
            self.v_buffer,
            self.req_to_token,
            self.req_pool_indices,
            self.seq_lens,
            self.extend_prefix_lens,
            self.extend_seq_lens,
            self.scale,
        )


def make_extend_batch(
    group_sizes: list[int],
    prefix_lens: list[int],
    private_cached: list[int],
    new_tokens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> ExtendBatch:
    """Requests (group by group, in batch order) with a shared cached prefix of the group's
    length, ``private_cached[r]`` more cached tokens of their own and ``new_tokens[r] >= 1``
    tokens to extend (their KV already in the pool)."""
    assert len(private_cached) == len(new_tokens) and min(new_tokens) >= 1
    own = [c + n for c, n in zip(private_cached, new_tokens)]
    base = make_decode_batch(
        group_sizes,
        prefix_lens,
        own,
        num_q_heads,
        num_kv_heads,
        head_dim,
        dtype=dtype,
        seed=seed,
        shuffle=False,
    )
    shared = [p for size, p in zip(group_sizes, prefix_lens) for _ in range(size)]
    ext = torch.tensor(new_tokens, dtype=torch.int64)
    pre = torch.tensor([s + c for s, c in zip(shared, private_cached)], dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(int(ext.sum()), num_q_heads, head_dim, generator=gen).to(dtype)
    return ExtendBatch(
        q,
        base.k_buffer,
        base.v_buffer,
        base.req_to_token,
        base.req_pool_indices,
        base.seq_lens,
        pre,
        ext,
        base.scale,
        base.groups,
    )
