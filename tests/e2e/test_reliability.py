"""End-to-end: a fault injected into feather on a live server, and an abort storm."""

from __future__ import annotations

import concurrent.futures
import random
import re
import time

import pytest
import requests

from feather_bench.tools import fault_inject as faults
from feather_bench.tools.server import SGLangServer
from feather_bench.tools.workload import compare_greedy, generate_all, shared_prefix_prompts

pytestmark = pytest.mark.e2e

# fp32: greedy outputs compared exactly with fcfs's (see test_server_policy)
SERVER_ARGS = ["--max-running-requests", "16", "--dtype", "float32"]
IDLE_CHECK_WAIT_S = 3.0


def _serve(model, policy, tmp_path, prompts, max_new_tokens, env=None, args=SERVER_ARGS):
    server = SGLangServer(model, policy, args, log_path=tmp_path / f"{policy}.log", env=env)
    with server:
        outputs = generate_all(server.url, prompts, max_new_tokens)
        time.sleep(
            IDLE_CHECK_WAIT_S
        )  # SGLang's idle memory check (a leaked KV slot kills the server)
        healthy = requests.get(server.url + "/health_generate", timeout=60).status_code == 200
    return outputs, healthy, server.log_path.read_text(errors="replace")


def test_a_fault_injected_at_pass_5_loses_no_request(tiny_model, tmp_path):
    prompts = shared_prefix_prompts(groups=10, per_group=20, repeat=8)  # 200 requests
    env = {faults.INJECT_ENV: "plan:5,rebuild:1", faults.ACK_ENV: faults.ACK_PHRASE}
    feather, healthy, log = _serve(tiny_model, "feather", tmp_path, prompts, 8, env=env)
    fcfs, _, _ = _serve(tiny_model, "fcfs", tmp_path, prompts, 8)
    assert len(feather) == 200 and healthy
    assert compare_greedy(fcfs, feather) == []
    assert "FAULT INJECTION is on" in log and "fault in plan (InjectedFault" in log
    assert "feather stands down" in log  # the rebuild failed too: fcfs from then on
    assert "Scheduler hit an exception" not in log


def test_an_abort_storm_leaks_nothing(tiny_model, tmp_path):
    """Shared-prefix requests, ~30% of whose clients disconnect at random times (queued or
    decoding), ~5% reusing a rid, a small --max-queued-requests; several cycles."""
    args = [*SERVER_ARGS, "--max-queued-requests", "64"]
    server = SGLangServer(tiny_model, "feather", args, log_path=tmp_path / "storm.log")
    rng = random.Random(0)
    prompts = shared_prefix_prompts(groups=6, per_group=20, repeat=8)
    completed = []

    def one(i_rid_text):
        i, (rid, text) = i_rid_text
        if rng.random() < 0.05 and i > 0:
            rid = prompts[i - 1][0]  # a reused rid
        timeout = rng.uniform(0.5, 8.0) if rng.random() < 0.3 else 600  # a client that gives up
        try:
            r = requests.post(
                server.url + "/generate",
                timeout=timeout,
                json={
                    "rid": f"{rid}-{cycle}",
                    "text": text,
                    "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True},
                },
            )
            return r.status_code
        except requests.exceptions.Timeout:
            return "disconnected"

    with server:
        for cycle in range(3):
            with concurrent.futures.ThreadPoolExecutor(max_workers=48) as pool:
                completed += list(pool.map(one, enumerate(prompts)))
        time.sleep(IDLE_CHECK_WAIT_S)
        assert requests.get(server.url + "/health_generate", timeout=120).status_code == 200
    log = server.log_path.read_text(errors="replace")
    assert server.returncode == 0 or not server.killed
    assert completed.count(200) > 0 and "disconnected" in completed
    assert "Scheduler hit an exception" not in log and "fault in" not in log
    idle = re.findall(r"feather: idle, tracking (\d+) requests, (\d+) CHT nodes", log)
    assert idle and idle[-1] == ("0", "0"), idle[-3:]
