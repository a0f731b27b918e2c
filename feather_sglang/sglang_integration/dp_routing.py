"""``--load-balance-method prefix_group``: SGLang's data-parallel controller routes by prefix group.

SGLang's own methods (round robin, fewest requests, fewest tokens) spread every prefix group
over every worker: each worker then computes each group's prefix and runs mixed batches. This
method sends a request to the worker that already serves the longest chunk-aligned prefix it
shares with earlier requests, when that prefix is at least ``MIN_SHARE`` of its prompt (as
sglang-router's cache-aware policy does with its cache threshold) and that worker is not
overloaded; otherwise to the least-loaded worker, which then owns the request's prefix.

Loads are SGLang's own: the controller's ``DPBudget`` (the workers' published request counts,
plus one per dispatch since), which SGLang keeps fresh for its ``total_requests`` method; the
controller is built with that method and then dispatches through :class:`PrefixGroupRouter`.
A fault in the router is contained: logged once, and that request goes round robin.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

from feather_sglang.chunk_hash import chunk_hashes
from feather_sglang.sglang_integration.names import PREFIX_GROUP, feather_config_of

logger = logging.getLogger(__name__)

MIN_SHARE = 0.5  # shared prefix / prompt length for a request to follow its group's worker
# Bounded loads: a group's worker takes the request while its load stays within
# (1 + BALANCE_REL_SLACK) x the mean load + BALANCE_ABS; beyond, the least-loaded worker does.
BALANCE_REL_SLACK = 0.02
BALANCE_ABS = 3
MAX_KEYS = 1 << 20  # prefix keys remembered (least recently used dropped first)
MAX_CHUNKS = 400  # leading chunks of a prompt considered


class PrefixGroupRouter:
    """Which worker serves each prefix: chunk keys (as in the CHT: the hash of chunks 0..i)
    mapped to the worker that first served them."""

    def __init__(self, chunk_size: int, max_keys: int = MAX_KEYS) -> None:
        self.chunk_size = chunk_size
        self.max_keys = max_keys
        self.owner: OrderedDict[int, int] = OrderedDict()
        self.routed: dict[int, int] = {}  # requests sent per worker
        self.by_group = 0  # requests that followed their group's worker

    def pick(self, token_ids: Sequence[int], loads: Sequence[int], active: Sequence[int]) -> int:
        """The worker for a prompt, given each worker's load and the active workers."""
        chunk = self.chunk_size
        keys = chunk_hashes(token_ids[: MAX_CHUNKS * chunk], chunk)
        owner, depth = None, 0
        for key in keys:  # every prefix of an owned prefix is owned: stop at the first miss
            worker = self.owner.get(key)
            if worker is None:
                break
            owner, depth = worker, depth + 1
        least = min(active, key=lambda w: loads[w])
        chosen = least
        if (
            owner is not None
            and owner in active
            and min(depth * chunk, len(token_ids)) >= MIN_SHARE * len(token_ids)
            and loads[owner] + 1
            <= (1 + BALANCE_REL_SLACK) * (sum(loads[w] for w in active) + 1) / len(active)
            + BALANCE_ABS
        ):
            chosen = owner
            self.by_group += 1
        owned = self.owner
        for key in keys[:depth]:
            owned.move_to_end(key)
        for key in keys[depth:]:
            owned[key] = chosen
        while len(owned) > self.max_keys:
            owned.popitem(last=False)
        self.routed[chosen] = self.routed.get(chosen, 0) + 1
        return chosen


def _dispatch(controller, router: PrefixGroupRouter, req) -> None:
    """The controller's ``dispatching`` for prefix-group routing."""
    from sglang.srt.managers.data_parallel_controller import sock_send

    if controller.maybe_external_dp_rank_routing(req):
        return
    try:
        active = [w for w in controller._active_workers if controller.status[w]]
        loads = controller.dp_budget.total_requests
        worker = router.pick(req.input_ids, loads, active)
    except Exception:  # noqa: BLE001 - a fault of feather's never stops the controller
        if not getattr(controller, "_feather_router_faulted", False):
            controller._feather_router_faulted = True
            logger.exception("feather: prefix-group routing failed; this request goes round robin")
        controller.round_robin_scheduler(req)
        return
    loads[worker] += 1  # as SGLang's own load methods count a dispatch until the next refresh
    sock_send(controller.workers[worker], req)
    if sum(router.routed.values()) % 1000 == 0:
        logger.info(
            "feather prefix-group routing: %s requests per worker, %d followed their group",
            dict(sorted(router.routed.items())),
            router.by_group,
        )


def data_parallel_controller_init_around(original, controller, server_args, *args, **kwargs):
    """AROUND hook on ``DataParallelController.__init__``: with ``prefix_group``, build the
    controller as for ``total_requests`` (so that SGLang keeps the load budget fresh), then
    dispatch through a :class:`PrefixGroupRouter`."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if parallel.load_balance_method != PREFIX_GROUP:
        return original(controller, server_args, *args, **kwargs)
    with parallel.override(load_balance_method="total_requests"):
        result = original(controller, server_args, *args, **kwargs)
    router = PrefixGroupRouter(feather_config_of(server_args).chunk_size)
    controller.feather_router = router
    controller.dispatching = lambda req: _dispatch(controller, router, req)
    logger.info(
        "feather: data-parallel requests are routed by prefix group (%d workers)",
        len(controller.workers),
    )
    return result
