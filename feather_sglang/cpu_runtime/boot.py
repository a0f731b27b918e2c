"""Imported by ``feather_sglang_cpu_runtime.pth`` at interpreter start-up; never breaks Python
start-up (a failure is reported once and ignored)."""

try:
    from feather_sglang.cpu_runtime import apply as _apply

    _apply()
except Exception as _exc:  # pragma: no cover - defensive
    import sys as _sys

    print(f"feather-sglang: CPU runtime not applied: {_exc!r}", file=_sys.stderr)
