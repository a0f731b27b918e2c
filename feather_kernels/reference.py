"""Plain torch decode attention over SGLang's KV pool layout: the oracle for the fast paths.

Layout (SGLang 0.5.23, ``mem_cache/memory_pool.py``):

* ``MHATokenToKVPool.k_buffer[layer]`` / ``v_buffer[layer]``: ``[num_slots, Hkv, D]``;
* ``ReqToTokenPool.req_to_token``: ``[max_reqs, max_context]`` int32 slot ids; request ``b`` of
  the batch owns row ``req_pool_indices[b]`` and its KV sits in slots
  ``req_to_token[req_pool_indices[b], :seq_lens[b]]``.

GQA follows ``scaled_dot_product_attention(enable_gqa=True)``: query head ``h`` reads KV head
``h // (Hq // Hkv)``.
"""

from __future__ import annotations

import torch


def decode_attention_reference(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One decode step of attention, one request at a time, softmax in fp32.

    Args:
        q: ``[B, Hq, D]`` float32/bfloat16/float16, one query token per request.
        k_buffer: ``[S, Hkv, D]`` same dtype family as ``q`` (any float dtype; upcast).
        v_buffer: ``[S, Hkv, Dv]``.
        req_to_token: ``[R, L]`` int32 (or int64) slot ids.
        req_pool_indices: ``[B]`` int64 rows of ``req_to_token``.
        seq_lens: ``[B]`` int64 tokens of KV per request (``>= 1``).
        scale: softmax scale (SGLang's ``layer.scaling``, usually ``D ** -0.5``).
        return_lse: also return the natural-log log-sum-exp of the scaled scores.

    Returns:
        ``out`` ``[B, Hq, Dv]`` in ``q.dtype``; with ``return_lse`` also ``lse`` ``[B, Hq]``
        float32.
    """
    B, Hq, D = q.shape
    Hkv = k_buffer.shape[1]
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    assert k_buffer.shape[2] == D and v_buffer.shape[:2] == k_buffer.shape[:2]
    group = Hq // Hkv
    out = torch.empty(B, Hq, v_buffer.shape[2], dtype=torch.float32, device=q.device)
    lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), :n].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)  # [n, Hq, Dv]
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale  # [Hq, n]
        lse[b] = torch.logsumexp(scores, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def extend_attention_reference(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal extend (prefill on top of a cached prefix), one request at a time, fp32 softmax.

    Request ``b`` owns ``extend_seq_lens[b]`` consecutive rows of ``q`` (batch order); its new
    token ``i`` sits at position ``extend_prefix_lens[b] + i`` and attends keys
    ``req_to_token[req_pool_indices[b], :extend_prefix_lens[b] + i + 1]`` (its own KV is
    already in the pool, as SGLang writes it before attention).

    Args:
        q: ``[T, Hq, D]``, ``T = sum(extend_seq_lens)``.
        k_buffer, v_buffer, req_to_token, req_pool_indices: as in
            :func:`decode_attention_reference`.
        seq_lens, extend_prefix_lens, extend_seq_lens: ``[B]`` int64,
            ``seq_lens = extend_prefix_lens + extend_seq_lens``.

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype``.
    """
    T, Hq, D = q.shape
    group = Hq // k_buffer.shape[1]
    out = torch.empty(T, Hq, v_buffer.shape[2], dtype=torch.float32, device=q.device)
    start = 0
    for b in range(int(seq_lens.shape[0])):
        n, pre, ext = int(seq_lens[b]), int(extend_prefix_lens[b]), int(extend_seq_lens[b])
        assert n == pre + ext
        slots = req_to_token[int(req_pool_indices[b]), :n].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,nhd->htn", q[start : start + ext].float(), k) * scale
        pos = torch.arange(n, device=q.device)
        allowed = pos[None, :] <= (pre + pos[:ext])[:, None]  # [ext, n]
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[start : start + ext] = torch.einsum("htn,nhd->thd", torch.softmax(scores, -1), v)
        start += ext
    return out.to(q.dtype)
