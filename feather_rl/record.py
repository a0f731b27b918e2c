"""``feather-record``: measure real batches with the real executor, for the replay executor.

The grid: batch sizes x prefix groups per batch x prompt shapes (shared prefix + distinct
suffix, real text from ``feather_bench.workloads.TextSource``). Each point is one real batch
run through ``sglang.Engine`` (:class:`RealExecutor`); the file keeps every measurement with its
provenance (command, model, settings, machine, date, duration).

    feather-record --model models/tiny-llama --out feather_rl/data/replay_tiny-llama.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from feather_bench.paths import model_dir
from feather_rl import provenance
from feather_rl.executors.real import RealExecutor

DEFAULT_MODEL = model_dir("tiny-llama")
# Prompt shapes (shared prefix, distinct suffix) spanning the built-in workloads: multilevel's
# short questions, gsp / feather-8x50 (400-512 + 24-32), batchllm's halved shape (1000 + 100).
DEFAULT_SHAPES = ((200, 24), (448, 32), (1000, 100))
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32)
DEFAULT_GROUPS = (1, 2, 4, 8, 0)  # 0: every request its own prefix (nothing shared)


def grid(sizes, groups, shapes) -> list[tuple[int, int, int, int]]:
    """(batch size, groups, prefix, suffix) points, each (size, groups) once."""
    points = []
    for prefix, suffix in shapes:
        for n in sizes:
            seen = set()
            for g in groups:
                g = n if g == 0 else g
                if g <= n and n % g == 0 and g not in seen:
                    seen.add(g)
                    points.append((n, g, prefix, suffix))
    return points


def make_batch(text, n: int, groups: int, prefix: int, suffix: int) -> list[tuple[int, ...]]:
    """``n`` prompts in ``groups`` equal prefix groups (real text, exact lengths)."""
    prompts = []
    for _ in range(groups):
        shared = text.take(prefix)
        prompts.extend(shared + text.take(suffix) for _ in range(n // groups))
    return prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feather-record",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model",
        default=str(DEFAULT_MODEL),
        help="model directory (default: tiny-llama under $FEATHER_MODELS_DIR, else models/)",
    )
    ap.add_argument(
        "--backend",
        action="append",
        choices=["feather", "torch_native"],
        help="attention backend(s) to record (repeatable; default: feather)",
    )
    ap.add_argument(
        "--out",
        default="results/replay/recording.json",
        help="JSON file to write (default: %(default)s; the shipped recording is not overwritten "
        "unless named here)",
    )
    ap.add_argument(
        "--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="batch sizes, comma-separated"
    )
    ap.add_argument(
        "--groups",
        default=",".join(map(str, DEFAULT_GROUPS)),
        help="prefix groups per batch, comma-separated (0: no sharing)",
    )
    ap.add_argument(
        "--shapes",
        default=",".join(f"{p}+{s}" for p, s in DEFAULT_SHAPES),
        help="prompt shapes PREFIX+SUFFIX tokens, comma-separated",
    )
    ap.add_argument(
        "--output-len", type=int, default=17, help="max_new_tokens per request (decode = this - 1)"
    )
    ap.add_argument("--repeats", type=int, default=1, help="runs per point; the median is kept")
    ap.add_argument("--seed", type=int, default=0, help="text position seed")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from feather_bench.workloads import TextSource, load_tokenizer

    sizes = [int(x) for x in args.sizes.split(",")]
    groups = [int(x) for x in args.groups.split(",")]
    shapes = [tuple(int(v) for v in s.split("+")) for s in args.shapes.split(",")]
    points = grid(sizes, groups, shapes)
    text = TextSource(load_tokenizer(args.model), args.seed)
    backends = args.backend or ["feather"]
    started = time.time()
    measurements, settings = [], {}
    with tqdm(
        total=len(points) * len(backends), desc="feather-record", unit="batch", file=sys.stderr
    ) as bar:
        for backend in backends:
            with RealExecutor(
                args.model, attention_backend=backend, max_batch=max(sizes), repeats=args.repeats
            ) as executor:
                settings[backend] = executor.describe()
                for n, g, prefix, suffix in points:
                    m = executor.measure(make_batch(text, n, g, prefix, suffix), args.output_len)
                    measurements.append(
                        {**m.to_json(), "groups": g, "prefix": prefix, "suffix": suffix}
                    )
                    bar.set_postfix(
                        n=n, groups=g, prompt=prefix + suffix, tok_s=f"{m.tokens_per_s:.0f}"
                    )
                    bar.update()
    duration = time.time() - started
    out = {
        "provenance": provenance.record(
            model=Path(args.model).name,
            settings=settings,
            repeats=args.repeats,
            output_len=args.output_len,
            duration_s=round(duration, 1),
            what="decode tokens/s of real batches, RealExecutor (sglang.Engine)",
        ),
        "measurements": measurements,
    }
    provenance.write_json(args.out, out)
    print(f"feather-record: {len(measurements)} measurements in {duration:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
