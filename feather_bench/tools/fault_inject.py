"""Fault injection for tests: the N-th call of one of feather's seams raises
:class:`InjectedFault` (``docs/reliability.md``).

``FEATHER_FAULT_INJECT=SEAM:N[,SEAM:N]`` takes effect only with
``FEATHER_FAULT_INJECT_ACK=break-this-test-server`` as well. This is an SGLang general plugin of
its own (entry point ``feather-fault-inject``), apart from the feather plugin: it wraps feather's
methods through SGLang's HookRegistry, so feather's own code carries no injection at all.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable

logger = logging.getLogger(__name__)

INJECT_ENV = "FEATHER_FAULT_INJECT"
ACK_ENV = "FEATHER_FAULT_INJECT_ACK"
ACK_PHRASE = "break-this-test-server"
_STATE = "feather_sglang.sglang_integration.policy.FeatherState"
# seam -> the callables whose calls it counts, each run inside one of feather's fault guards
SEAMS = {
    "plan": (f"{_STATE}.order",),
    "rebuild": (f"{_STATE}.rebuild",),
    "enqueue": (f"{_STATE}.on_enqueue_hooked",),
    "abort": (f"{_STATE}.on_removed",),
    "pass_end": (f"{_STATE}.on_pass_end",),
    "step": (f"{_STATE}.on_step", f"{_STATE}.on_idle"),
    "backend": ("feather_kernels.dispatch.run_decode", "feather_kernels.dispatch.run_extend"),
}


class InjectedFault(RuntimeError):
    """Raised at a seam by ``FEATHER_FAULT_INJECT``."""


def parse(spec: str) -> dict[str, int]:
    at = {}
    for part in spec.split(","):
        seam, _, n = part.strip().partition(":")
        if seam not in SEAMS or not n.isdigit() or int(n) < 1:
            raise ValueError(
                f"{INJECT_ENV}={spec!r}: expected SEAM:N[,SEAM:N] with SEAM one of "
                f"{', '.join(SEAMS)} and N >= 1"
            )
        at[seam] = int(n)
    return at


def hooks(spec: str) -> list[tuple[str, Callable]]:
    """(target, AROUND hook) pairs: the hooks of a seam raise at its N-th call, counted together."""
    calls: Counter = Counter()

    def raising_at(seam: str, n: int) -> Callable:
        def around(original, *args, **kwargs):
            calls[seam] += 1
            if calls[seam] == n:
                raise InjectedFault(f"injected fault at {seam} call {n}")
            return original(*args, **kwargs)

        return around

    return [(t, raising_at(seam, n)) for seam, n in parse(spec).items() for t in SEAMS[seam]]


def spec_from_env() -> str | None:
    """``FEATHER_FAULT_INJECT`` if it is acknowledged, else None."""
    spec = os.environ.get(INJECT_ENV)
    if spec and os.environ.get(ACK_ENV) != ACK_PHRASE:
        logger.warning(
            f"{INJECT_ENV} is set but {ACK_ENV} does not hold the test phrase: fault injection "
            "stays off"
        )
        return None
    return spec or None


def register() -> None:
    """SGLang general-plugin entry point: the injection hooks, where acknowledged."""
    spec = spec_from_env()
    if spec is None:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, around in hooks(spec):
        HookRegistry.register(target, around, HookType.AROUND)
    logger.warning("feather FAULT INJECTION is on (%s=%s): for tests only", INJECT_ENV, spec)
