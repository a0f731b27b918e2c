"""One scheduling pass of feather, independent of SGLang's objects (``docs/design.md``)."""

from __future__ import annotations

import functools
import itertools
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from feather_sglang.agents import Action, AgentState, make_agent
from feather_sglang.cht import ChunkedHashTree, RequestState, with_costs
from feather_sglang.config import FeatherConfig

RECENT_ADMISSIONS = 8  # the recent wait's window: an admission's weight is 1/8


@dataclass(slots=True)
class Plan:
    """The outcome of one pass: request ids to admit, in order, and why planning stopped."""

    rids: list[Hashable] = field(default_factory=list)
    starved: int = 0  # how many of ``rids`` (the first ones) the starvation bound admitted
    stop_reason: str = "empty"  # empty | agent | limit | budget | prefix-leader


@dataclass(slots=True)
class PlannerStats:
    """Counters since start (or the last :meth:`AdmissionPlanner.take_stats`)."""

    admitted: int = 0
    rolled_back: int = 0
    starved: int = 0
    cached_picks: int = 0  # picks of a waiting group the radix cache holds over the CHT's best
    stops: dict = field(default_factory=dict)


class AdmissionPlanner:
    """Tracks requests by id and plans each pass's admissions (``clock``: seconds)."""

    def __init__(self, config: FeatherConfig, clock=time.monotonic, agent=None) -> None:
        self.config = config
        self.cht = ChunkedHashTree(config.chunk_size)
        self.agent = agent or make_agent(config)
        self.clock = clock
        # Waiting requests in arrival order -> the time they (re-)entered the queue.
        self._waiting_since: dict[Hashable, float] = {}
        self._enqueue_seq: dict[Hashable, int] = {}  # rid -> order of its (re-)enqueue, for ties
        self._seq = itertools.count()
        self._pending: list[Hashable] = []  # planned, admission not yet confirmed
        self._admit_states: list[tuple[Hashable, AgentState]] = []  # agent-admitted in the plan
        self._agent_checkpoint: object = None
        # The starved group being served (request ids, oldest first).
        self._drain: deque[Hashable] = deque()
        self._oldest_scan = iter(())
        # The recent wait: an exponential moving average of admitted requests' waits (s).
        self._admitted_wait, self._admissions = 0.0, 0
        self._agent_stopped = False  # the last plan ended at the agent's STOP
        self.stats = PlannerStats()

    # ---- keeping in step with the scheduler ------------------------------------------------
    def on_enqueue(self, rid: Hashable, token_ids: Iterable[int]) -> None:
        """A request entered the waiting queue: a new arrival, or a running one retracted."""
        if rid in self.cht:
            if self.cht.state(rid) is RequestState.RUNNING:
                self.cht.retract(rid)
        else:
            self.cht.add_waiting(rid, token_ids)
        self._waiting_since.pop(rid, None)
        self._waiting_since[rid] = self.clock()
        self._enqueue_seq[rid] = next(self._seq)

    def is_waiting(self, rid: Hashable) -> bool:
        return rid in self.cht and self.cht.state(rid) is RequestState.WAITING

    def forget(self, rid: Hashable) -> None:
        """A request left for good (finished, aborted) from wherever it was."""
        if rid in self.cht:
            self.cht.remove(rid)
        self._dequeued(rid)

    def _dequeued(self, rid: Hashable) -> None:
        self._waiting_since.pop(rid, None)
        self._enqueue_seq.pop(rid, None)

    def sync_running(self, running: dict[Hashable, Callable[[], Iterable[int]]]) -> list[Hashable]:
        """The CHT's running set becomes ``running`` (rid -> lazy prompt tokens); ids forgotten."""
        if self._pending:
            # A plan whose end_pass never came: what runs now was admitted, the rest goes back.
            self.end_pass([rid for rid in self._pending if rid in running])
        gone = [r for r in self.cht.running_ids() if r not in running]
        for rid in gone:
            self.forget(rid)
        for rid, tokens in running.items():
            if rid not in self.cht:
                self.cht.add_waiting(rid, tokens())
            if self.cht.state(rid) is RequestState.WAITING:
                self.cht.admit(rid)
                self._dequeued(rid)
        return gone

    def sync_waiting(self, waiting: dict[Hashable, Callable[[], Iterable[int]]]) -> list[Hashable]:
        """Full O(W) reconciliation of the waiting set; returns the ids forgotten."""
        gone = [r for r in self._waiting_since if r not in waiting]
        for rid in gone:
            self.forget(rid)
        for rid, tokens in waiting.items():
            if rid not in self.cht or self.cht.state(rid) is RequestState.RUNNING:
                self.on_enqueue(rid, tokens() if rid not in self.cht else ())
        return gone

    @property
    def num_waiting(self) -> int:
        return self.cht.num_waiting

    @property
    def has_pending(self) -> bool:
        """A plan is out whose admissions the scheduler has not confirmed yet."""
        return bool(self._pending)

    # ---- one pass -------------------------------------------------------------------------
    def plan(
        self,
        max_new: int,
        cached_prefix_tokens: Callable[[Hashable], int] | None = None,
        token_budget: int | None = None,
        kv_free_tokens: int | None = None,
        kv_capacity_tokens: int | None = None,
    ) -> Plan:
        """Choose up to ``max_new`` waiting requests to admit this pass (``docs/design.md``)."""
        self.end_pass(())  # a plan the scheduler never consumed is rolled back
        cht, agent, chunk_size = self.cht, self.agent, self.config.chunk_size
        plan = Plan()
        if cht.num_running == 0:
            agent.on_batch_empty()
        # The agent as it was before this plan, for a partly consumed plan (see end_pass).
        self._agent_checkpoint = agent.checkpoint()
        self._admit_states = []
        if cached_prefix_tokens is not None:  # the radix cache does not change while planning
            cached_prefix_tokens = functools.cache(cached_prefix_tokens)
        cached = cached_prefix_tokens if self.config.prefix_leader else None
        groups = self.config.cached_groups if cached_prefix_tokens is not None else 0
        planned_tokens = 0  # estimated new prefill tokens of the picks so far
        # One scan of the enqueue order per pass, resumed for each starved group.
        self._oldest_scan = iter(self._waiting_since)

        def room() -> bool:
            return len(plan.rids) < max_new and (
                token_budget is None or planned_tokens < token_budget
            )

        while room() and (group := self._starved_group()):
            leader = self._needs_leader(group[0], cht.deficit(group[0]), cached)
            for rid in group:
                if not room():
                    break
                if self.is_waiting(rid):  # not gone meanwhile
                    planned_tokens += cht.deficit(rid) * chunk_size
                    cht.admit(rid)
                    plan.rids.append(rid)
                    if leader:
                        break
            plan.starved = len(plan.rids)
            if leader:
                plan.stop_reason = "prefix-leader"
                return self._finish_plan(plan)

        # The hot path of a pass: bound methods and constants are looked up once.
        rids, admit_states = plan.rids, self._admit_states
        best_view, admit, decide, on_admit = cht.best_view, cht.admit, agent.decide, agent.on_admit
        kv_known, costs = kv_free_tokens is not None and bool(kv_capacity_tokens), agent.wants_costs
        while True:
            if len(rids) >= max_new:
                plan.stop_reason = "limit" if cht.num_waiting else "empty"
                break
            if token_budget is not None and planned_tokens >= token_budget:
                plan.stop_reason = "budget"
                break
            if (best := best_view()) is None:
                plan.stop_reason = "empty"
                break
            rid, view = best
            if groups and view.deficit and cht.waiting_shared_beyond_running(rid):
                rid, view = self._cached_group_pick(rid, view, groups, cached_prefix_tokens)
            # KV capacity still free once this pass's picks so far are counted.
            headroom = (kv_free_tokens - planned_tokens) / kv_capacity_tokens if kv_known else 1.0
            # CandidateView's first three fields are AgentState's second to fourth.
            state = AgentState(
                view.batch_size, *view[:3], cht.num_waiting, min(max(headroom, 0.0), 1.0)
            )
            if costs:
                kv_free = -1 if kv_free_tokens is None else max(kv_free_tokens - planned_tokens, 0)
                state = with_costs(state, cht, rid, view.deficit, max_new - len(rids), kv_free)
            if decide(state) is Action.STOP:
                plan.stop_reason = "agent"
                break
            leader = self._needs_leader(rid, view.deficit, cached)
            planned_tokens += view.deficit * chunk_size
            admit(rid)
            on_admit(state)
            admit_states.append((rid, state))
            rids.append(rid)
            if leader:
                plan.stop_reason = "prefix-leader"
                break
        return self._finish_plan(plan)

    def on_step(self, batch_size: int, seconds: float, decode: bool) -> None:
        """A forward step ran; decode steps also tell the agent what the batch attended to."""
        self.agent.on_step(batch_size, seconds)
        if decode:
            unique, tokens = self.cht.working_set_chunks, self.cht.running_chunks
            chunk = self.config.chunk_size
            self.agent.on_decode_step(batch_size, unique * chunk, tokens * chunk, seconds)

    def _finish_plan(self, plan: Plan) -> Plan:
        self._pending = list(plan.rids)
        stats = self.stats
        stats.starved += plan.starved
        stats.stops[plan.stop_reason] = stats.stops.get(plan.stop_reason, 0) + 1
        self._agent_stopped = plan.stop_reason == "agent"
        return plan

    def _starved_group(self) -> deque[Hashable]:
        """What is left of the starved group being served, else the oldest starved one's group."""
        drain, cht = self._drain, self.cht
        while drain and not self.is_waiting(drain[0]):
            drain.popleft()
        if drain:
            return drain
        # Requests the agent holds back get the seconds alone: whatever it says, the bound holds.
        ratio = 0.0 if self._agent_stopped else self.config.max_wait_ratio
        bound = max(self.config.max_wait_s, ratio * self._admitted_wait)
        deadline = self.clock() - bound
        oldest = next(
            (rid for rid in self._oldest_scan if cht.state(rid) is RequestState.WAITING), None
        )
        if oldest is None or self._waiting_since[oldest] >= deadline:
            return drain
        # The whole group, oldest first (its starved members lead): O(g log g) for a group of g.
        # Its prefix is computed once for all; members left behind would starve after it has
        # been evicted and compute it again.
        since, seq = self._waiting_since, self._enqueue_seq
        drain.extend(sorted(cht.waiting_group(oldest), key=lambda rid: (since[rid], seq[rid])))
        return drain

    def _cached_group_pick(self, rid, view, groups: int, cached_prefix_tokens):
        """Of ``groups`` waiting groups' leaders (the CHT's best first), the one with the fewest
        chunks left once the radix cache's hit counts (ties: the CHT's order), and its view."""
        chunk = self.config.chunk_size
        pick = min(
            self.cht.branch_leaders(groups),
            key=lambda lead: min(lead[1], lead[2] - cached_prefix_tokens(lead[0]) // chunk),
        )[0]
        if pick == rid:
            return rid, view
        self.stats.cached_picks += 1
        return pick, self.cht.candidate_view(pick)

    def _needs_leader(self, rid, deficit: int, cached_prefix_tokens) -> bool:
        """True if ``rid``'s leading chunks shared with other waiting ones are not cached yet."""
        if cached_prefix_tokens is None or deficit <= 0:
            return False
        shared_chunks = self.cht.waiting_shared_beyond_running(rid)
        if not shared_chunks:
            return False
        return cached_prefix_tokens(rid) // self.config.chunk_size < shared_chunks - 1

    def end_pass(self, admitted: Iterable[Hashable]) -> None:
        """The scheduler took ``admitted`` (ids) from the last plan; the rest go back to waiting."""
        if not self._pending:
            return
        admitted = set(admitted)
        rolled_back = False
        now = self.clock()
        for rid in self._pending:
            if rid in admitted:
                wait = now - self._waiting_since.get(rid, now)
                self._admissions += 1  # a plain mean until the average's window has filled
                weight = max(1 / self._admissions, 1 / RECENT_ADMISSIONS)
                self._admitted_wait += (wait - self._admitted_wait) * weight
                self._dequeued(rid)
                self.stats.admitted += 1
            elif rid in self.cht and self.cht.state(rid) is RequestState.RUNNING:
                self.cht.retract(rid)
                self.stats.rolled_back += 1
                rolled_back = True
        if rolled_back:
            # Replay only the admissions that happened.
            self.agent.restore(self._agent_checkpoint)
            for rid, state in self._admit_states:
                if rid in admitted:
                    self.agent.on_admit(state)
        self._pending, self._admit_states = [], []

    def take_stats(self) -> PlannerStats:
        stats, self.stats = self.stats, PlannerStats()
        return stats


class SharedClock:
    """Tensor-parallel ranks' clock: the pass's time as the first rank read it at ``tick()``."""

    def __init__(self, broadcast: Callable[[list], list], local=time.monotonic) -> None:
        self.broadcast, self.local = broadcast, local
        self.tick()  # every rank builds its clock at the same point of start-up

    def tick(self) -> None:
        self.now = self.broadcast([self.local()])[0]

    def __call__(self) -> float:
        return self.now
