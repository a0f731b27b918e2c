"""End-to-end: --attention-backend feather (prefix-shared decode) on the real server gives the
same greedy outputs as torch_native, with feather and with fcfs scheduling."""

from __future__ import annotations

import pytest

from feather_bench.tools.server import SGLangServer
from feather_bench.tools.workload import compare_greedy, generate_all, shared_prefix_prompts

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("policy", ["feather", "fcfs"])
def test_feather_backend_outputs_equal_torch_native(smollm2_model, tmp_path, policy):
    prompts = shared_prefix_prompts(2, 6, repeat=24)  # two ~490-token system prompts
    outputs = {}
    for backend in ("feather", "torch_native"):
        args = ["--attention-backend", backend, "--dtype", "float32", "--max-running-requests", "8"]
        with SGLangServer(
            smollm2_model, policy, args, log_path=tmp_path / f"{backend}.log"
        ) as server:
            outputs[backend] = generate_all(server.url, prompts, max_new_tokens=12)
    problems = compare_greedy(outputs["feather"], outputs["torch_native"])
    assert not problems, "\n".join(problems)
    assert (
        "feather attention backend: prefix-shared decode and extend"
        in (tmp_path / "feather.log").read_text()
    )
