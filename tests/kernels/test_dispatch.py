"""Which decode and extend implementation ``--attention-backend feather`` runs
(``feather_kernels.dispatch``), and that each one, driven the way the backend drives it (one plan
per forward batch, reused by every layer), matches the reference: the torch path on CPU tensors, the Triton kernel on CUDA tensors (here: on CPU
tensors under ``TRITON_INTERPRET=1``, forced with ``FEATHER_ATTENTION_IMPL=triton``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from feather_kernels import decode_attention_reference, extend_attention_reference
from feather_kernels.dispatch import (
    IMPL_ENV,
    TritonDecode,
    TritonExtend,
    decode_impl,
    plan_decode_batch,
    plan_extend_batch,
    run_decode,
    run_extend,
)
from feather_kernels.prefix_shared_cpu import DecodePlan
from feather_kernels.synthetic import make_decode_batch, make_extend_batch

REPO = Path(__file__).resolve().parents[2]

# Two "layers" share one plan: the second gets its own K/V buffers, as each layer does.
_LAYERS_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from feather_kernels import decode_attention_reference
    from feather_kernels.synthetic import make_decode_batch
    from feather_kernels.dispatch import TritonDecode, plan_decode_batch, run_decode
    out = []
    batch = make_decode_batch([3, 2, 1], [40, 70, 0], [2, 0, 5, 9, 1, 3], 9, 3, 32, seed=7)
    plan = plan_decode_batch(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    for layer in range(2):
        k = batch.k_buffer if layer == 0 else torch.randn_like(batch.k_buffer)
        v = batch.v_buffer if layer == 0 else torch.randn_like(batch.v_buffer)
        args = (batch.q, k, v, batch.req_to_token, batch.req_pool_indices, batch.seq_lens, batch.scale)
        got = run_decode(plan, batch.q, torch.empty_like(batch.q), k, v, *args[3:])
        out.append({"kind": type(plan).__name__, "got": got.tolist(),
                    "ref": decode_attention_reference(*args).tolist()})
    print("RESULTS" + json.dumps(out))
    """
)

# The same for extend: two groups and a request that shares nothing, over two "layers".
_EXTEND_LAYERS_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from feather_kernels import extend_attention_reference
    from feather_kernels.synthetic import make_extend_batch
    from feather_kernels.dispatch import plan_extend_batch, run_extend
    out = []
    batch = make_extend_batch([3, 2, 1], [60, 40, 0], [0, 2, 0, 0, 1, 0], [4, 6, 1, 3, 5, 2],
                              9, 3, 32, seed=7)
    plan = plan_extend_batch(batch.req_to_token, batch.req_pool_indices,
                             batch.extend_prefix_lens, batch.extend_seq_lens)
    for layer in range(2):
        k = batch.k_buffer if layer == 0 else torch.randn_like(batch.k_buffer)
        v = batch.v_buffer if layer == 0 else torch.randn_like(batch.v_buffer)
        args = (batch.q, k, v, *batch.args[3:])
        got = run_extend(plan, batch.q, torch.empty_like(batch.q), *args[1:])
        out.append({"kind": type(plan).__name__, "got": got.tolist(),
                    "ref": extend_attention_reference(*args).tolist()})
    print("RESULTS" + json.dumps(out))
    """
)


def test_impl_choice_and_bad_value(monkeypatch):
    monkeypatch.delenv(IMPL_ENV, raising=False)
    assert decode_impl(torch.device("cpu")) == "torch"
    assert decode_impl(torch.device("cuda")) == "triton"
    monkeypatch.setenv(IMPL_ENV, "triton")
    assert decode_impl(torch.device("cpu")) == "triton"
    monkeypatch.setenv(IMPL_ENV, "flash")
    with pytest.raises(ValueError, match="allowed values are 'triton', 'torch'"):
        decode_impl(torch.device("cpu"))


def test_torch_path_on_cpu_plan_reused_by_layers(monkeypatch):
    monkeypatch.delenv(IMPL_ENV, raising=False)
    batch = make_decode_batch([3, 2, 1], [40, 70, 0], [2, 0, 5, 9, 1, 3], 9, 3, 32, seed=7)
    plan = plan_decode_batch(batch.req_to_token, batch.req_pool_indices, batch.seq_lens)
    assert isinstance(plan, DecodePlan)
    for layer in range(2):
        k = batch.k_buffer if layer == 0 else torch.randn_like(batch.k_buffer)
        v = batch.v_buffer if layer == 0 else torch.randn_like(batch.v_buffer)
        rest = (batch.req_to_token, batch.req_pool_indices, batch.seq_lens, batch.scale)
        got = run_decode(plan, batch.q, torch.empty_like(batch.q), k, v, *rest)
        torch.testing.assert_close(
            got, decode_attention_reference(batch.q, k, v, *rest), atol=1e-5, rtol=1e-5
        )


def test_nothing_shared_means_torch_natives_loop(monkeypatch):
    monkeypatch.delenv(IMPL_ENV, raising=False)
    batch = make_decode_batch([1, 1, 1], [0, 0, 0], [4, 7, 2], 4, 4, 16, seed=1)
    assert plan_decode_batch(batch.req_to_token, batch.req_pool_indices, batch.seq_lens) is None


@pytest.mark.parametrize("script,kind", [("decode", "TritonDecode"), ("extend", "TritonExtend")])
def test_triton_path_interpreted_plan_reused_by_layers(script, kind):
    pytest.importorskip("triton")
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        **{IMPL_ENV: "triton"},
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    code = _LAYERS_SCRIPT if script == "decode" else _EXTEND_LAYERS_SCRIPT
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS"))
    layers = json.loads(line[len("RESULTS") :])
    assert [r["kind"] for r in layers] == [kind, kind]
    for r in layers:
        torch.testing.assert_close(
            torch.tensor(r["got"]), torch.tensor(r["ref"]), atol=1e-4, rtol=1e-4
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_path_on_gpu(monkeypatch, dtype):
    monkeypatch.delenv(IMPL_ENV, raising=False)
    batch = make_decode_batch(
        [16, 8, 1], [2048, 513, 0], [64] * 16 + [3] * 8 + [9], 32, 8, 128, dtype=dtype, seed=3
    )
    cuda = [
        t.cuda()
        for t in (
            batch.q,
            batch.k_buffer,
            batch.v_buffer,
            batch.req_to_token,
            batch.req_pool_indices,
            batch.seq_lens,
        )
    ]
    q, k, v, r2t, rpi, lens = cuda
    plan = plan_decode_batch(r2t, rpi, lens)
    assert isinstance(plan, TritonDecode)
    got = run_decode(plan, q, torch.empty_like(q), k, v, r2t, rpi, lens, batch.scale)
    ref = decode_attention_reference(q, k, v, r2t, rpi, lens, batch.scale)
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3  # fp32 dots run as tf32 on the GPU
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


# --- extend ------------------------------------------------------------------------------------


def _extend_batch():
    return make_extend_batch(
        [3, 2, 1], [60, 40, 0], [0, 2, 0, 0, 1, 0], [4, 6, 1, 3, 5, 2], 9, 3, 32, seed=7
    )


def test_extend_torch_path_on_cpu_plan_reused_by_layers(monkeypatch):
    monkeypatch.delenv(IMPL_ENV, raising=False)
    batch = _extend_batch()
    plan = plan_extend_batch(
        batch.req_to_token, batch.req_pool_indices, batch.extend_prefix_lens, batch.extend_seq_lens
    )
    assert isinstance(plan, list) and sorted(g.prefix_len for g in plan) == [0, 40, 60]
    for layer in range(2):
        k = batch.k_buffer if layer == 0 else torch.randn_like(batch.k_buffer)
        v = batch.v_buffer if layer == 0 else torch.randn_like(batch.v_buffer)
        args = (batch.q, k, v, *batch.args[3:])
        got = run_extend(plan, batch.q, torch.empty_like(batch.q), *args[1:])
        torch.testing.assert_close(got, extend_attention_reference(*args), atol=1e-5, rtol=1e-5)


def test_extend_nothing_shared_means_torch_natives_loop(monkeypatch):
    for impl in ("torch", "triton"):
        monkeypatch.setenv(IMPL_ENV, impl)
        batch = make_extend_batch([1, 1], [0, 0], [3, 0], [4, 7], 4, 4, 16, seed=1)
        assert (
            plan_extend_batch(
                batch.req_to_token,
                batch.req_pool_indices,
                batch.extend_prefix_lens,
                batch.extend_seq_lens,
            )
            is None
        )


def test_extend_impl_choice(monkeypatch):
    batch = _extend_batch()
    args = (
        batch.req_to_token,
        batch.req_pool_indices,
        batch.extend_prefix_lens,
        batch.extend_seq_lens,
    )
    monkeypatch.setenv(IMPL_ENV, "triton")
    plan = plan_extend_batch(*args)
    assert isinstance(plan, TritonExtend) and sorted(g.prefix_len for g in plan.groups) == [
        0,
        40,
        60,
    ]
    monkeypatch.setenv(IMPL_ENV, "torch")
    assert isinstance(plan_extend_batch(*args), list)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_triton_path_on_gpu(monkeypatch, dtype):
    monkeypatch.delenv(IMPL_ENV, raising=False)
    batch = make_extend_batch(
        [16, 8, 1],
        [2048, 513, 0],
        [0] * 16 + [3] * 8 + [0],
        [64] * 16 + [17] * 8 + [9],
        32,
        8,
        128,
        dtype=dtype,
        seed=3,
    )
    cuda = [t.cuda() if isinstance(t, torch.Tensor) else t for t in batch.args]
    q, k, v, r2t, rpi, lens, pre, ext, scale = cuda
    plan = plan_extend_batch(r2t, rpi, pre, ext)
    assert isinstance(plan, TritonExtend)
    got = run_extend(plan, q, torch.empty_like(q), k, v, r2t, rpi, lens, pre, ext, scale)
    ref = extend_attention_reference(*batch.args)  # on the CPU
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3  # tf32 dots in fp32
    torch.testing.assert_close(got.cpu().float(), ref.float(), atol=tol, rtol=tol)
