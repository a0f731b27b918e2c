"""The overhead benchmark runs end to end on a tiny grid and writes its JSON.
(Its figures are checked by reading them, not by timed assertions.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_overhead_json_shape(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "feather_bench.overhead",
            "--waiting",
            "64,256",
            "--tokens",
            "600",
            "--repeats",
            "2",
            "--batch",
            "8",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"machine", "rows", "summary"} <= result.keys()
    for key in (
        "ratio_vs_dfs_weight_at_largest",
        "ratio_vs_lpm_at_largest",
        "insert_us_per_1k_tokens",
    ):
        assert result["summary"][key] > 0
    row_keys = {
        "waiting",
        "prompt_tokens",
        "groups",
        "policy",
        "us_per_pass",
        "us_per_insert",
        "fell_back_to_fcfs",
    }
    assert all(row_keys <= row.keys() for row in result["rows"])
    policies = {row["policy"] for row in result["rows"]}
    assert {"lpm", "lpm-no-fallback", "dfs-weight", "feather"} <= policies
    lpm_at_256 = [r for r in result["rows"] if r["policy"] == "lpm" and r["waiting"] == 256]
    assert lpm_at_256 and all(r["fell_back_to_fcfs"] for r in lpm_at_256)  # > 128 waiting
    # every policy picked from the running batch's group: the comparison is like for like
    feather = [r for r in result["rows"] if r["policy"] == "feather"]
    assert all(r.get("picks", 0) > 0 for r in feather)
    assert "| policy" in run.stdout or "feather" in run.stdout


def test_scale_benchmark_writes_per_pass_quantiles(tmp_path, capsys):
    """feather-bench-scale at a small W: every scenario runs through calc_priority without a
    fault or a full resync, and the JSON records the machine and the commit."""
    import json

    from feather_bench import scale

    out = tmp_path / "scale.json"
    assert scale.main(["--waiting", "300", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [(r["scenario"], r["prompt_tokens"]) for r in data["rows"]] == [
        ("fresh", 256),
        ("starved no-sharing", 256),
        ("after an abort", 256),
        ("fresh", 2048),
    ]
    assert all(r["resyncs"] == 0 and r["p99_us"] >= r["p50_us"] > 0 for r in data["rows"])
    assert all(r["feather_p99_us"] >= r["feather_p50_us"] > 0 for r in data["rows"])
    # An abort's pop is found by a search of the span it shifted, not by an O(W) reindex.
    assert all(r["reindexes"] == 0 for r in data["rows"])
    assert data["provenance"]["git"]["commit"] and data["provenance"]["machine"]["cpu"]
    print(capsys.readouterr().out)
