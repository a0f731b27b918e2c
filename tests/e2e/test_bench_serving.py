"""End-to-end: SGLang's own benchmark client runs in this environment, and feather-bench-serving
drives it against a real feather server."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from feather_bench import serving

pytestmark = pytest.mark.e2e


def test_sglang_bench_serving_imports_and_answers_help():
    out = subprocess.run(
        [sys.executable, "-m", "sglang.bench_serving", "--help"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--gsp-num-groups" in out.stdout and "--output-file" in out.stdout


def test_feather_bench_serving_writes_bench_servings_metrics(tiny_model, tmp_path, capsys):
    # --interleave: the configurations take turns, a server of their own per run
    small = (
        "--num-prompts 8 --gsp-num-groups 2 --gsp-prompts-per-group 4 --gsp-system-prompt-len 128 "
        "--gsp-question-len 16 --gsp-output-len 4"
    )
    code = serving.main(
        [
            "--model",
            str(tiny_model),
            "--workloads",
            "memory-ample",
            "--policies",
            "fcfs,feather",
            "--backends",
            "feather",
            "--repeats",
            "2",
            "--interleave",
            "--bench-args",
            small,
            "--out-dir",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "memory-ample.json").read_text())
    rows = {r["config"]: r for r in result["rows"]}
    assert set(rows) == {"fcfs+feather", "feather+feather"}
    for row in rows.values():
        assert row["output_throughput"] > 0 and row["errors"] == 0 and row["runs"] == 2
        # prompt tokens computed per run, from the server's log: each run's own (the cache is
        # flushed before it), at least both prefixes and every question, at most every prompt
        # whole (a template's tokens on top) and the warm-up request
        counts = row["prefill_tokens_runs"]
        assert len(counts) == 2 and row["prefill_tokens"] == statistics.median(counts)
        assert all(2 * 128 + 8 * 16 <= n < 9 * 2 * (128 + 16) for n in counts), counts
        assert row["median_ttft_ms"] > 0 and row["p99_itl_ms"] >= row["median_itl_ms"]
    # bench_serving's own JSONL lines are kept, one per run
    text = (tmp_path / "memory-ample.feather+feather.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["completed"] for line in lines] == [8, 8]
    assert rows["feather+feather"]["output_throughput"] == pytest.approx(
        statistics.median(line["output_throughput"] for line in lines)
    )
    assert rows["feather+feather"]["vs_best_stock_same_backend"] == pytest.approx(
        rows["feather+feather"]["output_throughput"] / rows["fcfs+feather"]["output_throughput"]
    )
    assert result["git"]["commit"] and result["machine"]["versions"]["sglang"]
    out = capsys.readouterr().out
    assert "| feather+feather |" in out
    order = [
        line.split(" ", 2)[2] for line in out.splitlines() if line.startswith("[bench-serving]")
    ]
    # each round starts one configuration later
    assert order == [
        "fcfs+feather run 1/2",
        "feather+feather run 1/2",
        "feather+feather run 2/2",
        "fcfs+feather run 2/2",
    ]
    report = " ".join(serving.report(tmp_path).split())
    assert "| fcfs+feather |" in report and "configurations taking turns" in report


def test_a_configuration_that_fails_leaves_the_others_measured(tiny_model, tmp_path, capsys):
    # feather's server refuses its agent and exits; fcfs, run after it, is still measured and
    # written, the failure is recorded and reported, and the job's status says it
    small = (
        "--num-prompts 4 --gsp-num-groups 2 --gsp-prompts-per-group 2 --gsp-system-prompt-len 64 "
        "--gsp-question-len 8 --gsp-output-len 4"
    )
    args = ["--model", str(tiny_model), "--workloads", "memory-ample", "--backends", "feather"]
    args += ["--repeats", "1", "--bench-args", small, "--out-dir", str(tmp_path), "--quiet"]
    code = serving.main(
        [*args, "--policies", "feather,fcfs", "--feather-args", "--feather-agent nope"]
    )
    assert code == 1
    result = json.loads((tmp_path / "memory-ample.json").read_text())
    assert [r["config"] for r in result["rows"]] == ["fcfs+feather"]
    assert result["rows"][0]["output_throughput"] > 0
    (failed,) = result["failed"]
    assert failed["config"] == "feather+feather" and failed["run"] == 1
    assert "unknown agent 'nope'" in failed["error"], failed
    assert "not measured: memory-ample feather+feather" in capsys.readouterr().err
    assert "feather+feather failed in run 1" in " ".join(serving.report(tmp_path).split())
    # --add: a configuration that fails again keeps the figures of the run that measured it
    code = serving.main([*args, "--policies", "fcfs", "--add", "--server-args=--nope"])
    assert code == 1
    again = json.loads((tmp_path / "memory-ample.json").read_text())
    (row,) = again["rows"]
    assert row["output_throughput"] == result["rows"][0]["output_throughput"]
    assert row["git"] == result["git"] and again["failed"][0]["config"] == "fcfs+feather"


def _kill_server_after_first_run(counts: Path, stop: threading.Event, killed: list) -> None:
    """Once run 1's prefill count is written, the server (a launch_server child) is killed:
    run 2's client, still importing, finds no server."""
    while not stop.is_set():
        if counts.exists():
            for proc in psutil.Process().children(recursive=True):
                try:  # a child may exit while it is read
                    if "sglang.launch_server" in " ".join(proc.cmdline()):
                        os.killpg(proc.pid, signal.SIGKILL)  # its session: it and its workers
                        killed.append(proc.pid)
                        return
                except (psutil.Error, ProcessLookupError):
                    continue
        time.sleep(0.05)


def test_a_server_lost_after_a_run_keeps_that_run(tiny_model, tmp_path, capsys):
    # one server for both runs (no --interleave); it dies after the first: the first run's
    # figures are written, the second is recorded as the failure, and the job says so
    small = (
        "--num-prompts 4 --gsp-num-groups 2 --gsp-prompts-per-group 2 --gsp-system-prompt-len 64 "
        "--gsp-question-len 8 --gsp-output-len 4"
    )
    stop, killed = threading.Event(), []
    killer = threading.Thread(
        target=_kill_server_after_first_run,
        args=(tmp_path / "memory-ample.feather+feather.prefill.json", stop, killed),
    )
    killer.start()
    try:
        code = serving.main(
            ["--model", str(tiny_model), "--workloads", "memory-ample", "--backends", "feather"]
            + ["--policies", "feather", "--repeats", "2", "--bench-args", small]
            + ["--out-dir", str(tmp_path), "--quiet"]
        )
    finally:
        stop.set()
        killer.join()
    assert killed, "the server was not found to kill after run 1"
    assert code == 1
    result = json.loads((tmp_path / "memory-ample.json").read_text())
    (row,) = result["rows"]
    assert row["config"] == "feather+feather" and row["runs"] == 1 and row["errors"] == 0
    assert len(row["output_throughput_runs"]) == len(row["prefill_tokens_runs"]) == 1
    assert row["output_throughput"] == row["output_throughput_runs"][0] > 0
    (failed,) = result["failed"]
    assert failed["config"] == "feather+feather" and failed["run"] == 2
    assert failed["error"].startswith("sglang.bench_serving exited with status"), failed
    assert "feather+feather from run 2 on" in capsys.readouterr().err


def test_bad_options_say_what_is_allowed(capsys):
    with pytest.raises(SystemExit) as err:
        serving.main(["--model", "m", "--policies", "fcfs,best"])
    assert err.value.code == 2
    assert (
        "--policies: best not allowed; choose from fcfs, lpm, dfs-weight, feather"
        in capsys.readouterr().err
    )
