"""Prefix-shared decode attention, vectorised torch (the CPU path).

A radix-cache hit writes the same KV slot ids into the leading entries of every sharing
request's ``req_to_token`` row, so a shared prefix is visible as equal leading slot ids. For a
group of ``G`` requests sharing ``P`` leading slots this computes

* the prefix part ONCE for the group: all ``G * Hq`` queries against the ``P`` prefix keys
  (torch's fused CPU flash-attention op, per KV head), giving a partial output and log-sum-exp
  per (request, query head). Runs of consecutive slots (what SGLang's allocator gives a prefix
  prefilled in one go) are read in place from the pool; other slots are gathered once;
* each request's own suffix ``[P, seq_len)``: the group's requests batched, padded to a common
  length within power-of-two length buckets and masked, in one softmax with the prefix part
  as one more key (score = its log-sum-exp, value = its output): the exact log-sum-exp merge
  of :func:`merge_state` (FlashInfer's cascade) folded into the suffix softmax.

The gather indices (:class:`DecodePlan`) are built once per forward batch and the gathered K/V
copies live in buffers of the plan, reused by every layer.

torch_native instead gathers and attends ``req_to_token[req, :seq_len]`` per request, reading
the shared prefix ``G`` times. Everything here accumulates in float32; inputs may be float32,
bfloat16 or float16. Shapes: ``B`` batch, ``Hq``/``Hkv`` query/KV heads (GQA: query head ``h``
reads KV head ``h // (Hq // Hkv)``), ``D``/``Dv`` head dims, ``S`` pool slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from feather_kernels.groups import PrefixGroup, find_prefix_groups


def merge_state(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results over disjoint key sets (FlashInfer's ``merge_state``).

    Args:
        o1, o2: ``[..., Dv]`` partial outputs, each normalised over its own keys.
        lse1, lse2: ``[...]`` natural-log log-sum-exp of the scaled scores of each part;
            ``-inf`` marks an empty part (its ``o`` is ignored, even if NaN).

    Returns:
        ``(o, lse)``: ``o`` ``[..., Dv]`` float32, ``lse`` ``[...]`` float32; both parts empty
        gives ``o = 0`` and ``lse = -inf``.
    """
    lse1 = lse1.float()
    lse2 = lse2.float()
    lse = torch.logaddexp(lse1, lse2)
    finite = torch.isfinite(lse)
    lse_safe = torch.where(finite, lse, torch.zeros_like(lse))
    # exp(-inf - finite) = 0; an empty part contributes nothing, NaNs in its o are masked.
    w1 = torch.where(finite, torch.exp(lse1 - lse_safe), torch.zeros_like(lse))
    w2 = torch.where(finite, torch.exp(lse2 - lse_safe), torch.zeros_like(lse))
    o1 = torch.where((w1 > 0).unsqueeze(-1), o1.float(), torch.zeros((), dtype=torch.float32))
    o2 = torch.where((w2 > 0).unsqueeze(-1), o2.float(), torch.zeros((), dtype=torch.float32))
    o = o1 * w1.unsqueeze(-1) + o2 * w2.unsqueeze(-1)
    return o, lse


# NOTE: torch's fused CPU flash-attention op returns the log-sum-exp beside the output and,
# at long prefixes, runs ~1.7x faster than matmul + softmax + matmul (it never materialises
# the [M, P] scores). Private but present since torch 2.3; the matmul path stands in without it.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)

# NOTE: on a CPU with AMX a bfloat16 KV cache is attended by the fused op in bfloat16 (it
# accumulates in float32 and returns a float32 log-sum-exp; only its output is rounded to
# bfloat16, as torch_native's is): 1.5-2.5x faster there than upcasting the prefix to float32
# (Xeon with AMX, one thread: 0.63 vs 0.96 ms for the prefix at B16/P2048 with 9/3 heads; the
# extend of 31 x 383 tokens over 815: 203 vs 500 ms). Not measured on CPUs without AMX, which
# keep the float32 path; float16 gains nothing on that Xeon and stays float32 everywhere.
_NATIVE_DTYPES = (torch.bfloat16,) if getattr(torch.cpu, "_is_amx_tile_supported", bool)() else ()


def prefix_dtype(kv_dtype: torch.dtype) -> torch.dtype:
    """The dtype the shared prefix is attended in, for a KV cache of ``kv_dtype``."""
    if kv_dtype in _NATIVE_DTYPES and _FLASH_CPU is not None:
        return kv_dtype
    return torch.float32


def _gather_heads_first(
    buffer: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``buffer[slots]`` as a ``dtype`` ``[H, P, D]`` view (strided: rows stay ``[P, H, D]``).

    NOTE: index_select is ~3-10x faster than advanced indexing for this gather on CPU, and a
    transposing copy into ``[H, P, D]`` costs more than the attention op loses on strides.
    """
    return buffer.index_select(0, slots).to(dtype).transpose(0, 1)


def mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask (True = attend) as the additive mask the fused op takes: 0 or -inf."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )


def attend_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Many queries against one key set, batched over KV heads.

    ``q`` ``[Hkv, M, D]``, ``k`` ``[Hkv, P, D]``, ``v`` ``[Hkv, P, Dv]`` (any strides, one
    dtype: float32, or :func:`prefix_dtype` with the fused op), ``P >= 1``; scores are
    ``scale * q.k``; ``mask`` optional ``[M, P]`` bool, True = attend, at least one True per
    row; or that mask as :func:`mask_bias` made it. Returns ``o`` ``[Hkv, M, Dv]`` in the
    inputs' dtype and float32 natural-log ``lse`` ``[Hkv, M]``.
    """
    if mask is not None and mask.dtype == torch.bool:
        mask = mask_bias(mask, q.dtype)
    if _FLASH_CPU is not None and q.device.type == "cpu" and k.shape[-1] == v.shape[-1]:
        bias = None if mask is None else mask[None, None]
        o, lse = _FLASH_CPU(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=bias, scale=scale
        )[:2]
        return o[0], lse[0]
    scores = torch.matmul(q, k.transpose(1, 2))  # [Hkv, M, P]
    if scale != 1.0:
        scores.mul_(scale)
    if mask is not None:
        scores.add_(mask)
    m = scores.amax(dim=-1)
    probs = torch.softmax(scores, dim=-1)
    # NOTE: the largest probability is exactly 1 / sum(exp(s - max)), so the LSE comes from
    # the fused softmax without a second exp pass over the scores.
    lse = m - torch.log(probs.amax(dim=-1))
    return torch.matmul(probs, v), lse


@dataclass(frozen=True)
class _SuffixBucket:
    """Members of one plan part whose own suffixes fall in one length bucket.

    ``pos``: ``[N]`` positions among the part's members (``None``: all of them, in order);
    ``batch_idx``: ``[N]`` batch indices; ``slots``: ``[N, W]`` int64 KV slots of the suffixes,
    padded with valid slot ids; ``invalid``: ``[N, W]`` bool padding mask (``None``: no padding).
    """

    pos: torch.Tensor | None
    batch_idx: torch.Tensor
    slots: torch.Tensor
    invalid: torch.Tensor | None


@dataclass(frozen=True)
class _Part:
    """One sharing group (``slots`` = its ``[P]`` prefix slots, ascending) or, with
    ``slots=None``, the requests that share nothing. ``batch_idx`` ``[G]``; ``whole_batch``: it
    is ``arange(B)``; ``empty``: positions of members whose suffix is empty (``None``: none)."""

    batch_idx: torch.Tensor
    whole_batch: bool
    slots: torch.Tensor | None
    buckets: tuple[_SuffixBucket, ...]
    empty: torch.Tensor | None
    # The prefix as (first slot, length) runs of consecutive slots attended in place, and the
    # slots outside them (``None``: none), gathered; ``runs=()``: the whole prefix is gathered.
    runs: tuple[tuple[int, int], ...] = ()
    rest: torch.Tensor | None = None


@dataclass(frozen=True)
class DecodePlan:
    """Gather indices of one decode batch, built once per forward batch and shared by every
    layer (the KV buffers change per layer, the slot ids do not).

    ``parts``: one per sharing group, plus one for the requests that share nothing; each
    request is in exactly one part. ``prefix``: per sharing group, ``(batch_idx [G] int64,
    slots [P] int64)`` (empty: nothing shared in this batch).
    """

    batch_size: int
    parts: tuple[_Part, ...]
    # Suffix gather rows per (part, bucket, head count) (see _suffix_rows), derived on the
    # first layer and reused by the others.
    _rows: dict = field(default_factory=dict, compare=False, repr=False)
    # Gather buffers (see _scratch), reused by every layer.
    _scratch: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def prefix(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        return tuple((p.batch_idx, p.slots) for p in self.parts if p.slots is not None)


# NOTE: suffixes up to this long share one bucket: padding them costs less than the extra
# launches of more buckets would.
_MIN_BUCKET = 16


def _sort_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` sorted along its last dim (numpy on CPU: torch 2.13's one-thread sort of 8192
    int64 takes ~300 us, numpy's ~20 us)."""
    if t.device.type == "cpu":
        return torch.from_numpy(np.sort(t.numpy(), axis=-1))
    return torch.sort(t, dim=-1).values


# NOTE: a prefix prefilled in one extend holds consecutive slots (SGLang's token allocator hands
# out the head of its free list, which is sorted on a fresh server), and a run of consecutive
# slots is attended in place, with no copy: on this CPU that saves ~0.13 us per slot, and a run
# costs one more call of the attention op and a merge, ~25-30 us. Shorter runs are gathered.
_MIN_RUN = 256


def _split_runs(slots: torch.Tensor) -> tuple[tuple[tuple[int, int], ...], torch.Tensor | None]:
    """``slots`` (ascending) as runs of at least ``_MIN_RUN`` consecutive ids, ``(first,
    length)``, and the ids outside them (``None``: none). No runs: ``((), None)``."""
    if slots.device.type != "cpu" or slots.numel() < _MIN_RUN:
        return (), None
    s = slots.numpy()
    cut = np.flatnonzero(np.diff(s) != 1) + 1
    starts = np.concatenate(([0], cut))
    lens = np.diff(np.concatenate((starts, [s.shape[0]])))
    long = lens >= _MIN_RUN
    if not long.any():
        return (), None
    runs = tuple((int(s[a]), int(n)) for a, n in zip(starts[long], lens[long]))
    outside = np.repeat(~long, lens)
    return runs, (slots[torch.from_numpy(outside)] if outside.any() else None)


def _plan_part(req_to_token, rpi, seq_lens, idx, prefix_len, slots, B) -> _Part:
    suf_len = seq_lens[idx] - prefix_len
    assert bool((suf_len >= 0).all()), "a group's prefix_len exceeds a member's seq_len"
    nonempty = suf_len > 0
    # Suffixes [prefix_len, seq_len), bucketed by power-of-two length so padding at most
    # doubles the work of a bucket.
    bucket = torch.where(
        nonempty, torch.ceil(torch.log2(suf_len.clamp(min=_MIN_BUCKET).double())).long(), -1
    )
    G = int(idx.shape[0])
    buckets = []
    for bk in torch.unique(bucket[nonempty]).tolist():
        pos = torch.nonzero(bucket == bk).flatten()
        lens = suf_len[pos]
        width = int(lens.max())
        ar = torch.arange(width, device=idx.device)
        valid = ar[None, :] < lens[:, None]  # [N, width]
        cols = (prefix_len + ar).clamp(max=req_to_token.shape[1] - 1)
        sl = req_to_token[rpi[idx[pos], None], cols[None, :]].long()  # [N, width]
        everyone = pos.shape[0] == G  # nonzero is sorted: all members, in order
        buckets.append(
            _SuffixBucket(
                None if everyone else pos, idx[pos], sl, None if bool(valid.all()) else ~valid
            )
        )
    empty = torch.nonzero(~nonempty).flatten()
    whole = G == B and bool((idx == torch.arange(B, device=idx.device)).all())
    runs, rest = _split_runs(slots) if slots is not None else ((), None)
    return _Part(idx, whole, slots, tuple(buckets), empty if empty.numel() else None, runs, rest)


def plan_decode(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    groups: list[PrefixGroup] | None = None,
) -> DecodePlan:
    """Build the :class:`DecodePlan` for a batch (``groups=None``: :func:`find_prefix_groups`).

    Args: ``req_to_token`` ``[R, L]`` int32, ``req_pool_indices`` ``[B]`` int64, ``seq_lens``
    ``[B]`` int64 (``>= 1``), ``groups`` covering each batch index once.
    """
    B = int(req_pool_indices.shape[0])
    device = req_to_token.device
    if groups is None:
        groups = find_prefix_groups(req_to_token, req_pool_indices, seq_lens)
    rpi = req_pool_indices.long()
    seq_lens = seq_lens.long()
    parts, loners = [], []
    for g in groups:
        idx = g.batch_indices.to(device).long()
        if g.prefix_len == 0:
            loners.append(idx)
            continue
        # NOTE: attention is blind to key order, so the prefix is gathered in ascending slot
        # order: nearby rows read in address order, which the prefetcher follows.
        slots = _sort_last(req_to_token[int(rpi[idx[0]]), : g.prefix_len].long())
        parts.append(_plan_part(req_to_token, rpi, seq_lens, idx, g.prefix_len, slots, B))
    if loners:
        idx = torch.sort(torch.cat(loners)).values
        if idx.numel():
            parts.append(_plan_part(req_to_token, rpi, seq_lens, idx, 0, None, B))
    return DecodePlan(B, tuple(parts))


def _suffix_rows(plan: DecodePlan, part_i: int, bucket_i: int, Hkv: int) -> torch.Tensor:
    """Rows of a ``[S * Hkv, D]`` view of a KV buffer holding one bucket's suffix keys, in
    (request, head, position) order, so that each (request, head)'s keys gather contiguous;
    where the part has a prefix, one spare row per (request, head) follows its ``W``
    positions (see :func:`_suffix_and_merge`). Derived on the first layer, reused by the
    others.
    """
    key = (part_i, bucket_i, Hkv)
    rows = plan._rows.get(key)
    if rows is None:
        part = plan.parts[part_i]
        slots = part.buckets[bucket_i].slots  # [N, W]
        if part.slots is not None:
            slots = torch.cat([slots, slots[:, :1]], 1)
        heads = torch.arange(Hkv, device=slots.device)
        rows = plan._rows[key] = (slots[:, None, :] * Hkv + heads[None, :, None]).flatten()
    return rows


def _scratch(
    plan: DecodePlan, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A reusable buffer of the plan: the same memory for every layer of the forward batch.

    NOTE: the gathered K/V copies are megabytes; allocated per call, glibc hands such blocks
    back to the kernel often enough that re-faulting their pages can cost as much as the
    attention itself (seen: ~1100 page faults and 2-3x the time per call at B=16, P=2048).
    Never a returned tensor.
    """
    n = 1
    for s in shape:
        n *= s
    key = (name, dtype, device)
    buf = plan._scratch.get(key)
    if buf is None or buf.numel() < n:
        buf = plan._scratch[key] = torch.empty(n, dtype=dtype, device=device)
    return buf[:n].view(shape)


def _gather(
    plan: DecodePlan,
    name: str,
    src: torch.Tensor,
    index: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``src.index_select(0, index)`` as ``dtype`` (float32 or ``src.dtype``), into the plan's
    scratch buffers."""
    shape = (index.shape[0],) + tuple(src.shape[1:])
    if src.dtype == dtype:
        return torch.index_select(
            src, 0, index, out=_scratch(plan, name, shape, src.dtype, src.device)
        )
    raw = torch.index_select(
        src, 0, index, out=_scratch(plan, name + "_raw", shape, src.dtype, src.device)
    )
    return _scratch(plan, name, shape, torch.float32, src.device).copy_(raw)


def _gather_suffix(
    plan: DecodePlan, name: str, buffer: torch.Tensor, rows: torch.Tensor, batch: int
) -> torch.Tensor:
    """The rows (from :func:`_suffix_rows`) of ``buffer`` ``[S, Hkv, D]`` as float32
    ``[batch, -1, D]``, ``batch`` = N * Hkv."""
    S, Hkv, D = buffer.shape
    if buffer.is_contiguous():
        return _gather(plan, name, buffer.view(S * Hkv, D), rows).view(batch, -1, D)
    # rare (a strided pool view): one row at a time
    return buffer[rows // Hkv, rows % Hkv].float().view(batch, -1, D)


def _suffix_and_merge(
    qs: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    invalid: torch.Tensor | None,
    scale: float,
    o_pre: torch.Tensor | None,
    lse_pre: torch.Tensor | None,
) -> torch.Tensor:
    """Each request's own suffix, merged with its prefix part if given; float32.

    ``qs`` ``[N, Hkv, grp, D]``; ``k`` ``[N * Hkv, W', D]``; ``v`` ``[N * Hkv, W', Dv]`` where
    ``W' = W + 1`` with a prefix part (the last row is a spare) and ``W`` without; ``invalid``
    ``[N, W]`` padding (every request keeps >= 1 key, counting the prefix part); ``o_pre``
    ``[N, Hkv, grp, Dv]`` and ``lse_pre`` ``[N, Hkv, grp]`` (any strides): the prefix part,
    normalised over its own keys. Returns ``[N, Hkv, grp, Dv]``.

    NOTE: the prefix part joins the softmax as one extra key per query, with score ``lse_pre``
    and value ``o_pre``: exp(lse_pre) is exactly the prefix part's softmax denominator, so one
    softmax over ``[suffix scores, lse_pre]`` weighs both parts as attention over all keys
    would: the log-sum-exp merge (FlashInfer's ``merge_state``) without its separate passes.
    The spare key row makes the score matrix ``[.., W + 1]`` come out of one contiguous
    batched matmul (a strided output makes torch loop over the batch); its score is then
    overwritten by ``lse_pre``.
    """
    N, Hkv, grp, D = qs.shape
    Wx, Dv = k.shape[1], v.shape[2]
    W = Wx - (0 if o_pre is None else 1)
    scores = torch.baddbmm(
        qs.new_empty(()).expand(N * Hkv, grp, Wx),
        qs.reshape(N * Hkv, grp, D),
        k.transpose(1, 2),
        beta=0.0,
        alpha=scale,
    )
    if invalid is not None:
        scores[:, :, :W].view(N, Hkv, grp, W).masked_fill_(invalid[:, None, None, :], float("-inf"))
    if o_pre is None:
        return torch.bmm(torch.softmax(scores, dim=-1), v).view(N, Hkv, grp, Dv)
    scores[:, :, W].view(N, Hkv, grp).copy_(lse_pre)
    probs = torch.softmax(scores, dim=-1)
    o = torch.empty(N, Hkv, grp, Dv, dtype=torch.float32, device=qs.device)
    torch.mul(probs[:, :, W:].view(N, Hkv, grp, 1), o_pre, out=o)
    o.view(N * Hkv, grp, Dv).baddbmm_(probs[:, :, :W], v[:, :W])
    return o


def _run_view(
    plan: DecodePlan, name: str, buffer: torch.Tensor, first: int, length: int
) -> torch.Tensor:
    """Slots ``[first, first + length)`` of ``buffer`` ``[S, Hkv, D]`` as ``[Hkv, length, D]``
    in :func:`prefix_dtype`: a view where that is the buffer's dtype, else converted into the
    plan's scratch."""
    rows = buffer[first : first + length]
    if buffer.dtype != prefix_dtype(buffer.dtype):
        rows = _scratch(plan, name, tuple(rows.shape), torch.float32, rows.device).copy_(rows)
    return rows.transpose(0, 1)


def _attend_group_prefix(
    plan: DecodePlan,
    part: _Part,
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` ``[Hkv, M, D]`` (in :func:`prefix_dtype` of the buffers) against a group's prefix:
    ``o`` ``[Hkv, M, Dv]`` float32 and ``lse`` ``[Hkv, M]``. Its runs of consecutive slots are
    attended in place and the rest gathered; the pieces are merged by log-sum-exp (each has at
    least one key)."""
    dt = q.dtype
    if not part.runs or k_buffer.stride(-1) != 1 or v_buffer.stride(-1) != 1:
        k = _gather(plan, "k_pre", k_buffer, part.slots, dt).transpose(0, 1)  # [Hkv, P, D]
        v = _gather(plan, "v_pre", v_buffer, part.slots, dt).transpose(0, 1)  # [Hkv, P, Dv]
        o, lse = attend_with_lse(q, k, v, scale=scale)
        return o.float(), lse
    pieces = [
        attend_with_lse(
            q,
            _run_view(plan, "k_run", k_buffer, a, n),
            _run_view(plan, "v_run", v_buffer, a, n),
            scale=scale,
        )
        for a, n in part.runs
    ]
    if part.rest is not None:
        pieces.append(
            attend_with_lse(
                q,
                _gather(plan, "k_pre", k_buffer, part.rest, dt).transpose(0, 1),
                _gather(plan, "v_pre", v_buffer, part.rest, dt).transpose(0, 1),
                scale=scale,
            )
        )
    if len(pieces) == 1:
        return pieces[0][0].float(), pieces[0][1]
    # NOTE: not merge_state: every piece has keys, so no -inf to guard, and this runs per layer
    # (16 us against merge_state's 44 us for two pieces at B16, 3 KV heads).
    lse = torch.stack([piece[1] for piece in pieces])  # [R, Hkv, M], all finite
    total = torch.logsumexp(lse, dim=0)
    weights = torch.exp(lse - total).unsqueeze(-1)
    o = pieces[0][0].float() * weights[0]
    for i in range(1, len(pieces)):
        o.addcmul_(pieces[i][0], weights[i])
    return o, total


def prefix_shared_decode(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    groups: list[PrefixGroup] | None = None,
    out: torch.Tensor | None = None,
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    """One decode step: shared prefix once per group, suffixes batched, merged exactly.

    Args:
        q: ``[B, Hq, D]`` float32/bfloat16/float16.
        k_buffer: ``[S, Hkv, D]``; v_buffer: ``[S, Hkv, Dv]`` (one layer of the pool).
        req_to_token: ``[R, L]`` int32; req_pool_indices: ``[B]`` int64; seq_lens: ``[B]``
            int64 (``>= 1``).
        scale: softmax scale.
        groups: from :func:`find_prefix_groups` (or the scheduler); each request in exactly
            one group; ``None`` finds them here. Ignored when ``plan`` is given.
        out: optional ``[B, Hq, Dv]`` (any strides) written in place.
        plan: from :func:`plan_decode` for this batch (reuse it across layers, one call at a
            time: it holds the gather buffers); ``None`` builds it here.

    Returns:
        ``[B, Hq, Dv]`` in ``q.dtype`` (``out`` if given).
    """
    B, Hq, D = q.shape
    S, Hkv, Dk = k_buffer.shape
    Dv = v_buffer.shape[2]
    assert Dk == D and v_buffer.shape[:2] == (S, Hkv), "k/v buffer shapes disagree with q"
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    assert req_pool_indices.shape == (B,) and seq_lens.shape == (B,)
    grp = Hq // Hkv
    if plan is None:
        plan = plan_decode(req_to_token, req_pool_indices, seq_lens, groups)
    assert plan.batch_size == B, "plan built for another batch"
    f32, dev = torch.float32, q.device
    qf = q.float().view(B, Hkv, grp, D)  # no copy for float32
    res = None  # [B, Hkv, grp, Dv] float32, possibly strided
    for i, part in enumerate(plan.parts):
        G = part.batch_idx.shape[0]
        qp = qf if part.whole_batch else qf.index_select(0, part.batch_idx)  # [G, Hkv, grp, D]
        o_pre = lse_pre = None
        if part.slots is not None:
            # The group's P prefix keys read once (in place where consecutive, else gathered);
            # all G*grp queries per KV head at once.
            qg = torch.empty(Hkv, G, grp, D, dtype=prefix_dtype(k_buffer.dtype), device=dev)
            qg.copy_(qp.transpose(0, 1))
            o, lse = _attend_group_prefix(
                plan, part, qg.view(Hkv, G * grp, D), k_buffer, v_buffer, scale
            )
            o_pre = o.view(Hkv, G, grp, Dv).transpose(0, 1)  # [G, Hkv, grp, Dv]
            lse_pre = lse.view(Hkv, G, grp).transpose(0, 1)  # [G, Hkv, grp]
        if len(part.buckets) == 1 and part.buckets[0].pos is None:  # the common case
            rows = _suffix_rows(plan, i, 0, Hkv)
            o_part = _suffix_and_merge(
                qp,
                _gather_suffix(plan, "k_suf", k_buffer, rows, G * Hkv),
                _gather_suffix(plan, "v_suf", v_buffer, rows, G * Hkv),
                part.buckets[0].invalid,
                scale,
                o_pre,
                lse_pre,
            )
        else:
            o_part = torch.empty(G, Hkv, grp, Dv, dtype=f32, device=dev)
            for j, b in enumerate(part.buckets):
                rows = _suffix_rows(plan, i, j, Hkv)
                N = b.pos.shape[0]
                o_part.index_copy_(
                    0,
                    b.pos,
                    _suffix_and_merge(
                        qp.index_select(0, b.pos),
                        _gather_suffix(plan, "k_suf", k_buffer, rows, N * Hkv),
                        _gather_suffix(plan, "v_suf", v_buffer, rows, N * Hkv),
                        b.invalid,
                        scale,
                        None if o_pre is None else o_pre.index_select(0, b.pos),
                        None if lse_pre is None else lse_pre.index_select(0, b.pos),
                    ),
                )
            if part.empty is not None and o_pre is not None:  # the prefix part alone
                o_part.index_copy_(0, part.empty, o_pre.index_select(0, part.empty))
            elif part.empty is not None:  # no keys at all (seq_len 0): zeros, as before
                o_part.index_fill_(0, part.empty, 0.0)
        if part.whole_batch:
            res = o_part
        else:
            if res is None:
                res = torch.empty(B, Hkv, grp, Dv, dtype=f32, device=dev)
            res.index_copy_(0, part.batch_idx, o_part)
    if res is None:  # empty batch
        res = torch.zeros(B, Hkv, grp, Dv, dtype=f32, device=dev)
    if out is not None:
        out.view(B, Hkv, grp, Dv).copy_(res)
        return out
    return res.reshape(B, Hq, Dv).to(q.dtype)
