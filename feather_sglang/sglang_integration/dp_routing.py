"""``--load-balance-method prefix_group``: SGLang's data-parallel controller routes by prefix group.

SGLang's own methods (round robin, fewest requests, fewest tokens) spread every prefix group
over every worker: each worker then computes each group's prefix and runs mixed batches. This
method sends a request to a worker that already serves the longest chunk-aligned prefix it
shares with earlier requests, when that prefix is at least ``MIN_SHARE`` of its prompt (as
sglang-router's cache-aware policy does with its cache threshold) and that worker is not
overloaded; otherwise to the least-loaded worker, which then serves that prefix too (see
:class:`PrefixGroupRouter`).

Loads are SGLang's own: the controller's ``DPBudget`` (the workers' published request counts,
plus one per dispatch since), which SGLang keeps fresh for its ``total_requests`` method; the
controller is built with that method and then dispatches through :class:`PrefixGroupRouter`.
A fault in the router is contained: logged once, and that request goes round robin.

With feather workers the controller also watches them (SGLang's ``SubprocessWatchdog``): SGLang's
launcher watches only the controller, so a worker that died would leave its requests waiting
forever; now it takes the server down, and every client gets an error.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

from feather_sglang.chunk_hash import chunk_hashes
from feather_sglang.sglang_integration.names import POLICY_NAME, PREFIX_GROUP, feather_config_of

logger = logging.getLogger(__name__)

MIN_SHARE = 0.5  # shared prefix / prompt length for a request to follow its group's worker
# Bounded loads: a group's worker takes the request while its load stays within
# (1 + BALANCE_REL_SLACK) x the mean load + BALANCE_ABS; beyond, the least-loaded worker does.
BALANCE_REL_SLACK = 0.02
BALANCE_ABS = 3
MAX_KEYS = 1 << 20  # prefix keys remembered (least recently used dropped first)
MAX_CHUNKS = 400  # leading chunks of a prompt considered


class PrefixGroupRouter:
    """Which workers serve each prefix: chunk keys (as in the CHT: the hash of chunks 0..i)
    mapped to the workers that serve them (its *homes*), first the one that served it first.

    A request follows its longest owned prefix to the least-loaded of that prefix's homes while
    that home's load stays within the bound; when every home is above it, the least-loaded
    worker takes the request and becomes one more home of the prefix, so the group's next
    requests can go there too. A group thus spreads over as few workers as its load needs.
    """

    def __init__(self, chunk_size: int, max_keys: int = MAX_KEYS) -> None:
        self.chunk_size = chunk_size
        self.max_keys = max_keys
        self.homes: OrderedDict[int, list[int]] = OrderedDict()
        self.routed: dict[int, int] = {}  # requests sent per worker
        self.by_group = 0  # requests that went to a home of their prefix

    def pick(self, token_ids: Sequence[int], loads: Sequence[int], active: Sequence[int]) -> int:
        """The worker for a prompt, given each worker's load and the active workers."""
        chunk = self.chunk_size
        keys = chunk_hashes(token_ids[: MAX_CHUNKS * chunk], chunk)
        homes, depth = None, 0
        for key in keys:  # every prefix of an owned prefix is owned: stop at the first miss
            found = self.homes.get(key)
            if found is None:
                break
            homes, depth = found, depth + 1
        least = min(active, key=lambda w: loads[w])
        chosen = least
        if homes is not None and min(depth * chunk, len(token_ids)) >= MIN_SHARE * len(token_ids):
            bound = (1 + BALANCE_REL_SLACK) * (sum(loads[w] for w in active) + 1) / len(active)
            bound += BALANCE_ABS
            home = min((w for w in homes if w in active), key=lambda w: loads[w], default=None)
            if home is not None and loads[home] + 1 <= bound:
                chosen = home
                self.by_group += 1
            elif least not in homes:
                homes.append(least)  # the group's load needs one more worker
        table = self.homes
        for key in keys[:depth]:
            table.move_to_end(key)
        for key in keys[depth:]:
            table[key] = [chosen]
        while len(table) > self.max_keys:
            table.popitem(last=False)
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
    """AROUND hook on ``DataParallelController.__init__``.

    With ``prefix_group``: build the controller as for ``total_requests`` (so that SGLang keeps
    the load budget fresh), then dispatch through a :class:`PrefixGroupRouter`. With feather
    workers: watch them with SGLang's ``SubprocessWatchdog``, so that a worker that dies takes
    the server down with it (its clients get an error) instead of leaving its requests waiting.
    """
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    routed = parallel.load_balance_method == PREFIX_GROUP
    if routed:
        with parallel.override(load_balance_method="total_requests"):
            result = original(controller, server_args, *args, **kwargs)
        router = PrefixGroupRouter(feather_config_of(server_args).chunk_size)
        controller.feather_router = router
        controller.dispatching = lambda req: _dispatch(controller, router, req)
        logger.info(
            "feather: data-parallel requests are routed by prefix group (%d workers)",
            len(controller.workers),
        )
    else:
        result = original(controller, server_args, *args, **kwargs)
    if routed or getattr(server_args, "schedule_policy", None) == POLICY_NAME:
        _watch_workers(controller)
    return result


def _watch_workers(controller) -> None:
    from sglang.srt.utils.watchdog import SubprocessWatchdog

    procs = [p for p in getattr(controller, "scheduler_procs", []) if p is not None]
    if procs:
        controller.feather_watchdog = SubprocessWatchdog(
            processes=procs, process_names=[f"scheduler_DP{i}" for i in range(len(procs))]
        )
        controller.feather_watchdog.start()
