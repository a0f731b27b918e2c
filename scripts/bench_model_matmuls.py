#!/usr/bin/env python
"""What one decode step of a model costs outside attention, at the least: its weight matmuls.

Loads the checkpoint's 2-D weights (safetensors) and times ``x @ W.T`` for every one of them at
batch ``--batch`` (each weight its own tensor, as in a server, so they stream from memory), plus
the LM head (the tied embedding where there is no ``lm_head.weight``). Medians over
``--repeats`` passes, printed per dtype and written to ``--json PATH``. On the server
comparison's batch (32 requests) this is the part of a decode step that no attention backend
can remove (see the README's "Where the server's fp32 time goes").

    .venv/bin/python scripts/bench_model_matmuls.py --batch 32 --dtypes float32,bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from feather_bench.timing import medians_ms  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def weight_matmuls_ms(state: dict[str, torch.Tensor], batch: int, dtype: torch.dtype,
                      repeats: int) -> dict:
    """Median ms of one pass over the layers' weight matmuls and of the LM head, at ``batch``."""
    head_name = "lm_head.weight" if "lm_head.weight" in state else "model.embed_tokens.weight"
    layers = [w.to(dtype).contiguous() for name, w in state.items()
              if w.dim() == 2 and name.endswith(".weight") and "embed_tokens" not in name
              and name != "lm_head.weight"]
    if not layers:
        raise ValueError("no 2-D layer weights in the checkpoint")
    head = state[head_name].to(dtype).contiguous()
    inputs = {k: torch.randn(batch, k, dtype=dtype) for k in {w.shape[1] for w in layers + [head]}}

    def layer_pass():
        for w in layers:
            torch.nn.functional.linear(inputs[w.shape[1]], w)

    flops = 2 * batch * sum(w.numel() for w in layers)
    layers_ms, head_ms = (round(t, 2) for t in medians_ms(
        layer_pass, lambda: torch.nn.functional.linear(inputs[head.shape[1]], head), repeats=repeats))
    return {"dtype": str(dtype).removeprefix("torch."), "batch": batch, "weights": len(layers),
            "weight_mb": round(sum(w.numel() * w.element_size() for w in layers + [head]) / 1e6, 1),
            "layers_ms": layers_ms, "lm_head_ms": head_ms,
            "step_ms": round(layers_ms + head_ms, 2),
            "layers_gflops": round(flops / layers_ms / 1e6, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=os.path.join(REPO, "models", "SmolLM2-135M-Instruct"),
                        help="model folder with model.safetensors (default: SmolLM2)")
    parser.add_argument("--batch", type=int, default=32, help="rows per matmul (default 32)")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="comma-separated, of: " + ", ".join(DTYPES))
    parser.add_argument("--repeats", type=int, default=7, help="passes timed per dtype (default 7)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads (default: all cores, as the server's scheduler)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows here")
    args = parser.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        parser.error(f"--dtypes: {bad or 'none given'}; allowed: {', '.join(DTYPES)}")
    for flag, value in (("--batch", args.batch), ("--repeats", args.repeats), ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{flag}: {value}; must be >= 1")
    path = os.path.join(args.model, "model.safetensors")
    if not os.path.isfile(path):
        parser.error(f"--model: no model.safetensors in {args.model} (run `make setup` for the default model)")

    torch.set_num_threads(args.threads)
    state = load_file(path)
    print(f"{args.model}: weight matmuls of one decode step at batch {args.batch}, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats}")
    print(f"{'dtype':>9} {'weights':>7} {'MB':>7} {'layers ms':>10} {'lm_head ms':>11} {'step ms':>8} {'GFLOPS':>7}")
    rows = []
    for name in dtypes:
        row = weight_matmuls_ms(state, args.batch, DTYPES[name], args.repeats)
        rows.append(row)
        print(f"{row['dtype']:>9} {row['weights']:>7} {row['weight_mb']:>7} {row['layers_ms']:>10.2f} "
              f"{row['lm_head_ms']:>11.2f} {row['step_ms']:>8.2f} {row['layers_gflops']:>7.1f}", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "threads": torch.get_num_threads(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
