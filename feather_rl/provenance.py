"""Where a recording, a training run or an evaluation came from: command, machine, date."""

from __future__ import annotations

import os
import subprocess
import sys

from feather_bench.tools.machine import describe, git_state


def date() -> str:
    """The date as the ``date`` command prints it (UTC, ISO 8601)."""
    try:
        return subprocess.run(
            ["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True, check=True
        ).stdout.strip()
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


def machine() -> dict:
    return describe("stable-baselines3", "gymnasium")


def write_json(path, data: dict) -> None:
    """Write a result JSON (``data`` carries its ``record()``), creating its folder."""
    import json
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def record(**extra) -> dict:
    return {"command": command(), "date": date(), "machine": machine(), "git": git_state(), **extra}
