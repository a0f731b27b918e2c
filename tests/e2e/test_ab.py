"""feather-ab end to end: real SGLang (Engine in offline mode, a server in online mode) on the
tiny model, a workload file, every configuration's JSON row, the chart and the greedy check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e
EXAMPLE = REPO / "scripts" / "example_workload.jsonl"


def run_ab(tmp_path: Path, *args: str, status: int = 0) -> tuple[dict, str]:
    out = tmp_path / "ab.json"
    p = subprocess.run(
        [
            str(Path(sys.executable).with_name("feather-ab")),
            *args,
            "--json",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert p.returncode == status, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text()), p.stdout + p.stderr


def check_rows(result: dict, configs: list[str], requests: int, output_tokens: int) -> None:
    assert [r["config"] for r in result["rows"]] == configs
    for r in result["rows"]:
        assert r["completed"] == requests and r["total_output_tokens"] == output_tokens
        assert r["output_throughput"] > 0
        assert 0 < r["median_ttft_ms"] <= r["p99_ttft_ms"] <= r["p99_e2e_latency_ms"]
        assert r["median_itl_ms"] > 0 and r["mean_tpot_ms"] > 0
        assert 0 <= r["cache_hit_rate"] < 1 and 0 <= r["saving_ratio_r"] < 1
        assert r["decode_steps"] > 0 and r["mean_decode_batch"] >= 1 and 0 < r["sched_fraction"] < 1
    assert result["greedy_outputs_identical"] is True and result["greedy_mismatches"] == []
    assert {"machine", "workload", "rows", "summary", "date", "command"} <= result.keys()


def test_offline_workload_file_every_configuration(tiny_model, tmp_path):
    result, stdout = run_ab(
        tmp_path,
        "--workload-file",
        str(EXAMPLE),
        "--model",
        str(tiny_model),
        "--policies",
        "fcfs,feather",
        "--backends",
        "feather",
        "--threads",
        "1",
    )
    check_rows(result, ["fcfs + feather", "feather + feather"], 12, 12 * 12)
    s = result["summary"]
    assert s["best_baseline"] == "fcfs + feather" and s["speedup_vs_best_baseline"] > 0
    # the prompts share long system prompts: the radix cache must have served part of them
    assert all(r["cache_hit_rate"] > 0.3 for r in result["rows"])
    assert "greedy outputs: identical in every configuration" in stdout
    png = (tmp_path / "ab.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_online_poisson_arrivals_on_a_real_server(tiny_model, tmp_path):
    result, _ = run_ab(
        tmp_path,
        "--workload",
        "gsp",
        "--gsp-groups",
        "2",
        "--gsp-prompts-per-group",
        "3",
        "--gsp-prefix-len",
        "96",
        "--gsp-output-len",
        "6",
        "--mode",
        "online",
        "--request-rate",
        "6",
        "--model",
        str(tiny_model),
        "--policies",
        "fcfs,feather",
        "--backends",
        "torch_native",
        "--threads",
        "1",
    )
    check_rows(result, ["fcfs + torch_native", "feather + torch_native"], 6, 36)
    assert (
        result["common"]["mode"] == "online" and result["workload"]["params"]["request_rate"] == 6
    )
    assert list((tmp_path / "work" / "rep0").glob("*.server.log"))


def test_a_configuration_that_fails_leaves_the_others_measured(tiny_model, tmp_path):
    # feather refuses priority scheduling, which fcfs takes: feather's engine exits, fcfs after
    # it is still measured, and the failure is recorded, reported and in the exit status
    args = ["--workload-file", str(EXAMPLE), "--model", str(tiny_model), "--threads", "1"]
    args += ["--policies", "feather,fcfs", "--backends", "feather"]
    result, out = run_ab(tmp_path, *args, "--server-args=--enable-priority-scheduling", status=1)
    check_rows(result, ["fcfs + feather"], 12, 12 * 12)
    (failed,) = result["failed"]
    assert failed["config"] == "feather + feather" and failed["run"] == 1
    assert "cannot be combined with --enable-priority-scheduling" in failed["error"]
    assert "not measured: feather + feather" in out
