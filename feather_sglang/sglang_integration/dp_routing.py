"""``--load-balance-method prefix_group``: data-parallel routing by prefix group."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import nullcontext

from feather_sglang.chunk_hash import chunk_hashes
from feather_sglang.sglang_integration.names import POLICY_NAME, PREFIX_GROUP, feather_config_of

logger = logging.getLogger(__name__)

MIN_SHARE = 0.5  # shared prefix / prompt length for a request to follow its group's worker
# A home takes the request while its load + 1 <= (1 + BALANCE_REL_SLACK) x mean + BALANCE_ABS.
BALANCE_REL_SLACK = 0.02
BALANCE_ABS = 3
MAX_KEYS = 1 << 20  # prefix keys remembered (least recently used dropped first)
MAX_CHUNKS = 400  # leading chunks of a prompt considered


class PrefixGroupRouter:
    """Chunk keys mapped to the workers serving them, first first (``docs/scale-out.md``)."""

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
        # Every prefix of an owned prefix is owned: the depth is the first miss.
        depth = next((i for i, key in enumerate(keys) if key not in self.homes), len(keys))
        homes = self.homes[keys[depth - 1]] if depth else None
        chosen = least = min(active, key=lambda w: loads[w])
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
            f"feather prefix-group routing: {dict(sorted(router.routed.items()))} requests per "
            f"worker, {router.by_group} followed their group"
        )


def data_parallel_controller_init_around(original, controller, server_args, *args, **kwargs):
    """AROUND ``DataParallelController.__init__``: prefix-group dispatch, a worker watchdog."""
    from sglang.srt.runtime_context import get_device, get_parallel

    parallel = get_parallel()
    routed = parallel.load_balance_method == PREFIX_GROUP
    # Built with SGLang's total_requests method, whose loads feather's router reads.
    with parallel.override(load_balance_method="total_requests") if routed else nullcontext():
        result = original(controller, server_args, *args, **kwargs)
    if routed:
        router = PrefixGroupRouter(feather_config_of(server_args).chunk_size)
        controller.feather_router = router
        controller.dispatching = lambda req: _dispatch(controller, router, req)
        workers = len(controller.workers)
        logger.info(
            f"feather: data-parallel requests are routed by prefix group ({workers} workers)"
        )
    if not routed and getattr(server_args, "schedule_policy", None) != POLICY_NAME:
        return result
    procs = [p for p in getattr(controller, "scheduler_procs", []) if p is not None]
    if procs:
        from sglang.srt.utils.watchdog import SubprocessWatchdog

        controller.feather_watchdog = SubprocessWatchdog(
            processes=procs, process_names=[f"scheduler_DP{i}" for i in range(len(procs))]
        )
        controller.feather_watchdog.start()
    if get_device().sleep_on_idle:
        controller.event_loop = lambda: _event_loop_sleeping_on_idle(controller)
    return result


def _event_loop_sleeping_on_idle(controller) -> None:
    """SGLang's controller loop, waiting on its socket where SGLang's polls it without pause."""
    import zmq
    from sglang.srt.managers.data_parallel_controller import sock_recv

    sock = controller.recv_from_tokenizer
    while True:
        controller.soft_watchdog.feed()
        if sock.poll(timeout=1000):
            while True:
                try:
                    req = sock_recv(sock, flags=zmq.NOBLOCK)
                except zmq.ZMQError:
                    break
                controller._request_dispatcher(req)
