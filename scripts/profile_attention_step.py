#!/usr/bin/env python
"""Where feather's CPU decode step spends its time: torch.profiler over one cell of
``bench_attention.py`` (same batch, same shape), with the caches flushed before every call
(as a layer finds them in a server, where the rest of the model ran in between).

    .venv/bin/python scripts/profile_attention_step.py --batch 16 --prefix 2048

Prints torch's op table (self CPU time per op, summed over the calls; the flush excluded)
and, per call, the time in the fused attention op over the group's prefix, in the KV gathers
(``index_select``), in the rest, and the prefix's FLOPs at this core's fp32 GEMM peak.
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench_attention import (  # noqa: E402
    HEAD_DIM, HKV, HQ, SUFFIX, decode_cell, gemm_peak_gflops, prefix_flops_ms,
)
from feather_kernels import prefix_shared_decode  # noqa: E402
from feather_kernels.synthetic import LAYOUTS  # noqa: E402

FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prefix", type=int, default=2048)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layout", choices=LAYOUTS, default="scattered",
                        help="slot ids of the batch (see bench_attention.py --layout)")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.prefix < 1 or args.calls < 1:
        parser.error("--batch, --prefix and --calls must be >= 1")
    torch.set_num_threads(args.threads)
    B, P = args.batch, args.prefix
    batch, plan = decode_cell(B, P, layout=args.layout)  # the benchmark's own cell
    flush = torch.ones(16 * 1024 * 1024)  # 64 MB: more than the last-level cache
    prefix_shared_decode(*batch.args, plan=plan)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.calls):
            flush.mul_(1.0)
            prefix_shared_decode(*batch.args, plan=plan)
    events = [e for e in prof.key_averages() if e.key != "aten::mul_"]
    print(f"feather decode step, B={B} P={P} suffix {SUFFIX}, Hq={HQ} Hkv={HKV} D={HEAD_DIM}, "
          f"fp32, {args.layout} slots, {args.threads} thread(s), caches flushed before each of {args.calls} calls")
    print(f"{'op':<52} {'self ms/call':>12} {'calls/step':>10}")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
        print(f"{e.key[:52]:<52} {e.self_cpu_time_total / 1e3 / args.calls:>12.3f} "
              f"{e.count / args.calls:>10.1f}")
    per_call = {k: sum(e.self_cpu_time_total for e in events if e.key == k) / 1e3 / args.calls
                for k in (FLASH, "aten::index_select")}
    total = sum(e.self_cpu_time_total for e in events) / 1e3 / args.calls
    floor = prefix_flops_ms(B, P, HQ, gemm_peak_gflops())
    print(f"per call: {total:.3f} ms in ops; prefix attention {per_call[FLASH]:.3f} ms "
          f"(its FLOPs at the fp32 GEMM peak: {floor:.3f} ms); KV gathers "
          f"{per_call['aten::index_select']:.3f} ms; the rest "
          f"{total - per_call[FLASH] - per_call['aten::index_select']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
