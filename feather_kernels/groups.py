"""Which requests of a decode batch share leading KV slots, found from ``req_to_token``.

A radix-cache hit writes the same KV slot ids into the leading entries of every sharing
request's ``req_to_token`` row; a group is a set of requests with equal first ``prefix_len``
slot ids. A scheduler that already knows its groups can build :class:`PrefixGroup` directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# NOTE: below this many shared tokens the extra merge and the separate prefix matmul cost
# more than reading the prefix once per request saves; such requests go to the P=0 group.
MIN_SHARED_PREFIX = 16


@dataclass(frozen=True)
class PrefixGroup:
    """Requests of one decode batch whose first ``prefix_len`` KV slot ids are equal.

    ``batch_indices``: ``[G]`` int64 positions in the batch (not pool rows). ``prefix_len`` may
    be 0: the group of requests that share nothing (they run as suffix only).
    """

    batch_indices: torch.Tensor
    prefix_len: int


def find_prefix_groups(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    min_prefix: int = MIN_SHARED_PREFIX,
    verify: bool = False,
) -> list[PrefixGroup]:
    """Group the batch's requests by shared leading KV slot ids.

    Candidates are requests with the same slot id at position ``min_prefix - 1``; for each
    candidate group the common length is binary-searched over ``[min_prefix, min seq_len of
    the group]`` by comparing ONE column of the members' ``req_to_token`` rows per probe, all
    candidate groups at once. Both rest on the radix-cache invariant: a slot id belongs to one
    tree node, so equal slots at position ``j`` imply equal slots before ``j`` (the probe
    "column ``m-1`` is equal" is monotone in ``m``, and equal slots at ``min_prefix - 1`` mean
    at least ``min_prefix`` shared). ``verify=True`` drops that assumption and checks the found
    prefixes in full.

    NOTE: keying on position 0 instead would lump together requests whose prompts only start
    alike (chat-template tokens, "You are a"), and their common length, a few tokens, would hide
    the long prefixes shared within each subset.

    Cost: ``O(B log L)`` int compares in ``~log2(L)`` vectorised steps (each a few small torch
    ops and one host sync), versus ``O(B * L)`` for comparing whole rows; ``verify`` adds
    ``O(sum of G * P)``. A group that branches deeper (A,B share 100 slots, C only 50 of them)
    gets the length all members share (50).

    Args:
        req_to_token: ``[R, L]`` int32 slot ids.
        req_pool_indices: ``[B]`` int64 rows of ``req_to_token``.
        seq_lens: ``[B]`` int64, ``>= 1``.
        min_prefix: shortest shared prefix worth its own group.
        verify: check every found prefix in full (for tables that break the invariant).

    Returns:
        Groups covering every batch index exactly once: groups of ``>= 2`` requests with
        ``prefix_len >= min_prefix``, then (if any request is left) one group with
        ``prefix_len = 0``.
    """
    B = int(req_pool_indices.shape[0])
    device = req_pool_indices.device
    if B == 0:
        return []
    rpi = req_pool_indices.long()
    seq_lens = seq_lens.long()
    arange_b = torch.arange(B, device=device)
    min_prefix = max(int(min_prefix), 1)
    # Requests shorter than min_prefix share nothing worth a group: a key of their own (< 0).
    col = min(min_prefix, req_to_token.shape[1]) - 1  # a narrower table has no eligible row
    key = torch.where(seq_lens >= min_prefix, req_to_token[rpi, col].long(), -1 - arange_b)
    uniq, gid, counts = torch.unique(key, return_inverse=True, return_counts=True)
    n_groups = int(uniq.shape[0])
    leader = torch.full((n_groups,), B, dtype=torch.long, device=device)
    leader = leader.scatter_reduce(0, gid, arange_b, reduce="amin")
    hi = torch.full((n_groups,), torch.iinfo(torch.long).max, dtype=torch.long, device=device)
    hi = hi.scatter_reduce(0, gid, seq_lens, reduce="amin")
    hi = torch.where(counts >= 2, hi, torch.zeros_like(hi))  # singletons share nothing
    lo = torch.full_like(hi, min_prefix).minimum(hi)  # the key column is shared
    leader_row = rpi[leader[gid]]  # [B] pool row of each request's group leader
    while bool((lo < hi).any()):
        mid = (lo + hi + 1) // 2  # probe: are the first `mid` slots shared?
        col = (mid - 1).clamp(min=0)[gid]
        eq = (req_to_token[rpi, col] == req_to_token[leader_row, col]).long()
        all_eq = torch.ones(n_groups, dtype=torch.long, device=device)
        all_eq = all_eq.scatter_reduce(0, gid, eq, reduce="amin").bool()
        active = lo < hi
        lo = torch.where(active & all_eq, mid, lo)
        hi = torch.where(active & ~all_eq, mid - 1, hi)
    prefix_len = lo.tolist()
    counts_l = counts.tolist()
    order = torch.argsort(gid, stable=True)
    members = torch.split(order, counts_l)
    groups: list[PrefixGroup] = []
    leftovers: list[torch.Tensor] = []
    for g in range(n_groups):
        p = int(prefix_len[g])
        idx = members[g]
        if verify and p > 0 and counts_l[g] >= 2:
            rows = req_to_token[rpi[idx], :p]
            same = (rows == rows[:1]).all(dim=0)
            if not bool(same.all()):
                p = int(torch.argmin(same.int()))  # first mismatching position
        if counts_l[g] >= 2 and p >= min_prefix:
            groups.append(PrefixGroup(idx, p))
        else:
            leftovers.append(idx)
    if leftovers:
        groups.append(PrefixGroup(torch.sort(torch.cat(leftovers)).values, 0))
    return groups
