"""Where a recording, a training run or an evaluation came from: command, machine, date."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata


def date() -> str:
    """The date as the ``date`` command prints it (UTC, ISO 8601)."""
    try:
        return subprocess.run(["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        from datetime import datetime, timezone

        return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def command() -> str:
    """The command line as typed: a console script by name, ``python -m`` for a module run."""
    prog = sys.argv[0] if sys.argv else "python"
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and not prog.endswith(("-record", "-train", "-eval")):
        prog = f"python -m {spec.name}"
    else:
        prog = os.path.basename(prog) or "python"
    return " ".join([prog, *sys.argv[1:]])


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict:
    return {
        "cpu": _cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
        "python": platform.python_version(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "versions": {d: _version(d) for d in ("sglang", "torch", "stable-baselines3", "gymnasium")},
    }


def record(**extra) -> dict:
    return {"command": command(), "date": date(), "machine": machine(), **extra}
