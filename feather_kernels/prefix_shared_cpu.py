"""Prefix-shared decode attention, vectorised torch (the CPU path).

A radix-cache hit writes the same KV slot ids into the leading entries of every sharing
request's ``req_to_token`` row, so a shared prefix is visible as equal leading slot ids. For a
group of ``G`` requests sharing ``P`` leading slots this computes

* the prefix part ONCE for the group: all ``G * Hq`` queries against the ``P`` prefix keys
  gathered once, as one matrix product per KV head, giving a partial output and log-sum-exp
  per (request, head);
* each request's own suffix ``[P, seq_len)``: all requests batched, padded to a common length
  within power-of-two length buckets and masked;
* the merge of the two parts by log-sum-exp (:func:`merge_state`, as FlashInfer's cascade).

torch_native instead gathers and attends ``req_to_token[req, :seq_len]`` per request, reading
the shared prefix ``G`` times. Everything here accumulates in float32; inputs may be float32,
bfloat16 or float16. Shapes: ``B`` batch, ``Hq``/``Hkv`` query/KV heads (GQA: query head ``h``
reads KV head ``h // (Hq // Hkv)``), ``D``/``Dv`` head dims, ``S`` pool slots.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _gather_heads_first(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``buffer[slots]`` as a float32 ``[H, P, D]`` view (strided: rows stay ``[P, H, D]``).

    NOTE: index_select is ~3-10x faster than advanced indexing for this gather on CPU, and a
    transposing copy into ``[H, P, D]`` costs more than the attention op loses on strides.
    """
    return buffer.index_select(0, slots).float().transpose(0, 1)


def attend_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Many queries against one key set, batched over KV heads, fp32.

    ``q`` ``[Hkv, M, D]`` (already scaled), ``k`` ``[Hkv, P, D]``, ``v`` ``[Hkv, P, Dv]``
    (any strides), ``P >= 1``; ``mask`` optional ``[M, P]`` bool, True = attend, at least one
    True per row. Returns ``o`` ``[Hkv, M, Dv]`` and natural-log ``lse`` ``[Hkv, M]``.
    """
    if _FLASH_CPU is not None and q.device.type == "cpu" and k.shape[-1] == v.shape[-1]:
        bias = None
        if mask is not None:
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
            bias = bias.masked_fill_(~mask, float("-inf"))[None, None]
        o, lse = _FLASH_CPU(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=bias,
                            scale=1.0)[:2]
        return o[0], lse[0]
    scores = torch.matmul(q, k.transpose(1, 2))  # [Hkv, M, P]
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    m = scores.amax(dim=-1)
    probs = torch.softmax(scores, dim=-1)
    # NOTE: the largest probability is exactly 1 / sum(exp(s - max)), so the LSE comes from
    # the fused softmax without a second exp pass over the scores.
    lse = m - torch.log(probs.amax(dim=-1))
    return torch.matmul(probs, v), lse


def _attend_padded(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked attention of one query per request against padded keys, fp32.

    ``q`` ``[N, Hkv, grp, D]`` (already scaled), ``k`` ``[N, L, Hkv, D]``, ``v``
    ``[N, L, Hkv, Dv]``, ``valid`` ``[N, L]`` bool with >= 1 valid key per request. Returns
    ``o`` ``[N, Hkv, grp, Dv]`` and ``lse`` ``[N, Hkv, grp]``.
    """
    if _FLASH_CPU is not None and q.device.type == "cpu" and k.shape[-1] == v.shape[-1]:
        mask = None
        if not bool(valid.all()):
            mask = torch.zeros(valid.shape[0], 1, 1, valid.shape[1], dtype=q.dtype,
                               device=q.device).masked_fill_(~valid[:, None, None, :],
                                                             float("-inf"))
        o, lse = _FLASH_CPU(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                            scale=1.0)[:2]
        return o, lse
    scores = torch.matmul(q, k.permute(0, 2, 3, 1))  # [N, Hkv, grp, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    m = scores.amax(dim=-1)
    probs = torch.softmax(scores, dim=-1)
    lse = m - torch.log(probs.amax(dim=-1))
    return torch.matmul(probs, v.permute(0, 2, 1, 3)), lse


@dataclass(frozen=True)
class DecodePlan:
    """Gather indices of one decode batch, built once per forward batch and shared by every
    layer (the KV buffers change per layer, the slot ids do not).

    ``prefix``: per sharing group, ``(batch_idx [G] int64, slots [P] int64)``.
    ``suffix``: per length bucket, ``(batch_idx [N] int64, slots [N * W] int64,
    valid [N, W] bool)``; requests with an empty suffix appear in no bucket.
    """

    batch_size: int
    prefix: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    suffix: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...]


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
    prefix_len = torch.zeros(B, dtype=torch.long, device=device)
    prefix = []
    for g in groups:
        if g.prefix_len == 0:
            continue
        idx = g.batch_indices.to(device).long()
        prefix_len[idx] = g.prefix_len
        slots = req_to_token[int(rpi[idx[0]]), : g.prefix_len].long()
        prefix.append((idx, slots))
    # Suffixes [prefix_len, seq_len), bucketed by power-of-two length so padding at most
    # doubles the work of a bucket.
    suf_len = seq_lens - prefix_len
    assert bool((suf_len >= 0).all()), "a group's prefix_len exceeds a member's seq_len"
    nonempty = suf_len > 0
    bucket = torch.where(
        nonempty, torch.ceil(torch.log2(suf_len.clamp(min=1).double())).long(), -1
    )
    suffix = []
    for bk in torch.unique(bucket[nonempty]).tolist():
        idx = torch.nonzero(bucket == bk).flatten()
        lens = suf_len[idx]
        width = int(lens.max())
        pos = torch.arange(width, device=device)
        valid = pos[None, :] < lens[:, None]  # [N, width]
        cols = (prefix_len[idx, None] + pos[None, :]).clamp(max=req_to_token.shape[1] - 1)
        slots = req_to_token[rpi[idx, None], cols].long().flatten()  # [N * width]
        suffix.append((idx, slots, valid))
    return DecodePlan(B, tuple(prefix), tuple(suffix))


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
    """One decode step: shared prefix once per group, suffixes batched, LSE merge.

    Args:
        q: ``[B, Hq, D]`` float32/bfloat16/float16.
        k_buffer: ``[S, Hkv, D]``; v_buffer: ``[S, Hkv, Dv]`` (one layer of the pool).
        req_to_token: ``[R, L]`` int32; req_pool_indices: ``[B]`` int64; seq_lens: ``[B]``
            int64 (``>= 1``).
        scale: softmax scale.
        groups: from :func:`find_prefix_groups` (or the scheduler); each request in exactly
            one group; ``None`` finds them here. Ignored when ``plan`` is given.
        out: optional ``[B, Hq, Dv]`` (any strides) written in place.
        plan: from :func:`plan_decode` for this batch (reuse it across layers); ``None``
            builds it here.

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
    qs = (q.float() * scale).view(B, Hkv, grp, D)  # scale folded into the small operand

    # Prefix parts: the group's P keys gathered once, all G*grp queries per KV head at once.
    pre_o: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for idx, slots in plan.prefix:
        k = _gather_heads_first(k_buffer, slots)  # [Hkv, P, D]
        v = _gather_heads_first(v_buffer, slots)  # [Hkv, P, Dv]
        G = idx.shape[0]
        qg = qs[idx].permute(1, 0, 2, 3).reshape(Hkv, G * grp, D)
        o, lse = attend_with_lse(qg, k, v)  # [Hkv, G*grp, Dv], [Hkv, G*grp]
        o = o.view(Hkv, G, grp, Dv).permute(1, 0, 2, 3)
        pre_o.append((idx, o, lse.view(Hkv, G, grp).permute(1, 0, 2)))

    # Suffix parts, one padded batch per length bucket.
    res = torch.zeros(B, Hkv, grp, Dv, dtype=torch.float32, device=q.device)
    suf_lse = torch.full((B, Hkv, grp), float("-inf"), dtype=torch.float32, device=q.device)
    for idx, slots, valid in plan.suffix:
        width = valid.shape[1]
        k = k_buffer.index_select(0, slots).float().view(-1, width, Hkv, D)
        v = v_buffer.index_select(0, slots).float().view(-1, width, Hkv, Dv)
        o, lse = _attend_padded(qs[idx], k, v, valid)
        res[idx] = o
        suf_lse[idx] = lse

    for idx, o, lse in pre_o:
        # NOTE: merge_state, minus its NaN guards: a prefix part is never empty (P >= 1) and an
        # empty suffix part holds zeros with lse = -inf, so the weights below are safe.
        suf = suf_lse[idx]
        m = torch.maximum(lse, suf)
        w_pre = torch.exp(lse - m).unsqueeze(-1)
        w_suf = torch.exp(suf - m).unsqueeze(-1)
        res[idx] = (o * w_pre + res[idx] * w_suf) / (w_pre + w_suf)
    result = res.view(B, Hq, Dv).to(q.dtype)
    if out is not None:
        out.copy_(result)
        return out
    return result
