"""What machine a figure was measured on: recorded in every benchmark's and tool's JSON."""

from __future__ import annotations

import os
import platform
from importlib import metadata


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (e.g. "AMD EPYC 9R14"), else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe(*dists: str) -> dict:
    """CPU, cores, architecture, GPU, bf16 instructions, AMX, Python, OpenMP threads and the versions
    of sglang, torch and ``dists``."""
    from feather_cpu import cpu_flags, gpu_present

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        "gpu": gpu_present(),
        "bf16_instructions": bool(cpu_flags() & {"avx512_bf16", "amx_bf16"}),
        "amx": "amx_bf16" in cpu_flags(),
        "python": platform.python_version(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "versions": {d: version(d) for d in ("sglang", "torch", *dists)},
    }


def cpu_label(machine: dict) -> str:
    """A recorded machine's CPU name, and whether it has bf16 instructions (one name covers hosts
    whose speed differs several times over; without them the CPU runtime serves fp32)."""
    bf16 = {True: " with bf16 instructions", False: " without bf16 instructions"}
    return f"{machine.get('cpu', '?')}{bf16.get(machine.get('bf16_instructions'), '')}"


def git_state() -> dict:
    """The commit measured and the files changed on top of it (None outside a checkout)."""
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:

        def git(*args):
            return subprocess.run(
                ["git", "-C", repo, *args], capture_output=True, text=True, timeout=10, check=True
            ).stdout

        return {
            "commit": git("rev-parse", "HEAD").strip(),
            "modified": sorted(
                set(git("diff", "--name-only", "HEAD").split())
                | set(git("ls-files", "--others", "--exclude-standard").split())
            ),
        }
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "modified": None}


def short_commit(git: dict | None, missing: str = "?") -> str:
    """The first 10 digits of the commit in ``git_state()``'s record, ``missing`` without one."""
    return ((git or {}).get("commit") or missing)[:10]


def round_order(items: list, round_: int) -> list:
    """``items`` in the order round ``round_`` runs them: each round starts one later, so that a
    host's drift within a round falls on none of them always."""
    turn = round_ % len(items) if items else 0
    return items[turn:] + items[:turn]
