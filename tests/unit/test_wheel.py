"""The wheel works outside the checkout: built from a copy of the sources, installed into an
empty folder, its console scripts' modules load from there (not from the checkout or an
editable install) and answer ``--help``, feather-eval and feather-train run from it, and the
package data is in it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("feather_sglang", "feather_cpu", "feather_kernels", "feather_rl", "feather_bench")
PACKAGE_DATA = (
    "feather_rl/data/replay_tiny-llama.json",
    "feather_rl/data/step_costs_cpu.json",
    "feather_rl/data/step_costs_cpu_xeon-2.8ghz.json",
    "feather_rl/agents/ppo_serving.zip",
    "feather_rl/agents/ppo_serving.json",
    "feather_rl/hyperparams/ppo.yml",
    "feather_cpu/requirements-cpu.txt",
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


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The wheel installed (without dependencies) into an empty folder."""
    target = tmp_path_factory.mktemp("site")
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
    return target


def _run(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``cwd`` with the installed wheel, not the checkout, on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(target), PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_installed_wheel_runs_outside_the_checkout(installed, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    for script, module in COMMANDS.items():
        where = _run(installed, cwd, "-c", f"import {module} as m; print(m.__file__)")
        assert where.returncode == 0, where.stderr[-3000:]
        assert Path(where.stdout.strip().splitlines()[-1]).is_relative_to(installed), where.stdout
        helped = _run(installed, cwd, "-m", module, "--help")
        assert helped.returncode == 0 and "usage:" in helped.stdout, (script, helped.stderr[-3000:])


def test_the_installed_wheel_evaluates_and_trains(installed, tmp_path):
    """feather-eval and a short feather-train from the installed wheel, in an empty folder: the
    step costs, regimes, hyperparameters and baselines come from the wheel's package data."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    out = tmp_path / "eval.json"
    evaluated = _run(
        installed,
        cwd,
        *("-m", COMMANDS["feather-eval"], "--regimes", "memory-ample/feather", "--seeds", "1"),
        *("--agents", "static,always-add", "--json", str(out)),
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["agent"], r["workload"]) for r in rows} >= {
        ("static", "memory-ample/feather"),
        ("always-add", "memory-ample/feather"),
    }
    assert all(r["mean_reward"] > 0 for r in rows)
    run = tmp_path / "run"
    trained = _run(
        installed,
        cwd,
        *("-m", COMMANDS["feather-train"], "--timesteps", "512", "--n-envs", "1"),
        *("--eval-every", "0", "--hyperparams", "n_steps=256", "batch_size=64", "--out", str(run)),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    for name in ("model.zip", "latest.zip", "progress.csv", "provenance.json"):
        assert (run / name).exists(), name
    assert json.loads((run / "provenance.json").read_text())["training"]["timesteps_done"] >= 512
    assert list(cwd.iterdir()) == []  # nothing written where it ran
