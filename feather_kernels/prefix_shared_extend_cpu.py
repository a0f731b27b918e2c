"""Prefix-shared extend (prefill on top of a cached prefix), torch on CPU.

When many requests extend on top of the same cached prefix (equal leading ``req_to_token``
slots), their new tokens all see that whole prefix: for each group this computes

* the prefix part ONCE: every new token of every member against the ``P`` shared keys
  (gathered once), one attention call per group, no mask;
* each request's own part: its new tokens against its keys ``[P, seq_len)``, causally;
* the merge of the two by log-sum-exp.

torch_native instead attends each request's tokens to its whole ``[0, seq_len)`` range, reading
and multiplying against the shared prefix once per request. Shapes: ``T`` new tokens in batch
order, ``B`` requests, ``Hq``/``Hkv`` heads (GQA: head ``h`` reads KV head
``h // (Hq // Hkv)``), ``D``/``Dv`` head dims. Accumulation in float32.
"""

from __future__ import annotations

import torch

from feather_kernels.groups import PrefixGroup, find_prefix_groups
from feather_kernels.prefix_shared_cpu import (
    _gather_heads_first,
    attend_with_lse,
    mask_bias,
    prefix_dtype,
)


def find_extend_groups(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    **kwargs,
) -> list[PrefixGroup]:
    """:func:`find_prefix_groups` over the cached prefixes only (a shared prefix must lie
    before every member's first new token). Requests with no cached prefix share nothing."""
    return find_prefix_groups(req_to_token, req_pool_indices, extend_prefix_lens, **kwargs)


def prefix_shared_extend(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    scale: float,
    groups: list[PrefixGroup] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal extend attention, shared cached prefix once per group, LSE merge.

    Args:
        q: ``[T, Hq, D]`` float32/bfloat16/float16, ``T = sum(extend_seq_lens)``; request
            ``b``'s new tokens are rows ``sum(extend_seq_lens[:b]) + i``.
        k_buffer: ``[S, Hkv, D]``; v_buffer: ``[S, Hkv, Dv]`` (the new tokens' KV already
            written, as SGLang's ``set_kv_buffer`` does before attention).
        req_to_token: ``[R, L]`` int32; req_pool_indices: ``[B]`` int64.
        seq_lens, extend_prefix_lens, extend_seq_lens: ``[B]`` int64 with
            ``seq_lens = extend_prefix_lens + extend_seq_lens``.
        scale: softmax scale.
        groups: covering each batch index once, each ``prefix_len <= extend_prefix_lens`` of
            its members (``None``: :func:`find_extend_groups`).
        out: optional ``[T, Hq, Dv]`` written in place.

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype`` (``out`` if given).
    """
    T, Hq, D = q.shape
    S, Hkv, Dk = k_buffer.shape
    Dv = v_buffer.shape[2]
    B = int(req_pool_indices.shape[0])
    assert Dk == D and v_buffer.shape[:2] == (S, Hkv), "k/v buffer shapes disagree with q"
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    assert seq_lens.shape == extend_prefix_lens.shape == extend_seq_lens.shape == (B,)
    grp = Hq // Hkv
    seq_l = seq_lens.tolist()
    pre_l = extend_prefix_lens.tolist()
    ext_l = extend_seq_lens.tolist()
    assert all(n == p + e for n, p, e in zip(seq_l, pre_l, ext_l)), "seq = prefix + extend"
    assert sum(ext_l) == T, f"q has {T} rows, extend_seq_lens sum to {sum(ext_l)}"
    if groups is None:
        groups = find_extend_groups(req_to_token, req_pool_indices, extend_prefix_lens)
    rpi = req_pool_indices.tolist()
    starts = [0] * B
    for b in range(1, B):
        starts[b] = starts[b - 1] + ext_l[b - 1]
    shared = [0] * B
    for g in groups:
        for b in g.batch_indices.tolist():
            assert g.prefix_len <= pre_l[b], "a shared prefix must end before new tokens"
            shared[b] = g.prefix_len

    # float32, or bfloat16 for a bfloat16 cache (see prefix_dtype); the merge is float32
    dt = prefix_dtype(k_buffer.dtype)
    qs = q.to(dt).view(T, Hkv, grp, D)
    res = torch.empty(T, Hkv, grp, Dv, dtype=torch.float32, device=q.device)
    own_lse = torch.empty(T, Hkv, grp, dtype=torch.float32, device=q.device)

    # Own parts: new token i of request b sees own keys j (positions shared[b] + j) while
    # shared[b] + j <= pre[b] + i. Rows are (token, head-in-group), token-major.
    # NOTE: requests with the same lengths share one additive mask (built once: ~1 ms each at
    # 383 new tokens, a fifth of the attention call it masks).
    masks: dict[tuple[int, int, int], torch.Tensor] = {}
    for b in range(B):
        if ext_l[b] == 0:
            continue
        P, n, e, t0 = shared[b], seq_l[b], ext_l[b], starts[b]
        slots = req_to_token[rpi[b], P:n].long()
        k = _gather_heads_first(k_buffer, slots, dt)  # [Hkv, n - P, D]
        v = _gather_heads_first(v_buffer, slots, dt)
        qb = qs[t0 : t0 + e].permute(1, 0, 2, 3).reshape(Hkv, e * grp, D)
        key = (e, n - P, pre_l[b] - P)
        bias = masks.get(key)
        if bias is None:
            token = torch.arange(e * grp, device=q.device) // grp
            allowed = (
                torch.arange(n - P, device=q.device)[None, :] <= (pre_l[b] - P + token)[:, None]
            )
            bias = masks[key] = mask_bias(allowed, dt)
        o, lse = attend_with_lse(qb, k, v, bias, scale)
        res[t0 : t0 + e] = o.view(Hkv, e, grp, Dv).permute(1, 0, 2, 3)
        own_lse[t0 : t0 + e] = lse.view(Hkv, e, grp).permute(1, 0, 2)

    # Prefix parts: all the group's new tokens against its P shared keys, then merge.
    for g in groups:
        members = sorted(b for b in g.batch_indices.tolist() if ext_l[b] > 0)
        if g.prefix_len == 0 or not members:
            continue
        # The members' rows, as a slice where they are back to back (the usual case: a
        # batch of one group), else as an index.
        if all(starts[b] + ext_l[b] == starts[c] for b, c in zip(members, members[1:])):
            rows = slice(starts[members[0]], starts[members[-1]] + ext_l[members[-1]])
        else:
            rows = torch.cat([torch.arange(starts[b], starts[b] + ext_l[b]) for b in members])
            rows = rows.to(q.device)
        slots = req_to_token[rpi[members[0]], : g.prefix_len].long()
        k = _gather_heads_first(k_buffer, slots, dt)  # [Hkv, P, D]
        v = _gather_heads_first(v_buffer, slots, dt)
        qm = qs[rows]
        M = int(qm.shape[0])
        qg = qm.permute(1, 0, 2, 3).reshape(Hkv, M * grp, D)
        o, lse = attend_with_lse(qg, k, v, scale=scale)
        o = o.view(Hkv, M, grp, Dv).permute(1, 0, 2, 3)
        lse = lse.view(Hkv, M, grp).permute(1, 0, 2)
        own = own_lse[rows]
        total = torch.logaddexp(lse, own)  # both finite: each token sees >= 1 own key (itself)
        mine = res[rows]  # a view for a slice, a copy for an index
        mine.mul_(torch.exp(own - total).unsqueeze(-1)).addcmul_(
            o, torch.exp(lse - total).unsqueeze(-1)
        )
        if not isinstance(rows, slice):
            res[rows] = mine

    result = res.view(T, Hq, Dv).to(q.dtype)
    if out is not None:
        out.copy_(result)
        return out
    return result
