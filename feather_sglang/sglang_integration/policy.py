"""``feather`` inside SGLang's scheduler: the policy and its hooks (``docs/design.md``)."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
from sglang.srt.mem_cache.common import match_kv_cache

from feather_sglang.agents import ServerShape
from feather_sglang.planner import AdmissionPlanner, SharedClock
from feather_sglang.sglang_integration.faults import FaultLog
from feather_sglang.sglang_integration.names import (
    ATTENTION_BACKEND_NAME,
    POLICY_NAME,
    feather_config_of,
)

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch

logger = logging.getLogger(__name__)
# FEATHER_CHECK_INVARIANTS=1: check feather's view against the queue and the batch every pass.
CHECK_INVARIANTS = os.environ.get("FEATHER_CHECK_INVARIANTS") == "1"
# Aborted waiting requests tolerated before the queue slots are rebuilt (see FeatherState._slot).
MAX_SHIFT_SEARCH = 1024


class FeatherSchedulePolicy(SchedulePolicy):
    """SGLang's SchedulePolicy plus ``feather`` (fcfs underneath, for code reading ``.policy``)."""

    def __init__(self, policy: str, tree_cache, *args, **kwargs):
        feather = policy == POLICY_NAME
        super().__init__("fcfs" if feather else policy, tree_cache, *args, **kwargs)
        self.feather = FeatherState(tree_cache) if feather else None

    def calc_priority(self, waiting_queue, running_batch=None, processed_tokens: int = 0) -> None:
        if self.feather is None or not self.feather.safe_order(waiting_queue, running_batch):
            return super().calc_priority(waiting_queue, running_batch, processed_tokens)
        # fcfs's prefix match of every waiting request (O(W x T), for load reports) is skipped.
        self._touch_waiting_prefixes(self.policy, waiting_queue)


class FeatherState:
    """Per-scheduler state of the feather policy; attached to a scheduler after init."""

    def __init__(self, tree_cache) -> None:
        self.tree_cache = tree_cache
        self.scheduler = None
        self.planner: AdmissionPlanner | None = None
        self.rank_clock: SharedClock | None = None  # tensor parallelism: rank 0's clock
        self._reset()
        # Counters; ``adopted``: requests queued without the enqueue hook, found at the tail.
        self.passes = self.steps = self.resyncs = self.reindexes = 0
        self.rebuilds = self.reused_rids = self.adopted = 0
        # Seconds in feather's calc_priority, and of the scheduler loop between forward steps.
        self.sched_seconds = self.busy_seconds = 0.0
        self._last_step_start: float | None = None
        self.faults = FaultLog("feather")
        self.stood_down = False  # after a fault that a rebuild could not mend: fcfs for good
        self._dirty = False  # a hook failed: rebuild from SGLang's queue and batch next pass
        self._idle_logged = True  # the idle line is logged once per busy period

    def _reset(self) -> None:
        self.reqs: dict = {}  # rid -> Req for requests the planner tracks
        self.plan_rids: frozenset = frozenset()
        # rid -> index + _slot_base in SGLang's waiting queue (docs/design.md, "queue slots").
        self._slot: dict = {}
        self._slot_base = self._shift = 0
        self._synced_running: list | None = None  # running rids as of the last sync

    def attach(self, scheduler) -> None:
        self.scheduler, server_args = scheduler, scheduler.server_args
        config = feather_config_of(server_args)
        # Tensor-parallel ranks admit alike on the first rank's clock, broadcast once per pass.
        self.rank_clock = None
        if (getattr(server_args, "tp_size", 1) or 1) > 1:
            from sglang.srt.distributed.communication_op import attn_cp_tp_broadcast_pyobj

            self.rank_clock = SharedClock(attn_cp_tp_broadcast_pyobj)
        self.planner = AdmissionPlanner(config, clock=self.rank_clock or time.monotonic)
        self.radix_enabled = not getattr(self.tree_cache, "disable", True)
        if not self.radix_enabled:
            logger.warning(
                "feather with the radix cache disabled: batches are still grouped by prefix, "
                "but requests of a group do not reuse each other's prefix KV (each computes "
                "it again), and the prefix-leader step is off."
            )
        shape = ServerShape(
            server_args.attention_backend == ATTENTION_BACKEND_NAME,
            int(getattr(scheduler, "max_running_requests", 0) or 0),
            int(getattr(scheduler, "max_total_num_tokens", 0) or 0),
            str(server_args.dtype),
        )
        self.planner.agent.bind_server(shape)
        logger.info("feather schedule policy: %s", config.as_dict())

    # ---- fault containment ---------------------------------------------------------------
    def safe_order(self, waiting_queue: list[Req], running_batch: ScheduleBatch | None) -> bool:
        """:meth:`order`, rebuilding after a fault; False once feather stood down (fcfs runs)."""
        if self.stood_down:
            return False
        try:
            if self._dirty:
                self.rebuild(waiting_queue, running_batch)
            self.order(waiting_queue, running_batch)
            return True
        except Exception as exc:  # noqa: BLE001
            self.faults.record(
                "plan", exc, "rebuilding feather's state from the scheduler's queue and batch"
            )
        try:
            self.rebuild(waiting_queue, running_batch)
            self.order(waiting_queue, running_batch)
            return True
        except Exception as exc:  # noqa: BLE001
            self.faults.record("rebuild", exc, "feather stands down")
            self.stand_down()
            return False

    def rebuild(self, waiting_queue: list[Req], running_batch: ScheduleBatch | None) -> None:
        """Feather's state anew from SGLang's queue and batch (the agent is kept)."""
        old = self.planner
        self.planner = AdmissionPlanner(old.config, clock=old.clock, agent=old.agent)
        self._reset()
        running = self._running_reqs(running_batch)
        self._sync_running(running)
        for i, req in enumerate(waiting_queue):
            self.on_enqueue(req, i)
        self._dirty = False
        self.rebuilds += 1
        logger.warning(
            f"feather: state rebuilt from the scheduler ({len(waiting_queue)} waiting, "
            f"{len(running)} running; {self.rebuilds} rebuilds)"
        )

    def stand_down(self) -> None:
        self.stood_down = True
        self._reset()
        logger.error(
            f"feather stands down after {self.faults.total} fault(s) {dict(self.faults.counts)}: "
            "the scheduler runs fcfs for the rest of this server's life; restart the server to "
            "schedule with feather again"
        )

    # ---- events from the scheduler -------------------------------------------------------
    def on_enqueue(self, req: Req, queue_index: int | None = None) -> None:
        """``req`` entered the waiting queue (at ``queue_index``); a reused rid is a new request."""
        known = self.reqs.get(req.rid)
        if known is not None and known is not req:
            self.planner.forget(req.rid)
            self._forget(req.rid)
            self.reused_rids += 1
        self.reqs[req.rid] = req
        if queue_index is not None:
            self._slot[req.rid] = queue_index + self._slot_base
        self.planner.on_enqueue(req.rid, req.origin_input_ids)

    def on_removed(self, req: Req) -> None:
        """SGLang released an aborted request: if it was waiting, forget it now."""
        if self._known_waiting(req):
            self.planner.forget(req.rid)
            self._forget(req.rid)
            self._shift += 1

    def on_pass_end(self, new_batch: ScheduleBatch | None) -> None:
        admitted = [r.rid for r in new_batch.reqs] if new_batch is not None else []
        self.planner.end_pass(admitted)
        # SGLang removed the admitted from the queue; the plan was at its front, in order.
        planned, slot = self.plan_rids, self._slot
        for rid in admitted:
            if rid in planned:
                slot.pop(rid, None)
                self._slot_base += 1
        self.plan_rids = frozenset()

    def _forget(self, rid) -> None:
        self.reqs.pop(rid, None)
        self._slot.pop(rid, None)

    # ---- one pass ------------------------------------------------------------------------
    def order(self, waiting_queue: list[Req], running_batch: ScheduleBatch | None) -> None:
        start = time.perf_counter()
        if self.rank_clock is not None:
            self.rank_clock.tick()
        planner, scheduler, reqs = self.planner, self.scheduler, self.reqs
        if running_batch is None:  # not how SGLang calls it: what runs is what the CHT says
            self._sync_running({r: reqs[r] for r in planner.cht.running_ids() if r in reqs})
        else:
            self._sync_running(self._running_reqs(running_batch))
        self._adopt_tail(waiting_queue, len(waiting_queue))
        if len(waiting_queue) != planner.num_waiting:
            self.resyncs += 1
            for rid in planner.sync_waiting(
                {r.rid: (lambda r=r: r.origin_input_ids) for r in waiting_queue}
            ):
                self._forget(rid)
            for r in waiting_queue:
                reqs[r.rid] = r
            self._reindex(waiting_queue)
        max_new = scheduler.get_num_allocatable_reqs(
            len(running_batch.reqs) if running_batch else 0
        )
        plan = planner.plan(
            max_new=max(max_new, 0),
            cached_prefix_tokens=self._cached_prefix_tokens if self.radix_enabled else None,
            token_budget=scheduler.max_prefill_tokens,
            kv_free_tokens=self._kv_free_tokens(),
            kv_capacity_tokens=getattr(scheduler, "max_total_num_tokens", None),
        )
        self.plan_rids = frozenset(plan.rids)
        if plan.rids:
            self._move_to_front(waiting_queue, [reqs[rid] for rid in plan.rids])
        if CHECK_INVARIANTS:
            self.check_invariants(waiting_queue, running_batch)
        self.sched_seconds += time.perf_counter() - start
        self.passes += 1

    def _running_reqs(self, running_batch: ScheduleBatch | None) -> dict:
        """rid -> Req of the running batch plus the chunked request."""
        running = {} if running_batch is None else {r.rid: r for r in running_batch.reqs}
        chunked = getattr(self.scheduler, "chunked_req", None)
        if chunked is not None:
            running[chunked.rid] = chunked
        return running

    def _sync_running(self, running: dict) -> None:
        """Make the CHT's running set ``running`` (rid -> Req), unless the last sync made it so."""
        rids, planner = list(running), self.planner
        if (
            rids == self._synced_running
            and len(rids) == planner.cht.num_running
            and not planner.has_pending
        ):
            return
        self.reqs.update(running)
        # Forget each sync's departures at once: one may come back as waiting in the next sync.
        for rid in planner.sync_running(
            {rid: (lambda r=r: r.origin_input_ids) for rid, r in running.items()}
        ):
            self._forget(rid)
        self._synced_running = rids

    def _known_waiting(self, req: Req) -> bool:
        return self.reqs.get(req.rid) is req and self.planner.is_waiting(req.rid)

    def _adopt_tail(self, queue: list[Req], end: int) -> None:
        """Take in the requests at the end of ``queue[:end]`` appended without the enqueue hook."""
        start = end
        while start > 0 and not self._known_waiting(queue[start - 1]):
            start -= 1
        for i in range(start, end):
            self.on_enqueue(queue[i], i)
        self.adopted += end - start

    def on_enqueue_hooked(self, queue: list[Req], req: Req) -> None:
        """The enqueue hook: ``req`` was appended to ``queue`` (earlier unhooked ones adopted)."""
        self._adopt_tail(queue, len(queue) - 1)
        self.on_enqueue(req, len(queue) - 1)

    def check_invariants(self, queue: list[Req], running_batch: ScheduleBatch | None) -> None:
        """The queue is the CHT's waiting set + the plan, the batch + the plan its running set."""
        cht, planned = self.planner.cht, set(self.plan_rids)
        queued = {r.rid for r in queue}
        waiting = {rid for rid in self.reqs if self.planner.is_waiting(rid)}
        if queued - planned != waiting or len(waiting) != cht.num_waiting or not planned <= queued:
            raise AssertionError(
                f"feather invariant: the queue holds {len(queued)} rids ({len(planned)} planned), "
                f"the CHT waits on {cht.num_waiting}; only in the queue: "
                f"{sorted(queued - planned - waiting)[:5]}, only in the CHT: {sorted(waiting - queued)[:5]}"
            )
        if running_batch is not None:
            running = set(self._running_reqs(running_batch))
            if running | planned != set(cht.running_ids()):
                raise AssertionError(
                    f"feather invariant: batch + plan {sorted(running | planned)[:5]} != CHT "
                    f"running {sorted(cht.running_ids())[:5]}"
                )

    def _move_to_front(self, queue: list[Req], planned: list[Req]) -> None:
        """Put ``planned`` at the front of ``queue``, in order, by swaps: O(len(planned))."""
        slot = self._slot
        if self._shift > MAX_SHIFT_SEARCH:
            self._reindex(queue)
        for i, req in enumerate(planned):
            j = slot.get(req.rid, -1) - self._slot_base
            if not (0 <= j < len(queue) and queue[j] is req):
                j = self._search(queue, req, j)
            if j < 0:
                self._reindex(queue)
                j = slot.get(req.rid, -1)
                if j < 0:
                    raise RuntimeError(
                        f"feather planned {req.rid!r}, which is not in the waiting queue"
                    )
            if j != i:
                displaced = queue[i]
                queue[i], queue[j] = req, displaced
                slot[displaced.rid] = j + self._slot_base
            slot[req.rid] = i + self._slot_base

    def _search(self, queue: list[Req], req: Req, j: int) -> int:
        """Where ``req``, recorded at ``j``, sits after aborts' pops, else -1."""
        if j < 0 or not self._shift:
            return -1
        try:
            return queue.index(req, max(j - self._shift, 0), j + 1)
        except ValueError:
            return -1

    def _reindex(self, queue: list[Req]) -> None:
        """Rebuild every waiting request's slot: O(W)."""
        self.reindexes += 1
        self._shift = self._slot_base = 0
        self._slot.clear()
        self._slot.update({r.rid: i for i, r in enumerate(queue)})

    def _kv_free_tokens(self) -> int | None:
        """KV cache tokens free or evictable now; None if the scheduler does not expose them."""
        try:
            free = self.scheduler.token_to_kv_pool_allocator.available_size()
            return free + (self.tree_cache.evictable_size() if self.radix_enabled else 0)
        except AttributeError:
            return None

    def _cached_prefix_tokens(self, rid) -> int:
        req = self.reqs[rid]
        return match_kv_cache(req, self.tree_cache, req.origin_input_ids).device_prefix_len

    def on_step(self, batch, started: float, ended: float) -> None:
        """A forward step ran from ``started`` to ``ended`` (perf_counter seconds)."""
        self._idle_logged = False
        if self._last_step_start is not None:
            self.busy_seconds += started - self._last_step_start
        self._last_step_start = started
        self.steps += 1
        decode = getattr(batch, "forward_mode", None) is not None and batch.forward_mode.is_decode()
        self.planner.on_step(batch.batch_size(), ended - started, decode)
        if self.steps % max(self.scheduler.server_args.decode_log_interval, 1) == 0:
            self.log_stats()

    def on_idle(self) -> None:
        """No batch this loop: once nothing runs, finished requests are forgotten now."""
        self._last_step_start = None
        scheduler, planner = self.scheduler, self.planner
        nothing_runs = not scheduler.running_batch.reqs
        if (
            nothing_runs
            and planner.cht.num_running
            and getattr(scheduler, "chunked_req", None) is None
            and not planner.has_pending
        ):
            for rid in planner.sync_running({}):
                self._forget(rid)
            self._synced_running = []
        if nothing_runs and not self._idle_logged and not scheduler.waiting_queue:
            self._idle_logged = True
            logger.info(
                f"feather: idle, tracking {len(self.reqs)} requests, "
                f"{planner.cht.memory_footprint().nodes} CHT nodes (faults {self.faults.total}, "
                f"rebuilds {self.rebuilds})"
            )

    def log_stats(self) -> None:
        """One line at SGLang's decode log interval: feather's share of the scheduler loop."""
        s = self.planner.take_stats()
        passes, seconds, busy = self.passes, self.sched_seconds, self.busy_seconds
        self.passes, self.sched_seconds, self.busy_seconds = 0, 0.0, 0.0
        if passes == 0:
            return
        share = f"{100 * seconds / busy:.3f}% of step time" if busy > 0 else "n/a of step time"
        logger.info(
            f"feather: sched_time={1e3 * seconds / passes:.3f} ms/pass ({share}) passes={passes} "
            f"admitted={s.admitted} rolled_back={s.rolled_back} starved={s.starved} "
            f"stops={s.stops} waiting={self.planner.num_waiting} "
            f"running={self.planner.cht.num_running} resyncs={self.resyncs} "
            f"reindexes={self.reindexes} faults={self.faults.total} rebuilds={self.rebuilds} "
            f"cached_picks={s.cached_picks}"
        )
        learned = self.planner.agent.describe()
        if learned:
            logger.info("feather agent %s: %s", self.planner.agent.name, learned)


def _feather_state(scheduler) -> FeatherState | None:
    return getattr(getattr(scheduler, "policy", None), "feather", None)


def _guarded(scheduler, seam: str, method: str, *args) -> None:
    """``FeatherState.<method>(*args)`` for feather; a fault is logged, counted and rebuilt."""
    state = _feather_state(scheduler)
    if state is None or state.stood_down:
        return
    try:
        getattr(state, method)(*args)
    except Exception as exc:  # noqa: BLE001 - no fault of feather's may reach the scheduler
        state._dirty = True
        state.faults.record(
            seam, exc, "feather's state will be rebuilt from the scheduler's queue and batch"
        )


# ---- scheduler hooks (registered by install_hooks from SCHEDULER_HOOKS) ------------------------
def init_schedule_policy_after(result, scheduler, *args, **kwargs):
    state = _feather_state(scheduler)
    if state is None:
        return result
    try:
        state.attach(scheduler)
    except Exception as exc:  # noqa: BLE001
        state.faults.record("attach", exc, "feather stands down")
        state.stand_down()

    class FeatherPrefillAdder(PrefillAdder):
        """Admits only the requests of the current feather plan."""

        def add_one_req(self, req, has_chunked_req, truncation_align_size):
            if req.rid not in state.plan_rids and not state.stood_down:
                return AddReqResult.OTHER  # the agent said STOP (or the plan is used up)
            return super().add_one_req(req, has_chunked_req, truncation_align_size)

    scheduler._feather_adder_class = FeatherPrefillAdder
    return result


def get_prefill_adder_class_around(original, scheduler, *args, **kwargs):
    cls = getattr(scheduler, "_feather_adder_class", None)
    return cls if cls is not None else original(scheduler, *args, **kwargs)


def add_request_to_queue_after(result, scheduler, req, *args, **kwargs):
    queue = scheduler.waiting_queue
    if queue and queue[-1] is req:
        _guarded(scheduler, "enqueue", "on_enqueue_hooked", queue, req)
    return result


def run_batch_around(original, scheduler, batch, *args, **kwargs):
    started = time.perf_counter()
    result = original(scheduler, batch, *args, **kwargs)
    ended = time.perf_counter()
    _guarded(scheduler, "step", "on_step", batch, started, ended)
    return result


def release_aborted_request_after(result, scheduler, req, *args, **kwargs):
    _guarded(scheduler, "abort", "on_removed", req)
    return result


def on_idle_after(result, scheduler, *args, **kwargs):
    _guarded(scheduler, "step", "on_idle")
    return result


def get_new_batch_prefill_raw_around(original, scheduler, *args, **kwargs):
    result = original(scheduler, *args, **kwargs)
    _guarded(scheduler, "pass_end", "on_pass_end", result[0])
    return result


# Scheduler method -> (its hook, the HookType's name): the seams the feather policy needs.
SCHEDULER_HOOKS = {
    "init_schedule_policy": (init_schedule_policy_after, "AFTER"),
    "get_prefill_adder_class": (get_prefill_adder_class_around, "AROUND"),
    "_add_request_to_queue": (add_request_to_queue_after, "AFTER"),
    "_get_new_batch_prefill_raw": (get_new_batch_prefill_raw_around, "AROUND"),
    "run_batch": (run_batch_around, "AROUND"),
    "on_idle": (on_idle_after, "AFTER"),
    "_release_aborted_request": (release_aborted_request_after, "AFTER"),
}
