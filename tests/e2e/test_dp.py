"""End-to-end: two data-parallel workers running feather behind SGLang's controller, routed by
prefix group."""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import signal
import time
from collections import Counter

import psutil
import pytest
import requests

from feather_bench.tools.server import SGLangServer
from feather_bench.tools.workload import compare_greedy, generate_all, grouped_prompts

pytestmark = pytest.mark.e2e

IDLE_CHECK_WAIT_S = 4.0  # SGLang's idle memory check (a leaked KV slot stops the server)
FP32 = ["--dtype", "float32"]
KILLED_WORKER_ANSWERED_S = 90.0  # every client of a server whose worker died hears back by then


def test_two_workers_keep_groups_whole_and_generate_what_one_worker_does(tiny_model, tmp_path):
    prompts = grouped_prompts(groups=8, per_group=6)  # 48 requests
    args = [*FP32, "--dp-size", "2", "--load-balance-method", "prefix_group", "--sleep-on-idle"]
    server = SGLangServer(tiny_model, "feather", args, log_path=tmp_path / "dp.log")
    with server:
        two = generate_all(server.url, prompts, 8)
        time.sleep(IDLE_CHECK_WAIT_S)
        assert requests.get(server.url + "/health_generate", timeout=120).status_code == 200
        idle_cores = _cores_used(server, seconds=5.0)  # controller and both workers idle
        # each worker runs on its own share of the host's cores
        shares = [set(p.cpu_affinity()) for p in _scheduler_processes(server)]
        log = server.log_text()
        # A worker dies mid-serving: no request is lost silently, every client hears back. (256
        # output tokens each: 64 were all done within the second before the kill on a fast host.)
        pending = grouped_prompts(groups=4, per_group=4, seed=1)
        with cf.ThreadPoolExecutor(len(pending)) as pool:
            futures = [pool.submit(_post, server.url, rid, text) for rid, text in pending]
            time.sleep(1.0)
            _scheduler_processes(server)[-1].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            outcomes = [f.result(timeout=300) for f in futures]
            answered_s = time.monotonic() - killed

    with SGLangServer(tiny_model, "feather", FP32, log_path=tmp_path / "one.log") as one_server:
        one = generate_all(one_server.url, prompts, 8)
    assert compare_greedy(one, two) == []

    by_group: dict[str, Counter] = {}
    for rid, out in two.items():
        by_group.setdefault(rid.split("-")[0], Counter())[out.dp_rank] += 1
    per_worker = Counter(out.dp_rank for out in two.values())
    assert set(per_worker) == {0, 1}, per_worker
    # the router bounds the workers' outstanding loads, not their totals: requests reach it one
    # by one after tokenization, so totals drift (31/17 of 48 seen on a 2-core host); neither
    # worker may be left with less than a quarter of them
    assert min(per_worker.values()) >= 0.25 * len(prompts), per_worker
    # All 48 arrive at once and the bounded loads split a few groups (4 to 8 of the 8 kept whole
    # across runs here); what routing by group guarantees is that most requests share their
    # group's worker: at least 3 in 4 (round robin leaves about 5 in 8)
    kept = sum(max(ranks.values()) for ranks in by_group.values()) / len(prompts)
    assert kept >= 0.75, by_group

    assert "routed by prefix group (2 workers)" in log
    if len(os.sched_getaffinity(0)) >= 2:
        assert shares[0] and shares[1] and not shares[0] & shares[1], shares
    # --sleep-on-idle reaches the controller too: idle, the whole server takes little CPU
    assert idle_cores < 0.5, idle_cores
    assert "Scheduler hit an exception" not in log
    assert "memory leak detected" not in log
    idle = dict(re.findall(r"DP(\d)\] feather: idle, tracking (\d+) requests, \d+ CHT nodes", log))
    assert idle == {"0": "0", "1": "0"}, idle
    # The dead worker's requests fail (SGLang's watchdog on the workers stops the server)
    # instead of waiting forever.
    assert answered_s < KILLED_WORKER_ANSWERED_S, (answered_s, outcomes)
    assert "error" in outcomes or any(o != 200 for o in outcomes), outcomes


def _cores_used(server, seconds: float) -> float:
    """CPU cores the server's processes used on average over ``seconds``."""
    procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(True)]

    def cpu() -> float:
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    start = cpu()
    time.sleep(seconds)
    return (cpu() - start) / seconds


def _post(url: str, rid: str, text: str):
    try:
        r = requests.post(
            url + "/generate",
            timeout=KILLED_WORKER_ANSWERED_S + 60,
            json={
                "rid": f"{rid}-late",
                "text": text,
                "sampling_params": {"max_new_tokens": 256, "temperature": 0, "ignore_eos": True},
            },
        )
        return r.status_code
    except requests.RequestException:
        return "error"


def _scheduler_processes(server: SGLangServer) -> list[psutil.Process]:
    procs = [
        p
        for p in psutil.Process(server.proc.pid).children(recursive=True)
        if "scheduler" in " ".join(p.cmdline())
    ]
    assert len(procs) == 2, [p.cmdline() for p in procs]
    return procs
