"""Decode attention on an NVIDIA GPU: feather's fused Triton kernel vs SGLang's Triton decode
kernel vs FlashInfer's cascade attention (run by ``scripts/gpu_check.sh``).

    python -m feather_bench.attention_gpu --json results/bench_attention_gpu.json
    python -m feather_bench.attention_gpu --smoke          # CPU, TRITON_INTERPRET=1, correctness

One layer, one decode step, on the same SGLang-layout KV pool and batch
(``feather_kernels.synthetic.make_decode_batch``): B requests sharing a P-token prefix (equal
leading slot ids, as a radix-cache hit leaves them) plus 64 own tokens each. Grid: B in
{4, 16, 64} x P in {512, 2048, 8192} x shape in {smollm2: 9 q / 3 kv heads, dim 64;
gqa32: 32 q / 8 kv heads, dim 128} x dtype in {bfloat16, float16}.

Kernels (each checked against ``feather_kernels.reference.decode_attention_reference`` before
it is timed; a kernel that does not match is reported and not timed):

* ``feather``: ``prefix_shared_decode_triton`` with its plan built once (a backend builds it
  once per forward batch for all layers; the scheduler hands it the groups). ``feather_plan_ms``
  is that per-batch host cost, not in ``feather_ms``.
* ``sglang``: SGLang 0.5.23's ``decode_attention_fwd`` (``sglang.kernels.ops.attention.
  decode_attention``; the ``triton_ops`` package of older SGLang moved there), called exactly
  as ``TritonAttnBackend.forward_decode`` calls it: ``kv_indptr`` int32, ``kv_indices`` int64,
  ``attn_logits``/``attn_lse`` fp32 with ``max_kv_splits = 8`` (``--triton-attention-num-kv-
  splits`` default), ``num_kv_splits`` from SGLang's ``get_num_kv_splits_triton`` with the
  device's SM count, PDL on sm90+ (``is_arch_support_pdl``). The metadata is built once per
  batch, outside the timing. Where the ``sglang`` package does not import (its full import needs
  zmq, pydantic, ... that a bare GPU machine lacks), the kernel module is loaded from its source
  files (``--sglang-src``; by default found in this repo's ``.venv``) with its three SGLang-
  internal imports (``score_mod``, ``srt.environ``, ``srt.utils``) stubbed for CUDA.
* ``flashinfer``: ``flashinfer.MultiLevelCascadeAttentionWrapper`` with two levels (the shared
  prefix: all B queries against P keys; each request's own suffix), page size 1 over the same
  KV buffers, planned once outside the timing. Skipped with a printed line where
  ``flashinfer`` does not import.

Times: ``triton.testing.do_bench`` medians (it flushes L2 between runs), in ms; speedups are
``other_ms / feather_ms``. ``--smoke``: tiny sizes on CPU tensors under ``TRITON_INTERPRET=1``
(set here when unset), correctness only: it proves the call signatures, not speed.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import re
import shlex
import statistics
import sys
import time
import traceback
import types
import warnings

from feather_bench.argtypes import ints

SHAPES = {"smollm2": (9, 3, 64), "gqa32": (32, 8, 128)}  # (Hq, Hkv, D)
SUFFIX = 64
MAX_KV_SPLITS = 8  # SGLang's --triton-attention-num-kv-splits default
# |kernel - reference| <= atol + rtol * |reference| (outputs in the input dtype; fp32 dots run
# as tf32 on the GPU)
TOL = {"float32": (5e-3, 5e-3), "bfloat16": (2e-2, 2e-2), "float16": (4e-3, 4e-3)}
SGLANG_FILES = ("decode_attention.py", "metadata.py", "score_mod.py")


def _say(msg: str) -> None:
    print(msg, flush=True)


# --- what is installed -----------------------------------------------------------------------


def probe_torch():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return None, f"torch: MISSING ({type(e).__name__}: {e})"
    return torch, f"torch: {torch.__version__}"


def probe_triton():
    try:
        import triton
        import triton.testing  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return None, f"triton: MISSING ({type(e).__name__}: {e})"
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return triton, f"triton: {triton.__version__}" + (" (TRITON_INTERPRET=1)" if interp else "")


def probe_flashinfer():
    try:
        import flashinfer
        from flashinfer.cascade import MultiLevelCascadeAttentionWrapper  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return None, f"flashinfer: MISSING ({type(e).__name__}: {e}) - its rows are skipped"
    return flashinfer, f"flashinfer: {getattr(flashinfer, '__version__', '?')}"


def _find_sglang_src(explicit: str | None) -> str | None:
    cands = [explicit] if explicit else []
    if os.environ.get("FEATHER_SGLANG_SRC"):
        cands.append(os.environ["FEATHER_SGLANG_SRC"])
    cands += sorted(
        glob.glob(
            os.path.join(
                ".venv", "lib", "python3*", "site-packages", "sglang", "kernels", "ops", "attention"
            )
        )
    )
    try:  # an installed sglang whose import fails (finding it imports nothing)
        spec = importlib.util.find_spec("sglang")
        if spec is not None and spec.submodule_search_locations:
            cands += [
                os.path.join(p, "kernels", "ops", "attention")
                for p in spec.submodule_search_locations
            ]
    except Exception:  # noqa: BLE001
        pass
    for d in cands:
        if all(os.path.isfile(os.path.join(d, f)) for f in SGLANG_FILES):
            return d
    return None


def _sglang_version_near(src: str) -> str:
    """The version in ``sglang/_version.py`` three folders above the kernel sources, if any."""
    path = os.path.join(src, "..", "..", "..", "_version.py")
    try:
        with open(path) as f:
            m = re.search(r"__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)", f.read())
        return m.group(1) if m else "?"
    except OSError:
        return "?"


def _load_file(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # triton's @jit reads the kernels' source via inspect
    spec.loader.exec_module(mod)
    return mod


def load_sglang_from_source(src: str) -> types.SimpleNamespace:
    """SGLang's decode kernel module from its files, without importing the ``sglang`` package.

    ``decode_attention.py`` imports ``unpack_aux_tensors`` (``score_mod.py``, torch/triton
    only: loaded for real), ``envs`` from ``sglang.srt.environ`` (read only on the ROCm Lean and
    MLA-tuning paths: every flag reads False here) and four helpers from ``sglang.srt.utils``
    (stubbed as SGLang defines them for CUDA). The stubs sit in ``sys.modules`` only while the
    file executes; whatever was there before is put back.
    """
    import torch

    tag = "_feather_sglang_src"
    score_mod = _load_file(f"{tag}.score_mod", os.path.join(src, "score_mod.py"))
    metadata = _load_file(f"{tag}.metadata", os.path.join(src, "metadata.py"))

    class _Flag:
        def get(self):
            return False

    class _Envs:
        def __getattr__(self, name):
            return _Flag()

    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = _Envs()
    utils = types.ModuleType("sglang.srt.utils")

    def get_device_core_count(device_id: int = 0) -> int:
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(device_id).multi_processor_count
        return 0

    utils.get_device_core_count = get_device_core_count
    utils.is_hip = lambda: torch.version.hip is not None
    utils.is_gfx95_supported = lambda: False
    utils.is_gfx1250_supported = lambda: False
    stubs = {
        "sglang.kernels.ops.attention.score_mod": score_mod,
        "sglang.srt.environ": environ,
        "sglang.srt.utils": utils,
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        decode = _load_file(f"{tag}.decode_attention", os.path.join(src, "decode_attention.py"))
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    with open(os.path.join(src, "decode_attention.py"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    where = os.path.relpath(src) if src.startswith(os.getcwd()) else src
    return types.SimpleNamespace(
        decode_attention_fwd=decode.decode_attention_fwd,
        get_num_kv_splits_triton=metadata.get_num_kv_splits_triton,
        how=f"source files {where} (sglang {_sglang_version_near(src)}, "
        f"decode_attention.py sha256 {digest})",
    )


def load_sglang_package() -> types.SimpleNamespace:
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

    try:
        from sglang.version import __version__ as v
    except Exception:  # noqa: BLE001
        v = "?"
    return types.SimpleNamespace(
        decode_attention_fwd=decode_attention_fwd,
        get_num_kv_splits_triton=get_num_kv_splits_triton,
        how=f"sglang package {v}",
    )


def probe_sglang(mode: str, src_dir: str | None):
    """``(namespace or None, line)``; ``mode``: auto (package, else source), package, source."""
    errors = []
    if mode in ("auto", "package"):
        try:
            ns = load_sglang_package()
            return ns, f"sglang decode kernel: {ns.how}"
        except Exception as e:  # noqa: BLE001
            errors.append(f"package import failed ({type(e).__name__}: {e})")
    if mode in ("auto", "source"):
        src = _find_sglang_src(src_dir)
        if src is None:
            errors.append(
                "no source files (--sglang-src DIR or FEATHER_SGLANG_SRC holding "
                + ", ".join(SGLANG_FILES)
                + "; default .venv/lib/python3*/"
                "site-packages/sglang/kernels/ops/attention)"
            )
        else:
            try:
                ns = load_sglang_from_source(src)
                return ns, f"sglang decode kernel: {ns.how}"
            except Exception as e:  # noqa: BLE001
                errors.append(f"loading {src} failed ({type(e).__name__}: {e})")
    return None, "sglang decode kernel: MISSING - " + "; ".join(errors) + " - its rows are skipped"


# --- the kernels, called as their backends call them -----------------------------------------


class SglangDecode:
    """One batch's metadata for SGLang's decode kernel, as ``TritonAttnBackend.
    init_forward_metadata`` builds it for a decode batch (no DCP, no sliding window)."""

    def __init__(self, ns, batch, core_count: int, use_pdl: bool):
        import torch

        self.ns, self.use_pdl = ns, use_pdl
        dev = batch.q.device
        B, Hq, _ = batch.q.shape
        Hkv, Dv = batch.v_buffer.shape[1], batch.v_buffer.shape[2]
        seq_lens = batch.seq_lens
        self.kv_indptr = torch.zeros(B + 1, dtype=torch.int32, device=dev)
        self.kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)
        rows = batch.req_to_token[batch.req_pool_indices]  # [B, L]
        cols = torch.arange(rows.shape[1], device=dev)
        self.kv_indices = rows[cols[None, :] < seq_lens[:, None]].to(torch.int64)
        self.attn_logits = torch.empty(B, Hq, MAX_KV_SPLITS, Dv, dtype=torch.float32, device=dev)
        self.attn_lse = torch.empty(B, Hq, MAX_KV_SPLITS, dtype=torch.float32, device=dev)
        self.num_kv_splits = torch.empty(B, dtype=torch.int32, device=dev)
        self.uneven_batch = torch.zeros(1, dtype=torch.int32, device=dev)
        if core_count <= 0:  # TritonAttnBackend.get_num_kv_splits without a device count
            self.num_kv_splits.fill_(MAX_KV_SPLITS)
        else:
            import triton

            ns.get_num_kv_splits_triton[(1,)](
                self.num_kv_splits,
                seq_lens,
                B,
                1,
                Hq,
                Hkv,
                MAX_KV_SPLITS,
                core_count,
                MAX_NUM_SEQ=256 if B < 256 else triton.next_power_of_2(B),
                uneven_batch_ptr=self.uneven_batch,
            )
        self.out = torch.empty(B, Hq, Dv, dtype=batch.q.dtype, device=dev)
        self.batch = batch

    def __call__(self):
        b = self.batch
        self.ns.decode_attention_fwd(
            b.q,
            b.k_buffer,
            b.v_buffer,
            self.out,
            self.kv_indptr,
            self.kv_indices,
            self.attn_logits,
            self.attn_lse,
            self.num_kv_splits,
            MAX_KV_SPLITS,
            b.scale,
            1.0,
            1.0,  # sm_scale, k_scale, v_scale (k/v descale 1.0 for bf16/fp16)
            logit_cap=0.0,
            sinks=None,
            xai_temperature_len=-1,
            has_mla=False,
            use_pdl=self.use_pdl,
            page_size=1,
            score_mod=None,
            aux_tensors=None,
            enable_lean=None,
            uneven_batch=self.uneven_batch,
        )
        return self.out


class FlashInferCascade:
    """Two-level cascade over the batch: level 0 the group's shared prefix (all B queries
    against its P keys, not causal), level 1 each request's own suffix; page size 1."""

    def __init__(self, batch, prefix_len: int):
        import torch
        from flashinfer.cascade import MultiLevelCascadeAttentionWrapper

        dev = batch.q.device
        B, Hq, D = batch.q.shape
        S, Hkv, _ = batch.k_buffer.shape
        i32 = dict(dtype=torch.int32, device=dev)
        rows = batch.req_to_token[batch.req_pool_indices].to(torch.int32)  # [B, L]
        prefix = rows[0, :prefix_len].contiguous()
        own = batch.seq_lens - prefix_len
        cols = torch.arange(rows.shape[1], device=dev)
        mask = (cols[None, :] >= prefix_len) & (cols[None, :] < batch.seq_lens[:, None])
        suffix_indices = rows[mask].contiguous()
        suffix_indptr = torch.zeros(B + 1, **i32)
        suffix_indptr[1:] = torch.cumsum(own, 0)
        self.workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
        self.wrapper = MultiLevelCascadeAttentionWrapper(2, self.workspace, "NHD")
        self.wrapper.plan(
            [torch.tensor([0, B], **i32), torch.arange(B + 1, **i32)],
            [torch.tensor([0, prefix_len], **i32), suffix_indptr],
            [prefix, suffix_indices],
            [torch.ones(1, **i32), torch.ones(B, **i32)],
            Hq,
            Hkv,
            D,
            1,
            causal=False,
            sm_scale=batch.scale,
            q_data_type=batch.q.dtype,
            kv_data_type=batch.k_buffer.dtype,
        )
        self.kv = (
            batch.k_buffer.view(S, 1, Hkv, D),
            batch.v_buffer.view(S, 1, Hkv, batch.v_buffer.shape[2]),
        )
        self.q = batch.q

    def __call__(self):
        return self.wrapper.run(self.q, self.kv)


# --- measuring -------------------------------------------------------------------------------


def _time_ms(fn, use_do_bench: bool) -> dict:
    import torch

    if use_do_bench:
        import triton.testing

        med, p20, p80 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
        return {"ms": med, "p20_ms": p20, "p80_ms": p80}
    # CUDA events (no triton: only flashinfer can run then)
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(50):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    q = statistics.quantiles(times, n=5)
    return {"ms": statistics.median(times), "p20_ms": q[0], "p80_ms": q[3]}


def _graph_ms(fn) -> dict:
    """The kernel's GPU time alone: ``fn`` captured in a CUDA graph and replayed, so no host
    launch cost is in it (what a server running CUDA graphs pays)."""
    import triton.testing

    med, p20, p80 = triton.testing.do_bench_cudagraph(fn, rep=100, quantiles=[0.5, 0.2, 0.8])
    return {"ms": med, "p20_ms": p20, "p80_ms": p80}


def _check(out, ref, dtype_name: str) -> tuple[bool, float]:
    atol, rtol = TOL[dtype_name]
    o, r = out.float(), ref.float()
    diff = (o - r).abs()
    ok = bool(torch_isfinite_all(o)) and bool((diff <= atol + rtol * r.abs()).all())
    return ok, float(diff.max())


def torch_isfinite_all(t) -> bool:
    import torch

    return bool(torch.isfinite(t).all())


def interpreter_bf16_dot_ok() -> bool:
    """Whether ``tl.dot`` on bfloat16 is right here: TRITON_INTERPRET's is not (triton 3.9
    gives errors of 1e10 on a 16x16 product), so SGLang's kernel, which feeds bf16 straight to
    ``tl.dot``, can be checked in bf16 on a GPU only (feather's wrapper upcasts when
    interpreting)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _dot16(A, B, C):
        o = tl.arange(0, 16)
        a = tl.load(A + o[:, None] * 16 + o[None, :])
        b = tl.load(B + o[:, None] * 16 + o[None, :])
        tl.store(C + o[:, None] * 16 + o[None, :], tl.dot(a, b))

    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 16, generator=g).to(torch.bfloat16)
    b = torch.randn(16, 16, generator=g).to(torch.bfloat16)
    c = torch.empty(16, 16)
    _dot16[(1,)](a, b, c)
    return bool(torch.allclose(c, a.float() @ b.float(), atol=1e-2, rtol=1e-2))


def _host_ms(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_cell(
    kernels: dict,
    shape: str,
    dtype_name: str,
    B: int,
    P: int,
    suffix: int,
    device: str,
    timing: bool,
    core_count: int,
    state: dict,
) -> dict:
    """One (shape, dtype, B, P) cell: every kernel checked against the reference, then timed.
    ``state``: ``use_pdl`` (SGLang's PDL launch; turned off for good if it fails) and
    ``skip`` (kernel name -> reason, for dtypes a kernel cannot be checked in here)."""
    import torch

    from feather_kernels import PrefixGroup, decode_attention_reference
    from feather_kernels.synthetic import make_decode_batch

    Hq, Hkv, D = SHAPES[shape]
    dtype = getattr(torch, dtype_name)
    cpu = make_decode_batch([B], [P], [suffix] * B, Hq, Hkv, D, dtype=dtype, seed=B * 7 + P)
    batch = type(cpu)(
        *[
            t.to(device) if isinstance(t, torch.Tensor) else t
            for t in (
                cpu.q,
                cpu.k_buffer,
                cpu.v_buffer,
                cpu.req_to_token,
                cpu.req_pool_indices,
                cpu.seq_lens,
            )
        ],
        cpu.scale,
        cpu.groups,
    )
    ref = decode_attention_reference(*batch.args)
    row = {
        "shape": shape,
        "Hq": Hq,
        "Hkv": Hkv,
        "D": D,
        "dtype": dtype_name,
        "B": B,
        "P": P,
        "suffix": suffix,
    }
    runners = {}
    if "feather" in kernels:
        from feather_kernels.prefix_shared_triton import (
            plan_decode_triton,
            prefix_shared_decode_triton,
        )

        groups = [PrefixGroup(torch.tensor(m, device=device), p) for m, p in batch.groups]

        def plan_fn():
            return plan_decode_triton(
                batch.req_to_token, batch.req_pool_indices, batch.seq_lens, Hq // Hkv, groups=groups
            )

        plan = plan_fn()
        if timing:
            row["feather_plan_ms"] = round(
                _host_ms(lambda: (plan_fn(), torch.cuda.synchronize())), 4
            )
        out_buf = torch.empty_like(batch.q)
        runners["feather"] = lambda: prefix_shared_decode_triton(
            *batch.args, out=out_buf, plan=plan
        )
    for name, ns in kernels.items():
        try:
            if name.startswith("sglang"):
                runners[name] = SglangDecode(ns, batch, core_count, state["use_pdl"])
            elif name == "flashinfer":
                runners[name] = FlashInferCascade(batch, P)
        except Exception as e:  # noqa: BLE001
            row[f"{name}_error"] = f"metadata/plan: {type(e).__name__}: {e}"[:400]
            _say(f"  {name}: ERROR {row[f'{name}_error']}")
            traceback.print_exc()
    for name, fn in runners.items():
        reason = state["skip"].get((name.split("_")[0], dtype_name))
        if reason:
            row[f"{name}_skipped"] = reason
            continue
        try:
            try:
                out = fn()
            except Exception as e:  # noqa: BLE001
                if not (name.startswith("sglang") and fn.use_pdl):
                    raise
                # NOTE: PDL needs sm90+ and a triton that takes launch_pdl; SGLang itself
                # enables it from the arch alone, so fall back rather than fail the cell
                _say(
                    f"  {name}: failed with PDL ({type(e).__name__}: {str(e)[:300]}); "
                    "retrying without PDL, and without it from here on"
                )
                state["use_pdl"] = False
                state["pdl_error"] = f"{type(e).__name__}: {e}"[:400]
                fn.use_pdl = False
                out = fn()
            ok, err = _check(out, ref, dtype_name)
        except Exception as e:  # noqa: BLE001
            row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:400]
            _say(f"  {name}: ERROR {row[f'{name}_error']}")
            traceback.print_exc()
            continue
        if name.startswith("sglang"):
            row[f"{name}_use_pdl"] = fn.use_pdl
        row[f"{name}_ok"], row[f"{name}_max_abs_diff"] = ok, err
        if not ok:
            _say(
                f"  {name}: MISMATCH vs reference (max abs diff {err:.3g}, tol "
                f"{TOL[dtype_name]}) - not timed"
            )
            continue
        if timing:
            try:
                t = _time_ms(fn, use_do_bench="triton" in sys.modules)
            except Exception as e:  # noqa: BLE001
                row[f"{name}_time_error"] = f"{type(e).__name__}: {e}"[:400]
                _say(f"  {name}: timing failed: {row[f'{name}_time_error']}")
                continue
            row[f"{name}_ms"] = round(t["ms"], 5)
            row[f"{name}_p20_ms"], row[f"{name}_p80_ms"] = (
                round(t["p20_ms"], 5),
                round(t["p80_ms"], 5),
            )
            if "triton" in sys.modules:
                try:
                    g = _graph_ms(fn)
                except Exception as e:  # noqa: BLE001
                    row[f"{name}_graph_error"] = f"{type(e).__name__}: {e}"[:400]
                    _say(f"  {name}: CUDA-graph timing failed: {row[f'{name}_graph_error']}")
                    continue
                row[f"{name}_graph_ms"] = round(g["ms"], 5)
    for other in ("sglang", "flashinfer"):
        for kind in ("", "graph_"):
            if f"feather_{kind}ms" in row and f"{other}_{kind}ms" in row:
                row[f"{kind}speedup_vs_{other}"] = round(
                    row[f"{other}_{kind}ms"] / row[f"feather_{kind}ms"], 3
                )
    return row


def _fmt(row: dict, key: str) -> str:
    if f"{key}_ms" in row:
        return f"{row[f'{key}_ms'] * 1e3:>11.1f}"
    if f"{key}_ok" in row:
        return f"{'ok' if row[f'{key}_ok'] else 'MISMATCH':>11}"
    if f"{key}_error" in row:
        return f"{'ERROR':>11}"
    if f"{key}_skipped" in row:
        return f"{'skip':>11}"
    return f"{'-':>11}"


def _print_row(row: dict, timing: bool, pkg_column: bool) -> None:
    sp = (
        "".join(
            f"{row[k]:>9.2f}x" if k in row else f"{'-':>10}"
            for k in ("speedup_vs_sglang", "speedup_vs_flashinfer", "graph_speedup_vs_sglang")
        )
        if timing
        else ""
    )
    _say(
        f"{row['shape']:>8} {row['dtype']:>9} {row['B']:>4} {row['P']:>6} "
        f"{_fmt(row, 'feather')}{_fmt(row, 'sglang')}{_fmt(row, 'flashinfer')}"
        + (_fmt(row, "sglang_pkg") if pkg_column else "")
        + sp
    )


def summarize(rows: list[dict], timing: bool, skipped: list[str]) -> dict:
    kernels = ("feather", "sglang", "sglang_pkg", "flashinfer")
    checked = [(r, k) for r in rows for k in kernels if f"{k}_ok" in r or f"{k}_error" in r]
    summary = {
        "all_correct": bool(checked) and all(r.get(f"{k}_ok", False) for r, k in checked),
        "checked": {
            k: sum(1 for r, kk in checked if kk == k and r.get(f"{k}_ok")) for k in kernels
        },
        "failed": [
            f"{r['shape']}/{r['dtype']}/B{r['B']}/P{r['P']}/{k}"
            for r, k in checked
            if not r.get(f"{k}_ok", False)
        ],
        "timing_failed": [
            f"{r['shape']}/{r['dtype']}/B{r['B']}/P{r['P']}/{k}"
            for r in rows
            for k in kernels
            if f"{k}_time_error" in r
        ],
        "skipped_cells": skipped,
    }
    if not timing:
        return summary

    def speedup(other, B, P, shape, dtype):
        hits = [
            r.get(f"speedup_vs_{other}")
            for r in rows
            if r["B"] == B and r["P"] == P and r["shape"] == shape and r["dtype"] == dtype
        ]
        return hits[0] if hits else None

    # headline keys, as in feather_bench.attention: SmolLM2 shape, bfloat16, vs SGLang's triton
    summary["speedup_b16_p2048"] = speedup("sglang", 16, 2048, "smollm2", "bfloat16")
    summary["speedup_b64_p8192"] = speedup("sglang", 64, 8192, "smollm2", "bfloat16")
    for shape in SHAPES:
        for dtype in ("bfloat16", "float16"):
            for other in ("sglang", "flashinfer"):
                for B, P in ((16, 2048), (64, 8192)):
                    v = speedup(other, B, P, shape, dtype)
                    if v is not None:
                        summary[f"speedup_vs_{other}_b{B}_p{P}_{shape}_{dtype}"] = v
    for other in ("sglang", "flashinfer"):
        for kind in ("", "graph_"):
            vals = [
                r[f"{kind}speedup_vs_{other}"] for r in rows if f"{kind}speedup_vs_{other}" in r
            ]
            summary[f"min_{kind}speedup_vs_{other}"] = min(vals) if vals else None
            summary[f"median_{kind}speedup_vs_{other}"] = (
                round(statistics.median(vals), 3) if vals else None
            )
            summary[f"cells_timed_{kind}vs_{other}"] = len(vals)
    summary["targets"] = {"min_speedup_vs_sglang": 1.0}
    return summary


def _names(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes on CPU tensors under TRITON_INTERPRET=1 (set here when "
        "unset): correctness of every kernel's call, no timing",
    )
    parser.add_argument("--json", metavar="PATH", help="write rows and summary as JSON here")
    parser.add_argument("--batches", type=ints, help="comma-separated B values")
    parser.add_argument("--prefixes", type=ints, help="comma-separated P values")
    parser.add_argument("--shapes", type=_names, help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--dtypes", type=_names, help="comma-separated (default bfloat16,float16)")
    parser.add_argument("--suffix", type=int, default=None, help=f"own tokens (default {SUFFIX})")
    parser.add_argument(
        "--sglang",
        choices=("auto", "package", "source"),
        default="auto",
        help="where SGLang's decode kernel comes from (auto: the sglang package, "
        "else its source files)",
    )
    parser.add_argument(
        "--sglang-src", metavar="DIR", help="folder with SGLang's " + ", ".join(SGLANG_FILES)
    )
    parser.add_argument("--no-flashinfer", action="store_true", help="leave FlashInfer out")
    parser.add_argument(
        "--no-pdl",
        action="store_true",
        help="call SGLang's kernel without programmatic dependent launch",
    )
    parser.add_argument(
        "--core-count",
        type=int,
        default=None,
        help="SM count handed to SGLang's get_num_kv_splits_triton (default: "
        "the GPU's; smoke: 4); 0 = every request gets max_kv_splits, as "
        "the backend does without a device count",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=170.0,
        help="start no new cell after this many seconds (default 170)",
    )
    args = parser.parse_args(argv)

    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    t_start = time.perf_counter()
    torch, line = probe_torch()
    _say(line)
    if torch is None:
        _say("nothing can run without torch")
        return 2
    cuda = torch.cuda.is_available() and torch.version.hip is None
    if cuda:
        _say(
            f"device: {torch.cuda.get_device_name(0)}, capability "
            f"{'.'.join(map(str, torch.cuda.get_device_capability(0)))}, "
            f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs, "
            f"CUDA {torch.version.cuda}"
        )
    else:
        _say(
            "device: no NVIDIA GPU visible to torch"
            + (" (smoke mode: CPU tensors)" if args.smoke else "")
        )
    triton, line = probe_triton()
    _say(line)
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if not args.smoke and not cuda:
        _say("no GPU: nothing to time here; run with --smoke for the CPU correctness check")
        return 2
    if args.smoke and (triton is None or not interp):
        _say("smoke mode needs triton and TRITON_INTERPRET=1")
        return 2

    kernels: dict = {}
    if triton is not None:
        kernels["feather"] = None
        ns, line = probe_sglang(args.sglang if not args.smoke else "source", args.sglang_src)
        _say(line)
        if ns is not None:
            kernels["sglang"] = ns
        if args.smoke and args.sglang == "auto":
            # the device path is the source loader; prove the package import gives the same
            pkg, line = probe_sglang("package", None)
            _say(line.replace("sglang decode kernel", "sglang decode kernel (package)"))
            if pkg is not None:
                kernels["sglang_pkg"] = pkg
    else:
        _say("feather and sglang kernels: SKIPPED (they are Triton kernels)")
    if args.no_flashinfer:
        _say("flashinfer: left out (--no-flashinfer)")
    elif args.smoke:
        _say("flashinfer: not in smoke mode (CUDA only)")
    else:
        fi, line = probe_flashinfer()
        _say(line)
        if fi is not None:
            kernels["flashinfer"] = fi
            _say(
                "flashinfer: its first calls JIT-build kernels unless flashinfer-jit-cache is "
                "installed (minutes); --no-flashinfer leaves it out"
            )
    if not kernels:
        _say("no kernel can run here")
        return 2

    if args.smoke:
        shapes = args.shapes or ("smollm2", "gqa32")
        dtypes = args.dtypes or ("float32", "float16", "bfloat16")
        batches, prefixes = args.batches or (1, 3), args.prefixes or (20, 70)
        suffix, device, timing = (args.suffix if args.suffix is not None else 5), "cpu", False
    else:
        shapes = args.shapes or tuple(SHAPES)
        dtypes = args.dtypes or ("bfloat16", "float16")
        batches, prefixes = args.batches or (4, 16, 64), args.prefixes or (512, 2048, 8192)
        suffix, device, timing = (args.suffix if args.suffix is not None else SUFFIX), "cuda", True
    core_count = (
        args.core_count
        if args.core_count is not None
        else torch.cuda.get_device_properties(0).multi_processor_count
        if cuda
        else 4
    )
    # TritonAttnBackend: use_pdl = is_arch_support_pdl() (sm90+) on CUDA
    use_pdl = cuda and not args.no_pdl and torch.cuda.get_device_capability(0)[0] >= 9
    state = {"use_pdl": use_pdl, "skip": {}}
    if "sglang" in kernels:
        _say(
            f"sglang: max_kv_splits={MAX_KV_SPLITS}, core count {core_count}, " f"use_pdl={use_pdl}"
        )
    if args.smoke:
        warnings.filterwarnings(
            "ignore", message="invalid value encountered", category=RuntimeWarning
        )  # -inf - -inf in masked lanes
        if "bfloat16" in dtypes and not interpreter_bf16_dot_ok():
            why = (
                "TRITON_INTERPRET's bf16 tl.dot is wrong (checked on a 16x16 product): "
                "SGLang's kernel is checked in bf16 on a GPU only"
            )
            state["skip"][("sglang", "bfloat16")] = why
            _say(f"sglang bfloat16: skipped in smoke mode - {why}")

    _say(
        f"decode attention step, suffix {suffix}; "
        + (
            "times: do_bench medians in us; speedup = other / feather; graph: the same "
            "speedup from CUDA-graph replays (GPU time, no launch cost)"
            if timing
            else "correctness only (no timing)"
        )
    )
    _say(
        f"{'shape':>8} {'dtype':>9} {'B':>4} {'P':>6} {'feather':>11}{'sglang':>11}"
        f"{'flashinfer':>11}"
        + (f"{'sglang_pkg':>11}" if "sglang_pkg" in kernels else "")
        + (f"{'vs_sglang':>10}{'vs_fi':>10}{'graph':>10}" if timing else "")
    )
    rows, skipped = [], []
    from feather_bench.tools.machine import describe, git_state

    machine = {
        **describe("triton", "flashinfer"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join(["python", "-m", "feather_bench.attention_gpu", *sys.argv[1:]]),
        "git": git_state(),
        "gpu_name": torch.cuda.get_device_name(0) if cuda else None,
        "cuda": torch.version.cuda,
        "smoke": args.smoke,
        "kernels": {
            k: (
                getattr(v, "how", None)
                if k.startswith("sglang")
                else getattr(v, "__version__", None)
            )
            for k, v in kernels.items()
        },
        "sglang_max_kv_splits": MAX_KV_SPLITS,
        "sglang_core_count": core_count,
    }

    def write_json(partial: bool) -> dict:
        summary = summarize(rows, timing, skipped)
        summary["seconds"] = round(time.perf_counter() - t_start, 1)
        summary["complete"] = not partial
        if args.json:
            machine.update(
                sglang_use_pdl=state["use_pdl"],
                sglang_pdl_error=state.get("pdl_error"),
                skipped_kernels={f"{k}/{d}": v for (k, d), v in state["skip"].items()},
            )
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"machine": machine, "rows": rows, "summary": summary}, f, indent=2)
            os.replace(tmp, args.json)
        return summary

    for dtype in dtypes:
        for shape in shapes:
            for B in batches:
                for P in prefixes:
                    cell = f"{shape}/{dtype}/B{B}/P{P}"
                    if time.perf_counter() - t_start > args.budget_s:
                        skipped.append(cell)
                        continue
                    row = run_cell(
                        kernels, shape, dtype, B, P, suffix, device, timing, core_count, state
                    )
                    rows.append(row)
                    _print_row(row, timing, "sglang_pkg" in kernels)
                    # NOTE: written after every cell, so a run cut short by a timeout (a
                    # FlashInfer JIT build, say) still leaves what it measured
                    write_json(partial=True)
    if skipped:
        _say(
            f"time budget ({args.budget_s:.0f} s) spent: {len(skipped)} cells skipped: "
            + ", ".join(skipped)
        )
    summary = write_json(partial=False)
    _say(json.dumps(summary))
    if args.json:
        _say(f"wrote {args.json}")
    return 0 if summary["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
