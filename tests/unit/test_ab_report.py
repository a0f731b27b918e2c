"""The A/B tool's arithmetic and reporting (feather_bench/ab/{metrics,report,cli}.py) on
hand-made records and traces whose figures are known; the real runs are in tests/e2e/test_ab.py."""

from __future__ import annotations

import pytest

from feather_bench.ab.client import RequestRecord
from feather_bench.ab.metrics import compute, median_of
from feather_bench.ab.report import check_greedy, summary, table
from feather_bench.ab.runner import ABConfig, RunResult
from feather_bench.workloads import Workload, WorkloadRequest


def rec(rid, prompt, cached, ids, ttft, e2e, gaps=None):
    top2 = [[[-0.1, t], [-0.1 - (gaps[i] if gaps else 5.0), t + 1]] for i, t in enumerate(ids)]
    return RequestRecord(rid, prompt, cached, ids, top2, 0.0, ttft, e2e)


def workload():
    reqs = [
        WorkloadRequest("a", (1,) * 100, 4, None, "g0"),
        WorkloadRequest("b", (1,) * 100, 4, None, "g0"),
        WorkloadRequest("c", (2,) * 100, 4, None, "g1"),
    ]
    return Workload("w", tuple(reqs), "test")


def test_metrics_from_records_and_trace():
    records = [
        rec("a", 100, 0, [5, 6, 7, 8], 1.0, 2.0),
        rec("b", 100, 90, [5, 6, 7, 8], 2.0, 3.0),
        rec("c", 100, 0, [9, 9, 9, 9], 3.0, 4.0),
    ]
    trace = [
        {
            "mode": "extend",
            "rids": ["a", "c"],
            "prefix_tokens": 0,
            "extend_tokens": 200,
            "sched_s": 0.01,
            "step_s": 0.99,
            "attn_s": 0.3,
        },
        {
            "mode": "extend",
            "rids": ["b"],
            "prefix_tokens": 100,
            "extend_tokens": 10,
            "sched_s": 0.0,
            "step_s": 0.5,
            "attn_s": 0.1,
        },
        {
            "mode": "decode",
            "rids": ["a", "b", "c"],
            "prefix_tokens": 0,
            "extend_tokens": 0,
            "sched_s": 0.0,
            "step_s": 0.25,
            "attn_s": 0.05,
        },
        {
            "mode": "decode",
            "rids": ["a", "b"],
            "prefix_tokens": 100,
            "extend_tokens": 0,
            "sched_s": 0.0,
            "step_s": 0.25,
            "attn_s": 0.05,
        },
    ]
    m = compute(RunResult(ABConfig("fcfs", "torch_native"), records, 4.0, trace), workload())
    assert m["output_throughput"] == 12 / 4 and m["total_throughput"] == 312 / 4
    assert m["request_throughput"] == 3 / 4 and m["duration"] == 4.0 and m["completed"] == 3
    assert m["median_ttft_ms"] == 2000.0 and m["median_e2e_latency_ms"] == 3000.0
    assert 3900 < m["p99_e2e_latency_ms"] <= 4000
    assert m["prefill_tokens_logical"] == 300 and m["prefill_tokens_computed"] == 210
    assert m["saving_ratio_r"] == pytest.approx(0.3) and m["cache_hit_rate"] == pytest.approx(0.3)
    assert m["decode_steps"] == 2 and m["mean_decode_batch"] == 2.5
    assert m["mean_decode_prefix_tokens"] == 50 and m["mean_groups_per_decode"] == 1.5
    assert m["sched_fraction"] == pytest.approx(0.01 / 2.0)
    assert m["extend_step_s"] == pytest.approx(1.49) and m["decode_step_s"] == pytest.approx(0.5)
    assert m["attention_s"] == pytest.approx(0.5) and m["attention_fraction"] == pytest.approx(
        0.5 / 1.99
    )
    assert (
        median_of([m, {**m, "output_throughput": 1.0}, {**m, "output_throughput": 100.0}])[
            "output_throughput"
        ]
        == 3.0
    )


def test_greedy_check_accepts_near_ties_only():
    a = {"x": rec("x", 10, 0, [1, 2, 3], 0, 0)}
    same = {"x": rec("x", 10, 0, [1, 2, 3], 0, 0)}
    flip_tie = {"x": rec("x", 10, 0, [1, 7, 8], 0, 0, gaps=[5.0, 1e-4, 5.0])}
    a_tie = {"x": rec("x", 10, 0, [1, 2, 3], 0, 0, gaps=[5.0, 1e-4, 5.0])}
    flip_real = {"x": rec("x", 10, 0, [1, 7, 8], 0, 0)}
    c = [ABConfig("fcfs", "torch_native"), ABConfig("feather", "feather")]
    assert check_greedy({c[0]: a, c[1]: same}) == []
    assert check_greedy({c[0]: a_tie, c[1]: flip_tie}) == []
    problems = check_greedy({c[0]: a, c[1]: flip_real})
    assert (
        len(problems) == 1
        and "feather + feather vs fcfs + torch_native: x: token 1 differs" in problems[0]
    )


def row(policy, backend, tok_s, ttft99):
    return {
        "policy": policy,
        "attention_backend": backend,
        "config": f"{policy} + {backend}",
        "output_throughput": tok_s,
        "p99_ttft_ms": ttft99,
    }


def test_summary_compares_feather_with_the_best_baseline_and_separates_policy_from_backend():
    rows = [
        row("fcfs", "torch_native", 10, 4),
        row("lpm", "torch_native", 12, 5),
        row("dfs-weight", "torch_native", 11, 5),
        row("feather", "torch_native", 13, 3),
        row("fcfs", "feather", 20, 2),
        row("lpm", "feather", 22, 2),
        row("feather", "feather", 30, 1),
    ]
    s = summary(rows, ("fcfs", "lpm", "dfs-weight"))
    assert s["best_baseline"] == "lpm + torch_native" and s["best_feather"] == "feather + feather"
    assert s["speedup_vs_best_baseline"] == 30 / 12
    assert (
        s["policy_speedup_same_backend"] == 30 / 22
        and s["policy_speedup_same_backend_vs"] == "lpm + feather"
    )
    assert (
        s["output_throughput_vs_fcfs_same_backend"] == 30 / 20
        and s["ttft_p99_vs_fcfs_same_backend"] == 0.5
    )
    assert s["ttft_p99_vs_fcfs_torch_native"] == 0.25
    assert "speedup_bound_if_attention_were_free" not in s  # no attention timing in these rows
    timed = {
        **rows[-1],
        "duration": 10.0,
        "total_output_tokens": 300,
        "attention_s": 4.0,
        "attention_fraction": 0.4,
    }
    s = summary(rows[:-1] + [timed], ("fcfs", "lpm", "dfs-weight"))
    # 300 tokens in the 6 s left without attention = 50 tok/s, over lpm's 12
    assert s["speedup_bound_if_attention_were_free"] == pytest.approx(50 / 12)
    assert (
        summary([row("fcfs", "torch_native", 1, 1)], ("fcfs",))["speedup_vs_best_baseline"] is None
    )


def test_table_has_a_row_per_configuration():
    from feather_bench.ab.metrics import COLUMNS

    r = {k: 1.0 for k, _, _ in COLUMNS}
    text = table([{**r, "config": "fcfs + torch_native"}, {**r, "config": "feather + feather"}])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0].startswith("configuration") and "out tok/s" in lines[0]
    assert lines[3].startswith("feather + feather")


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--workload", "gsp", "--policies", "fcfs,best"],
            "--policies: unknown policy 'best'; allowed: lpm, dfs-weight",
        ),
        (
            ["--workload", "gsp", "--backends", "cuda_magic"],
            "--backends: unknown attention backend 'cuda_magic'; allowed:",
        ),
        (
            ["--workload", "gsp", "--feather-agents", "genius"],
            "--feather-agents: unknown agent 'genius'; allowed: admit, dqn:PATH, ppo:PATH, qlearning, static, throughput, ucb",
        ),
        (
            ["--workload", "gsp", "--feather-agents", "static,ppo:/nowhere.zip"],
            "--feather-agents: ppo:/nowhere.zip: no such file",
        ),
        (["--workload", "gsp", "--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--workload", "gsp", "--request-rate", "2"], "--request-rate needs --mode online"),
        (["--workload", "gsp", "--model", "/nowhere"], "--model: no model at /nowhere"),
        (["--workload", "bogus"], "--workload: unknown workload 'bogus'; built-in workloads: gsp,"),
        (
            ["--workload", "gsp:groups"],
            "--workload: workload 'gsp:groups': parameter 'groups' is not key=value",
        ),
        (["--workload", "file:x.jsonl"], "give a workload file with --workload-file"),
        (["--workload", "gsp", "--gsp-groups", "0"], "groups must be a positive integer, got 0"),
        (
            ["--workload", "gsp", "--max-total-tokens", "500"],
            "--max-total-tokens 500 cannot hold request 'g0-q3' (544 prompt + 16 output tokens); use at least 560",
        ),
    ],
)
def test_bad_options_exit_2_saying_what_is_allowed(argv, message, tmp_path, capsys):
    from feather_bench.ab.cli import main

    with pytest.raises(SystemExit) as e:
        main([*argv, "--json", str(tmp_path / "x.json")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
