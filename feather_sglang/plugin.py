"""SGLang general-plugin entry point (group ``sglang.srt.plugins``, name ``feather``)."""

from __future__ import annotations


def register() -> None:
    """Idempotent: registers feather's hooks with SGLang's HookRegistry."""
    from feather_sglang.sglang_integration import install_hooks

    install_hooks()
