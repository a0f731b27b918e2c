"""ruff's lint rules and formatter (configured in pyproject.toml) find nothing to change."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (make setup installs the pinned one)")
    return [found]


@pytest.mark.parametrize(
    "args", [["check", "."], ["format", "--check", "."]], ids=["check", "format"]
)
def test_ruff_finds_nothing(args):
    run = subprocess.run([*_ruff(), *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"ruff {' '.join(args)}:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
