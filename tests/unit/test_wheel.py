"""The wheel works outside the checkout: built from a copy of the sources, installed into an
empty folder, its console scripts' modules load from there (not from the checkout or an
editable install) and answer ``--help``, and the package data is in it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("feather_sglang", "feather_kernels", "feather_rl", "feather_bench")
PACKAGE_DATA = (
    "feather_rl/data/replay_tiny-llama.json",
    "feather_rl/data/step_costs_cpu.json",
    "feather_rl/agents/ppo_serving.zip",
    "feather_rl/agents/ppo_serving.json",
    "feather_rl/hyperparams/ppo.yml",
    "feather_sglang/cpu_runtime/requirements-cpu.txt",
)
# console script -> module run with --help
COMMANDS = {
    "feather-ab": "feather_bench.ab.cli",
    "feather-train": "feather_rl.train",
    "feather-eval": "feather_rl.evaluate",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (path,) = out.glob("feather_sglang-*.whl")
    return path


def test_the_wheel_holds_the_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in PACKAGE_DATA if f not in names]
    assert missing == []
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script, module in COMMANDS.items():
        assert f"{script} = {module}:main" in text


def test_the_installed_wheel_runs_outside_the_checkout(wheel, tmp_path):
    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(target), PYTHONWARNINGS="ignore")
    for script, module in COMMANDS.items():
        where = subprocess.run(
            [sys.executable, "-c", f"import {module} as m; print(m.__file__)"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert where.returncode == 0, where.stderr[-3000:]
        assert Path(where.stdout.strip().splitlines()[-1]).is_relative_to(target), where.stdout
        helped = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert helped.returncode == 0 and "usage:" in helped.stdout, (script, helped.stderr[-3000:])
