"""End-to-end: start-up paths (CLI help, bad options, sglang serve, Engine) and a chat answer."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest
import requests

from feather_bench.tools.engine import shutdown_engine
from feather_bench.tools.server import SGLangServer
from feather_sglang.config import FeatherConfigError

pytestmark = pytest.mark.e2e


def test_help_lists_feather_and_its_options():
    out = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "shortest-prefill-first,feather}" in out.stdout
    for flag in (
        "--feather-chunk-size",
        "--feather-agent",
        "--feather-static-max-loss",
        "--feather-static-max-loss-crowded",
        "--feather-static-crowd-threshold",
        "--feather-static-floor-max",
        "--feather-max-wait-s",
        "--feather-prefix-leader",
    ):
        assert flag in out.stdout, flag
    assert "Failed to" not in out.stderr  # every hook applied


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--feather-agent", "nope"],
            "argument --feather-agent: --feather-agent: unknown agent 'nope'; allowed: admit, dqn:PATH, ppo:PATH, qlearning, static, throughput, ucb",
        ),
        (
            ["--feather-agent", "ppo:/nonexistent/agent.zip"],
            "--feather-agent: ppo:/nonexistent/agent.zip: no such file",
        ),
        (["--feather-chunk-size", "0"], "--feather-chunk-size must be an integer >= 8, got 0"),
        (["--feather-max-wait-s", "-1"], "--feather-max-wait-s must be a number of seconds > 0"),
        (
            ["--feather-static-max-loss", "7", "--feather-static-max-loss-crowded", "5"],
            "--feather-static-max-loss-crowded (5) must be >= --feather-static-max-loss (7)",
        ),
        (
            ["--enable-priority-scheduling"],
            "feather cannot be combined with --enable-priority-scheduling",
        ),
        (["--pp-size", "2"], "does not support pipeline parallelism (--pp-size 2)"),
        (["--disaggregation-mode", "prefill"], "does not support PD disaggregation"),
        (
            ["--attention-backend", "feather", "--kv-cache-dtype", "fp8_e4m3"],
            "--attention-backend feather does not support --kv-cache-dtype fp8_e4m3; allowed:",
        ),
        (["--feather-chunk-size", "4"], "--feather-chunk-size must be an integer >= 8, got 4"),
    ],
)
def test_bad_feather_option_stops_start_up_with_a_clear_message(tiny_model, flags, message):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(tiny_model),
            "--schedule-policy",
            "feather",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_engine_rejects_a_bad_feather_option_before_launching(tiny_model):
    import sglang

    with pytest.raises(
        FeatherConfigError, match="--feather-chunk-size must be an integer >= 8, got 0"
    ):
        sglang.Engine(model_path=str(tiny_model), schedule_policy="feather", feather_chunk_size=0)


def test_sglang_serve_with_radix_cache_disabled_explains_what_it_loses(tiny_model, tmp_path):
    """`sglang serve` path, and a combination feather cannot serve well: it runs, and says why."""
    server = SGLangServer(
        tiny_model,
        "feather",
        ["--disable-radix-cache"],
        log_path=tmp_path / "log",
        launcher="serve",
    )
    with server:
        r = requests.post(
            server.url + "/generate",
            json={
                "text": "Hello there",
                "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            },
            timeout=120,
        )
        assert r.status_code == 200 and r.json()["text"]
    log = server.log_path.read_text()
    from feather_cpu import fastest_cpu_dtype, gpu_present

    if not gpu_present():  # the CPU runtime filled in the settings a CPU server needs, and said so
        assert (
            "feather-sglang CPU runtime (no GPU on this host) set device=cpu, attention_backend=torch_native, "
            f"disable_overlap_schedule=True, dtype={fastest_cpu_dtype()}"
        ) in log
    assert "feather with the radix cache disabled" in log
    assert "prefix-leader step is off" in log


def test_engine_runs_feather_with_options(tiny_model, capfd):
    from multiprocessing import resource_tracker

    import psutil
    import sglang

    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid
    engine = sglang.Engine(
        model_path=str(tiny_model),
        schedule_policy="feather",
        feather_chunk_size=32,
        feather_max_wait_s=5.0,
        max_total_tokens=8192,
        log_level="info",
    )
    try:
        outs = engine.generate(
            ["The same prefix, then A", "The same prefix, then B"],
            {"max_new_tokens": 4, "temperature": 0},
        )
        assert len(outs) == 2 and all(o["text"] for o in outs)
    finally:
        shutdown_engine(engine)
    assert "feather schedule policy: {'chunk_size': 32" in capfd.readouterr().err
    # the engine's shutdown kills this process's children, but not the resource tracker
    assert psutil.pid_exists(tracker) and psutil.Process(tracker).status() != psutil.STATUS_ZOMBIE


def test_smollm2_answers_capital_of_france(smollm2_model, tmp_path):
    with SGLangServer(smollm2_model, "feather", log_path=tmp_path / "log") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        reply = (
            client.chat.completions.create(
                model=str(smollm2_model),
                messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_tokens=24,
                temperature=0,
            )
            .choices[0]
            .message.content
        )
    assert "Paris" in reply, reply


def test_a_sigterm_to_the_tool_stops_its_server(tiny_model):
    """A benchmark killed with SIGTERM (a CI timeout, ``kill``) leaves no server behind."""
    import os
    import signal

    script = (
        "import sys, time\n"
        "from feather_bench.tools.server import SGLangServer\n"
        f"with SGLangServer({str(tiny_model)!r}, 'fcfs', ['--dtype', 'float32']) as s:\n"
        "    print(s.proc.pid, flush=True)\n"
        "    time.sleep(600)\n"
    )
    tool = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(tool.stdout.readline())
        tool.send_signal(signal.SIGTERM)
        assert tool.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        tool.kill()
    with pytest.raises(ProcessLookupError):
        os.killpg(server_pid, 0)  # nothing of the server's process group is left
