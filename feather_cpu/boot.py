"""Imported by ``feather_sglang_cpu_runtime.pth`` at start-up; a failure is only reported."""

try:
    from feather_cpu import apply as _apply

    _apply()
except Exception as _exc:  # pragma: no cover - defensive
    import sys as _sys

    print(f"feather-sglang: CPU runtime not applied: {_exc!r}", file=_sys.stderr)
