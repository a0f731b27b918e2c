"""Prefix-shared decode and extend attention as one horizontally fused Triton launch plus a merge kernel.

Launch 1, ``_prefix_shared_fwd``, grid ``(n_prefix_tiles + n_own_tiles, Hkv)``:

* programs ``pid < n_prefix_tiles`` each take one tile of a group's shared prefix: up to
  ``BLOCK_M_PREFIX`` query rows (rows are (member, query head in the GQA group) pairs of the
  group's requests) against one chunk of the prefix KV, as ``tl.dot`` matrix products - the
  prefix KV is read once per tile, not once per request;
* programs ``pid >= n_prefix_tiles`` each take the own keys ``[prefix_len, seq_len)`` of a run
  of consecutive queries on one ``req_to_token`` row, for the ``Hq // Hkv`` query heads of one
  KV head: in decode one request (its suffix); in extend up to ``BLOCK_M_OWN // (Hq // Hkv)``
  new tokens of one request, each row masked at its own ``seq_len`` (causal), so that these
  are matrix products too.

Each program writes a partial output normalised over its keys and its log-sum-exp into
``o_part[part]`` / ``lse_part[part]`` (part 0: suffix; part ``1 + i``: prefix chunk ``i``).
Launch 2, ``_merge_parts``, grid ``(B,)``, merges the parts by log-sum-exp (an empty part has
``lse = -inf``). Interpreter notes (``TRITON_INTERPRET=1``): ``tl.dot`` on bf16 is wrong there,
so the wrapper upcasts to fp32 before every dot when interpreting; programs run one after
another, hence the separate merge launch rather than any waiting between programs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from feather_kernels.groups import PrefixGroup, find_prefix_groups

# NOTE: a prefix longer than this is split over several programs (split-KV) so a few big
# groups still fill the GPU; each chunk adds one partial output per (request, head) to merge.
PREFIX_CHUNK = 1024
BLOCK_M_PREFIX = 64  # query rows (member x head) per prefix tile
BLOCK_M_OWN = 64  # query rows (token x head) per own-keys tile of an extend
BLOCK_N = 64  # keys per inner-loop step
_SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)
_TILE_FIELDS = 7  # member_start, group_size, row_start, kv_start, kv_end, pool_row, part
_OWN_FIELDS = 2  # first query, number of queries (consecutive, on one req_to_token row)


@triton.jit
def _attend_tile(
    # pointers
    Q,
    K,
    V,
    ReqToToken,
    OPart,
    LsePart,
    # this tile: per-row batch index / query head / validity / key end, and the key range
    b,
    head,
    row_ok,
    row_kv_end,
    kvh,
    pool_row,
    kv_start,
    kv_end,
    part,
    # sizes
    scale_log2,
    # strides
    stride_qb,
    stride_qh,
    stride_qd,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_rr,
    stride_rl,
    stride_op,
    stride_ob,
    stride_oh,
    stride_od,
    stride_lp,
    stride_lb,
    stride_lh,
    # meta
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """Online-softmax attention of BLOCK_M query rows over keys [kv_start, kv_end) of row
    ``pool_row`` of req_to_token, row ``i`` only up to ``row_kv_end[i]`` (<= kv_end); writes
    the normalised partial output and natural-log LSE (-inf for a row with no key)."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    dv_ok = offs_dv < HEAD_DIM_V
    b64 = b.to(tl.int64)
    q = tl.load(
        Q + b64[:, None] * stride_qb + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    r2t_row = ReqToToken + pool_row.to(tl.int64) * stride_rr
    for start in range(kv_start, kv_end, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < kv_end
        slots = tl.load(r2t_row + cols * stride_rl, mask=col_ok, other=0).to(tl.int64)
        k = tl.load(
            K + slots[None, :] * stride_ks + kvh * stride_kh + offs_d[:, None] * stride_kd,
            mask=col_ok[None, :] & d_ok[:, None],
            other=0.0,
        )  # [BLOCK_D, BLOCK_N]
        v = tl.load(
            V + slots[:, None] * stride_vs + kvh * stride_vh + offs_dv[None, :] * stride_vd,
            mask=col_ok[:, None] & dv_ok[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_DV]
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k) * scale_log2
        s = tl.where(cols[None, :] < row_kv_end[:, None], s, float("-inf"))
        # a row may have no key yet (causal rows of an extend): subtract 0 there, not -inf
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_sub)
        p = tl.exp2(s - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if DOT_FP32:
            acc += tl.dot(p, v)
        else:
            acc += tl.dot(p.to(v.dtype), v)
        m_i = m_new
    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(nonempty, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    tl.store(
        OPart
        + part * stride_op
        + b64[:, None] * stride_ob
        + head[:, None] * stride_oh
        + offs_dv[None, :] * stride_od,
        o,
        mask=row_ok[:, None] & dv_ok[None, :],
    )
    tl.store(LsePart + part * stride_lp + b64 * stride_lb + head * stride_lh, lse, mask=row_ok)


@triton.jit
def _prefix_shared_fwd(
    # pointers: inputs
    Q,
    K,
    V,
    ReqToToken,
    ReqPoolIdx,
    SeqLens,
    PrefixLens,
    Members,
    Tiles,
    OwnTiles,
    # pointers: outputs
    OPart,
    LsePart,
    # sizes
    n_prefix_tiles,
    scale_log2,
    # strides
    stride_qb,
    stride_qh,
    stride_qd,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_rr,
    stride_rl,
    stride_op,
    stride_ob,
    stride_oh,
    stride_od,
    stride_lp,
    stride_lb,
    stride_lh,
    # meta
    GQA_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_M_PREFIX: tl.constexpr,
    BLOCK_M_SUFFIX: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    if pid < n_prefix_tiles:
        # shared prefix: many queries of one group against one chunk of the prefix KV
        t = Tiles + pid * 7
        member_start = tl.load(t + 0)
        group_size = tl.load(t + 1)
        row_start = tl.load(t + 2)
        kv_start = tl.load(t + 3)
        kv_end = tl.load(t + 4)
        pool_row = tl.load(t + 5)
        part = tl.load(t + 6)
        rows = row_start + tl.arange(0, BLOCK_M_PREFIX)
        member = rows // GQA_GROUP
        row_ok = member < group_size
        b = tl.load(Members + member_start + member, mask=row_ok, other=0)
        head = kvh * GQA_GROUP + rows % GQA_GROUP
        _attend_tile(
            Q,
            K,
            V,
            ReqToToken,
            OPart,
            LsePart,
            b,
            head,
            row_ok,
            tl.zeros([BLOCK_M_PREFIX], dtype=tl.int32) + kv_end,
            kvh,
            pool_row,
            kv_start,
            kv_end,
            part,
            scale_log2,
            stride_qb,
            stride_qh,
            stride_qd,
            stride_ks,
            stride_kh,
            stride_kd,
            stride_vs,
            stride_vh,
            stride_vd,
            stride_rr,
            stride_rl,
            stride_op,
            stride_ob,
            stride_oh,
            stride_od,
            stride_lp,
            stride_lb,
            stride_lh,
            HEAD_DIM,
            HEAD_DIM_V,
            BLOCK_M_PREFIX,
            BLOCK_N,
            BLOCK_D,
            BLOCK_DV,
            DOT_FP32,
        )
    else:
        # own keys of a run of queries on one req_to_token row (decode: one request's suffix;
        # extend: consecutive new tokens of one request), their GQA_GROUP heads of KV head kvh.
        # Names differ from the other branch's: compiled Triton requires a name bound in both
        # branches of a runtime `if` to have one type, and the tiles have different row counts
        # (the interpreter does not check this; tests/kernels/test_triton_lowering.py does).
        ot = OwnTiles + (pid - n_prefix_tiles) * 2
        first = tl.load(ot + 0)
        count = tl.load(ot + 1)
        own_rows = tl.arange(0, BLOCK_M_SUFFIX)
        own_ok = own_rows // GQA_GROUP < count
        own_b = first + tl.where(own_ok, own_rows // GQA_GROUP, 0)
        own_head = kvh * GQA_GROUP + own_rows % GQA_GROUP
        own_pool_row = tl.load(ReqPoolIdx + first)
        own_kv_start = tl.load(PrefixLens + first)  # one request: the same for every query
        own_row_kv_end = tl.load(SeqLens + own_b, mask=own_ok, other=0)
        own_kv_end = tl.max(own_row_kv_end, 0)
        _attend_tile(
            Q,
            K,
            V,
            ReqToToken,
            OPart,
            LsePart,
            own_b,
            own_head,
            own_ok,
            own_row_kv_end,
            kvh,
            own_pool_row,
            own_kv_start,
            own_kv_end,
            0,
            scale_log2,
            stride_qb,
            stride_qh,
            stride_qd,
            stride_ks,
            stride_kh,
            stride_kd,
            stride_vs,
            stride_vh,
            stride_vd,
            stride_rr,
            stride_rl,
            stride_op,
            stride_ob,
            stride_oh,
            stride_od,
            stride_lp,
            stride_lb,
            stride_lh,
            HEAD_DIM,
            HEAD_DIM_V,
            BLOCK_M_SUFFIX,
            BLOCK_N,
            BLOCK_D,
            BLOCK_DV,
            DOT_FP32,
        )


@triton.jit
def _merge_parts(
    # pointers
    OPart,
    LsePart,
    Out,
    # sizes
    n_parts,
    num_heads,
    # strides
    stride_op,
    stride_ob,
    stride_oh,
    stride_od,
    stride_lp,
    stride_lb,
    stride_lh,
    stride_outb,
    stride_outh,
    stride_outd,
    # meta
    HEAD_DIM_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Out[b] = log-sum-exp merge of o_part[:, b] (all heads of one request per program)."""
    b = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_dv = tl.arange(0, BLOCK_DV)
    h_ok = offs_h < num_heads
    mask = h_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V)
    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)  # noqa: E741 (the softmax denominator's usual name)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for p in range(0, n_parts):
        lse = tl.load(
            LsePart + p * stride_lp + b * stride_lb + offs_h * stride_lh,
            mask=h_ok,
            other=float("-inf"),
        )
        o = tl.load(
            OPart
            + p * stride_op
            + b * stride_ob
            + offs_h[:, None] * stride_oh
            + offs_dv[None, :] * stride_od,
            mask=mask,
            other=0.0,
        )
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        w = tl.exp(lse - m_safe)
        o = tl.where(w[:, None] > 0, o, 0.0)  # an empty part's o is never read as NaN
        acc = acc * alpha[:, None] + o * w[:, None]
        l = l * alpha + w  # noqa: E741
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(
        Out + b * stride_outb + offs_h[:, None] * stride_outh + offs_dv[None, :] * stride_outd,
        out.to(Out.dtype.element_ty),
        mask=mask,
    )


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class TritonPlan:
    """Work tables of one decode batch for the fused launch, built once per forward batch and
    shared by every layer.

    ``members`` ``[sum G]`` int32 batch indices, group by group; ``tiles``
    ``[n_prefix_tiles, 7]`` int32 rows (member_start, group_size, row_start, kv_start, kv_end,
    pool_row, part); ``own_tiles`` ``[n_own_tiles, 2]`` int32 rows (first query, number of
    queries): runs of consecutive queries on one ``req_to_token`` row with one ``prefix_lens``
    (decode: one per request), ``block_m_own`` query rows per own tile (a power of two >=
    queries x ``gqa_group``); ``prefix_lens`` ``[B]`` int32 (0 outside sharing groups);
    ``req_pool_idx`` and ``seq_lens`` ``[B]`` int32; ``n_parts`` = 1 (suffix) + the most prefix
    chunks of any group. All tensors on the kernel's device.
    """

    batch_size: int
    gqa_group: int
    members: torch.Tensor
    tiles: torch.Tensor
    prefix_lens: torch.Tensor
    req_pool_idx: torch.Tensor
    seq_lens: torch.Tensor
    n_prefix_tiles: int
    n_parts: int
    own_tiles: torch.Tensor
    n_own_tiles: int
    block_m_own: int


def plan_decode_triton(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    gqa_group: int,
    groups: list[PrefixGroup] | None = None,
    prefix_chunk: int = PREFIX_CHUNK,
    own_runs: list[tuple[int, int]] | None = None,
    block_m_own: int | None = None,
) -> TritonPlan:
    """Build the :class:`TritonPlan` (host-side tables, one copy to the device).

    Args: ``req_to_token`` ``[R, L]``, ``req_pool_indices`` ``[B]`` int64, ``seq_lens`` ``[B]``
    int64, ``gqa_group`` = Hq // Hkv, ``groups`` covering each batch index once (``None``:
    :func:`find_prefix_groups`), ``prefix_chunk`` keys of a prefix per program (split-KV);
    ``own_runs`` the own tiles as (first query, count), ``block_m_own`` their rows (``None``:
    one tile per query, as in decode).
    """
    assert prefix_chunk >= 1 and gqa_group >= 1
    B = int(req_pool_indices.shape[0])
    device = req_pool_indices.device
    if groups is None:
        groups = find_prefix_groups(req_to_token, req_pool_indices, seq_lens)
    rpi_host = req_pool_indices.cpu()
    members: list[torch.Tensor] = []
    tiles: list[list[int]] = []
    prefix_lens = torch.zeros(B, dtype=torch.int32)
    n_chunks_max = 0
    member_start = 0
    for g in groups:
        if g.prefix_len == 0:
            continue
        idx = g.batch_indices.cpu().long()
        P, G = g.prefix_len, int(idx.shape[0])
        prefix_lens[idx] = P
        members.append(idx.int())
        pool_row = int(rpi_host[idx[0]])
        chunks = list(range(0, P, prefix_chunk))
        n_chunks_max = max(n_chunks_max, len(chunks))
        for row_start in range(0, G * gqa_group, BLOCK_M_PREFIX):
            for i, kv_start in enumerate(chunks):
                kv_end = min(P, kv_start + prefix_chunk)
                tiles.append([member_start, G, row_start, kv_start, kv_end, pool_row, 1 + i])
        member_start += G
    members_t = torch.cat(members) if members else torch.zeros(1, dtype=torch.int32)
    tiles_t = (
        torch.tensor(tiles, dtype=torch.int32)
        if tiles
        else torch.zeros(1, _TILE_FIELDS, dtype=torch.int32)
    )
    if own_runs is None:  # decode: each request its own tile
        own = torch.stack([torch.arange(B, dtype=torch.int32), torch.ones(B, dtype=torch.int32)], 1)
    else:
        own = torch.tensor(own_runs, dtype=torch.int32).reshape(-1, _OWN_FIELDS)
    return TritonPlan(
        batch_size=B,
        gqa_group=gqa_group,
        members=members_t.to(device),
        tiles=tiles_t.reshape(-1, _TILE_FIELDS).to(device),
        prefix_lens=prefix_lens.to(device),
        req_pool_idx=req_pool_indices.to(torch.int32),
        seq_lens=seq_lens.to(torch.int32),
        n_prefix_tiles=len(tiles),
        n_parts=1 + n_chunks_max,
        own_tiles=own.to(device),
        n_own_tiles=int(own.shape[0]),
        block_m_own=block_m_own or max(16, triton.next_power_of_2(gqa_group)),
    )


def prefix_shared_decode_triton(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    groups: list[PrefixGroup] | None = None,
    out: torch.Tensor | None = None,
    prefix_chunk: int = PREFIX_CHUNK,
    plan: TritonPlan | None = None,
) -> torch.Tensor:
    """One decode step: shared prefixes and suffixes in one fused launch, then a merge launch.

    Args:
        q: ``[B, Hq, D]`` float32/bfloat16/float16 (any strides).
        k_buffer: ``[S, Hkv, D]``; v_buffer: ``[S, Hkv, Dv]``; same dtype as ``q``.
        req_to_token: ``[R, L]`` int32/int64 slot ids.
        req_pool_indices: ``[B]`` int64; seq_lens: ``[B]`` int64, ``>= 1``.
        scale: softmax scale.
        groups: :class:`PrefixGroup` list covering each batch index once (``None``: found by
            :func:`find_prefix_groups`).
        out: optional ``[B, Hq, Dv]`` in ``q.dtype``, written in place.
        prefix_chunk: keys of a prefix per program (split-KV).
        plan: from :func:`plan_decode_triton` for this batch (reuse it across layers);
            ``None`` builds it here (then ``groups`` and ``prefix_chunk`` apply).

    Returns:
        ``[B, Hq, Dv]`` in ``q.dtype``.
    """
    assert q.dim() == 3 and k_buffer.dim() == 3 and v_buffer.dim() == 3
    B, Hq, D = q.shape
    S, Hkv, Dk = k_buffer.shape
    Dv = v_buffer.shape[2]
    assert Dk == D, f"k head dim {Dk} != q head dim {D}"
    assert v_buffer.shape[:2] == (S, Hkv), "v_buffer must be [S, Hkv, Dv] like k_buffer"
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    assert (
        q.dtype in _SUPPORTED and k_buffer.dtype == q.dtype == v_buffer.dtype
    ), f"q/k/v dtypes {q.dtype}/{k_buffer.dtype}/{v_buffer.dtype}: one of {_SUPPORTED}"
    assert req_to_token.dim() == 2 and req_to_token.dtype in (torch.int32, torch.int64)
    assert req_pool_indices.shape == (B,) and seq_lens.shape == (B,)
    devices = {t.device for t in (q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)}
    assert len(devices) == 1, f"all tensors must share one device, got {devices}"
    assert min(q.stride() + k_buffer.stride() + v_buffer.stride()) >= 0
    device = q.device
    grp = Hq // Hkv
    if out is None:
        out = torch.empty(B, Hq, Dv, dtype=q.dtype, device=device)
    assert out.shape == (B, Hq, Dv) and out.dtype == q.dtype
    if B == 0:
        return out
    if plan is None:
        plan = plan_decode_triton(
            req_to_token, req_pool_indices, seq_lens, grp, groups, prefix_chunk
        )
    assert plan.batch_size == B and plan.gqa_group == grp, "plan built for another batch"
    assert plan.tiles.device == device, "plan tensors must be on q's device"
    n_parts, n_prefix_tiles = plan.n_parts, plan.n_prefix_tiles

    o_part = torch.empty(n_parts, B, Hq, Dv, dtype=torch.float32, device=device)
    lse_part = torch.full((n_parts, B, Hq), float("-inf"), dtype=torch.float32, device=device)
    block_d = max(16, triton.next_power_of_2(D))
    block_dv = max(16, triton.next_power_of_2(Dv))
    dot_fp32 = _interpreting() or q.dtype == torch.float32
    grid = (n_prefix_tiles + plan.n_own_tiles, Hkv)
    _prefix_shared_fwd[grid](
        q,
        k_buffer,
        v_buffer,
        req_to_token,
        plan.req_pool_idx,
        plan.seq_lens,
        plan.prefix_lens,
        plan.members,
        plan.tiles,
        plan.own_tiles,
        o_part,
        lse_part,
        n_prefix_tiles,
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_buffer.stride(0),
        k_buffer.stride(1),
        k_buffer.stride(2),
        v_buffer.stride(0),
        v_buffer.stride(1),
        v_buffer.stride(2),
        req_to_token.stride(0),
        req_to_token.stride(1),
        o_part.stride(0),
        o_part.stride(1),
        o_part.stride(2),
        o_part.stride(3),
        lse_part.stride(0),
        lse_part.stride(1),
        lse_part.stride(2),
        GQA_GROUP=grp,
        HEAD_DIM=D,
        HEAD_DIM_V=Dv,
        BLOCK_M_PREFIX=BLOCK_M_PREFIX,
        BLOCK_M_SUFFIX=plan.block_m_own,
        BLOCK_N=BLOCK_N,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        DOT_FP32=dot_fp32,
    )
    _merge_parts[(B,)](
        o_part,
        lse_part,
        out,
        n_parts,
        Hq,
        o_part.stride(0),
        o_part.stride(1),
        o_part.stride(2),
        o_part.stride(3),
        lse_part.stride(0),
        lse_part.stride(1),
        lse_part.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        HEAD_DIM_V=Dv,
        BLOCK_H=max(16, triton.next_power_of_2(Hq)),
        BLOCK_DV=block_dv,
    )
    return out


# --- extend (prefill on a cached prefix) --------------------------------------------------------


@dataclass(frozen=True)
class TritonExtendPlan:
    """An extend batch as a decode batch of its new tokens, for the same fused launch.

    New token ``i`` of request ``b`` attends causally to keys ``[0, pre_b + i]`` of ``b``'s
    ``req_to_token`` row: exactly a decode query with ``seq_len = pre_b + i + 1`` on that row.
    So each new token is one query of :func:`prefix_shared_decode_triton`: a group's new tokens
    share its cached prefix (its prefix programs take them all as matrix products,
    ``BLOCK_M_PREFIX`` rows per tile), and the own keys ``[P, pre_b + i]`` of up to
    ``BLOCK_M_OWN // gqa_group`` consecutive tokens of a request are one own tile (each row
    masked at its own end: causal). ``req_pool_idx`` / ``seq_lens`` ``[T]`` int64: each token's
    row and key count.
    """

    req_pool_idx: torch.Tensor
    seq_lens: torch.Tensor
    decode: TritonPlan


def plan_extend_triton(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    extend_prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    gqa_group: int,
    groups: list[PrefixGroup],
) -> TritonExtendPlan:
    """Build the :class:`TritonExtendPlan` of an extend batch.

    Args: ``req_pool_indices``, ``extend_prefix_lens``, ``extend_seq_lens`` ``[B]`` int64;
    ``groups`` covering each batch index once, each ``prefix_len`` at most every member's
    ``extend_prefix_lens`` (:func:`feather_kernels.find_extend_groups`).

    NOTE: the prefix is not split over programs (split-KV) here: a group's new tokens already
    give ``tokens * gqa_group / BLOCK_M_PREFIX`` tiles, and one chunk keeps the partial outputs
    at two per (token, head).
    """
    device = req_pool_indices.device
    ext = extend_seq_lens.long()
    B = int(ext.shape[0])
    T = int(ext.sum())
    batch_of_token = torch.repeat_interleave(torch.arange(B, device=device), ext)  # [T]
    first = torch.cumsum(ext, 0) - ext  # each request's first token row
    offset = torch.arange(T, device=device) - first[batch_of_token]
    tok_rpi = req_pool_indices.long()[batch_of_token]
    tok_seq = extend_prefix_lens.long()[batch_of_token] + offset + 1
    token_groups, rest = [], []
    for g in groups:
        rows = torch.nonzero(torch.isin(batch_of_token, g.batch_indices.to(device))).flatten()
        if rows.numel() == 0:
            continue
        (
            token_groups.append(PrefixGroup(rows, g.prefix_len))
            if g.prefix_len > 0
            else rest.append(rows)
        )
    if rest:
        token_groups.append(PrefixGroup(torch.sort(torch.cat(rest)).values, 0))
    # Own tiles: each request's tokens in runs of up to `per_tile`.
    block_m = max(BLOCK_M_OWN, triton.next_power_of_2(gqa_group))
    per_tile = block_m // gqa_group
    own = [
        (f, min(per_tile, f0 + e - f))
        for f0, e in zip(first.tolist(), ext.tolist())
        for f in range(f0, f0 + e, per_tile)
    ]
    longest = max([g.prefix_len for g in token_groups] + [1])
    decode = plan_decode_triton(
        req_to_token,
        tok_rpi,
        tok_seq,
        gqa_group,
        token_groups,
        prefix_chunk=longest,
        own_runs=own,
        block_m_own=block_m,
    )
    return TritonExtendPlan(tok_rpi, tok_seq, decode)


def prefix_shared_extend_triton(
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
    plan: TritonExtendPlan | None = None,
) -> torch.Tensor:
    """Causal extend attention, each group's cached prefix read once per tile of its new
    tokens, in the fused decode launch (see :class:`TritonExtendPlan`).

    Args:
        q: ``[T, Hq, D]``, ``T = sum(extend_seq_lens)``, request by request (SGLang's order).
        k_buffer, v_buffer: ``[S, Hkv, D]`` / ``[S, Hkv, Dv]``, the new tokens' KV written.
        req_to_token: ``[R, L]``; req_pool_indices, seq_lens, extend_prefix_lens,
            extend_seq_lens: ``[B]`` int64, ``seq_lens = extend_prefix_lens + extend_seq_lens``
            (the arguments of :func:`feather_kernels.prefix_shared_extend`).
        scale: softmax scale.
        groups: as :func:`plan_extend_triton` takes them (``None``: found here).
        out: optional ``[T, Hq, Dv]`` in ``q.dtype``.
        plan: from :func:`plan_extend_triton` (reuse it across layers).

    Returns:
        ``[T, Hq, Dv]`` in ``q.dtype``.
    """
    assert bool((seq_lens == extend_prefix_lens + extend_seq_lens).all()), "seq = prefix + extend"
    if plan is None:
        if groups is None:
            groups = find_prefix_groups(req_to_token, req_pool_indices, extend_prefix_lens)
        plan = plan_extend_triton(
            req_to_token,
            req_pool_indices,
            extend_prefix_lens,
            extend_seq_lens,
            q.shape[1] // k_buffer.shape[1],
            groups,
        )
    assert q.shape[0] == plan.seq_lens.shape[0], "q rows must be the batch's new tokens"
    return prefix_shared_decode_triton(
        q,
        k_buffer,
        v_buffer,
        req_to_token,
        plan.req_pool_idx,
        plan.seq_lens,
        scale,
        out=out,
        plan=plan.decode,
    )
