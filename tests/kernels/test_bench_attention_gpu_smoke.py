"""The GPU benchmark's smoke mode on CPU: both Triton kernels it times (feather's fused kernel
and SGLang 0.5.23's decode kernel, loaded from its source files as on a GPU machine without the
sglang package) run under ``TRITON_INTERPRET=1`` with the benchmark's own call signatures and
match the torch reference. Proves the calls ``scripts/gpu_check.sh`` makes, not any speed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _sglang_kernel_dir() -> Path | None:
    spec = importlib.util.find_spec("sglang")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "kernels" / "ops" / "attention"
    return d if (d / "decode_attention.py").is_file() else None


def test_gpu_bench_smoke_checks_both_kernels_against_reference(tmp_path):
    pytest.importorskip("triton")
    src = _sglang_kernel_dir()
    if src is None:
        pytest.skip("sglang is not installed: no decode kernel source to load")
    out = tmp_path / "smoke.json"
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    # B=3 (not a power of two), a 20-token shared prefix, both head shapes, fp16 (the
    # interpreter's bf16 tl.dot is wrong, so SGLang's bf16 path is a GPU-only check)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "feather_bench.attention_gpu",
            "--smoke",
            "--sglang",
            "source",
            "--sglang-src",
            str(src),
            "--dtypes",
            "float16",
            "--batches",
            "3",
            "--prefixes",
            "20",
            "--json",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    data = json.loads(out.read_text())
    assert data["machine"]["smoke"] is True
    assert "source files" in data["machine"]["kernels"]["sglang"]
    rows = data["rows"]
    assert {r["shape"] for r in rows} == {"smollm2", "gqa32"}
    for r in rows:
        assert r["feather_ok"] and r["sglang_ok"], r
        assert not any(k.endswith("_ms") for k in r), "smoke mode must not time anything"
    summary = data["summary"]
    assert summary["all_correct"] and summary["complete"]
    assert summary["checked"]["feather"] == summary["checked"]["sglang"] == 2
