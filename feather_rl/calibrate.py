"""``feather-calibrate``: the simulator's step costs, from the logs of real SGLang servers.

    feather-calibrate results/bench_serving/*.server.log --out feather_rl/data/step_costs_cpu.json

Decode: the step-time models that feather's ``throughput`` agent fitted online in each server
(its ``step model: A ms + B ms/request + C ms/1k tokens (... attention, N decode steps seen)``
log lines), the last line of each log with at least ``--min-steps`` steps, the median of each
coefficient per attention kind. Prefill: SGLang's own ``Prefill batch`` lines (``#new-token``
over ``input throughput``), the median seconds per new token over prefills of at least
``--min-prefill`` tokens.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from feather_rl import provenance

STEP_MODEL = re.compile(
    r"step model: ([\d.]+) ms \+ ([\d.]+) ms/request \+ ([\d.]+) ms/1k tokens "
    r"\((prefix-shared|per-request) attention, (\d+) decode steps seen\)"
)
PREFILL = re.compile(r"#new-token: (\d+),.*input throughput \(token/s\): ([\d.]+)")
PREFILL_FIXED_S = 0.02  # a prefill forward's launch and sampling, beside its per-token work


def calibrate(logs: list[Path], min_steps: int = 64, min_prefill: int = 256) -> dict:
    fits: dict[str, list[tuple[float, float, float]]] = {"prefix_shared": [], "per_request": []}
    per_token: list[float] = []
    for path in logs:
        last = None
        for line in path.read_text(errors="replace").splitlines():
            if m := STEP_MODEL.search(line):
                if int(m.group(5)) >= min_steps:
                    last = m
            elif (
                (m := PREFILL.search(line))
                and int(m.group(1)) >= min_prefill
                and float(m.group(2)) > 0
            ):
                per_token.append(1.0 / float(m.group(2)))
        if last is not None:
            a, b, c = (float(last.group(i)) for i in (1, 2, 3))
            fits[last.group(4).replace("-", "_")].append((a / 1e3, b / 1e3, c / 1e6))
    missing = [k for k, v in fits.items() if not v]
    if missing or not per_token:
        raise SystemExit(
            f"feather-calibrate: no {' or '.join(missing) or 'prefill'} measurements in {len(logs)} "
            "log(s); run servers with --feather-agent throughput (make bench-serving) first"
        )
    decode = {k: [statistics.median(c[i] for c in v) for i in range(3)] for k, v in fits.items()}
    return {
        "decode": decode,
        "prefill_fixed_s": PREFILL_FIXED_S,
        "prefill_per_token_s": statistics.median(per_token),
        "sources": {
            "logs": len(logs),
            "decode_fits": {k: len(v) for k, v in fits.items()},
            "prefills": len(per_token),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feather-calibrate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "logs", nargs="+", type=Path, help="SGLang server logs (feather policy, throughput agent)"
    )
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument(
        "--min-steps",
        type=int,
        default=64,
        help="use step-model lines fitted on at least this many steps",
    )
    ap.add_argument(
        "--min-prefill", type=int, default=256, help="use prefills of at least this many new tokens"
    )
    args = ap.parse_args(argv)
    data = calibrate(args.logs, args.min_steps, args.min_prefill)
    data["provenance"] = provenance.record()
    provenance.write_json(args.out, data)
    d = data["decode"]
    for kind, (a, b, c) in d.items():
        print(
            f"decode {kind:>13}: {a * 1e3:.1f} ms + {b * 1e3:.2f} ms/request + {c * 1e6:.2f} ms/1k tokens"
        )
    print(
        f"prefill: {data['prefill_fixed_s'] * 1e3:.0f} ms + {data['prefill_per_token_s'] * 1e3:.2f} ms/token "
        f"({data['sources']}) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
