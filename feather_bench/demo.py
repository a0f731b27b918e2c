"""`make demo`: the real SGLang server with --schedule-policy feather on the default model
(SmolLM2-135M-Instruct), answering a batch of requests that share long system prompts, and
its throughput.

    python -m feather_bench.demo [--policy feather] [--groups 4] [--per-group 8]
                                 [--max-new-tokens 32] [--json results/demo.json] [-- FLAGS]

FLAGS after ``--`` go to ``sglang.launch_server`` (e.g. ``-- --dtype float32``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import openai

from feather_bench.paths import RESULTS_DIR, model_dir
from feather_bench.tools.machine import describe as machine
from feather_bench.tools.server import SGLangServer
from feather_bench.tools.workload import generate_all, shared_prefix_prompts


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=str(model_dir()),
        help="model directory (default: SmolLM2-135M-Instruct under $FEATHER_MODELS_DIR, else models/)",
    )
    parser.add_argument("--groups", type=int, default=4, help="distinct shared system prompts")
    parser.add_argument("--per-group", type=int, default=8, help="requests per system prompt")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--prefix-repeat",
        type=int,
        default=40,
        help="times the system-prompt sentence is repeated (40: ~740 tokens)",
    )


def run_workload(
    args, policy: str, server_args: list[str], log_path: Path, chat: bool = False
) -> dict:
    """Start a server, send the shared-prefix batch at once, stop it; returns the figures."""
    if not (Path(args.model) / "config.json").exists():
        sys.exit(f"error: no model at {args.model}; run `make setup` first")
    prompts = shared_prefix_prompts(args.groups, args.per_group, repeat=args.prefix_repeat)
    t0 = time.monotonic()
    with SGLangServer(args.model, policy, server_args, log_path=log_path) as server:
        print(
            f"  server ready in {time.monotonic() - t0:.0f} s; sending {len(prompts)} requests "
            f"({args.groups} shared system prompts x {args.per_group} questions, shuffled), "
            f"{args.max_new_tokens} greedy tokens each",
            flush=True,
        )
        start = time.monotonic()
        outputs = generate_all(server.url, prompts, args.max_new_tokens)
        elapsed = time.monotonic() - start
        answer = None
        if chat:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
            answer = (
                client.chat.completions.create(
                    model=args.model,
                    messages=[{"role": "user", "content": "What is the capital of France?"}],
                    max_tokens=24,
                    temperature=0,
                )
                .choices[0]
                .message.content
            )
    out_tokens = sum(len(o.token_ids) for o in outputs.values())
    rid, text = prompts[0]
    return {
        "policy": policy,
        "server_args": server_args,
        "requests": len(prompts),
        "output_tokens": out_tokens,
        "elapsed_s": round(elapsed, 3),
        "output_tok_per_s": round(out_tokens / elapsed, 2),
        "requests_per_s": round(len(prompts) / elapsed, 3),
        "chat_answer": answer,
        "sample": {"prompt_tail": text[-60:], "output": outputs[rid].text},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_workload_args(parser)
    parser.add_argument(
        "--policy", default="feather", help="--schedule-policy for the server (default feather)"
    )
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument(
        "server_args", nargs="*", help="extra sglang.launch_server flags (after --)"
    )
    args = parser.parse_args()

    RESULTS_DIR.mkdir(exist_ok=True)
    log_path = RESULTS_DIR / "demo-server.log"
    print(
        f"demo: sglang.launch_server --schedule-policy {args.policy} --model-path {args.model} "
        f"{' '.join(args.server_args)}",
        flush=True,
    )
    fig = run_workload(args, args.policy, args.server_args, log_path, chat=True)
    fig["machine"] = machine()
    print(f"\nsample: ...{fig['sample']['prompt_tail']!r}\n     -> {fig['sample']['output']!r}")
    print(f"chat:   'What is the capital of France?' -> {fig['chat_answer']!r}")
    print(f"server log: {log_path}")
    print(
        f"\nthroughput: {args.policy}: {fig['requests']} requests, {fig['output_tokens']} output tokens in "
        f"{fig['elapsed_s']:.1f} s = {fig['output_tok_per_s']:.1f} output tok/s ({fig['requests_per_s']:.2f} req/s)"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(fig, indent=2))


if __name__ == "__main__":
    main()
