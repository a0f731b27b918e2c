"""Helpers around ``sglang.Engine``."""

from __future__ import annotations

import atexit


def shutdown_engine(engine) -> None:
    """``engine.shutdown()``, once.

    NOTE: ``sglang.Engine.__init__`` registers ``shutdown`` with atexit. Run again at exit, after
    an explicit shutdown, it logs through handlers whose streams may be closed by then (pytest's
    capture: "--- Logging error --- ... kill_process_tree"), so the registration is removed.
    """
    try:
        engine.shutdown()
    finally:
        atexit.unregister(engine.shutdown)
