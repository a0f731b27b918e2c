"""patches/: feather built into SGLang's own source, for a fork, with no entry-point plugin.

Each test patches a hard-linked copy of the installed sglang (a ``cp -al`` tree: GNU patch and
Python's .pyc writer both replace a file rather than write into it, so the installed package
is never touched; the tests check that too) with ``python -m feather_bench.patch_sglang``, the command a
fork's maintainer runs.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sglang

from feather_bench.tools.server import SGLangServer
from feather_bench.tools.workload import compare_greedy, generate_all, shared_prefix_prompts
from feather_sglang.sglang_integration import SGLANG_VERSION

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "patches" / f"sglang-{SGLANG_VERSION}-feather.patch"
INSTALLED = Path(sglang.__file__).resolve().parent.parent  # the directory holding sglang/
MARK = "# feather-sglang (patches/):"


def _touched() -> list[str]:
    from feather_bench.patch_sglang import patched_files

    return patched_files(PATCH)


def _digests(root: Path, files: list[str]) -> dict[str, str]:
    return {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in files}


def _copy_sglang(tmp_path: Path) -> Path:
    target = tmp_path / "fork"
    target.mkdir()
    subprocess.run(["cp", "-al", str(INSTALLED / "sglang"), str(target)], check=True)
    return target


def _run_script(target: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "feather_bench.patch_sglang", str(target), *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
    )


def test_patch_applies_checks_and_reverts_without_touching_the_install(tmp_path):
    files = _touched()
    assert len(files) == 6 and "sglang/srt/managers/scheduler.py" in files
    installed = _digests(INSTALLED, files)
    fork = _copy_sglang(tmp_path)

    checked = _run_script(fork, "--check")
    assert checked.returncode == 0 and "applies cleanly" in checked.stdout, checked.stderr
    applied = _run_script(fork)
    assert applied.returncode == 0 and "applied in" in applied.stdout, applied.stderr
    patched = _digests(fork, files)
    for f in files:
        assert patched[f] != installed[f] and MARK in (fork / f).read_text(), f
    assert _digests(INSTALLED, files) == installed, "patching the copy changed the installed sglang"

    again = _run_script(fork)
    assert again.returncode == 0 and "already applied" in again.stdout
    assert _digests(fork, files) == patched
    reverted = _run_script(fork, "--revert")
    assert reverted.returncode == 0 and "reverted in" in reverted.stdout, reverted.stderr
    assert _digests(fork, files) == installed


def test_patch_refuses_to_half_apply_when_one_anchor_moved(tmp_path):
    files = _touched()
    fork = _copy_sglang(tmp_path)
    scheduler = fork / "sglang/srt/managers/scheduler.py"
    text = scheduler.read_text()
    anchor = '        """Idle housekeeping: guard, check, metrics, reset, sleep."""\n'
    assert text.count(anchor) == 1
    scheduler.unlink()  # a new file: writing through the hard link would edit the install
    scheduler.write_text(
        text.replace(anchor, '        """Idle housekeeping (a fork changed this line)."""\n')
    )
    before = _digests(fork, files)

    for flags in ((), ("--check",)):
        result = _run_script(fork, *flags)
        assert result.returncode == 1, result.stdout
        assert "does not apply" in result.stderr and "nothing was changed" in result.stderr
        assert "written for 0.5.23" in result.stderr
        assert re.search(
            r"sglang/srt/managers/scheduler\.py: Hunk #\d+ FAILED", result.stderr
        ), result.stderr
    # every other hunk would have applied: none of them did
    assert _digests(fork, files) == before


def test_patch_script_rejects_a_directory_without_sglang(tmp_path):
    result = _run_script(tmp_path)
    assert result.returncode == 1
    assert "does not hold an sglang package" in result.stderr and "python/" in result.stderr


def _hooks_installed_by_plugin(pythonpath: Path | None) -> list[str]:
    """The HookRegistry targets feather's plugin registers, in a fresh interpreter."""
    code = (
        "import feather_sglang.plugin as p; p.register()\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "print(sorted(t for t in HookRegistry._hooks if t.startswith(('sglang.srt.managers.scheduler.', "
        "'sglang.srt.server_args.'))))"
    )
    env = {**os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_plugin_stands_down_on_a_patched_sglang(tmp_path):
    fork = _copy_sglang(tmp_path)
    assert _run_script(fork).returncode == 0
    stock = _hooks_installed_by_plugin(None)  # stock sglang: the plugin's hooks
    assert len(stock) == 10 and "sglang.srt.managers.scheduler.SchedulePolicy" in stock, stock
    assert _hooks_installed_by_plugin(fork) == []  # patched: no seam runs twice


@pytest.mark.e2e
def test_patched_sglang_serves_feather_without_the_plugin(tiny_model, tmp_path):
    """The patched copy, with the plugin switched off, serves --schedule-policy feather and
    --attention-backend feather, and its greedy outputs equal stock SGLang's fcfs/torch_native."""
    fork = _copy_sglang(tmp_path)
    assert _run_script(fork).returncode == 0
    imported = subprocess.run(
        [sys.executable, "-c", "import sglang; print(sglang.__file__)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(fork)},
    ).stdout
    assert imported.startswith(str(fork / "sglang")), imported
    prompts = shared_prefix_prompts(3, 4, repeat=24)
    common = ["--dtype", "float32", "--max-running-requests", "4", "--max-total-tokens", "16384"]
    runs = {
        "patched": (
            "feather",
            ["--attention-backend", "feather", "--decode-log-interval", "1"],
            {"PYTHONPATH": str(fork), "SGLANG_PLUGINS": "none-feather-is-built-in"},
        ),
        "stock": ("fcfs", ["--attention-backend", "torch_native"], {}),
    }
    outputs = {}
    for name, (policy, args, env) in runs.items():
        with SGLangServer(
            tiny_model, policy, common + args, log_path=tmp_path / f"{name}.log", env=env
        ) as server:
            outputs[name] = generate_all(server.url, prompts, max_new_tokens=16)
    problems = compare_greedy(outputs["patched"], outputs["stock"])
    assert not problems, "\n".join(problems)

    log = (tmp_path / "patched.log").read_text(errors="replace")
    assert "feather attention backend: prefix-shared decode and extend" in log
    admitted = [int(n) for n in re.findall(r"feather: sched_time=.*? admitted=(\d+)", log)]
    assert (
        sum(admitted) > 0
    ), "the feather planner never admitted a request through the patched seams"
