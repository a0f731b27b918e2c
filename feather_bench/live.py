"""feather's scheduling time as a share of step time, read off a real server's log.

The scheduler logs, at SGLang's decode log interval, a line
``feather: sched_time=X ms/pass (Y% of step time) ...`` (see
``sglang_integration/policy.py``); this runs a real server on a shared-prefix workload and
collects those lines.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

SHARE_LINE = re.compile(r"feather: sched_time=([\d.]+) ms/pass \(([\d.]+)% of step time\)")


def parse_shares(log_text: str) -> list[tuple[float, float]]:
    """(ms per pass, % of step time) for every feather stats line in a server log."""
    return [(float(ms), float(share)) for ms, share in SHARE_LINE.findall(log_text)]


def run_live(
    model: str,
    log_path: Path,
    groups: int = 4,
    per_group: int = 16,
    repeat: int = 40,
    max_new_tokens: int = 64,
) -> dict:
    """Serve ``model`` with feather, send the shared-prefix batch, return the logged shares."""
    from feather_bench.tools.server import SGLangServer
    from feather_bench.tools.workload import generate_all, shared_prefix_prompts

    prompts = shared_prefix_prompts(groups, per_group, repeat=repeat)
    args = ["--decode-log-interval", "10", "--max-running-requests", "16"]
    with SGLangServer(model, "feather", args, log_path=log_path) as server:
        start = time.monotonic()
        outputs = generate_all(server.url, prompts, max_new_tokens)
        elapsed = time.monotonic() - start
    shares = parse_shares(Path(log_path).read_text(errors="replace"))
    return {
        "model": str(model),
        "requests": len(prompts),
        "output_tokens": sum(len(o.token_ids) for o in outputs.values()),
        "elapsed_s": round(elapsed, 2),
        "log_lines": len(shares),
        "ms_per_pass_median": statistics.median(ms for ms, _ in shares) if shares else None,
        "share_of_step_time_pct_median": statistics.median(p for _, p in shares)
        if shares
        else None,
        "share_of_step_time_pct_max": max(p for _, p in shares) if shares else None,
        "server_args": args,
        "log": str(log_path),
    }
