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
    split_max_reads: float | None = None,
) -> list[PrefixGroup]:
    """Group the batch's requests by shared leading KV slot ids.

    Candidates are requests with the same slot id at position ``min_prefix - 1``; for each
    candidate group the common length is binary-searched over ``[min_prefix, min seq_len of
    the group]`` by comparing ONE column of the members' ``req_to_token`` rows per probe, all
    candidate groups at once. Both rest on the radix-cache invariant: a slot id belongs to one
    tree node, so equal slots at position ``j`` imply equal slots before ``j`` (the probe
    "column ``m-1`` is equal" is monotone in ``m``, and equal slots at ``min_prefix - 1`` mean
    at least ``min_prefix`` shared). ``verify=True`` drops that assumption and checks the found
    prefixes in full (and does not split groups deeper, below).

    A group whose members branch after their common ``P`` slots (a system prompt shared by all,
    then one document per subset) is split at the branch when reading each subset's deeper
    prefix once costs at most half the KV reads of reading ``P`` once and the rest per request
    (see :func:`_split_deeper`), recursively.

    NOTE: keying on position 0 instead would lump together requests whose prompts only start
    alike (chat-template tokens, "You are a"), and their common length, a few tokens, would hide
    the long prefixes shared within each subset.

    Cost: ``O(B log L)`` int compares in ``~log2(L)`` vectorised steps (each a few small torch
    ops and one host sync), versus ``O(B * L)`` for comparing whole rows; ``verify`` adds
    ``O(sum of G * P)``. A group that branches deeper (A,B share 100 slots, C only 50 of them)
    gets the length all members share (50) unless splitting it halves the reads (here it does
    not: with members of length ``L`` both ways read ``3L - 100`` KV rows).

    Args:
        req_to_token: ``[R, L]`` int32 slot ids.
        req_pool_indices: ``[B]`` int64 rows of ``req_to_token``.
        seq_lens: ``[B]`` int64, ``>= 1``.
        min_prefix: shortest shared prefix worth its own group.
        verify: check every found prefix in full (for tables that break the invariant).
        split_max_reads: split a group at a deeper branch when the split reads at most this
            fraction of the KV rows the whole group reads (``None``: ``_SPLIT_MAX_READS``, 0.5;
            0: never split; 1: whenever it reads no more).

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
    hi = torch.full((n_groups,), torch.iinfo(torch.long).max, dtype=torch.long, device=device)
    hi = hi.scatter_reduce(0, gid, seq_lens, reduce="amin")
    hi = torch.where(counts >= 2, hi, torch.zeros_like(hi))  # singletons share nothing
    lo = torch.full_like(hi, min_prefix).minimum(hi)  # the key column is shared
    lo = _common_lens(req_to_token, rpi, gid, lo, hi)
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
            if verify or split_max_reads == 0:  # verify distrusts the invariant the split rests on
                groups.append(PrefixGroup(idx, p))
            else:
                found, _, loners = _split_deeper(
                    req_to_token,
                    rpi,
                    seq_lens,
                    idx,
                    p,
                    _SPLIT_MAX_READS if split_max_reads is None else split_max_reads,
                )
                groups += found
                leftovers += loners
        else:
            leftovers.append(idx)
    if leftovers:
        groups.append(PrefixGroup(torch.sort(torch.cat(leftovers)).values, 0))
    return groups


def _common_lens(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    gid: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
) -> torch.Tensor:
    """Per group ``g`` (``gid[i]``: the group of pool row ``rows[i]``), the largest ``m`` in
    ``[lo[g], hi[g]]`` such that its rows share their first ``m`` slots, given that they share
    the first ``lo[g]``: a binary search, all groups at once, ONE ``req_to_token`` column per
    group and probe, each row compared with its group's first."""
    n, device = int(lo.shape[0]), rows.device
    arange = torch.arange(rows.shape[0], device=device)
    leader = torch.full((n,), rows.shape[0], dtype=torch.long, device=device)
    leader = leader.scatter_reduce(0, gid, arange, reduce="amin")
    leader_row = rows[leader[gid]]  # each row's group leader
    while bool((lo < hi).any()):
        mid = (lo + hi + 1) // 2  # probe: are the first `mid` slots shared?
        col = (mid - 1).clamp(min=0)[gid]
        eq = (req_to_token[rows, col] == req_to_token[leader_row, col]).long()
        all_eq = torch.ones(n, dtype=torch.long, device=device)
        all_eq = all_eq.scatter_reduce(0, gid, eq, reduce="amin").bool()
        active = lo < hi
        lo = torch.where(active & all_eq, mid, lo)
        hi = torch.where(active & ~all_eq, mid - 1, hi)
    return lo


# NOTE: a split must at least halve the KV reads: fewer queries per group make the attention
# op less efficient, so a small cut in reads need not pay. Measured on one layer's step
# (python -m feather_bench.attention --split, which also times the split at any saving): splits that
# cut the reads to 0.30-0.32 of one group's ran 1.4x-1.6x faster; one that cut them to 0.69 ran
# 0.84x-1.07x over 6 runs, no gain, so it is not taken.
_SPLIT_MAX_READS = 0.5


def _group_reads(seq_lens: torch.Tensor, idx: torch.Tensor, p: int) -> int:
    """KV rows a group at prefix ``p`` reads: the prefix once, each member's tail once."""
    return p + int((seq_lens[idx] - p).sum())


def _split_deeper(req_to_token, rpi, seq_lens, idx, p, max_reads):
    """``idx`` (sorted batch indices) share ``p`` leading slots: ``(groups, reads, loners)`` of
    the cheaper of ``idx`` as one group at ``p`` and its split at slot ``p``, where the split
    must read at most ``max_reads`` of the whole group's KV rows (by default half).

    Reads are counted in KV rows: a group reads its prefix once and each member its own tail
    (``seq_len - prefix``); a loner reads its whole length. Split: each subset of >= 2 that
    agrees at slot ``p`` (split further where that pays, recursively), and the members left, a
    group at ``p`` if >= 2, else a loner."""
    whole = ([PrefixGroup(idx, p)], _group_reads(seq_lens, idx, p), [])
    deeper = seq_lens[idx] > p
    if int(deeper.sum()) < 2:
        return whole
    col = min(p, req_to_token.shape[1] - 1)
    key = torch.where(
        deeper,
        req_to_token[rpi[idx], col].long(),
        -1 - torch.arange(idx.shape[0], device=idx.device),
    )
    _, inv, counts = torch.unique(key, return_inverse=True, return_counts=True)
    in_sub = counts[inv] >= 2  # key < 0 is unique, so never in a subset
    if not bool(in_sub.any()):
        return whole
    # The subsets' common lengths, all at once.
    sub_gid = torch.unique(inv[in_sub], return_inverse=True)[1]
    members = idx[in_sub]
    hi = torch.full(
        (int(sub_gid.max()) + 1,), torch.iinfo(torch.long).max, dtype=torch.long, device=idx.device
    ).scatter_reduce(0, sub_gid, seq_lens[members], reduce="amin")
    depth = _common_lens(req_to_token, rpi[members], sub_gid, torch.full_like(hi, p + 1), hi)
    groups, reads, loners = [], 0, []
    for k, q in enumerate(depth.tolist()):
        g, r, lo = _split_deeper(req_to_token, rpi, seq_lens, members[sub_gid == k], q, max_reads)
        groups += g
        reads += r
        loners += lo
    rest = idx[~in_sub]
    if rest.numel() >= 2:
        groups.append(PrefixGroup(rest, p))
        reads += _group_reads(seq_lens, rest, p)
    elif rest.numel():
        loners.append(rest)
        reads += int(seq_lens[rest].sum())
    if reads > max_reads * whole[1]:
        return whole
    return groups, reads, loners
