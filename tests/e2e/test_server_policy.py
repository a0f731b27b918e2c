"""End-to-end: the real SGLang server with --schedule-policy feather vs fcfs, over HTTP.

Each (model, policy) server is started once per module under a timeout, runs the same
shared-prefix workload, then idles long enough for SGLang's own idle memory check (strict by
default: a leaked KV slot raises in the scheduler and kills the server), and is stopped.
"""

from __future__ import annotations

import re
import time

import openai
import pytest
import requests

from feather_bench.tools.server import SGLangServer
from feather_bench.tools.trace import read_trace
from feather_bench.tools.workload import (
    compare_greedy,
    generate_all,
    homogeneity,
    shared_prefix_prompts,
)

pytestmark = pytest.mark.e2e

# NOTE: a small --max-running-requests makes admission a real choice (more requests wait
# than fit), which is where policies differ; with everything admitted at once they cannot.
# fp32 for the exactness check: batch composition moves fp32 logits by ~1e-6, so a token
# flip can only be a near-tie; bf16 (the CPU runtime's pick where the CPU has bf16) rounds
# at ~1e-2 and would need a tolerance loose enough to hide a real bug.
SERVER_ARGS = ["--max-running-requests", "4", "--max-total-tokens", "16384", "--dtype", "float32"]
IDLE_CHECK_WAIT_S = 3.0
# ~490-token system prompts (10 chunks of 50): longer than the static rule's loss limit
# (5 chunks), so joining another group is a loss the agent refuses. With prompts shorter
# than that, every group is "close enough" and feather mixes them on purpose.
PREFIX_REPEAT = 24  # the scheduler runs its idle self-check on every idle loop


def _run(
    model,
    policy,
    tmp_path_factory,
    groups,
    per_group,
    max_new_tokens,
    completions=0,
    server_args=SERVER_ARGS,
    env=None,
):
    tmp = tmp_path_factory.mktemp(f"{model.name}-{policy}")
    trace = tmp / "trace.jsonl"
    prompts = shared_prefix_prompts(groups, per_group, repeat=PREFIX_REPEAT)
    server = SGLangServer(
        model,
        policy,
        server_args,
        log_path=tmp / "server.log",
        env={"FEATHER_BATCH_TRACE": str(trace), **(env or {})},
    )
    result = {"prompts": prompts}
    with server:
        start = time.monotonic()
        result["outputs"] = generate_all(server.url, prompts, max_new_tokens)
        result["elapsed_s"] = time.monotonic() - start
        if completions:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
            result["completions"] = [
                client.completions.create(
                    model=str(model), prompt=text, max_tokens=8, temperature=0
                )
                .choices[0]
                .text
                for _, text in prompts[:completions]
            ]
        time.sleep(IDLE_CHECK_WAIT_S)
        result["healthy_after_idle"] = (
            requests.get(server.url + "/health_generate", timeout=60).status_code == 200
        )
    result["exit_code"] = server.returncode
    result["killed"] = server.killed
    result["group_alive_after_stop"] = server.group_alive()
    result["log"] = server.log_path.read_text(errors="replace")
    result["homogeneity"] = homogeneity(trace, [rid for rid, _ in prompts])
    result["trace"] = read_trace(trace)
    return result


@pytest.fixture(scope="module")
def tiny_runs(tiny_model, tmp_path_factory):
    return {
        policy: _run(
            tiny_model,
            policy,
            tmp_path_factory,
            groups=3,
            per_group=6,
            max_new_tokens=24,
            completions=3,
        )
        for policy in ("feather", "fcfs")
    }


@pytest.fixture(scope="module")
def smollm2_runs(smollm2_model, tmp_path_factory):
    return {
        policy: _run(
            smollm2_model, policy, tmp_path_factory, groups=3, per_group=4, max_new_tokens=8
        )
        for policy in ("feather", "fcfs")
    }


# Chunked prefill in 128-token pieces (prompts are ~490 tokens), and SGLang's own retraction
# test switch: every 7th decode step retracts running requests back to the waiting queue, as
# a full KV pool would (SGLang's admission is too conservative to fill the pool on demand).
PRESSURE_ARGS = [
    "--max-running-requests",
    "8",
    "--chunked-prefill-size",
    "128",
    "--dtype",
    "float32",
]
PRESSURE_ENV = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "7"}


@pytest.fixture(scope="module")
def pressure_runs(tiny_model, tmp_path_factory):
    return {
        policy: _run(
            tiny_model,
            policy,
            tmp_path_factory,
            groups=3,
            per_group=6,
            max_new_tokens=48,
            server_args=PRESSURE_ARGS,
            env=PRESSURE_ENV,
        )
        for policy in ("feather", "fcfs")
    }


def test_chunked_prefill_and_retraction(pressure_runs):
    feather, fcfs = pressure_runs["feather"], pressure_runs["fcfs"]
    retracted = [
        int(n) for n in re.findall(r"Testing retraction\. #retracted_reqs: (\d+)", feather["log"])
    ]
    assert sum(retracted) > 0, "no request was retracted"
    # a prompt prefilled in 128-token chunks, the rest of it pending
    assert re.search(
        r"#new-token: 128, .*#pending-token: [1-9]", feather["log"]
    ), "no chunked prefill happened"
    problems = compare_greedy(feather["outputs"], fcfs["outputs"])
    assert not problems, "\n".join(problems)
    for run in (feather, fcfs):
        assert run["healthy_after_idle"] and "memory leak detected" not in run["log"]
        assert "Scheduler hit an exception" not in run["log"]


@pytest.mark.parametrize("runs", ["tiny_runs", "smollm2_runs"])
def test_greedy_outputs_equal_to_fcfs(runs, request):
    runs = request.getfixturevalue(runs)
    problems = compare_greedy(runs["feather"]["outputs"], runs["fcfs"]["outputs"])
    assert not problems, "\n".join(problems)


def test_openai_completions_equal_to_fcfs(tiny_runs):
    assert tiny_runs["feather"]["completions"] == tiny_runs["fcfs"]["completions"]
    assert all(isinstance(t, str) and t for t in tiny_runs["feather"]["completions"])


@pytest.mark.parametrize("runs", ["tiny_runs", "smollm2_runs"])
def test_batches_more_prefix_homogeneous_than_fcfs(runs, request):
    runs = request.getfixturevalue(runs)
    feather, fcfs = runs["feather"]["homogeneity"], runs["fcfs"]["homogeneity"]
    print("feather", feather, "\nfcfs", fcfs)
    assert feather["decode_steps"] > 0 and fcfs["decode_steps"] > 0
    assert feather["mean_groups_per_step"] < fcfs["mean_groups_per_step"]
    assert feather["mean_shared_prefix_tokens"] > fcfs["mean_shared_prefix_tokens"]


@pytest.mark.parametrize("policy", ["feather", "fcfs"])
def test_trace_times_attention_inside_each_step(smollm2_runs, policy):
    steps = smollm2_runs[policy]["trace"]
    assert {e["mode"] for e in steps} == {"extend", "decode"}
    for e in steps:
        # every step runs all layers' attention, and more than attention
        assert 0 < e["attn_s"] < e["step_s"], e


@pytest.mark.parametrize("runs", ["tiny_runs", "smollm2_runs"])
@pytest.mark.parametrize("policy", ["feather", "fcfs"])
def test_no_kv_leak_and_clean_shutdown(runs, policy, request):
    run = request.getfixturevalue(runs)[policy]
    assert run["healthy_after_idle"], run["log"][-3000:]
    assert "memory leak detected" not in run["log"]
    assert "Scheduler hit an exception" not in run["log"]
    assert not run["group_alive_after_stop"], "server processes left running after stop"
    assert run["exit_code"] == 0 and not run["killed"], "SIGTERM did not stop the server cleanly"


def test_feather_logged_its_decisions(tiny_runs):
    log = tiny_runs["feather"]["log"]
    assert "feather schedule policy: {'chunk_size': 50" in log
    shares = re.findall(r"feather: sched_time=([\d.]+) ms/pass \(([\d.]+)% of step time\)", log)
    assert shares, "no feather stats line at the decode log interval"
    print("feather scheduling share of step time (%):", [float(p) for _, p in shares])
