"""A stand-in ``sgl_kernel`` where the real one cannot load (``docs/cpu-runtime.md``)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

STANDIN_MODULE = "sgl_kernel"
STANDIN_VERSION = "0.0.0+feather.cpu.standin"

# Names sglang 0.5.23 imports from sgl_kernel at module load on the CPU path.
STANDIN_FUNCTIONS = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "verify_tree_greedy_cpu",
)


class SglKernelStandInError(RuntimeError):
    """Raised when SGLang calls a kernel that only the real ``sgl_kernel`` has."""


def _trace_missing(what: str) -> None:
    if os.environ.get("FEATHER_SGL_KERNEL_TRACE") == "1":
        print(f"feather sgl_kernel stand-in: missing {what}", file=sys.stderr)


def _raising_function(name: str):
    def standin(*args, **kwargs):
        raise SglKernelStandInError(
            f"sgl_kernel.{name} was called, but this host has feather-sglang's CPU stand-in for "
            "sgl_kernel (the real package needs CUDA or AVX-512/AMX). Use "
            "--attention-backend torch_native (or feather) on CPU, or install the real "
            "sgl_kernel on a GPU host."
        )

    standin.__name__ = standin.__qualname__ = name
    return standin


def _missing_name(name: str):
    """The stand-in module's ``__getattr__``: other names are missing, so SGLang's fallbacks run."""
    if not name.startswith("__"):
        _trace_missing(f"name {name!r}")
    raise AttributeError(f"module 'sgl_kernel' (feather CPU stand-in) has no attribute {name!r}")


class SglKernelStandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``sgl_kernel`` (last on ``sys.meta_path``: a real one wins)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == STANDIN_MODULE:
            return importlib.machinery.ModuleSpec(fullname, self)
        if fullname.startswith(STANDIN_MODULE + "."):
            _trace_missing(f"submodule {fullname!r}")
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__version__ = STANDIN_VERSION
        module.__feather_standin__ = True
        module.__getattr__ = _missing_name
        for name in STANDIN_FUNCTIONS:
            setattr(module, name, _raising_function(name))
        return module

    def exec_module(self, module):
        pass


def install() -> bool:
    """Append the finder to ``sys.meta_path`` once. Returns True if newly installed."""
    if any(isinstance(f, SglKernelStandInFinder) for f in sys.meta_path):
        return False
    sys.meta_path.append(SglKernelStandInFinder())
    return True
