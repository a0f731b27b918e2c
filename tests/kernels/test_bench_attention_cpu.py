"""The CPU attention benchmark (``make bench-attention``'s kernel part) runs on a small grid and
writes its JSON: rows per cell, the headline summary keys, the GEMM floor
beside each speedup and the rows at the targets' reference shape. Its figures are read, not
asserted on time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_attention_json_shape(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "feather_bench.attention",
            "--batches",
            "3,16",
            "--prefixes",
            "0,2048",
            "--repeats",
            "2",
            "--split",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"machine", "rows", "extend_rows", "split_rows", "server", "summary"} <= result.keys()
    assert result["machine"]["malloc_pinned"]  # glibc here: no side pays page faults per call
    assert result["machine"]["bf16_prefix_dtype"] == (
        "bfloat16" if result["machine"]["amx"] else "float32"
    )
    # the finder splits the system prompt + document shapes into one group per document
    split = result["split_rows"]
    assert split[0]["groups_found"] == [[4, 728]] * 4 and split[0]["speedup"] > 0
    assert split[-1]["groups_found"] == [[16, 128]]  # 64-token documents: not worth a split
    summary = result["summary"]
    assert summary["speedup_b16_p2048"] > 0 and summary["speedup_bound_b16_p2048"] > 0
    assert summary["speedup_bound_gemm_b16_p2048"] > 0
    assert summary["speedup_b64_p8192"] is None  # not in this grid
    assert summary["speedup_b16_p2048_reference_shape"] > 0
    assert summary["reference_shape"] == {"Hq": 8, "Hkv": 8, "head_dim": 64, "dtype": "float32"}
    assert summary["layout"] == "scattered" and summary["speedup_b16_p2048_allocator_layout"] > 0
    rows = result["rows"]
    # 2 batches x 2 prefixes x (float32, bfloat16) at SmolLM2's shape, scattered slots; the
    # target cell in the allocator's layout; the target cell at the reference shape
    assert len(rows) == 10
    assert sorted((r["shape"], r["Hq"], r["Hkv"], r["layout"]) for r in rows) == (
        [("reference", 8, 8, "scattered")]
        + [("smollm2", 9, 3, "allocator")]
        + [("smollm2", 9, 3, "scattered")] * 8
    )
    for r in rows:
        # the same answer from both sides, empty prefix (P=0: nothing shared) included
        assert r["max_abs_diff"] < (1e-5 if r["dtype"] == "float32" else 2e-2), r
        assert r["torch_native_ms"] > 0 and r["feather_ms"] > 0 and r["prefix_flops_ms"] >= 0
        assert (r["prefix_gemm_ms"] > 0) == (
            r["P"] > 0
        ), r  # the measured floor, none without a prefix
    assert "speedup" in run.stdout and "bound" in run.stdout


def test_bench_attention_rejects_bad_server_options_before_running():
    for flag, value, says in (
        ("--server-groups", "3", "it must divide the 32 requests"),
        ("--server-dtypes", "fp8", "allowed: float32, bfloat16, float16"),
        ("--server-prefix-repeat", "0", "must be >= 1"),
        ("--server-repeats", "0", "--server-repeats: 0; must be >= 1"),
        ("--server-rounds", "-1", "--server-rounds: -1; must be >= 1"),
    ):
        run = subprocess.run(
            [sys.executable, "-m", "feather_bench.attention", "--server", flag, value],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert run.returncode == 2 and says in run.stderr, run.stderr[-2000:]
        assert "decode attention step" not in run.stdout  # nothing ran
