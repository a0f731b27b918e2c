"""Chunked Hash Tree (CHT): which waiting request best fits the running batch's prefixes.

Feather ("Requests of a Feather Must Flock Together") replaces a radix-tree walk per
scheduling pass with incremental bookkeeping over cumulative chunk hashes. A request is its
keys, one per chunk of ``chunk_size`` tokens: key ``i`` is (level ``i``, hash of chunks
``0..i``) from :func:`chunk_hashes`. The *working set* counts how many RUNNING requests hold
each key; a waiting request's *deficit* is how many of its keys are not in it (its chunks no
running request shares). A reverse index (key -> waiting holders) updates deficits only when
a count crosses zero, and a lazily invalidated min-heap of (deficit, arrival) yields the best
candidate in O(log W). For the stop/add agent it also exposes the *shared chain*: the
leading keys held by every running request, and how far a candidate would shorten it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from feather_sglang.chunk_hash import chunk_hashes

if TYPE_CHECKING:
    import numpy as np

# NOTE: stale heap entries (pushed before a deficit changed, or left behind by requests that
# left the queue) are skipped at the top; rebuilding once they outnumber live ones this many
# times keeps memory O(W) at amortised O(1) cost per push.
HEAP_STALE_PER_LIVE = 2
# Never rebuild for fewer stale entries than this: a rebuild per push would cost more.
HEAP_COMPACT_MIN_STALE = 64


class RequestState(str, Enum):
    """Where a tracked request is: in the waiting queue or in the running batch."""

    WAITING = "waiting"
    RUNNING = "running"


@dataclass(frozen=True, slots=True)
class CandidateView:
    """What the stop/add agent sees about one waiting candidate (lengths in chunks)."""

    chunks_before: int  # shared-chain length of the running batch now
    chunks_after: int  # shared-chain length if the candidate joined
    # OTHER waiting requests (candidate excluded) holding the key at level chunks_after - 1,
    # i.e. that could follow it at the new depth; 0 when chunks_after == 0.
    waiting: int
    deficit: int  # the candidate's chunks that no running request holds
    batch_size: int  # running requests now

    @property
    def chunk_loss(self) -> int:
        """Chunks of shared depth lost by admitting the candidate (negative when it grows)."""
        return self.chunks_before - self.chunks_after


@dataclass(frozen=True, slots=True)
class MemoryFootprint:
    """Entry counts of the CHT's containers; all zero once every request has left."""

    requests: int
    levels: int  # per-level dicts allocated (working set or reverse index, the longer)
    working_set_keys: int
    reverse_index_keys: int
    reverse_index_holders: int  # sum over keys of waiting requests holding it
    heap_entries: int  # live and stale


@dataclass(slots=True, eq=False)
class _Request:
    """One tracked request: its cumulative chunk hashes (level = index) and bookkeeping."""

    keys: list[int]
    arrival: int  # arrival sequence number, the tie-break of equal deficits
    state: RequestState = RequestState.WAITING
    deficit: int = 0  # kept current while waiting
    heap_version: int = -1  # names its one live heap entry; -1: none


class ChunkedHashTree:
    """Incremental deficits and shared-chain view over waiting and running requests.

    Requests are keyed by any hashable id (SGLang's ``rid``). Costs for a request of C chunks,
    W waiting requests, H waiting holders of keys whose count crosses zero: add O(C);
    admit/finish/retract O(C + H log W); remove_waiting O(C); best O(log W) amortised;
    shared_chain_len O(log C), cached until the batch changes; candidate_view O(log C).
    Keys live in per-level dicts (list index = level), so levels never alias.
    """

    def __init__(self, chunk_size: int) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 token, got {chunk_size}")
        self.chunk_size = chunk_size
        self._requests: dict[Hashable, _Request] = {}
        self._running: dict[Hashable, _Request] = {}
        self._num_waiting = 0
        # Per level: hash -> number of running requests holding that key (never 0: deleted).
        self._working_set: list[dict[int, int]] = []
        # Per level: hash -> ids of waiting requests holding that key (never empty: deleted).
        self._holders: list[dict[int, set[Hashable]]] = []
        # Entries (deficit, arrival, heap_version, rid); (arrival, version) is unique, so
        # tuple comparison never reaches rid, which need not be orderable.
        self._heap: list[tuple[int, int, int, Hashable]] = []
        self._next_arrival = 0
        self._next_heap_version = 0
        self._shared_chain: tuple[int, Sequence[int]] | None = None  # (length, anchor keys)

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_running(self) -> int:
        return len(self._running)

    def __contains__(self, rid: Hashable) -> bool:
        return rid in self._requests

    def state(self, rid: Hashable) -> RequestState:
        return self._lookup(rid).state

    def deficit(self, rid: Hashable) -> int:
        """Chunks of waiting request ``rid`` that no running request holds."""
        return self._lookup(rid, RequestState.WAITING).deficit

    def best(self) -> Hashable | None:
        """Waiting request with the least deficit, earliest arrival first; None if none wait."""
        heap, requests = self._heap, self._requests
        while heap:
            _, _, version, rid = heap[0]
            request = requests.get(rid)
            if request is not None and request.heap_version == version:
                return rid
            heapq.heappop(heap)
        return None

    def shared_chain_len(self) -> int:
        """Leading levels (chunks) whose key every running request holds; 0 if none run."""
        return self._shared_chain_state()[0]

    def candidate_view(self, rid: Hashable) -> CandidateView:
        """The agent's view of admitting waiting request ``rid`` (see :class:`CandidateView`)."""
        request = self._lookup(rid, RequestState.WAITING)
        keys = request.keys
        chunks_before, anchor_keys = self._shared_chain_state()
        if not self._running:
            chunks_after = len(keys)
        else:
            limit = min(chunks_before, len(keys))
            chunks_after = _leading_true(limit, lambda level: keys[level] == anchor_keys[level])
        waiting = 0
        if chunks_after:
            level = chunks_after - 1
            waiting = len(self._holders[level][keys[level]]) - 1  # minus the candidate
        batch_size = len(self._running)
        return CandidateView(chunks_before, chunks_after, waiting, request.deficit, batch_size)

    def waiting_shared_depth(self, rid: Hashable) -> int:
        """Leading chunks of waiting ``rid`` that at least one OTHER waiting request holds.

        O(log chunks). The prefix leader uses it: a group whose shared prefix is not cached
        yet should compute it once before the rest of the group is admitted.
        """
        keys = self._lookup(rid, RequestState.WAITING).keys
        holders = self._holders
        return _leading_true(len(keys), lambda level: len(holders[level][keys[level]]) > 1)

    def num_chunks(self, rid: Hashable) -> int:
        """Number of keys (chunks, the last one possibly partial) of ``rid``."""
        return len(self._lookup(rid).keys)

    def running_ids(self) -> list[Hashable]:
        """Ids of the running requests (a copy: safe to finish them while iterating)."""
        return list(self._running)

    def memory_footprint(self) -> MemoryFootprint:
        """Entry counts of every container, to check memory returns to baseline."""
        return MemoryFootprint(
            requests=len(self._requests),
            levels=max(len(self._working_set), len(self._holders)),
            working_set_keys=sum(map(len, self._working_set)),
            reverse_index_keys=sum(map(len, self._holders)),
            reverse_index_holders=sum(len(s) for d in self._holders for s in d.values()),
            heap_entries=len(self._heap),
        )

    def add_waiting(self, rid: Hashable, token_ids: Iterable[int] | np.ndarray) -> None:
        """A request arrives with its prompt token ids; it joins the waiting queue."""
        self.add_waiting_keys(rid, chunk_hashes(token_ids, self.chunk_size))

    def add_waiting_keys(self, rid: Hashable, keys: Sequence[int]) -> None:
        """Like :meth:`add_waiting` with precomputed ``chunk_hashes(tokens, chunk_size)``."""
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already tracked ({self._requests[rid].state})")
        request = _Request(list(keys), self._next_arrival)
        self._next_arrival += 1
        self._requests[rid] = request
        self._enter_waiting(rid, request)

    def admit(self, rid: Hashable) -> None:
        """Waiting -> running: its keys join the working set."""
        request = self._lookup(rid, RequestState.WAITING)
        self._leave_waiting(rid, request)
        request.state = RequestState.RUNNING
        self._running[rid] = request
        self._shift_working_set(request, +1)

    def finish(self, rid: Hashable) -> None:
        """Running -> gone: its keys leave the working set."""
        self._leave_running(rid)
        del self._requests[rid]

    def retract(self, rid: Hashable) -> None:
        """Running -> waiting (SGLang retracts under memory pressure); keeps its arrival."""
        self._enter_waiting(rid, self._leave_running(rid))

    def remove_waiting(self, rid: Hashable) -> None:
        """Waiting -> gone (aborted before admission); its heap entries become stale."""
        request = self._lookup(rid, RequestState.WAITING)
        self._leave_waiting(rid, request)
        del self._requests[rid]

    abort = remove_waiting

    def remove(self, rid: Hashable) -> None:
        """Forget ``rid`` whether it waits or runs."""
        if self._lookup(rid).state is RequestState.RUNNING:
            self.finish(rid)
        else:
            self.remove_waiting(rid)

    def _lookup(self, rid: Hashable, expected: RequestState | None = None) -> _Request:
        request = self._requests.get(rid)
        if request is None:
            raise KeyError(f"request {rid!r} is not tracked by the chunked hash tree")
        if expected is not None and request.state is not expected:
            raise ValueError(f"request {rid!r} is {request.state.value}, expected {expected.value}")
        return request

    def _enter_waiting(self, rid: Hashable, request: _Request) -> None:
        working_set, holders = self._working_set, self._holders
        _grow(holders, len(request.keys))
        levels_in_working_set = len(working_set)
        missing = 0
        for level, key in enumerate(request.keys):
            if level >= levels_in_working_set or key not in working_set[level]:
                missing += 1
            level_holders = holders[level]
            holder_set = level_holders.get(key)
            if holder_set is None:
                level_holders[key] = {rid}
            else:
                holder_set.add(rid)
        request.state = RequestState.WAITING
        request.deficit = missing
        self._num_waiting += 1
        self._push(rid, request)

    def _leave_waiting(self, rid: Hashable, request: _Request) -> None:
        holders = self._holders
        for level, key in enumerate(request.keys):
            level_holders = holders[level]
            holder_set = level_holders[key]
            holder_set.discard(rid)
            if not holder_set:
                del level_holders[key]
        _trim(holders)
        request.heap_version = -1  # every heap entry of this request is now stale
        self._num_waiting -= 1
        if self._num_waiting == 0:
            self._heap.clear()  # only stale entries remain
        else:
            self._compact_heap_if_stale()

    def _leave_running(self, rid: Hashable) -> _Request:
        request = self._lookup(rid, RequestState.RUNNING)
        del self._running[rid]
        self._shift_working_set(request, -1)
        return request

    def _shift_working_set(self, request: _Request, step: int) -> None:
        """Add (step +1) or remove (step -1) a running request's keys to the working set.

        A key crossing zero moves each waiting holder's deficit by -step; each moved holder
        gets one fresh heap entry, however many of its keys crossed.
        """
        self._shared_chain = None
        working_set, holders, requests = self._working_set, self._holders, self._requests
        _grow(working_set, len(request.keys))
        changed: dict[Hashable, _Request] = {}
        for level, key in enumerate(request.keys):
            counts = working_set[level]
            previous = counts.get(key, 0)
            count = previous + step
            if count:
                counts[key] = count
            else:
                del counts[key]
            if (previous == 0 or count == 0) and level < len(holders):  # crossed zero
                for holder in holders[level].get(key, ()):
                    holder_request = requests[holder]
                    holder_request.deficit -= step
                    changed[holder] = holder_request
        _trim(working_set)
        for holder, holder_request in changed.items():
            self._push(holder, holder_request)

    def _push(self, rid: Hashable, request: _Request) -> None:
        """Give ``request`` a fresh heap entry; older entries of it become stale."""
        version = self._next_heap_version
        self._next_heap_version += 1
        request.heap_version = version
        heapq.heappush(self._heap, (request.deficit, request.arrival, version, rid))
        self._compact_heap_if_stale()

    def _compact_heap_if_stale(self) -> None:
        """Keep heap entries <= (1 + HEAP_STALE_PER_LIVE) * live + HEAP_COMPACT_MIN_STALE.

        An O(live) rebuild frees >= 2 * live stale entries, each left by one push or one
        departure, so it adds amortised O(1) to each.
        """
        live = self._num_waiting
        if len(self._heap) - live > HEAP_STALE_PER_LIVE * live + HEAP_COMPACT_MIN_STALE:
            requests = self._requests
            live_entries = [
                entry
                for entry in self._heap
                if (owner := requests.get(entry[3])) is not None and owner.heap_version == entry[2]
            ]
            heapq.heapify(live_entries)
            self._heap = live_entries

    def _shared_chain_state(self) -> tuple[int, Sequence[int]]:
        """(shared-chain length, keys of one running request whose prefix is the chain)."""
        if self._shared_chain is None:
            # Every running request's keys start with the chain: take the first one's.
            anchor_keys = next(iter(self._running.values())).keys if self._running else []
            everyone, working_set = len(self._running), self._working_set
            length = _leading_true(
                len(anchor_keys), lambda level: working_set[level][anchor_keys[level]] == everyone
            )
            self._shared_chain = (length, anchor_keys)
        return self._shared_chain


def _grow(levels: list[dict], count: int) -> None:
    """Make sure ``levels`` has a dict for each of the first ``count`` levels."""
    levels.extend({} for _ in range(count - len(levels)))


def _trim(levels: list[dict]) -> None:
    """Drop empty dicts at the deepest levels so memory returns to baseline."""
    while levels and not levels[-1]:
        levels.pop()


def _leading_true(limit: int, holds: Callable[[int], bool]) -> int:
    """Number of leading levels in ``[0, limit)`` where ``holds`` is true, in O(log limit).

    NOTE: binary search is valid as the predicates here are monotone in the level: cumulative
    hashes equal at level i are equal at every shallower level too.
    """
    low, high = 0, limit
    while low < high:
        mid = (low + high) // 2
        if holds(mid):
            low = mid + 1
        else:
            high = mid
    return low
