"""Every Triton launch the prefix-shared wrappers make compiles for an NVIDIA Hopper GPU
(sm_90: H100, H200), on a machine without one.

``TRITON_INTERPRET=1`` runs a kernel's Python body and skips the compiler's checks: one type
per name across the branches of a runtime ``if``, block shapes, register and shared-memory
budgets. Here the wrappers run on CPU tensors with their launches recorded, and each recorded
launch (its real arguments and constexprs) goes through ``triton.compile`` down to a cubin
for sm_90. The GPU tests (``-m gpu``) check the numbers; this checks that there is a kernel.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

from feather_kernels import prefix_shared_triton as pst  # noqa: E402
from feather_kernels.synthetic import make_decode_batch, make_extend_batch  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
SHARED_MEMORY_SM90 = 232_448  # bytes of shared memory one block may use on sm_90


class _Recorder:
    """Stands in for a ``@triton.jit`` function at its launch site: ``kernel[grid](...)``
    records the call instead of running it."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def _record(monkeypatch, run):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    recorders = {
        name: _Recorder(getattr(pst, name)) for name in ("_prefix_shared_fwd", "_merge_parts")
    }
    for name, rec in recorders.items():
        monkeypatch.setattr(pst, name, rec)
    run()
    return recorders


def _compile_sm90(fn, args, kwargs):
    bound = dict(zip((p.name for p in fn.params), args))
    bound.update(kwargs)
    signature, constexprs = {}, {}
    for p in fn.params:
        value = bound[p.name]
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[p.name] = value
        else:
            signature[p.name] = mangle_type(value)
    return triton.compile(ASTSource(fn, signature, constexprs), target=HOPPER)


def _check_launches(recorders):
    assert all(rec.calls for rec in recorders.values()), "a kernel was never launched"
    for rec in recorders.values():
        for grid, args, kwargs in rec.calls:
            kernel = _compile_sm90(rec.fn, args, kwargs)
            assert kernel.asm.get("cubin"), f"{rec.fn.__name__}: no cubin"
            assert kernel.metadata.shared <= SHARED_MEMORY_SM90, (
                rec.fn.__name__,
                kernel.metadata.shared,
            )


# (Hq, Hkv, head dim, dtype): SmolLM2-135M's 9/3 heads of 64 in each dtype, and 32/8 heads
# of 128 (Llama-3-8B's) in bf16
CASES = [(9, 3, 64, dt) for dt in (torch.bfloat16, torch.float16, torch.float32)] + [
    (32, 8, 128, torch.bfloat16)
]


@pytest.mark.parametrize("hq,hkv,d,dtype", CASES, ids=str)
def test_decode_launches_compile_for_sm90(monkeypatch, hq, hkv, d, dtype):
    # a sharing group past one prefix chunk, a small group, a request that shares nothing
    batch = make_decode_batch(
        [16, 3, 1], [1100, 17, 0], [5] * 16 + [1, 40, 0] + [9], hq, hkv, d, dtype=dtype, seed=1
    )
    recorders = _record(monkeypatch, lambda: pst.prefix_shared_decode_triton(*batch.args))
    _check_launches(recorders)


@pytest.mark.parametrize("hq,hkv,d,dtype", CASES, ids=str)
def test_extend_launches_compile_for_sm90(monkeypatch, hq, hkv, d, dtype):
    batch = make_extend_batch(
        [4, 1], [70, 0], [2, 0, 5, 0, 0], [40, 9, 1, 3, 7], hq, hkv, d, dtype=dtype, seed=2
    )
    recorders = _record(monkeypatch, lambda: pst.prefix_shared_extend_triton(*batch.args))
    _check_launches(recorders)
