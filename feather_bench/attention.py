"""Decode attention step time: feather's prefix-shared CPU path vs torch_native .

    python -m feather_bench.attention --json results/bench_attention.json
    python -m feather_bench.attention --quick

One layer, one decode step, on the same SGLang-layout KV pool and batch: B requests sharing a
P-token prefix (equal leading slot ids, as a radix-cache hit leaves them) plus 64 own tokens
each, SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head dim 64).

* ``torch_native``: the per-request loop of SGLang 0.5.23's
  ``TorchNativeAttnBackend._run_sdpa_forward_decode`` (gather ``req_to_token[req, :seq_len]``,
  SDPA with ``enable_gqa``), reimplemented here on the same tensors.
* ``feather``: ``feather_kernels.prefix_shared_decode`` with its plan (groups and gather
  indices) already built: a backend builds it once per forward batch, not per layer.
  ``plan_ms`` is that per-step cost (``find_prefix_groups`` from ``req_to_token`` plus
  ``plan_decode``), paid once for all layers.

Times are medians over repeats, in ms, with ``--threads`` torch threads (default 1); the two
sides are timed alternately, call by call, so a load change on the shared machine hits both
(and each call finds the caches as the other left them, as a layer's attention does in a
server, where the rest of the model runs in between). ``pre_flops`` (``prefix_flops_ms``) is a
floor under any exact prefix-shared step in fp32: the prefix's two matrix products (``Q Kᵀ``
and ``probs V``, ``4 B Hq P D`` FLOPs) at this core's fp32 GEMM peak (a 1024-cube ``torch.mm``,
measured at the start); ``bound`` = torch_native / that floor. ``pre_gemm``
(``prefix_gemm_ms``) is the tighter floor of the same two products timed at the cell's own shape
(inner dimension 64) in 512-key blocks, as a fused kernel runs them, and the second ``bound``
torch_native / it. glibc's malloc thresholds are pinned first (``pin_malloc``), so that neither
side's figure depends on page faults that come and go with what ran before in the process.

Slot ids (``--layout``): ``scattered`` (default), every slot at random over the pool, the
hardest case for reads; or ``allocator``, as SGLang's token allocator lays the batch out on a
fresh server: the shared prefix in one block of consecutive slots (which feather attends in
place, with no copy), then one slot per request per decode step. Both sides read the same
slots.

Full grid: B in {4, 16, 64} x P in {512, 2048, 8192} x dtype in {float32, bfloat16}, plus the
two target cells (B16/P2048, B64/P8192, float32) in the other layout (rows and summary keys
``*_allocator_layout`` by default) and at the reference shape
the targets are stated for (8 query and 8 KV heads, head dim 64; rows with ``"shape":
"reference"``); ``--quick``: B in {4, 16} x P in {512, 2048}, float32 only.
``--extend`` adds the extend case (``prefix_shared_extend`` vs torch_native's extend
loop, which attends all ``seq_len`` query rows and keeps the new ones).
``--server`` adds the end-to-end comparison on a real server
(:func:`feather_bench.attention_e2e.run_server_comparison`): total times, their split
into extend, decode and attention from the batch trace, and two bounds on the ratio, with
feather's attention free and with it taking only its own FLOPs (the prompts' shared prefix
computed once) at the GEMM peak measured here at the servers' thread count and dtype.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

import torch
from torch.nn.functional import scaled_dot_product_attention

from feather_bench.argtypes import ints
from feather_bench.paths import RESULTS_DIR, model_dir
from feather_bench.timing import medians_ms
from feather_bench.tools.machine import describe
from feather_kernels import (
    PrefixGroup,
    find_extend_groups,
    find_prefix_groups,
    plan_decode,
    prefix_shared_decode,
    prefix_shared_extend,
)
from feather_kernels.prefix_shared_cpu import prefix_dtype
from feather_kernels.synthetic import LAYOUTS, make_decode_batch, make_extend_batch

HQ, HKV, HEAD_DIM = 9, 3, 64  # SmolLM2-135M-Instruct
# 8 query and 8 KV heads of dimension 64: the shape the speed-up targets (8x at B16/P2048,
# 12x at B64/P8192) are stated for.
REFERENCE_SHAPE = (8, 8)
SUFFIX = 64


def torch_native_decode(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, scale):
    """SGLang 0.5.23 torch_native decode (``_run_sdpa_forward_decode``), same tensors."""
    output = torch.empty_like(q)
    query = q.movedim(0, q.dim() - 2)  # [Hq, B, D]
    enable_gqa = q.shape[1] != k_cache.shape[1]
    start_q = 0
    for seq_idx in range(seq_lens.shape[0]):
        seq_len_kv = seq_lens[seq_idx]
        end_q = start_q + 1
        per_req_query = query[:, start_q:end_q, :]
        per_req_tokens = req_to_token[req_pool_indices[seq_idx], 0:seq_len_kv]
        per_req_key = k_cache[per_req_tokens].movedim(0, query.dim() - 2)
        per_req_value = v_cache[per_req_tokens].movedim(0, query.dim() - 2)
        per_req_out = (
            scaled_dot_product_attention(
                per_req_query.unsqueeze(0),
                per_req_key.unsqueeze(0),
                per_req_value.unsqueeze(0),
                enable_gqa=enable_gqa,
                scale=scale,
                is_causal=False,
            )
            .squeeze(0)
            .movedim(query.dim() - 2, 0)
        )
        output[start_q:end_q, :, :] = per_req_out
        start_q = end_q
    return output


def torch_native_extend(
    q,
    k_cache,
    v_cache,
    req_to_token,
    req_pool_indices,
    seq_lens,
    extend_prefix_lens,
    extend_seq_lens,
    scale,
):
    """SGLang 0.5.23 torch_native extend (``_run_sdpa_forward_extend``, causal), same tensors."""
    output = torch.empty_like(q)
    query = q.movedim(0, q.dim() - 2)
    enable_gqa = q.shape[1] != k_cache.shape[1]
    start_q = 0
    for seq_idx in range(seq_lens.shape[0]):
        extend_seq_len_q = extend_seq_lens[seq_idx]
        prefill_seq_len_q = extend_prefix_lens[seq_idx]
        seq_len_kv = seq_lens[seq_idx]
        end_q = start_q + extend_seq_len_q
        per_req_query = query[:, start_q:end_q, :]
        # NOTE: torch_native attends a full seq_len of query rows (the cached prefix rows
        # included) and keeps the last extend_seq_len of them.
        redundant = torch.empty(
            (per_req_query.shape[0], seq_len_kv, per_req_query.shape[2]), dtype=per_req_query.dtype
        )
        redundant[:, prefill_seq_len_q:, :] = per_req_query
        per_req_tokens = req_to_token[req_pool_indices[seq_idx], 0:seq_len_kv]
        per_req_key = k_cache[per_req_tokens].movedim(0, query.dim() - 2)
        per_req_value = v_cache[per_req_tokens].movedim(0, query.dim() - 2)
        out = (
            scaled_dot_product_attention(
                redundant.unsqueeze(0),
                per_req_key.unsqueeze(0),
                per_req_value.unsqueeze(0),
                enable_gqa=enable_gqa,
                scale=scale,
                is_causal=True,
            )
            .squeeze(0)
            .movedim(query.dim() - 2, 0)
        )
        output[start_q:end_q, :, :] = out[prefill_seq_len_q:, :, :]
        start_q = end_q
    return output


def run_extend(dtypes, requests: int, prefix: int, new_tokens: int, repeats: int) -> list[dict]:
    """The extend case: ``requests`` requests extending ``new_tokens`` each over a
    cached ``prefix``-token shared prefix, one layer."""
    rows = []
    for dtype in dtypes:
        batch = make_extend_batch(
            [requests],
            [prefix],
            [0] * requests,
            [new_tokens] * requests,
            HQ,
            HKV,
            HEAD_DIM,
            dtype=dtype,
            seed=requests,
        )
        groups = find_extend_groups(
            batch.req_to_token, batch.req_pool_indices, batch.extend_prefix_lens
        )
        native, feather = medians_ms(
            lambda: torch_native_extend(*batch.args),
            lambda: prefix_shared_extend(*batch.args, groups=groups),
            repeats=repeats,
        )
        err = (
            (
                prefix_shared_extend(*batch.args, groups=groups).float()
                - torch_native_extend(*batch.args).float()
            )
            .abs()
            .max()
            .item()
        )
        row = {
            "dtype": str(dtype).removeprefix("torch."),
            "requests": requests,
            "P": prefix,
            "new_tokens": new_tokens,
            "torch_native_ms": round(native, 2),
            "feather_ms": round(feather, 2),
            "speedup": round(native / feather, 2),
            "max_abs_diff": err,
            "repeats": repeats,
        }
        rows.append(row)
        print(
            f"extend {row['dtype']:>9} {requests:>3} x {new_tokens} new over P={prefix}: "
            f"torch_native {native:.1f} ms, feather {feather:.1f} ms, "
            f"{native / feather:.2f}x",
            flush=True,
        )
    return rows


# (system prompt, document, documents, requests per document): one system prompt shared by
# all, then one document per subset of requests, then 20 own tokens each.
SPLIT_SHAPES = ((128, 600, 4, 4), (128, 400, 6, 5), (512, 256, 4, 4), (128, 64, 8, 2))


def run_split(repeats: int) -> list[dict]:
    """The group finder's split at a deeper branch (``feather_kernels.groups._split_deeper``):
    feather's decode step with the groups it finds, with the groups of a split at any saving of
    KV reads (``split_max_reads=1``, without the one-half rule) and as one group over the system
    prompt (what the finder returned before the split), float32."""
    rows = []
    for system, doc, docs, per in SPLIT_SHAPES:
        batch = make_decode_batch(
            [per] * docs,
            [system + doc] * docs,
            [20] * (docs * per),
            HQ,
            HKV,
            HEAD_DIM,
            seed=system + doc,
            layout="allocator",
        )
        r2t, rpi, lens = batch.req_to_token, batch.req_pool_indices, batch.seq_lens
        first = rpi[batch.groups[0][0][0]]
        for members, _ in batch.groups[1:]:  # every document after the same system prompt
            r2t[rpi[members], :system] = r2t[first, :system]
        found = find_prefix_groups(r2t, rpi, lens)
        any_saving = find_prefix_groups(r2t, rpi, lens, split_max_reads=1.0)
        one = [PrefixGroup(torch.arange(docs * per), system)]
        plans = [plan_decode(r2t, rpi, lens, g) for g in (found, any_saving, one)]
        step = [lambda plan=plan: prefix_shared_decode(*batch.args, plan=plan) for plan in plans]
        # NOTE: timed in pairs against one group: in a round of three, the call after another
        # plan's ran ~10% slower than the same plan elsewhere in the round (seen with equal plans).
        t_found, t_one = medians_ms(step[0], step[2], repeats=repeats)
        same = [[g.batch_indices.tolist(), g.prefix_len] for g in any_saving] == [
            [g.batch_indices.tolist(), g.prefix_len] for g in found
        ]
        t_any = t_found if same else medians_ms(step[1], step[2], repeats=repeats)[0]
        times = (t_found, t_any, t_one)
        row = {
            "system": system,
            "document": doc,
            "documents": docs,
            "per_document": per,
            "groups_found": [[len(g.batch_indices), g.prefix_len] for g in found],
            "groups_any_saving": [[len(g.batch_indices), g.prefix_len] for g in any_saving],
            "split_ms": round(times[0], 3),
            "any_saving_ms": round(times[1], 3),
            "one_group_ms": round(times[2], 3),
            "speedup": round(times[2] / times[0], 2),
            "speedup_any_saving": round(times[2] / times[1], 2),
            "repeats": repeats,
        }
        rows.append(row)
        print(
            f"split: system {system} + {docs} documents of {doc} x {per} requests: groups "
            f"{row['groups_found']}: {times[0]:.2f} ms; split at any saving: {times[1]:.2f} ms; "
            f"one group at {system}: {times[2]:.2f} ms; {row['speedup']:.2f}x and "
            f"{row['speedup_any_saving']:.2f}x",
            flush=True,
        )
    return rows


def pin_malloc() -> bool:
    """Fix glibc malloc's thresholds for this process; False where that is not possible.

    NOTE: glibc serves a block above its mmap threshold (128 KiB at start, raised as large blocks
    are freed) with a fresh mmap, and trims the heap top beyond twice that threshold, so in some
    process states torch_native's per-request gathers (1.6 MiB each at B16/P2048) page-fault on
    every call (seen: ~1,150 minor faults and 12-20 ms a step instead of 9.8 ms, depending on
    what had run before). Pinned (blocks up to 32 MiB from the heap, never trimmed), every side
    runs fault-free, as in a long-running server, whatever ran before in this process.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's mallopt parameters
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(
            libc.mallopt(m_trim_threshold, 1 << 30)
        )
    except (OSError, AttributeError):
        return False


def decode_cell(
    B: int, P: int, dtype=torch.float32, hq: int = HQ, hkv: int = HKV, layout: str = "scattered"
):
    """One cell's batch (``B`` requests sharing ``P`` prefix slots, ``SUFFIX`` own tokens each,
    slot ids laid out as ``layout``, see ``make_decode_batch``) and its plan, as a backend
    builds it once per forward batch."""
    batch = make_decode_batch(
        [B], [P], [SUFFIX] * B, hq, hkv, HEAD_DIM, dtype=dtype, seed=B + P, layout=layout
    )
    groups = [PrefixGroup(torch.tensor(m), p) for m, p in batch.groups]
    return batch, plan_decode(batch.req_to_token, batch.req_pool_indices, batch.seq_lens, groups)


def _machine() -> dict:
    # the dtype feather's CPU path attends a bfloat16 cache's prefix in (bfloat16 on AMX hosts)
    bf16_prefix = str(prefix_dtype(torch.bfloat16)).removeprefix("torch.")
    return {
        **describe(),
        "torch_threads": torch.get_num_threads(),
        "bf16_prefix_dtype": bf16_prefix,
    }


def gemm_peak_gflops(repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """The GEMM rate at torch's current thread count (one core by default here): a 1024-cube
    ``torch.mm`` in ``dtype``, best of ``repeats``."""
    a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024**3 / best / 1e9


def _print_server(result: dict) -> None:
    med, split, peak = (
        result["median_s"],
        result["median_split_s"],
        result["attention_at_gemm_peak"],
    )
    print(
        f"  medians: feather {med['feather']:.2f} s (attention {split['feather']['attention_s']:.2f} s), "
        f"torch_native {med['torch_native']:.2f} s: {result['speedup_total_time']:.2f}x; "
        f"bound with free attention {result['speedup_bound_if_attention_were_free']}x",
        flush=True,
    )
    print(
        f"  attention's own FLOPs (shared prefix once): {peak['attention_gflops']} GFLOP, "
        f"{peak['attention_floor_s']:.2f} s at the servers' GEMM peak ({peak['gemm_peak_gflops']} GFLOPS); "
        f"feather's attention at that floor would give {peak['speedup_bound']}x",
        flush=True,
    )


def prefix_flops_ms(B: int, P: int, hq: int, peak_gflops: float) -> float:
    """The prefix's two matrix products (``Q Kᵀ`` and ``probs V``: ``4 * B * Hq * P * D``
    FLOPs) at the fp32 GEMM peak: a floor under any exact prefix-shared step in fp32 (before
    its gathers, softmax, suffixes and merge)."""
    return 4 * B * hq * P * HEAD_DIM / (peak_gflops * 1e9) * 1e3


# The key block of the floor's products: torch's fused CPU attention op's own (kvSplitSize 512).
GEMM_BLOCK = 512


def prefix_gemm_ms(B: int, P: int, hq: int, hkv: int, repeats: int) -> float:
    """The prefix's two matrix products at the rate torch's fp32 GEMM reaches for this cell's
    shape: ``Q Kᵀ`` (``[Hkv, B * Hq / Hkv, D] x [Hkv, D, P]``) and ``probs V``, each in blocks of
    ``GEMM_BLOCK`` keys into a reused output, as a fused attention kernel runs them (the whole
    ``[Hkv, M, P]`` score matrix never written out), operands warm: the floor of a step built
    on torch's GEMM, measured at the cell's shape rather than taken from the 1024-cube peak
    (``prefix_flops_ms``). What a fused step adds to it is the softmax's exponentials.

    NOTE: not as whole products: ``Q Kᵀ`` then writes the full score matrix (19 MB at
    B64/P8192) and, at 2 threads, took longer than torch's fused attention op itself."""
    if B == 0 or P == 0:
        return 0.0  # no prefix, no floor
    M = B * (hq // hkv)
    q, k, v = (
        torch.randn(hkv, M, HEAD_DIM),
        torch.randn(hkv, P, HEAD_DIM),
        torch.randn(hkv, P, HEAD_DIM),
    )
    w = min(GEMM_BLOCK, P)
    scores, probs, out = (
        torch.empty(hkv, M, w),
        torch.randn(hkv, M, w),
        torch.empty(hkv, M, HEAD_DIM),
    )

    def products():
        for a in range(0, P, w):
            n = min(w, P - a)  # the last block may be shorter
            torch.matmul(q, k[:, a : a + n].transpose(1, 2), out=scores[:, :, :n])
            torch.matmul(probs[:, :, :n], v[:, a : a + n], out=out)

    (one,) = medians_ms(products, repeats=repeats)
    return one


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b else "-"


def run(
    batches,
    prefixes,
    dtypes,
    repeats: int,
    peak_gflops: float,
    hq: int = HQ,
    hkv: int = HKV,
    shape: str = "smollm2",
    layout: str = "scattered",
) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for B in batches:
            for P in prefixes:
                batch, plan = decode_cell(B, P, dtype, hq, hkv, layout)
                # fewer repeats where one torch_native step takes seconds
                reps = max(3, repeats // (1 + B * P * hkv // (65536 * HKV)))
                native, feather = medians_ms(
                    lambda: torch_native_decode(*batch.args),
                    lambda: prefix_shared_decode(*batch.args, plan=plan),
                    repeats=reps,
                )
                (find,) = medians_ms(
                    lambda: plan_decode(
                        batch.req_to_token,
                        batch.req_pool_indices,
                        batch.seq_lens,
                        find_prefix_groups(
                            batch.req_to_token, batch.req_pool_indices, batch.seq_lens
                        ),
                    ),
                    repeats=reps,
                )
                floor = prefix_flops_ms(B, P, hq, peak_gflops)
                gemm = prefix_gemm_ms(B, P, hq, hkv, max(reps, 5))
                err = (
                    (
                        prefix_shared_decode(*batch.args, plan=plan).float()
                        - torch_native_decode(*batch.args).float()
                    )
                    .abs()
                    .max()
                    .item()
                )
                row = {
                    "dtype": str(dtype).removeprefix("torch."),
                    "shape": shape,
                    "Hq": hq,
                    "Hkv": hkv,
                    "layout": layout,
                    "B": B,
                    "P": P,
                    "suffix": SUFFIX,
                    "torch_native_ms": round(native, 3),
                    "feather_ms": round(feather, 3),
                    "speedup": round(native / feather, 2),
                    "plan_ms": round(find, 3),
                    "prefix_flops_ms": round(floor, 3),
                    "speedup_bound": round(native / floor, 2) if floor else None,
                    "prefix_gemm_ms": round(gemm, 3),
                    "speedup_bound_gemm": round(native / gemm, 2) if gemm else None,
                    "max_abs_diff": err,
                    "repeats": reps,
                }
                rows.append(row)
                print(
                    f"{row['dtype']:>9} {hq:>2}/{hkv:<2} {layout:>9} {B:>4} {P:>6} {native:>14.2f} "
                    f"{feather:>11.2f} {native / feather:>8.1f}x {find:>10.3f} "
                    f"{floor:>10.3f} {_ratio(native, floor):>9} {gemm:>9.3f} "
                    f"{_ratio(native, gemm):>9}",
                    flush=True,
                )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="B in {4, 16} x P in {512, 2048}, float32, fewer repeats",
    )
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per cell")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for both sides (default 1: stable medians "
        "on a shared 2-core machine)",
    )
    parser.add_argument(
        "--batches", type=ints, help="comma-separated B values (overrides the grid)"
    )
    parser.add_argument(
        "--prefixes", type=ints, help="comma-separated P values (overrides the grid)"
    )
    parser.add_argument(
        "--no-reference-shape",
        action="store_true",
        help="skip the rows at the reference shape (8 query "
        "and 8 KV heads) the targets are stated for (full grid only)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="scattered",
        help="slot ids of the grid's batches: scattered at random over the pool "
        "(default, the hardest case for reads) or as SGLang's allocator lays "
        "them out on a fresh server (each prefix one block of consecutive "
        "slots, one slot per request per decode step); the full grid adds "
        "the two target cells in the other layout",
    )
    parser.add_argument(
        "--extend",
        action="store_true",
        help="also time the extend case (31 requests x 383 new tokens "
        'over a cached 815-token prefix), rows under "extend_rows"',
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="also time the group finder's split at a deeper branch (a system prompt "
        "shared by all, one document per subset) against one group over the "
        'system prompt, rows under "split_rows"',
    )
    parser.add_argument(
        "--server",
        metavar="MODEL_DIR",
        nargs="?",
        const=str(model_dir()),
        help="also compare the backends end to end on a real server (default model: "
        "SmolLM2): 32 requests sharing a ~740-token prompt, 32 tokens each",
    )
    parser.add_argument(
        "--dtype", default="bfloat16", help="second dtype besides float32 (full grid only)"
    )
    parser.add_argument(
        "--server-groups",
        type=int,
        default=1,
        help="system prompts the --server requests are spread over (must divide "
        "32; default 1); with more, fcfs batches mix groups",
    )
    parser.add_argument(
        "--server-prefix-repeat",
        type=int,
        default=40,
        help="times the system prompt's topic text is repeated (default 40: "
        "prompts of ~740 tokens sharing 728; 44: ~812 sharing 800)",
    )
    parser.add_argument(
        "--server-rounds",
        type=int,
        default=2,
        help="fresh servers per backend, interleaved (default 2)",
    )
    parser.add_argument(
        "--server-repeats",
        type=int,
        default=2,
        help="runs of the batch per server, its cache flushed before each (default 2); "
        "medians are over rounds x repeats runs per backend",
    )
    parser.add_argument(
        "--server-dtypes",
        default="float32,bfloat16",
        help="serving dtypes of the --server comparison, comma-separated (default: "
        "float32, the stricter case, and bfloat16, what the CPU runtime serves "
        "in by default on CPUs with bf16 instructions)",
    )
    args = parser.parse_args(argv)

    # The server options are checked before the kernel grid runs, not after.
    server_dtypes = [d.strip() for d in args.server_dtypes.split(",") if d.strip()]
    unknown = [d for d in server_dtypes if d not in ("float32", "bfloat16", "float16")]
    if unknown or not server_dtypes:
        parser.error(
            f"--server-dtypes: {unknown or 'none given'}; allowed: float32, bfloat16, float16"
        )
    if args.server_prefix_repeat < 1:
        parser.error(f"--server-prefix-repeat: {args.server_prefix_repeat}; must be >= 1")
    for flag, value in (
        ("--server-rounds", args.server_rounds),
        ("--server-repeats", args.server_repeats),
    ):
        if value < 1:
            parser.error(f"{flag}: {value}; must be >= 1")
    if args.server_groups < 1 or 32 % args.server_groups:
        parser.error(
            f"--server-groups: {args.server_groups}; allowed: 1, 2, 4, 8, 16 or 32 "
            "(it must divide the 32 requests)"
        )

    torch.set_num_threads(args.threads)
    malloc_pinned = pin_malloc()
    if args.quick:
        batches, prefixes, dtypes, repeats = (4, 16), (512, 2048), (torch.float32,), 5
    else:
        batches, prefixes = (4, 16, 64), (512, 2048, 8192)
        dtypes, repeats = (torch.float32, getattr(torch, args.dtype)), 9
    repeats = args.repeats or repeats
    batches, prefixes = args.batches or batches, args.prefixes or prefixes
    print(
        f"decode attention step, Hq={HQ} Hkv={HKV} D={HEAD_DIM}, suffix {SUFFIX}, "
        f"{torch.get_num_threads()} threads; medians in ms"
        + ("" if malloc_pinned else "; malloc thresholds not pinned (not glibc)")
    )
    print(
        f"{'dtype':>9} {'Hq/Hkv':>5} {'layout':>9} {'B':>4} {'P':>6} {'torch_native':>14} {'feather':>11} "
        f"{'speedup':>9} {'plan':>10} {'pre_flops':>10} {'bound':>9} {'pre_gemm':>9} {'bound':>9}"
    )
    peak = gemm_peak_gflops()
    rows = run(batches, prefixes, dtypes, repeats, peak, layout=args.layout)
    (other,) = (name for name in LAYOUTS if name != args.layout)
    if not args.quick:
        # The targets' own cells (those in the grid) in the other slot layout and at the shape
        # of the measurement the targets come from.
        for B, P in ((16, 2048), (64, 8192)):
            if B in batches and P in prefixes:
                rows += run((B,), (P,), (torch.float32,), repeats, peak, layout=other)
                if not args.no_reference_shape:
                    rows += run(
                        (B,),
                        (P,),
                        (torch.float32,),
                        repeats,
                        peak,
                        *REFERENCE_SHAPE,
                        shape="reference",
                        layout=args.layout,
                    )

    def speedup(B, P, dtype="float32", shape="smollm2", key="speedup", layout=args.layout):
        hits = [
            r[key]
            for r in rows
            if r["B"] == B
            and r["P"] == P
            and r["dtype"] == dtype
            and r["shape"] == shape
            and r["layout"] == layout
        ]
        return hits[0] if hits else None

    # NOTE: the headline keys are float32 (the stricter case: both sides do the same fp32
    # FLOPs, so the gain is bounded by GEMM vs per-request GEMV + gather); the second dtype
    # gets its own keys.
    summary = {
        "speedup_b16_p2048": speedup(16, 2048),
        "speedup_b64_p8192": speedup(64, 8192),
        "layout": args.layout,
        "threads": args.threads,
        "targets": {"speedup_b16_p2048": 8.0, "speedup_b64_p8192": 12.0},
        "fp32_gemm_peak_gflops": round(peak, 1),
        # native / the prefix's FLOPs at that peak (prefix_flops_ms)
        "speedup_bound_b16_p2048": speedup(16, 2048, key="speedup_bound"),
        "speedup_bound_b64_p8192": speedup(64, 8192, key="speedup_bound"),
        # native / the prefix's two GEMMs at the rate torch reaches for them (prefix_gemm_ms)
        "speedup_bound_gemm_b16_p2048": speedup(16, 2048, key="speedup_bound_gemm"),
        "speedup_bound_gemm_b64_p8192": speedup(64, 8192, key="speedup_bound_gemm"),
    }
    if speedup(16, 2048, shape="reference") is not None:
        summary["reference_shape"] = {
            "Hq": REFERENCE_SHAPE[0],
            "Hkv": REFERENCE_SHAPE[1],
            "head_dim": HEAD_DIM,
            "dtype": "float32",
        }
        summary["speedup_b16_p2048_reference_shape"] = speedup(16, 2048, shape="reference")
        summary["speedup_b64_p8192_reference_shape"] = speedup(64, 8192, shape="reference")
    if speedup(16, 2048, layout=other) is not None:
        summary[f"speedup_b16_p2048_{other}_layout"] = speedup(16, 2048, layout=other)
        summary[f"speedup_b64_p8192_{other}_layout"] = speedup(64, 8192, layout=other)
    for dtype in dtypes[1:]:
        name = str(dtype).removeprefix("torch.")
        summary[f"speedup_b16_p2048_{name}"] = speedup(16, 2048, name)
        summary[f"speedup_b64_p8192_{name}"] = speedup(64, 8192, name)
    extend_rows = run_extend(dtypes, 31, 815, 383, 3) if args.extend else []
    for row in extend_rows:
        summary[f"extend_speedup_{row['dtype']}"] = row["speedup"]
    split_rows = run_split(21) if args.split else []
    server = None
    if args.server:
        from feather_bench.attention_e2e import run_server_comparison

        torch.set_num_threads(os.cpu_count() or 1)  # the servers are separate processes anyway
        server = {}
        for dtype in server_dtypes:
            # the servers' GEMM rate (their thread count, their dtype), for the attention floor
            server_peak = gemm_peak_gflops(dtype=getattr(torch, dtype))
            print(f"server comparison on {args.server}, {dtype} ...", flush=True)
            server[dtype] = run_server_comparison(
                args.server,
                str(RESULTS_DIR),
                dtype=dtype,
                groups=args.server_groups,
                prefix_repeat=args.server_prefix_repeat,
                rounds=args.server_rounds,
                repeats=args.server_repeats,
                gemm_peak_gflops=server_peak,
            )
            _print_server(server[dtype])
            # float32 keeps the unsuffixed keys (the headline, as before); others get a suffix.
            suffix = "" if dtype == "float32" else f"_{dtype}"
            summary[f"server_speedup_total_time{suffix}"] = server[dtype]["speedup_total_time"]
            summary[f"server_greedy_outputs_equal{suffix}"] = not server[dtype]["greedy_problems"]
            summary[f"server_speedup_bound_if_attention_were_free{suffix}"] = server[dtype][
                "speedup_bound_if_attention_were_free"
            ]
            summary[f"server_speedup_bound_if_attention_at_gemm_peak{suffix}"] = server[dtype][
                "attention_at_gemm_peak"
            ]["speedup_bound"]
    print(json.dumps(summary))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": {**_machine(), "malloc_pinned": malloc_pinned},
                    "rows": rows,
                    "extend_rows": extend_rows,
                    "split_rows": split_rows,
                    "server": server,
                    "summary": summary,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
