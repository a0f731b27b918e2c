"""Helpers around ``sglang.Engine``."""

from __future__ import annotations

import atexit
import contextlib
from multiprocessing import resource_tracker


def shutdown_engine(engine) -> None:
    """``engine.shutdown()``, once, sparing Python's multiprocessing resource tracker.

    NOTE: ``sglang.Engine.__init__`` registers ``shutdown`` with atexit. Run again at exit, after
    an explicit shutdown, it logs through handlers whose streams may be closed by then (pytest's
    capture: "--- Logging error --- ... kill_process_tree"), so the registration is removed.

    NOTE: ``Engine.shutdown`` ends with ``kill_process_tree(os.getpid(), include_parent=False)``,
    which SIGKILLs every child of this process, the resource tracker included. Python relaunches
    the tracker on its next use ("resource_tracker: process died unexpectedly"), but the new one
    has lost what the old one tracked, and unregistering those names at exit printed
    ``KeyError: '/mp-...'`` tracebacks (seen after the test suite's in-process engines). The
    tracker is passed as ``skip_pid`` while the engine shuts down.
    """
    try:
        with _spare_resource_tracker():
            engine.shutdown()
    finally:
        atexit.unregister(engine.shutdown)


@contextlib.contextmanager
def _spare_resource_tracker():
    import sglang.srt.entrypoints.engine as engine_module

    kill = getattr(engine_module, "kill_process_tree", None)
    tracker_pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    if kill is None or tracker_pid is None:  # no tracker running: nothing to spare
        yield
        return

    def kill_sparing_tracker(parent_pid, include_parent=True, skip_pid=None, **kwargs):
        return kill(
            parent_pid,
            include_parent=include_parent,
            skip_pid=tracker_pid if skip_pid is None else skip_pid,
            **kwargs,
        )

    engine_module.kill_process_tree = kill_sparing_tracker
    try:
        yield
    finally:
        engine_module.kill_process_tree = kill
