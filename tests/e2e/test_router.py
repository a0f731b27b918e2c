"""End-to-end: two feather servers behind sglang-router's cache_aware policy (the
``sglang-router`` package), set up as feather-bench-router sets them up."""

from __future__ import annotations

import psutil
import pytest

from feather_bench.router import log_counts, log_since, worker_env, worker_server_args
from feather_bench.tools.server import SGLangRouter, SGLangServer
from feather_bench.tools.workload import compare_greedy, generate_all, grouped_prompts

pytestmark = pytest.mark.e2e
pytest.importorskip(
    "sglang_router", reason="sglang-router is not installed (make setup installs it)"
)

FP32 = ["--dtype", "float32"]
MAX_NEW_TOKENS = 6
READY_TIMEOUT_S = 600  # three servers load the model at the same time, two on one core each


def _sglang_descendants() -> list[psutil.Process]:
    """This test process's live descendants that are SGLang or sglang-router processes."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "sglang" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def test_cache_aware_router_over_two_workers_generates_what_one_server_does(tiny_model, tmp_path):
    prompts = grouped_prompts(groups=4, per_group=3)  # 12 requests, all sent at once
    workers = [
        SGLangServer(
            tiny_model,
            "feather",
            worker_server_args("--dtype float32"),
            log_path=tmp_path / f"worker{i}.log",
            ready_timeout_s=READY_TIMEOUT_S,
            env=worker_env(i, 2),
        )
        for i in range(2)
    ]
    single = SGLangServer(  # a fixed pool as the workers have: three servers load at once
        tiny_model,
        "feather",
        [*FP32, "--max-total-tokens", "65536", "--sleep-on-idle"],
        log_path=tmp_path / "single.log",
        ready_timeout_s=READY_TIMEOUT_S,
    )
    servers = [*workers, single]
    router = None
    try:
        for s in servers:  # all three load the model at the same time
            s.launch()
        for s in servers:
            s.wait_ready()
        # made once the workers are ready: a worker whose port was taken serves on another
        router = SGLangRouter(
            [w.url for w in workers],
            "cache_aware",
            log_path=tmp_path / "router.log",
            ready_timeout_s=300,
        )
        router.start()
        offsets = [w.log_path.stat().st_size for w in workers]
        single_offset = single.log_path.stat().st_size
        routed = generate_all(router.url, prompts, MAX_NEW_TOKENS)
        one = generate_all(single.url, prompts, MAX_NEW_TOKENS)
        logs = [log_since(w.log_path, offset) for w, offset in zip(workers, offsets)]
        single_log = log_since(single.log_path, single_offset)
    finally:
        if router is not None:
            router.stop()
        for s in servers:
            s.stop()

    # every request completed, with the single server's greedy tokens
    assert sorted(routed) == sorted(rid for rid, _ in prompts)
    assert all(len(out.token_ids) == MAX_NEW_TOKENS for out in routed.values())
    assert compare_greedy(one, routed) == []

    # the workers' own logs account for every request, and cache_aware kept each group on one
    # worker: together they computed about what the single server did (round robin would
    # compute every group's prefix on both workers, about twice that)
    counts = [log_counts(text) for text in logs]
    assert sum(c["requests"] for c in counts) == len(prompts), counts
    alone = log_counts(single_log)
    assert alone["requests"] == len(prompts), alone
    computed = sum(c["new_tokens"] for c in counts)
    assert computed <= 1.25 * alone["new_tokens"], (counts, alone)
    for log in logs:
        assert "Scheduler hit an exception" not in log

    # stopped cleanly: nothing of the router or the servers is left
    assert not router.killed and not any(s.killed for s in servers)
    assert not router.group_alive() and not any(s.group_alive() for s in servers)
    assert _sglang_descendants() == []
