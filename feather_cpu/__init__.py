"""What it takes to run stock SGLang 0.5.23 on a CPU-only host (``docs/cpu-runtime.md``)."""

from __future__ import annotations

import math
import os
from pathlib import Path

PTH_NAME = "feather_sglang_cpu_runtime.pth"
# Run by Python's site module at start-up; does nothing once feather-sglang is uninstalled.
PTH_LINE = (
    "import importlib.util as _feather_u; "
    '_feather_u.find_spec("feather_cpu") and __import__("feather_cpu.boot")\n'
)
ENV_DISABLE = "FEATHER_CPU_RUNTIME_DISABLE"  # set to 1 to switch the runtime off
ENV_APPLIED = "FEATHER_CPU_RUNTIME_APPLIED"  # set by apply(), inherited by children

# Flags a CPU server needs in sglang 0.5.23 (docs/cpu-runtime.md).
CPU_SERVER_FLAGS = "--device cpu --attention-backend torch_native --disable-overlap-schedule"
# CPU features with bf16 arithmetic; without them bf16 is emulated and fp32 is fastest.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
MULTI_RANK_KV_TOKENS = 65536  # KV tokens per rank when several share the host (a few GB)


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this host (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "flags:")
    except OSError:
        return frozenset()
    return frozenset(line.split(":", 1)[1].split())


def fastest_cpu_dtype() -> str:
    """The model dtype that serves fastest on this CPU (measurements: ``docs/cpu-runtime.md``)."""
    return "bfloat16" if cpu_flags() & BF16_CPU_FLAGS else "float32"


def server_defaults(values: dict) -> dict:
    """{ServerArgs field: new value} for a GPU-less host; only sglang's defaults change."""
    if (
        accelerator_present()
        or os.environ.get(ENV_DISABLE) == "1"
        or values.get("device") not in (None, "cpu")
    ):
        return {}
    changes = {}
    if values.get("device") is None:
        changes["device"] = "cpu"
    if values.get("attention_backend") is None:  # the x86 default (intel_amx) needs sgl_kernel
        changes["attention_backend"] = "torch_native"
    if not values.get("disable_overlap_schedule"):
        changes["disable_overlap_schedule"] = True  # overlap on: 6.6 tok/s, off: 92 tok/s
    if values.get("dtype") in (None, "auto"):
        changes["dtype"] = fastest_cpu_dtype()
    ranks = math.prod(int(values.get(name) or 1) for name in ("dp_size", "tp_size", "pp_size"))
    if ranks > 1:
        # Split the cores among the ranks and give each a fixed KV pool (docs/cpu-runtime.md).
        if not os.environ.get(THREADS_BIND_ENV):
            binding = threads_binding(ranks, sorted(os.sched_getaffinity(0)))
            if binding:
                os.environ[THREADS_BIND_ENV] = binding
                changes[THREADS_BIND_ENV] = binding
        if values.get("max_total_tokens") is None:
            changes["max_total_tokens"] = MULTI_RANK_KV_TOKENS
    return changes


def threads_binding(ranks: int, cores: list[int]) -> str | None:
    """SGLang's per-rank core binding (``0-3|4-7``), or None with fewer cores than ranks."""
    if ranks < 2 or len(cores) < ranks:
        return None
    per = len(cores) // ranks
    return "|".join(_core_list(cores[i * per : (i + 1) * per]) for i in range(ranks))


def _core_list(cores: list[int]) -> str:
    if len(cores) > 1 and cores[-1] - cores[0] == len(cores) - 1:
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def bind_rank_threads_around(original, *args, local_omp_cpuid=None, **kwargs):
    """AROUND SGLang's CPU thread set-up: binds the rank to its share where SGLang does not."""
    original(*args, local_omp_cpuid=local_omp_cpuid, **kwargs)
    from sglang.srt.distributed import bootstrap

    if bootstrap._is_cpu_amx_available or bootstrap._is_cpu_arm64:
        return
    if not (os.environ.get(THREADS_BIND_ENV) and isinstance(local_omp_cpuid, str)):
        return
    import torch

    spans = [part.partition("-") for part in local_omp_cpuid.split(",")]
    cores = {c for a, _, b in spans for c in range(int(a), int(b or a) + 1)}
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))


def gpu_present() -> bool:
    """True if an NVIDIA (or ROCm) GPU is visible, without importing torch."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    nodes = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd", "/proc/driver/nvidia")
    return any(map(os.path.exists, nodes))


# Device nodes of the accelerators SGLang can serve on besides NVIDIA/AMD GPUs: Ascend NPUs,
# Habana Gaudi HPUs, Moore Threads GPUs, and generic accelerator nodes (/dev/accel: Gaudi, TPUs).
_ACCELERATOR_GLOBS = ("davinci[0-9]*", "hl[0-9]*", "mtgpu*", "accel/accel*")


def accelerator_present() -> bool:
    """True if a GPU, an Intel GPU on ``xe`` or a node of ``_ACCELERATOR_GLOBS`` is visible."""
    if gpu_present():
        return True
    dev = Path("/dev")
    if any(next(dev.glob(pattern), None) is not None for pattern in _ACCELERATOR_GLOBS):
        return True
    for node in Path("/sys/class/drm").glob("renderD*"):
        try:
            driver = (node / "device" / "driver").resolve().name
            vendor = (node / "device" / "vendor").read_text().strip()
        except OSError:
            continue
        if vendor == "0x8086" and driver == "xe":
            return True
    return False


def apply() -> list[str]:
    """Apply the CPU runtime to this process (at every Python start-up); returns what it did."""
    if os.environ.get(ENV_DISABLE) == "1" or accelerator_present():
        return []
    from . import sgl_kernel_standin, torchvision_fix

    done = []
    if os.environ.get("SGLANG_USE_CPU_ENGINE") is None:
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
        done.append("set SGLANG_USE_CPU_ENGINE=1 (sglang's CPU engine path)")
    if sgl_kernel_standin.install():
        done.append("sgl_kernel: stand-in served when no real sgl_kernel is importable")
    if torchvision_fix.install():
        done.append("torchvision: nms/qnms op schemas defined before its meta registrations")
    os.environ[ENV_APPLIED] = "1"
    return done


def status() -> dict:
    """What the runtime does on this host, for ``python -m feather_cpu status``."""
    return {
        "gpu_present": gpu_present(),
        "accelerator_present": accelerator_present(),
        "disabled_by_env": os.environ.get(ENV_DISABLE) == "1",
        "applied_in_this_process": os.environ.get(ENV_APPLIED) == "1",
        "pth_installed": _pth_path().exists(),
        "SGLANG_USE_CPU_ENGINE": os.environ.get("SGLANG_USE_CPU_ENGINE"),
        "recommended_server_flags": CPU_SERVER_FLAGS,
    }


def _pth_path() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def install_pth() -> str:
    """Write the start-up hook into this environment's site-packages (CPU hosts only)."""
    if accelerator_present():
        return "accelerator present: CPU runtime not installed (install sglang normally)"
    path = _pth_path()
    if path.exists() and path.read_text() == PTH_LINE:
        return f"CPU runtime already installed: {path}"
    path.write_text(PTH_LINE)
    return f"CPU runtime installed: {path}"


def uninstall_pth() -> str:
    path = _pth_path()
    if path.exists():
        path.unlink()
        return f"removed {path}"
    return "CPU runtime was not installed"
