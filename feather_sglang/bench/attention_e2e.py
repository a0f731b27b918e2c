"""End-to-end: the same shared-prefix batch on a real server with ``--attention-backend
feather`` and with ``torch_native``, same policy, rounds interleaved; medians and the ratio."""

from __future__ import annotations

import statistics
import time
from pathlib import Path


def run_server_comparison(model: str, log_dir: Path, rounds: int = 2, requests: int = 32,
                          prefix_repeat: int = 40, max_new_tokens: int = 32, policy: str = "fcfs",
                          dtype: str = "float32") -> dict:
    """Total time of ``requests`` greedy requests sharing one ~740-token system prompt (cold
    server: the first request computes the prefix), per backend; outputs must agree."""
    from feather_sglang.tools.server import SGLangServer
    from feather_sglang.tools.workload import compare_greedy, generate_all, shared_prefix_prompts

    prompts = shared_prefix_prompts(1, requests, repeat=prefix_repeat)
    times: dict[str, list[float]] = {"feather": [], "torch_native": []}
    outputs = {}
    for r in range(rounds):
        for backend in times:
            args = ["--attention-backend", backend, "--dtype", dtype]
            log_path = Path(log_dir) / f"attention-{backend}-{dtype}.log"
            with SGLangServer(model, policy, args, log_path=log_path) as server:
                start = time.monotonic()
                outputs[backend] = generate_all(server.url, prompts, max_new_tokens)
                times[backend].append(time.monotonic() - start)
            print(f"  round {r + 1}: {backend}: {times[backend][-1]:.1f} s", flush=True)
    med = {b: statistics.median(t) for b, t in times.items()}
    return {
        "model": model, "policy": policy, "dtype": dtype, "requests": requests,
        "max_new_tokens": max_new_tokens, "seconds": times, "median_s": med,
        "speedup_total_time": round(med["torch_native"] / med["feather"], 2),
        "greedy_problems": compare_greedy(outputs["feather"], outputs["torch_native"]),
    }
