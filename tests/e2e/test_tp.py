"""End-to-end: feather on two tensor-parallel ranks. Every rank runs its own scheduler and must
form the same batches, including the starvation bound's clock-based ones."""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict

import pytest
import requests

from feather_bench.tools.server import SGLangServer
from feather_bench.tools.workload import compare_greedy, generate_all, grouped_prompts

pytestmark = pytest.mark.e2e

IDLE_CHECK_WAIT_S = 4.0  # SGLang's idle memory check (a leaked KV slot stops the server)
# fp32; the static agent's STOPs and a short starvation bound in seconds alone, so that
# clock-based admissions happen while 48 requests queue on a 2-core host
ARGS = [
    *("--dtype", "float32", "--feather-agent", "static"),
    *("--feather-max-wait-s", "0.5", "--feather-max-wait-ratio", "0"),
]
STATS = re.compile(
    r"TP(\d)\] feather: sched_time=.* admitted=(\d+) rolled_back=(\d+) starved=(\d+) "
    r"stops=(\{.*?\}) waiting=(\d+) running=(\d+)"
)


def test_two_ranks_form_the_same_batches_and_generate_what_one_rank_does(tiny_model, tmp_path):
    prompts = grouped_prompts(groups=8, per_group=6)  # 48 requests
    trace = tmp_path / "batches.jsonl"
    args = [*ARGS, "--tp-size", "2", "--sleep-on-idle", "--decode-log-interval", "5"]
    env = {"FEATHER_BATCH_TRACE": str(trace)}
    server = SGLangServer(tiny_model, "feather", args, log_path=tmp_path / "tp.log", env=env)
    with server:
        two = generate_all(server.url, prompts, 8)
        time.sleep(IDLE_CHECK_WAIT_S)
        assert requests.get(server.url + "/health_generate", timeout=120).status_code == 200
        log = server.log_text()
    with SGLangServer(tiny_model, "feather", ARGS, log_path=tmp_path / "one.log") as one_server:
        one = generate_all(one_server.url, prompts, 8)
    assert compare_greedy(one, two) == []

    steps = defaultdict(list)  # scheduler pid -> its steps, in order
    for line in trace.read_text().splitlines():
        step = json.loads(line)
        if not step["rids"][0].startswith("HEALTH_CHECK"):
            steps[step["pid"]].append((step["mode"], step["rids"]))
    assert len(steps) == 2, list(steps)
    first, second = steps.values()
    assert first == second  # the same batches, step by step, in the same order
    served = {rid for mode, rids in first if mode == "extend" for rid in rids}
    assert served >= {rid for rid, _ in prompts}
    # feather's own counts, logged by each rank at the same steps, agree: admissions, STOPs
    # and the starvation bound's admissions (on the first rank's clock, shared)
    stats = defaultdict(list)
    for rank, *counts in STATS.findall(log):
        stats[rank].append(counts)
    assert stats["0"] and stats["0"] == stats["1"], stats
    assert sum(int(c[2]) for c in stats["0"]) > 0, stats["0"]  # the bound did admit
    assert "Scheduler hit an exception" not in log
    assert "memory leak detected" not in log
    idle = dict(re.findall(r"TP(\d)\] feather: idle, tracking (\d+) requests, \d+ CHT nodes", log))
    assert idle == {"0": "0", "1": "0"}, idle
