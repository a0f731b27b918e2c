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
        [sys.executable, str(REPO / "scripts" / "bench_attention.py"), "--batches", "3,16",
         "--prefixes", "0,2048", "--repeats", "2", "--split", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"machine", "rows", "extend_rows", "split_rows", "server", "summary"} <= result.keys()
    assert result["machine"]["malloc_pinned"]  # glibc here: no side pays page faults per call
    assert result["machine"]["bf16_prefix_dtype"] == ("bfloat16" if result["machine"]["amx"] else "float32")
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
        [("reference", 8, 8, "scattered")] + [("smollm2", 9, 3, "allocator")]
        + [("smollm2", 9, 3, "scattered")] * 8)
    for r in rows:
        # the same answer from both sides, empty prefix (P=0: nothing shared) included
        assert r["max_abs_diff"] < (1e-5 if r["dtype"] == "float32" else 2e-2), r
        assert r["torch_native_ms"] > 0 and r["feather_ms"] > 0 and r["prefix_flops_ms"] >= 0
        assert (r["prefix_gemm_ms"] > 0) == (r["P"] > 0), r  # the measured floor, none without a prefix
    assert "speedup" in run.stdout and "bound" in run.stdout


def test_profile_attention_step_prints_the_breakdown():
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "profile_attention_step.py"), "--batch", "3",
         "--prefix", "40", "--calls", "2"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "_scaled_dot_product_flash_attention_for_cpu" in run.stdout
    assert "per call:" in run.stdout and "KV gathers" in run.stdout
    bad = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "profile_attention_step.py"), "--batch", "0"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr


def test_bench_attention_rejects_bad_server_options_before_running():
    for flag, value, says in (("--server-groups", "3", "it must divide the 32 requests"),
                              ("--server-dtypes", "fp8", "allowed: float32, bfloat16, float16"),
                              ("--server-prefix-repeat", "0", "must be >= 1"),
                              ("--server-repeats", "0", "--server-repeats: 0; must be >= 1"),
                              ("--server-rounds", "-1", "--server-rounds: -1; must be >= 1")):
        run = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "bench_attention.py"), "--server", flag, value],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )
        assert run.returncode == 2 and says in run.stderr, run.stderr[-2000:]
        assert "decode attention step" not in run.stdout  # nothing ran


def test_bench_model_matmuls_counts_every_layer_weight(tmp_path):
    """The floor of a decode step outside attention: every 2-D layer weight of the checkpoint
    (7 per llama layer) and the tied LM head, timed per dtype; bad options say what is allowed."""
    model = REPO / "models" / "tiny-llama"
    config = json.loads((model / "config.json").read_text())
    out = tmp_path / "mm.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_model_matmuls.py"), "--model", str(model),
         "--batch", "3", "--repeats", "1", "--dtypes", "float32,bfloat16", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["dtype"] for r in rows] == ["float32", "bfloat16"]
    for row in rows:
        assert row["weights"] == 7 * config["num_hidden_layers"] and row["batch"] == 3
        assert row["step_ms"] == round(row["layers_ms"] + row["lm_head_ms"], 2) and row["layers_ms"] > 0
    assert rows[1]["weight_mb"] < rows[0]["weight_mb"]  # half the bytes in bf16
    for flag, value, says in (("--dtypes", "int4", "allowed: float32, bfloat16, float16"),
                              ("--batch", "0", "--batch: 0; must be >= 1"),
                              ("--model", str(tmp_path), "no model.safetensors")):
        bad = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_model_matmuls.py"), flag, value],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr[-2000:]
