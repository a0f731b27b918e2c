"""The Python steps of ``scripts/gpu_check.sh`` (``make gpu-check``), run from the repository's root.

python -m feather_bench.gpu_check versions          # what is installed, one line each
python -m feather_bench.gpu_check server MODEL LOG  # a feather server on the GPU, one request
"""

from __future__ import annotations

import importlib
import sys


def _line(name, fn) -> None:
    try:
        print(f"   {name}: {fn()}")
    except Exception as e:  # noqa: BLE001
        print(f"   {name}: MISSING ({type(e).__name__}: {str(e)[:200]})")


def _torch() -> str:
    import torch

    gpu = (
        f"{torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}"
        if torch.cuda.is_available()
        else "NO GPU visible"
    )
    return f"{torch.__version__} ({gpu})"


def _sglang() -> str:
    try:
        importlib.import_module("sglang.kernels.ops.attention.decode_attention")
        return "package imports (its decode kernel is used from it)"
    except Exception as e:  # noqa: BLE001
        from feather_bench.attention_gpu import _find_sglang_src

        src = _find_sglang_src(None)
        if src is None:
            raise RuntimeError(
                f"package import failed ({type(e).__name__}) and no source "
                "files: the benchmark's sglang rows are skipped"
            ) from None
        return (
            f"package import failed ({type(e).__name__}: {str(e)[:80]}); the decode "
            f"kernel is loaded from {src}"
        )


def versions() -> int:
    _line("torch", _torch)
    _line("triton", lambda: importlib.import_module("triton").__version__)
    _line("pytest", lambda: importlib.import_module("pytest").__version__)
    _line("feather_kernels", lambda: importlib.import_module("feather_kernels").__file__)
    _line("sglang", _sglang)
    _line("flashinfer", lambda: importlib.import_module("flashinfer").__version__)
    return 0


def server(model: str, log: str) -> int:
    """A server with ``--attention-backend feather`` and CUDA graphs at SGLang's default:
    0 when it answers and logs that feather turned CUDA graphs off."""
    import requests

    from feather_bench.tools.server import SGLangServer

    with SGLangServer(model, "feather", ["--attention-backend", "feather"], log_path=log) as s:
        r = requests.post(
            s.url + "/generate",
            timeout=120,
            json={
                "text": "The capital of France is",
                "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            },
        )
        print("   answer:", r.status_code, r.json().get("text"))
    with open(log) as f:
        text = f.read()
    ok = (
        r.status_code == 200
        and "CUDA graphs are disabled because of --attention-backend feather" in text
    )
    print("   CUDA graphs turned off with a log line:", ok)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["versions"]:
        return versions()
    if args[:1] == ["server"] and len(args) == 3:
        return server(args[1], args[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
