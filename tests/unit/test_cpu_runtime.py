"""The CPU runtime: sgl_kernel stand-in, torchvision fix, server defaults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import feather_cpu
from feather_cpu import sgl_kernel_standin


def test_standin_functions_raise_naming_themselves():
    module = sgl_kernel_standin.SglKernelStandInFinder().create_module(
        __import__("importlib").machinery.ModuleSpec("sgl_kernel", None)
    )
    for name in sgl_kernel_standin.STANDIN_FUNCTIONS:
        with pytest.raises(
            sgl_kernel_standin.SglKernelStandInError, match=f"sgl_kernel.{name} was called"
        ):
            getattr(module, name)(1, 2)
    with pytest.raises(AttributeError, match="feather CPU stand-in"):
        module.some_cuda_only_kernel  # other names are missing, so sglang's fallbacks run
    with pytest.raises(ImportError):
        exec("from sgl_kernel.scalar_type import scalar_types", {})


@pytest.mark.skipif(
    feather_cpu.gpu_present(), reason="the CPU runtime is only applied without a GPU"
)
def test_fresh_interpreter_has_the_runtime_applied():
    """The venv's .pth applies the runtime before anything else: sglang's scheduler module
    (which imports sgl_kernel names at load) and torchvision import in a bare interpreter."""
    code = (
        "import os, sgl_kernel, torchvision.transforms;"
        "import sglang.srt.managers.scheduler;"
        "print(os.environ['SGLANG_USE_CPU_ENGINE'], sgl_kernel.__version__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["1", sgl_kernel_standin.STANDIN_VERSION]


def test_runtime_can_be_switched_off():
    env = {**os.environ, "FEATHER_CPU_RUNTIME_DISABLE": "1"}
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    env.pop(feather_cpu.ENV_APPLIED, None)
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('SGLANG_USE_CPU_ENGINE'))"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.stdout.strip() == "None"


def test_server_defaults_only_fill_what_was_left_default(monkeypatch):
    monkeypatch.setattr(feather_cpu, "gpu_present", lambda: False)
    monkeypatch.setattr(feather_cpu, "cpu_flags", lambda: frozenset({"avx2"}))
    assert feather_cpu.fastest_cpu_dtype() == "float32"
    defaults = {
        "device": None,
        "attention_backend": None,
        "disable_overlap_schedule": False,
        "dtype": "auto",
    }
    assert feather_cpu.server_defaults(defaults) == {
        "device": "cpu",
        "attention_backend": "torch_native",
        "disable_overlap_schedule": True,
        "dtype": "float32",
    }
    chosen = {
        "device": "cpu",
        "attention_backend": "triton",
        "disable_overlap_schedule": True,
        "dtype": "float16",
    }
    assert feather_cpu.server_defaults(chosen) == {}
    monkeypatch.setattr(feather_cpu, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert feather_cpu.server_defaults(defaults)["dtype"] == "bfloat16"
    monkeypatch.setattr(feather_cpu, "gpu_present", lambda: True)
    assert feather_cpu.server_defaults(defaults) == {}


def test_the_pth_line_is_harmless_once_feather_sglang_is_gone():
    """After ``pip uninstall`` the .pth may stay behind: its line must then do nothing."""
    import subprocess
    import sys

    from feather_cpu import PTH_LINE

    # -I -S: no site-packages, so feather_sglang cannot be found, as after an uninstall
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PTH_LINE + "print('ok')"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok" and out.stderr == ""
    assert (
        PTH_LINE.startswith("import ") and PTH_LINE.count("\n") == 1
    )  # site executes it as one line


def test_no_cpu_defaults_where_an_accelerator_is_present(monkeypatch):
    import feather_cpu as rt

    monkeypatch.setattr(rt, "accelerator_present", lambda: True)
    assert rt.server_defaults({"device": None, "attention_backend": None}) == {}
    monkeypatch.setattr(rt, "accelerator_present", lambda: False)
    assert rt.server_defaults({"device": None, "attention_backend": None})["device"] == "cpu"
