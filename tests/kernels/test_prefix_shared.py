"""Prefix-shared decode and extend attention: CPU paths and Triton kernel against the torch
reference.

The Triton kernel runs under ``TRITON_INTERPRET=1`` in two subprocesses, one for decode and one
for extend (the variable must be set before triton defines the kernels, and another test module
may already have imported triton here); GPU tests run it compiled when CUDA is present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from feather_kernels import (
    PrefixGroup,
    decode_attention_reference,
    find_prefix_groups,
    merge_state,
    plan_decode,
    prefix_shared_decode,
)
from feather_kernels.prefix_shared_extend_cpu import find_extend_groups, prefix_shared_extend
from feather_kernels.reference import extend_attention_reference
from feather_kernels.synthetic import make_decode_batch, make_extend_batch

REPO = Path(__file__).resolve().parents[2]
# |fast - reference| <= atol + rtol * |reference|, on outputs rounded to the input dtype
TOL = {
    torch.float32: dict(atol=2e-5, rtol=1e-4),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}


def _suffixes(B: int, P: int, seed: int) -> list[int]:
    """Ragged suffix lengths; 0 included when the prefix alone gives the request a token."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 40, (B,), generator=g).tolist()
    lens[0] = 0 if P > 0 else 1
    if B > 1:
        lens[-1] = 70  # longer than one power-of-two bucket of the others
    return [max(n, 0 if P > 0 else 1) for n in lens]


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


# --- CPU path --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("P", [0, 17, 64])
@pytest.mark.parametrize("B", [1, 3, 8])
def test_cpu_path_matches_reference(B, P, heads, dtype):
    Hq, Hkv = heads
    batch = make_decode_batch(
        [B], [P], _suffixes(B, P, seed=B * 100 + P), Hq, Hkv, 32, dtype=dtype, seed=B + P
    )
    ref = decode_attention_reference(*batch.args)
    # groups found from the table, and the true groups handed in (as a scheduler would)
    _close(prefix_shared_decode(*batch.args), ref, dtype)
    given = [PrefixGroup(torch.tensor(m), p) for m, p in batch.groups]
    _close(prefix_shared_decode(*batch.args, groups=given), ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cpu_path_mixed_groups_and_loners(dtype):
    # two sharing groups, a one-request "group" with a long private prefix, P=0 requests
    sizes, prefixes = [3, 5, 1, 2], [40, 130, 50, 0]
    suffixes = [0, 5, 9, 1, 2, 64, 33, 7, 0, 3, 12]
    batch = make_decode_batch(sizes, prefixes, suffixes, 9, 3, 64, dtype=dtype, seed=7)
    groups = find_prefix_groups(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    found = {tuple(g.batch_indices.tolist()): g.prefix_len for g in groups}
    want = {tuple(m): p for m, p in batch.groups[:2]}
    loners = sorted(batch.groups[2][0] + batch.groups[3][0])
    want[tuple(loners)] = 0
    assert found == want
    out = torch.empty_like(batch.q)
    res = prefix_shared_decode(*batch.args, groups=groups, out=out)
    assert res is out
    _close(out, decode_attention_reference(*batch.args), dtype)


def test_cpu_plan_is_reused_across_layers():
    # a backend plans once per forward batch; each layer has its own KV buffers
    batch = make_decode_batch([4, 2], [50, 20], [3, 0, 7, 1, 5, 9], 8, 2, 32, seed=3)
    plan = plan_decode(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        k = torch.randn(batch.k_buffer.shape, generator=g)
        v = torch.randn(batch.v_buffer.shape, generator=g)
        q = torch.randn(batch.q.shape, generator=g)
        args = (q, k, v, batch.req_to_token, batch.req_pool_indices, batch.seq_lens, batch.scale)
        _close(
            prefix_shared_decode(*args, plan=plan), decode_attention_reference(*args), torch.float32
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "suffixes",
    [
        [40, 33, 64, 50, 63],  # one length bucket, padded and masked
        [64, 64, 64, 64, 64],  # one bucket, no padding (the benchmark's shape)
        [1, 16, 5, 9, 0],  # short suffixes share a bucket; one request is the prefix alone
        [0, 0, 0, 0, 0],  # prefix only
    ],
)
def test_cpu_path_one_group_suffix_shapes(suffixes, dtype):
    batch = make_decode_batch([5], [30], suffixes, 9, 3, 64, dtype=dtype, seed=sum(suffixes))
    _close(prefix_shared_decode(*batch.args), decode_attention_reference(*batch.args), dtype)


def test_cpu_plan_buffers_are_not_returned():
    # the plan keeps its gather buffers between calls: an earlier layer's output must survive
    batch = make_decode_batch([4, 3], [50, 20], [3, 0, 7, 1, 5, 9, 64], 8, 2, 32, seed=4)
    plan = plan_decode(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    first = prefix_shared_decode(*batch.args, plan=plan)
    kept = first.clone()
    g = torch.Generator().manual_seed(2)
    k = torch.randn(batch.k_buffer.shape, generator=g)
    v = torch.randn(batch.v_buffer.shape, generator=g)
    args = (batch.q, k, v) + batch.args[3:]
    _close(prefix_shared_decode(*args, plan=plan), decode_attention_reference(*args), torch.float32)
    assert torch.equal(first, kept)
    # the same plan for another dtype (its own buffers) and a bigger head count
    args16 = (batch.q.bfloat16(), k.bfloat16(), v.bfloat16()) + batch.args[3:]
    _close(
        prefix_shared_decode(*args16, plan=plan),
        decode_attention_reference(*args16),
        torch.bfloat16,
    )
    q8 = torch.randn(batch.q.shape[0], 8, 32, generator=g)
    k8 = torch.randn(k.shape[0], 4, 32, generator=g)
    v8 = torch.randn(k.shape[0], 4, 32, generator=g)
    args8 = (q8, k8, v8) + batch.args[3:]
    _close(
        prefix_shared_decode(*args8, plan=plan), decode_attention_reference(*args8), torch.float32
    )


def test_cpu_path_strided_kv_buffers():
    # a KV pool view that is not contiguous (e.g. one slice of a wider buffer)
    batch = make_decode_batch([3, 2], [40, 0], [0, 5, 70, 1, 3], 8, 2, 32, seed=8)
    wide_k = torch.randn(batch.k_buffer.shape[0], 4, 32)
    wide_v = torch.randn(batch.v_buffer.shape[0], 4, 32)
    wide_k[:, 1:3] = batch.k_buffer
    wide_v[:, 1:3] = batch.v_buffer
    args = (batch.q, wide_k[:, 1:3], wide_v[:, 1:3]) + batch.args[3:]
    assert not args[1].is_contiguous()
    _close(prefix_shared_decode(*args), decode_attention_reference(*batch.args), torch.float32)


def test_cpu_paths_without_the_fused_flash_op(monkeypatch):
    # the matmul + softmax fallback, for torch builds without the private flash op
    import feather_kernels.prefix_shared_cpu as cpu

    monkeypatch.setattr(cpu, "_FLASH_CPU", None)
    batch = make_decode_batch([3, 2, 1], [40, 20, 0], [0, 5, 70, 1, 3, 9], 8, 2, 32, seed=5)
    _close(
        prefix_shared_decode(*batch.args), decode_attention_reference(*batch.args), torch.float32
    )
    one = make_decode_batch([4], [40], [9, 12, 3, 16], 8, 2, 32, seed=9)  # one suffix bucket
    _close(prefix_shared_decode(*one.args), decode_attention_reference(*one.args), torch.float32)
    ext = make_extend_batch([3, 1], [30, 0], [2, 0, 0, 0], [4, 1, 9, 6], 8, 2, 32, seed=6)
    _close(prefix_shared_extend(*ext.args), extend_attention_reference(*ext.args), torch.float32)


@pytest.mark.parametrize("native", [False, True])
def test_cpu_bfloat16_prefix_attended_in_either_dtype(native, monkeypatch):
    # bfloat16 caches: the prefix in bfloat16 (hosts with AMX) or upcast to float32 (others);
    # both paths run here whatever this host is
    import feather_kernels.prefix_shared_cpu as cpu

    monkeypatch.setattr(cpu, "_NATIVE_DTYPES", (torch.bfloat16,) if native else ())
    assert cpu.prefix_dtype(torch.bfloat16) == (torch.bfloat16 if native else torch.float32)
    assert cpu.prefix_dtype(torch.float32) == torch.float32
    for layout in ("scattered", "allocator"):  # gathered, and read in place (runs >= 256)
        batch = make_decode_batch(
            [3, 2, 1],
            [300, 20, 0],
            [0, 5, 70, 1, 3, 9],
            9,
            3,
            32,
            dtype=torch.bfloat16,
            seed=5,
            layout=layout,
        )
        _close(
            prefix_shared_decode(*batch.args),
            decode_attention_reference(*batch.args),
            torch.bfloat16,
        )
    ext = make_extend_batch(
        [3, 1], [30, 0], [2, 0, 0, 0], [4, 1, 9, 6], 9, 3, 32, dtype=torch.bfloat16, seed=6
    )
    _close(prefix_shared_extend(*ext.args), extend_attention_reference(*ext.args), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_extend_group_rows_not_back_to_back(dtype):
    # a group of requests 0 and 2 (rows not adjacent: request 1 between them shares nothing)
    ext = make_extend_batch([3], [30], [0, 3, 0], [4, 5, 6], 8, 2, 32, dtype=dtype, seed=3)
    groups = [PrefixGroup(torch.tensor([2, 0]), 30), PrefixGroup(torch.tensor([1]), 0)]
    _close(
        prefix_shared_extend(*ext.args, groups=groups), extend_attention_reference(*ext.args), dtype
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_path_allocator_layout_reads_runs_in_place(dtype):
    # SGLang's allocator gives a prefix prefilled at once consecutive slots: the plan attends
    # such runs in place (one long run per group here), the result must not change.
    sizes, prefixes = [5, 3, 2], [600, 300, 40]
    suffixes = [64, 30, 1, 0, 17, 64, 64, 2, 9, 33]
    batch = make_decode_batch(
        sizes, prefixes, suffixes, 9, 3, 64, dtype=dtype, seed=11, layout="allocator"
    )
    plan = plan_decode(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    runs = sorted(n for part in plan.parts for _, n in part.runs)
    assert runs == [300, 600]  # the 40-token prefix is below _MIN_RUN: gathered
    assert all(part.rest is None for part in plan.parts)
    _close(
        prefix_shared_decode(*batch.args, plan=plan), decode_attention_reference(*batch.args), dtype
    )


def test_cpu_path_prefix_of_runs_and_scattered_slots():
    # a fragmented pool: the prefix is two long runs, short runs and single slots, listed out of
    # order in req_to_token; the runs are read in place, the rest gathered, merged by LSE
    batch = make_decode_batch(
        [4, 1], [800, 0], [5, 64, 0, 12, 3], 8, 2, 32, seed=12, layout="allocator", spare_slots=256
    )
    n_slots = batch.k_buffer.shape[0]
    prefix = torch.arange(1, 801, dtype=torch.int32)
    prefix[300:340] = torch.arange(n_slots - 40, n_slots, dtype=torch.int32)  # 40 moved slots
    prefix[500:503] = torch.tensor([n_slots - 100, n_slots - 150, n_slots - 41], dtype=torch.int32)
    prefix = prefix[torch.randperm(800, generator=torch.Generator().manual_seed(0))]
    members = batch.groups[0][0]
    batch.req_to_token[batch.req_pool_indices[members], :800] = prefix
    plan = plan_decode(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    (part,) = [p for p in plan.parts if p.slots is not None]
    assert [n for _, n in part.runs] == [300, 297] and part.rest.numel() == 203
    ref = decode_attention_reference(*batch.args)
    _close(prefix_shared_decode(*batch.args, plan=plan), ref, torch.float32)
    # the same through a strided pool view (one slice of a wider buffer)
    wide_k = torch.randn(n_slots, 4, 32)
    wide_v = torch.randn(n_slots, 4, 32)
    wide_k[:, 1:3], wide_v[:, 1:3] = batch.k_buffer, batch.v_buffer
    args = (batch.q, wide_k[:, 1:3], wide_v[:, 1:3]) + batch.args[3:]
    _close(prefix_shared_decode(*args, plan=plan), ref, torch.float32)


def test_synthetic_layouts():
    # "allocator": each prefix one block from slot 1, then one slot per request per step
    b = make_decode_batch([2, 1], [5, 3], [2, 3, 1], 4, 2, 8, layout="allocator", shuffle=False)
    rows = b.req_to_token[b.req_pool_indices]
    assert rows[0, :7].tolist() == [1, 2, 3, 4, 5, 9, 12]
    assert rows[1, :8].tolist() == [1, 2, 3, 4, 5, 10, 13, 14]
    assert rows[2, :4].tolist() == [6, 7, 8, 11]
    with pytest.raises(ValueError, match="allowed values are 'scattered' and 'allocator'"):
        make_decode_batch([1], [4], [1], 4, 2, 8, layout="sorted")


# --- extend (prefill on a cached prefix), CPU path --------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize(
    "shape",
    [
        # group sizes, shared prefixes, private cached tokens, new tokens
        ([1], [0], [0], [7]),
        ([3], [17], [0, 0, 0], [1, 5, 12]),
        ([4, 2, 1], [50, 0, 20], [2, 0, 5, 0, 0, 4, 0], [5, 10, 1, 3, 7, 5, 2]),
        ([8], [64], [0, 1, 2, 3, 0, 0, 9, 0], [1, 2, 3, 4, 33, 6, 7, 8]),
    ],
)
def test_cpu_extend_matches_reference(shape, heads, dtype):
    sizes, prefixes, private, new = shape
    batch = make_extend_batch(sizes, prefixes, private, new, *heads, 32, dtype=dtype, seed=len(new))
    ref = extend_attention_reference(*batch.args)
    _close(prefix_shared_extend(*batch.args), ref, dtype)
    given = [PrefixGroup(torch.tensor(m), p) for m, p in batch.groups]
    _close(prefix_shared_extend(*batch.args, groups=given), ref, dtype)


def test_extend_groups_stop_at_the_cached_prefix():
    batch = make_extend_batch([3], [30], [4, 0, 2], [5, 6, 7], 4, 4, 16)
    groups = find_extend_groups(
        batch.req_to_token, batch.req_pool_indices, batch.extend_prefix_lens
    )
    assert [(g.batch_indices.tolist(), g.prefix_len) for g in groups] == [([0, 1, 2], 30)]
    # a shorter shared prefix than the cache holds is still exact
    short = [PrefixGroup(torch.tensor([0, 1, 2]), 20)]
    _close(
        prefix_shared_extend(*batch.args, groups=short),
        extend_attention_reference(*batch.args),
        torch.float32,
    )
    with pytest.raises(AssertionError):
        prefix_shared_extend(*batch.args, groups=[PrefixGroup(torch.tensor([0, 1, 2]), 31)])


# --- find_prefix_groups ----------------------------------------------------------------------


def _groups(table, rows, lens, **kw):
    r2t = torch.tensor(table, dtype=torch.int32)
    gs = find_prefix_groups(r2t, torch.tensor(rows), torch.tensor(lens), **kw)
    seen = sorted(i for g in gs for i in g.batch_indices.tolist())
    assert seen == list(range(len(rows))), "every request in exactly one group"
    return {tuple(g.batch_indices.tolist()): g.prefix_len for g in gs}


def test_find_groups_common_length_and_branching():
    table = [
        [5, 6, 7, 8, 9, 0],
        [9, 1, 2, 3, 4, 0],
        [5, 6, 7, 8, 1, 0],  # shares 4 with row 0
        [5, 6, 3, 3, 3, 0],  # shares only 2 with rows 0 and 2
        [9, 1, 2, 3, 4, 0],  # shares 5 with row 1
    ]
    # batch order differs from pool rows
    assert _groups(table, [0, 2, 3, 1, 4], [5, 5, 5, 5, 5], min_prefix=1) == {
        (0, 1, 2): 2,
        (3, 4): 5,
    }
    # without row 3 the 5-group shares 4
    assert _groups(table, [2, 0], [5, 5], min_prefix=1) == {(0, 1): 4}


def test_find_groups_capped_by_shortest_member_and_min_prefix():
    table = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]]
    assert _groups(table, [0, 1, 2], [6, 3, 6], min_prefix=1) == {(0, 1, 2): 3}
    # the member too short for min_prefix is left out; the others share all 6
    assert _groups(table, [0, 1, 2], [6, 3, 6], min_prefix=4) == {(0, 2): 6, (1,): 0}
    assert _groups(table, [0, 1, 2], [3, 3, 3], min_prefix=4) == {(0, 1, 2): 0}
    assert _groups(table, [0], [6], min_prefix=1) == {(0,): 0}
    assert _groups([[1, 2], [3, 4]], [0, 1], [2, 2], min_prefix=1) == {(0, 1): 0}


def test_find_groups_prompts_that_only_start_alike():
    # Two system prompts that begin with the same 3 tokens ("You are a", a chat template):
    # the radix tree shares those 3 slots between them, then each prompt's own 40 slots are
    # shared within its group. Both groups must be found (a shared start of 3 < min_prefix
    # must not hide them), and a request that shares only the start stays out.
    start = [1, 2, 3]
    a = start + list(range(100, 140))
    b = start + list(range(200, 240))
    table = [a + [500 + i] for i in range(3)] + [b + [600 + i] for i in range(3)]
    table.append(start + list(range(300, 341)))  # shares only the 3-token start
    rows = [0, 3, 6, 1, 4, 2, 5]  # groups interleaved in the batch
    assert _groups(table, rows, [44] * 7) == {(0, 3, 5): 43, (1, 4, 6): 43, (2,): 0}


def _pad(table):
    """Rows of one width: each padded with slot ids of its own (past its seq_len)."""
    width = max(len(row) for row in table)
    return [
        row + [10_000 + 1_000 * r + j for j in range(width - len(row))]
        for r, row in enumerate(table)
    ]


def test_find_groups_split_at_a_deeper_branch():
    # a 20-slot system prompt shared by all, then one document per subset (+100 and +90
    # slots), then each request's own slots: the subsets are the groups, not everyone at 20
    # (650 KV rows read as one group at 20, 290 split)
    system = list(range(1, 21))
    doc_a, doc_b = list(range(100, 200)), list(range(200, 290))
    table = [system + doc_a + [300 + i] * 5 for i in range(3)]
    table += [system + doc_b + [400 + i] * 15 for i in range(3)]
    rows = [0, 3, 1, 4, 2, 5]
    assert _groups(table, rows, [125] * 6) == {(0, 2, 4): 120, (1, 3, 5): 110}
    # two levels: the first document's subset branches again after 10 slots (+100 and +110)
    deep = [system + doc_a[:10] + list(range(500, 600)) + [600 + i] for i in range(3)]
    deep += [system + doc_a[:10] + list(range(700, 810)) + [800 + i] for i in range(3)]
    table2 = _pad(deep + [system + doc_b[:25] + [900 + i] for i in range(2)])
    lens2 = [131] * 3 + [141] * 3 + [46] * 2
    assert _groups(table2, list(range(8)), lens2) == {(0, 1, 2): 130, (3, 4, 5): 140, (6, 7): 45}
    # short second branches (+12, +14): splitting would not halve the reads, at either level
    short = [row[:42] + [1000 + r] for r, row in enumerate(deep[:3])]
    short += [row[:44] + [1100 + r] for r, row in enumerate(deep[3:])]
    table3 = _pad(short + [system + doc_b[:25] + [900 + i] for i in range(2)])
    assert _groups(table3, list(range(8)), [43] * 3 + [45] * 3 + [46] * 2) == {tuple(range(8)): 20}
    # members left at the branch stay a group at the common length; a single one is a loner
    table4 = _pad(
        [system + doc_a + [300 + i] for i in range(3)] + [system + [900 + i] * 5 for i in range(2)]
    )
    assert _groups(table4, [0, 1, 2, 3, 4], [121] * 3 + [25] * 2) == {(0, 1, 2): 120, (3, 4): 20}
    table5 = _pad([system + doc_a + [300 + i] for i in range(3)] + [system + [900] * 5])
    assert _groups(table5, [0, 1, 2, 3], [121] * 3 + [25]) == {(0, 1, 2): 120, (3,): 0}
    # not worth it: the subsets share only one slot more than everyone
    table6 = [system + [50] + [60 + i] * 30 for i in range(2)] + [
        system + [51] + [70 + i] * 30 for i in range(2)
    ]
    assert _groups(table6, [0, 1, 2, 3], [51] * 4) == {(0, 1, 2, 3): 20}


def test_cpu_path_with_groups_split_at_a_deeper_branch():
    # two groups of the synthetic batch made to share their first 20 slots (one system
    # prompt): the finder splits at the branch and the step still matches the reference
    batch = make_decode_batch(
        [3, 3, 2], [150, 145, 0], [4, 0, 9, 1, 7, 3, 5, 2], 9, 3, 64, seed=21, layout="allocator"
    )
    (a, pa), (b, pb) = batch.groups[:2]
    rows_a, rows_b = batch.req_pool_indices[a], batch.req_pool_indices[b]
    batch.req_to_token[rows_b, :20] = batch.req_to_token[rows_a[0], :20]
    groups = find_prefix_groups(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    found = {tuple(g.batch_indices.tolist()): g.prefix_len for g in groups}
    assert found[tuple(a)] == 150 and found[tuple(b)] == 145
    _close(
        prefix_shared_decode(*batch.args, groups=groups),
        decode_attention_reference(*batch.args),
        torch.float32,
    )


def test_find_groups_verify_catches_tables_that_break_the_radix_invariant():
    table = [[1, 2, 3, 4], [1, 9, 3, 4]]  # equal at 0, 2, 3 but not 1
    assert _groups(table, [0, 1], [4, 4], min_prefix=1, verify=True) == {(0, 1): 1}


def test_find_groups_empty_batch():
    r2t = torch.zeros(2, 4, dtype=torch.int32)
    empty = torch.zeros(0, dtype=torch.long)
    assert find_prefix_groups(r2t, empty, empty) == []


# --- merge_state -----------------------------------------------------------------------------


def test_merge_state_equals_attention_over_all_keys():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(6, 50, generator=g) * 3  # scores for 6 (request, head) rows, 50 keys
    v = torch.randn(50, 16, generator=g)
    full = torch.softmax(s, -1) @ v

    def part(lo, hi):
        return torch.softmax(s[:, lo:hi], -1) @ v[lo:hi], torch.logsumexp(s[:, lo:hi], -1)

    o, lse = merge_state(*part(0, 20), *part(20, 50))
    torch.testing.assert_close(o, full, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))
    o2, lse2 = merge_state(*part(20, 50), *part(0, 20))
    torch.testing.assert_close(o2, o)
    torch.testing.assert_close(lse2, lse)


def test_merge_state_empty_parts():
    o = torch.randn(3, 8)
    lse = torch.randn(3)
    nan_o = torch.full((3, 8), float("nan"))
    ninf = torch.full((3,), float("-inf"))
    for args in ((o, lse, nan_o, ninf), (nan_o, ninf, o, lse)):
        mo, mlse = merge_state(*args)
        torch.testing.assert_close(mo, o)
        torch.testing.assert_close(mlse, lse)
    mo, mlse = merge_state(nan_o, ninf, nan_o, ninf)
    assert torch.equal(mo, torch.zeros(3, 8)) and torch.isneginf(mlse).all()
    # mixed rows: row 0 empty in part 1 only
    lse1 = lse.clone()
    lse1[0] = float("-inf")
    mo, _ = merge_state(nan_o.clone().index_fill_(0, torch.tensor([1, 2]), 0.0), lse1, o, lse)
    torch.testing.assert_close(mo[0], o[0])


# --- Triton kernel ---------------------------------------------------------------------------

# (group sizes, prefix lens, suffix lens, Hq, Hkv, D, dtype, prefix_chunk); kept small: the
# interpreter costs ~0.1-0.5 s per case. A grid B x P x GQA with the dtype cycling, then cases
# for mixed groups, split prefixes (prefix_chunk < P) and all-empty suffixes.
_DTYPES = ["float32", "bfloat16", "float16"]
TRITON_CASES = [
    ([B], [P], _suffixes(B, P, seed=B * 10 + P), hq, hkv, 32, _DTYPES[i % 3], 1024)
    for i, (B, P, (hq, hkv)) in enumerate(
        (B, P, h) for B in (1, 3, 8) for P in (0, 17, 64) for h in ((4, 4), (8, 2))
    )
] + [
    ([3], [64], [2, 0, 9], 8, 2, 64, "bfloat16", 1024),
    ([2, 3, 1, 2], [40, 100, 30, 0], [0, 3, 5, 0, 66, 2, 1, 7], 9, 3, 64, "float32", 32),
    ([2, 3, 1, 2], [40, 100, 30, 0], [0, 3, 5, 0, 66, 2, 1, 7], 9, 3, 64, "float16", 32),
    ([5], [64], [0, 0, 0, 0, 0], 4, 4, 16, "bfloat16", 16),
]

_TRITON_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from feather_kernels import decode_attention_reference, PrefixGroup
    from feather_kernels.prefix_shared_triton import (
        plan_decode_triton, prefix_shared_decode_triton)
    from feather_kernels.synthetic import make_decode_batch
    results = []
    for i, (sizes, prefixes, suffixes, hq, hkv, d, dtype, chunk) in enumerate(
            json.loads(sys.argv[1])):
        batch = make_decode_batch(sizes, prefixes, suffixes, hq, hkv, d,
                                  dtype=getattr(torch, dtype), seed=i)
        ref = decode_attention_reference(*batch.args).float()
        found = prefix_shared_decode_triton(*batch.args, prefix_chunk=chunk)
        plan = plan_decode_triton(
            batch.req_to_token, batch.req_pool_indices, batch.seq_lens, hq // hkv,
            groups=[PrefixGroup(torch.tensor(m), p) for m, p in batch.groups],
            prefix_chunk=chunk)
        given = prefix_shared_decode_triton(*batch.args, plan=plan)
        results.append({"dtype": found.dtype == batch.q.dtype,
                        "found": found.float().tolist(), "given": given.float().tolist(),
                        "ref": ref.tolist()})
    print("RESULTS" + json.dumps(results))
    """
)


def _run_interpreted(script: str, cases: list) -> list[dict]:
    """``script`` run over ``cases`` under ``TRITON_INTERPRET=1`` in a subprocess: its results."""
    pytest.importorskip("triton")
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cases)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS"))
    return json.loads(line[len("RESULTS") :])


def _check_interpreted(r: dict, dtype_name: str) -> None:
    """One case's outputs (groups found and groups given) against the reference."""
    dtype = getattr(torch, dtype_name)
    assert r["dtype"], "output dtype must be q's dtype"
    ref = torch.tensor(r["ref"])
    # the interpreter truncates fp32 -> bf16 on store: allow one more bf16 ulp
    tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else TOL[dtype]
    for key in ("found", "given"):
        torch.testing.assert_close(torch.tensor(r[key]), ref, **tol)


@pytest.fixture(scope="module")
def triton_interpreted():
    return _run_interpreted(_TRITON_SCRIPT, TRITON_CASES)


@pytest.mark.parametrize("case", range(len(TRITON_CASES)))
def test_triton_interpreted_matches_reference(triton_interpreted, case):
    _check_interpreted(triton_interpreted[case], TRITON_CASES[case][6])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,P", [(1, 0), (3, 17), (16, 2048), (64, 513)])
def test_triton_gpu_matches_reference(B, P, dtype):
    from feather_kernels.prefix_shared_triton import prefix_shared_decode_triton

    batch = make_decode_batch([B], [P], _suffixes(B, P, seed=B + P), 9, 3, 64, dtype=dtype, seed=B)
    cuda = [t.cuda() if isinstance(t, torch.Tensor) else t for t in batch.args]
    ref = decode_attention_reference(*batch.args)
    out = prefix_shared_decode_triton(*cuda)
    # fp32 dots run as tf32 on the GPU
    tol = dict(atol=5e-3, rtol=5e-3) if dtype == torch.float32 else TOL[dtype]
    torch.testing.assert_close(out.cpu().float(), ref.float(), **tol)


# --- Triton extend: each new token one query of the same launch ------------------------------

# (group sizes, shared prefixes, private cached tokens, new tokens, Hq, Hkv, dtype): a lone
# request with nothing cached, a group with ragged new tokens, groups beside requests that share
# nothing (and private cached tokens past the shared prefix), groups past one prefix tile and
# one own tile of query rows (40 tokens x 4 heads > 64 rows; 50 x 3, where 3 heads do not
# divide 64).
TRITON_EXTEND_CASES = [
    ([1], [0], [0], [7], 4, 4, "float32"),
    ([3], [17], [0, 0, 0], [1, 5, 12], 8, 2, "float16"),
    ([4, 2, 1], [50, 0, 20], [2, 0, 5, 0, 0, 4, 0], [5, 10, 1, 3, 7, 5, 2], 9, 3, "bfloat16"),
    ([2], [70], [0, 3], [40, 9], 8, 2, "float32"),
    ([2], [30], [0, 5], [50, 23], 9, 3, "float16"),
]

_TRITON_EXTEND_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from feather_kernels import PrefixGroup, extend_attention_reference
    from feather_kernels.prefix_shared_triton import prefix_shared_extend_triton
    from feather_kernels.synthetic import make_extend_batch
    results = []
    for i, (sizes, prefixes, private, new, hq, hkv, dtype) in enumerate(json.loads(sys.argv[1])):
        batch = make_extend_batch(sizes, prefixes, private, new, hq, hkv, 32,
                                  dtype=getattr(torch, dtype), seed=i)
        ref = extend_attention_reference(*batch.args).float()
        found = prefix_shared_extend_triton(*batch.args)
        given = prefix_shared_extend_triton(
            *batch.args, groups=[PrefixGroup(torch.tensor(m), p) for m, p in batch.groups])
        results.append({"dtype": found.dtype == batch.q.dtype, "found": found.float().tolist(),
                        "given": given.float().tolist(), "ref": ref.tolist()})
    print("RESULTS" + json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def triton_extend_interpreted():
    return _run_interpreted(_TRITON_EXTEND_SCRIPT, TRITON_EXTEND_CASES)


@pytest.mark.parametrize("case", range(len(TRITON_EXTEND_CASES)))
def test_triton_extend_interpreted_matches_reference(triton_extend_interpreted, case):
    _check_interpreted(triton_extend_interpreted[case], TRITON_EXTEND_CASES[case][6])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_extend_gpu_matches_reference(dtype):
    from feather_kernels.prefix_shared_triton import prefix_shared_extend_triton

    # scaled: 31 requests extending over one cached 815-token prefix
    batch = make_extend_batch(
        [31], [815], [0] * 31, [48 + i for i in range(31)], 9, 3, 64, dtype=dtype, seed=5
    )
    cuda = [t.cuda() if isinstance(t, torch.Tensor) else t for t in batch.args]
    ref = extend_attention_reference(*batch.args)
    out = prefix_shared_extend_triton(*cuda)
    tol = dict(atol=5e-3, rtol=5e-3) if dtype == torch.float32 else TOL[dtype]  # tf32 dots
    torch.testing.assert_close(out.cpu().float(), ref.float(), **tol)


def test_package_import_does_not_import_triton():
    code = (
        "import sys, feather_kernels; assert 'triton' not in sys.modules; "
        "feather_kernels.prefix_shared_decode_triton"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, timeout=120)
