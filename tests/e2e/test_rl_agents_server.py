"""End-to-end: a real server runs feather with the learning agents (shipped PPO file, ucb)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from feather_bench.tools.server import SGLangServer
from feather_bench.tools.workload import generate_all, shared_prefix_prompts

pytestmark = pytest.mark.e2e

SHIPPED = sorted((Path(__file__).resolve().parents[2] / "feather_rl" / "agents").glob("ppo_*.zip"))
SERVER_ARGS = ["--max-running-requests", "4", "--max-total-tokens", "16384"]


@pytest.mark.parametrize("agent", ["ppo", "ucb"])
def test_server_serves_with_a_learning_agent(tiny_model, tmp_path, agent):
    spec = f"ppo:{SHIPPED[0]}" if agent == "ppo" else "ucb"
    prompts = shared_prefix_prompts(3, 4, repeat=24)
    server = SGLangServer(
        tiny_model, "feather", [*SERVER_ARGS, "--feather-agent", spec], log_path=tmp_path / "log"
    )
    with server:
        outputs = generate_all(server.url, prompts, 8)
        assert len(outputs) == len(prompts)
        assert requests.get(server.url + "/health_generate", timeout=60).status_code == 200
    log = server.log_path.read_text(errors="replace")
    assert f"'agent': '{spec}'" in log
    assert "Scheduler hit an exception" not in log and "Traceback" not in log
    assert server.returncode == 0
