"""feather-bench-dp's and feather-bench-router's per-worker counts and worker settings, without
servers."""

from __future__ import annotations

import pytest

import feather_cpu
from feather_bench import router, serving
from feather_bench.dp import per_worker, spread

DP_LOG = """\
[2026-01-01 10:00:00 DP1] Prefill batch, #new-seq: 2, #new-token: 60, #cached-token: 30, token usage: 0.00
[2026-01-01 10:00:01 DP0] Prefill batch, #new-seq: 1, #new-token: 5, #cached-token: 0, token usage: 0.00
[2026-01-01 10:00:01 DP0 TP1] Prefill batch, #new-seq: 9, #new-token: 9, #cached-token: 9, token usage: 0.00
"""
ONE_WORKER_LOG = """\
[2026-01-01 10:00:00] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00
[2026-01-01 10:00:01] Cache flushed successfully!
[2026-01-01 10:00:02] Prefill batch, #new-seq: 3, #new-token: 40, #cached-token: 0, token usage: 0.00
[2026-01-01 10:00:03] Prefill batch, #new-seq: 1, #new-token: 4, #cached-token: 20, token usage: 0.00
"""


def test_prefill_lines_count_for_the_dp_worker_that_logged_them():
    rows = per_worker(DP_LOG, 2)
    assert rows[0] == {"worker": 0, "requests": 1, "new_tokens": 5, "cached_tokens": 0}
    assert rows[1] == {"worker": 1, "requests": 2, "new_tokens": 60, "cached_tokens": 30}
    assert per_worker(DP_LOG, 2, skip=1)[1]["requests"] == 0
    assert spread([3, 1]) == 1.0


def test_a_one_worker_log_counts_from_its_last_cache_flush():
    assert router.log_counts(ONE_WORKER_LOG) == {
        "requests": 4,
        "new_tokens": 44,
        "cached_tokens": 20,
        "flushed": True,
    }
    whole = router.log_counts(ONE_WORKER_LOG.replace("Cache flushed successfully!", ""))
    assert whole["requests"] == 5 and whole["flushed"] is False


def test_each_worker_gets_its_share_of_the_cores_on_a_cpu_host(monkeypatch):
    monkeypatch.setattr(feather_cpu, "accelerator_present", lambda: False)
    monkeypatch.setattr(router.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    quiet = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
    assert router.worker_env(1, 2) == {**quiet, "SGLANG_CPU_OMP_THREADS_BIND": "2-3"}
    assert router.worker_env(0, 2) == {**quiet, "SGLANG_CPU_OMP_THREADS_BIND": "0-1"}
    assert router.worker_env(0, 8) == quiet  # fewer cores than workers: no binding
    assert router.worker_server_args("--dtype float32") == [
        "--dtype",
        "float32",
        "--sleep-on-idle",
        "--max-total-tokens",
        str(feather_cpu.MULTI_RANK_KV_TOKENS),
    ]
    assert router.worker_server_args("--max-total-tokens 4096 --sleep-on-idle") == [
        "--max-total-tokens",
        "4096",
        "--sleep-on-idle",
    ]
    monkeypatch.setattr(feather_cpu, "accelerator_present", lambda: True)
    assert router.worker_env(0, 2) == quiet
    assert router.worker_server_args("") == ["--sleep-on-idle"]


def test_each_router_is_launched_by_its_own_module_and_offers_its_own_policies(capsys):
    from feather_bench.tools.server import SGLangRouter

    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    for name, module in (
        ("sglang-router", "sglang_router.launch_router"),
        ("smg", "smg.launch_router"),
    ):
        r = SGLangRouter(urls, "round_robin", router=name)
        assert (
            r.args[1:3] == ["-m", module] and r.args[r.args.index("--policy") + 1] == "round_robin"
        )
    with pytest.raises(ValueError, match="sglang-router, smg"):
        SGLangRouter(urls, router="nginx")
    # prefix_hash is smg's alone: refused for sglang-router, with what sglang-router offers
    assert "prefix_hash" in router.POLICIES["smg"]
    with pytest.raises(SystemExit) as refused:
        router.main(["--policies", "prefix_hash"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "unknown to sglang-router: ['prefix_hash']" in err and "power_of_two" in err


def test_smg_streams_without_keep_alive_comments_unless_the_user_sets_them():
    # bench_serving's client parses every streamed line as JSON; smg's ": ping" is not
    assert router.router_args("smg", "") == ["--sse-keepalive-secs", "0"]
    assert router.router_args("smg", "--sse-keepalive-secs 5 --cache-threshold 0.5") == [
        "--sse-keepalive-secs",
        "5",
        "--cache-threshold",
        "0.5",
    ]
    assert router.router_args("sglang-router", "--cache-threshold 0.5") == [
        "--cache-threshold",
        "0.5",
    ]


def test_bench_serving_counts_the_prompt_tokens_computed_in_its_run_alone(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(ONE_WORKER_LOG)
    assert serving.prefill_tokens(log) == 51
    earlier = len(ONE_WORKER_LOG.encode().split(b"Cache flushed")[0])  # a later run's start
    assert serving.prefill_tokens(log, earlier) == 44
