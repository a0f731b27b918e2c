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
