"""Chunked Hash Tree: the waiting request that best fits the running batch (``docs/design.md``)."""

from __future__ import annotations

import array
import heapq
import itertools
import sys
import types
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import numpy as np

from feather_sglang.chunk_hash import (
    CHUNK_HASH_ROOT_SEED,
    hash_chunk,
    hash_chunks_from,
    token_bytes,
)

# A node's heap is rebuilt once it holds more than this many entries per child and per request
# ending there (each has at most one live entry), + the minimum.
HEAP_ENTRIES_PER_SLOT = 3
HEAP_MIN_ENTRIES = 8
# A node's posted key: deficit << ARRIVAL_BITS | arrival (least deficit, then earliest arrival).
ARRIVAL_BITS = 48
# A leaf's children until it has one (most nodes are leaves: one dict fewer each).
_NO_CHILDREN = types.MappingProxyType({})


class RequestState(str, Enum):
    """Where a tracked request is: in the waiting queue or in the running batch."""

    WAITING = "waiting"
    RUNNING = "running"


class CandidateView(NamedTuple):
    """What the stop/add agent sees about one waiting candidate (lengths in chunks)."""

    chunks_before: int  # shared-chain length of the running batch now
    chunks_after: int  # shared-chain length if the candidate joined
    waiting: int  # OTHER waiting requests holding the key at level chunks_after - 1 (0 at 0)
    deficit: int  # the candidate's chunks that no running request holds
    batch_size: int  # running requests now

    @property
    def chunk_loss(self) -> int:  # negative when the shared depth grows
        return self.chunks_before - self.chunks_after


@dataclass(frozen=True, slots=True)
class MemoryFootprint:
    """What the CHT holds (keys counted one entry per key); all zero once every request has left."""

    requests: int
    levels: int  # the deepest level any tracked request reaches, + 1
    working_set_keys: int  # keys held by at least one running request
    reverse_index_keys: int  # keys held by at least one waiting request
    reverse_index_holders: int  # sum over keys of the waiting requests holding it
    heap_entries: int  # in every node's heap, live and stale
    nodes: int = 0  # path-compressed nodes (runs of levels with the same holders)
    live_heap_entries: int = 0  # one per waiting request, one per node a waiting request passes


class _Unordered:
    """Heap entries of equal keys compare their items: any order will do."""

    __slots__ = ()

    def __lt__(self, other: object) -> bool:
        return False


@dataclass(slots=True, eq=False)
class _Node(_Unordered):
    """Levels ``[start, end)`` that the same requests hold, 8 bytes of ``keys`` each (see
    ``docs/design.md``).

    ``heap`` holds the tournament's entries: ``None``, one entry, or a list kept as a heap. An
    entry is a child's post ``(key, child)``, live while it is ``child.entry``, or a request
    ending here (wrapped as ``(arrival, request)`` in a list), live while the request waits
    (a retracted request may be held twice until the heap is rebuilt).
    """

    end: int
    keys: bytes  # the levels' cumulative hashes, native uint64 each
    parent: "_Node | None"
    source: object = None  # a prompt through it (its tokens end at min(end*chunk, len)) or None
    children: "dict[int, _Node]" = field(default_factory=lambda: _NO_CHILDREN)
    running: int = 0  # running requests through this node
    waiting: int = 0  # waiting requests through it
    ends: int = 0  # requests (waiting or running) whose last key is this node's last
    heap: object = None
    entry: "tuple[int, _Node] | None" = None  # its live post in its parent's heap

    @property
    def start(self) -> int:
        return self.end - (len(self.keys) >> 3)

    def key_list(self) -> "memoryview":
        """The node's keys as ints (level ``start`` first)."""
        return memoryview(self.keys).cast("Q")


@dataclass(slots=True, eq=False)
class _Request(_Unordered):
    """One tracked request; its last key is ``leaf``'s last (``leaf.end`` keys in all)."""

    rid: Hashable
    leaf: _Node  # the node holding its last key (the root for an empty prompt)
    arrival: int  # arrival sequence number, the tie-break of equal deficits
    waiting: bool = True

    @property
    def state(self) -> RequestState:
        return RequestState.WAITING if self.waiting else RequestState.RUNNING


class ChunkedHashTree:
    """Deficits and the shared chain over waiting and running requests, by any hashable id."""

    def __init__(self, chunk_size: int) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 token, got {chunk_size}")
        self.chunk_size = chunk_size
        self._requests: dict[Hashable, _Request] = {}
        self._running: dict[Hashable, _Request] = {}
        self._num_waiting = 0
        self._root = _Node(0, b"", None)
        self._arrivals = itertools.count()
        self._shared_chain: int | None = None  # cached shared-chain length
        # Chunks the running batch attends to: each distinct key once, and per request.
        self.working_set_chunks = 0
        self.running_chunks = 0

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
        return _deficit(self._lookup(rid, RequestState.WAITING))

    def best(self) -> Hashable | None:
        """Waiting request with the least deficit, earliest arrival first; None if none wait."""
        return None if (best := self.best_view()) is None else best[0]

    def shared_chain_len(self) -> int:
        """Leading levels (chunks) whose key every running request holds; 0 if none run."""
        if self._shared_chain is None:
            first = next(iter(self._running.values()), None)
            self._shared_chain = 0 if first is None else self._under_everyone(first.leaf).end
        return self._shared_chain

    def _under_everyone(self, node: _Node) -> _Node:
        """The deepest node of ``node``'s path that every running request runs through."""
        everyone = len(self._running)
        while node.running != everyone and node.parent is not None:
            node = node.parent
        return node

    def candidate_view(self, rid: Hashable) -> CandidateView:
        """The agent's view of admitting waiting request ``rid`` (see :class:`CandidateView`)."""
        request = self._lookup(rid, RequestState.WAITING)
        return self._view(request, _deficit(request))

    def best_view(self) -> tuple[Hashable, CandidateView] | None:
        """``best()`` and its ``candidate_view``: down the tournament's winners."""
        entry = _top(self._root)
        if entry is None:
            return None
        item = _item(entry)
        while type(item) is _Node:
            item = _item(_top(item))
        return item.rid, self._view(item, _key(entry) >> ARRIVAL_BITS)

    def _view(self, request: _Request, deficit: int) -> CandidateView:
        chunks_before = self.shared_chain_len()
        node = self._under_everyone(request.leaf)  # with none running: the leaf
        waiting = node.waiting - 1 if node.end else 0  # the node's, minus the candidate
        return CandidateView(chunks_before, node.end, waiting, deficit, len(self._running))

    def branch_leaders(self, limit: int) -> list[tuple[Hashable, int, int]]:
        """``(id, deficit, chunks)`` of the best waiting request of each of the first ``limit``
        branches where the waiting requests' paths part, in the tournament's order; O(limit x
        depth x log), however many requests wait."""
        wanted = max(limit, 2)  # two tell a node where paths part
        entries = _smallest_live(self._root, wanted)
        while len(entries) == 1 and type(_item(entries[0])) is _Node:
            entries = _smallest_live(_item(entries[0]), wanted)
        leaders = []
        for entry in entries[:limit]:
            item = _item(entry)
            while type(item) is _Node:
                item = _item(_top(item))
            leaders.append((item.rid, _deficit(item), item.leaf.end))
        return leaders

    def waiting_shared_beyond_running(self, rid: Hashable) -> int:
        """``waiting_share(rid)[0]`` unless running requests hold all those chunks, else 0."""
        node = self._deepest_shared_while_waiting(rid)
        return node.end if not node.running else 0

    def waiting_group(self, rid: Hashable) -> set[Hashable]:
        """Ids of the waiting requests through the deepest node waiting ``rid`` shares."""
        node = self._deepest_shared_while_waiting(rid)
        if node.parent is None:  # the root: nothing shared
            return {rid}
        group, stack = set(), [node]
        while stack:
            node = stack.pop()
            for entry in _live_entries(node).values():
                item = _item(entry)
                if type(item) is _Node:
                    stack.append(item)
                else:
                    group.add(item.rid)
        return group

    def _deepest_shared_while_waiting(self, rid: Hashable) -> _Node:
        """The deepest node of waiting ``rid``'s path that another waiting request shares."""
        node = self._lookup(rid, RequestState.WAITING).leaf
        while node.waiting < 2 and node.parent is not None:
            node = node.parent
        return node

    def waiting_share(self, rid: Hashable) -> tuple[int, int]:
        """(leading chunks of ``rid`` another waiting request holds, its group's size)."""
        node = self._deepest_shared_while_waiting(rid)
        return node.end, (1 if node.parent is None else node.waiting)

    def running_ids(self) -> list[Hashable]:
        """Ids of the running requests (a copy: safe to finish them while iterating)."""
        return list(self._running)

    def memory_footprint(self) -> MemoryFootprint:
        """What the tree holds (O(nodes)), to check memory returns to baseline."""
        nodes, stack = [], list(self._root.children.values())
        while stack:
            nodes.append(stack.pop())
            stack.extend(nodes[-1].children.values())
        return MemoryFootprint(
            requests=len(self._requests),
            levels=max((n.end for n in nodes), default=0),
            working_set_keys=sum(len(n.keys) >> 3 for n in nodes if n.running),
            reverse_index_keys=sum(len(n.keys) >> 3 for n in nodes if n.waiting),
            reverse_index_holders=sum((len(n.keys) >> 3) * n.waiting for n in nodes),
            heap_entries=sum(len(_entries(n)) for n in [self._root, *nodes]),
            nodes=len(nodes),
            live_heap_entries=sum(len(_live_entries(n)) for n in [self._root, *nodes]),
        )

    def add_waiting(self, rid: Hashable, token_ids: Iterable[int] | np.ndarray) -> None:
        """A request arrives with its prompt token ids; it joins the waiting queue."""
        self._check_new(rid)
        buffer = token_bytes(token_ids)
        tokens = np.frombuffer(buffer, dtype="<i8")
        keys = self._keys_reusing_nodes(buffer, tokens)
        # A new node keeps the caller's array('q') itself (a view would pin its buffer).
        in_place = (
            isinstance(token_ids, array.array)
            and token_ids.typecode in "ql"
            and token_ids.itemsize == 8
            and sys.byteorder == "little"
        )
        self._add(rid, keys, token_ids if in_place else tokens)

    def add_waiting_keys(self, rid: Hashable, keys: Sequence[int]) -> None:
        """:meth:`add_waiting` with precomputed ``chunk_hashes`` (its new nodes keep no tokens)."""
        self._check_new(rid)
        self._add(rid, list(keys), None)

    def _check_new(self, rid: Hashable) -> None:
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already tracked ({self._requests[rid].state})")

    def _add(self, rid: Hashable, keys: list[int], source: object) -> None:
        leaf = self._insert_path(keys, source)
        leaf.ends += 1
        request = self._requests[rid] = _Request(rid, leaf, next(self._arrivals))
        self._enter_waiting(request)

    def admit(self, rid: Hashable) -> None:
        """Waiting -> running: its keys join the working set."""
        request = self._lookup(rid, RequestState.WAITING)
        self._leave_waiting(request)
        self._running[rid] = request
        self._shift_working_set(request, +1)

    def finish(self, rid: Hashable) -> None:
        """Running -> gone: its keys leave the working set."""
        self._detach(self._leave_running(rid))
        del self._requests[rid]

    def retract(self, rid: Hashable) -> None:
        """Running -> waiting (SGLang retracts under memory pressure); keeps its arrival."""
        self._enter_waiting(self._leave_running(rid))

    def remove_waiting(self, rid: Hashable) -> None:
        """Waiting -> gone (aborted before admission); its heap entry becomes stale."""
        request = self._lookup(rid, RequestState.WAITING)
        self._leave_waiting(request)
        self._detach(request)
        del self._requests[rid]

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
        if expected is not None and request.waiting != (expected is RequestState.WAITING):
            raise ValueError(f"request {rid!r} is {request.state.value}, expected {expected.value}")
        return request

    # ---- the tree's shape --------------------------------------------------------------------
    def _keys_reusing_nodes(self, buffer: bytes | memoryview, tokens: np.ndarray) -> list[int]:
        """``chunk_hashes``, with the keys of every node whose tokens the prompt repeats."""
        chunk, total_tokens = self.chunk_size, len(tokens)
        total = -(-total_tokens // chunk)
        keys: list[int] = []
        seed, node, level = CHUNK_HASH_ROOT_SEED, self._root, 0
        while level < total:
            # The first chunk of a node is hashed: it names the child to follow.
            key = hash_chunk(buffer, chunk, level, seed)
            keys.append(key)
            seed, level = key, level + 1
            child = node.children.get(key)
            if child is None or child.source is None:
                break
            stop = min(child.end * chunk, len(child.source))  # the child's end, in tokens
            # The child's chunks are the prompt's if the tokens and the last chunk's length match.
            if stop > total_tokens or (stop != total_tokens and stop != child.end * chunk):
                break
            theirs = np.frombuffer(child.source, dtype="<i8")  # an ndarray or an array('q')
            if not np.array_equal(tokens[level * chunk : stop], theirs[level * chunk : stop]):
                break
            keys.extend(child.key_list()[1:])
            seed, node, level = keys[-1], child, child.end
        keys.extend(hash_chunks_from(buffer, chunk, level, seed))
        return keys

    def _insert_path(self, keys: list[int], source: object = None) -> _Node:
        """The node of ``keys[-1]``, splitting or adding nodes (new ones keep ``source``)."""
        node, level, total = self._root, 0, len(keys)
        while level < total:
            child = node.children.get(keys[level])
            if child is None:
                child = _Node(total, array.array("Q", keys[level:]).tobytes(), node, source)
                if node.children is _NO_CHILDREN:
                    node.children = {}
                node.children[keys[level]] = child
                return child
            # Equal cumulative hashes at a level are equal above it: bisect the first difference.
            start, child_keys = child.start, child.key_list()
            low, high = level + 1, min(child.end, total)
            while low < high:
                mid = (low + high) // 2
                if keys[mid] == child_keys[mid - start]:
                    low = mid + 1
                else:
                    high = mid
            if low < child.end:
                child = self._split(child, low)
            node, level = child, low
        return node

    def _split(self, node: _Node, level: int) -> _Node:
        """Cut ``node`` before ``level``; the new upper part is returned, ``node`` stays a leaf."""
        cut, parent, keys = (level - node.start) << 3, node.parent, node.key_list()
        upper = _Node(level, node.keys[:cut], parent, node.source)
        upper.running, upper.waiting = node.running, node.waiting
        upper.children = {keys[cut >> 3]: node}
        parent.children[keys[0]] = upper
        node.keys, node.parent = node.keys[cut:], upper
        self._unpost(node, parent)
        self._refresh(node)
        return upper

    def _detach(self, request: _Request) -> None:
        """Uncounted ``request`` leaves: drop the nodes only it held, merge a lone child up."""
        node = request.leaf
        node.ends -= 1
        _compact_if_stale(node)
        while not node.ends and not node.children and node.parent is not None:
            del node.parent.children[node.key_list()[0]]
            self._unpost(node, node.parent)
            node = node.parent
        if not node.ends and len(node.children) == 1 and node.parent is not None:
            (child,) = node.children.values()
            parent = node.parent
            child.keys, child.parent = node.keys + child.keys, parent
            parent.children[node.key_list()[0]] = child
            self._unpost(node, parent)
            child.entry = None  # its entry was in the merged node's heap
            self._refresh(child)

    # ---- counts and deficits -------------------------------------------------------------
    def _enter_waiting(self, request: _Request) -> None:
        request.waiting = True
        _push(request.leaf, request)
        self._count_waiting(request.leaf, +1)

    def _leave_waiting(self, request: _Request) -> None:
        request.waiting = False  # its heap entry is now stale
        self._count_waiting(request.leaf, -1)

    def _count_waiting(self, leaf: _Node, step: int) -> None:
        """A waiting request through ``leaf`` arrives (step +1) or leaves (-1)."""
        node = leaf
        while node.parent is not None:
            node.waiting += step
            node = node.parent
        self._num_waiting += step
        self._refresh(leaf)

    def _leave_running(self, rid: Hashable) -> _Request:
        request = self._lookup(rid, RequestState.RUNNING)
        del self._running[rid]
        self._shift_working_set(request, -1)
        return request

    def _shift_working_set(self, request: _Request, step: int) -> None:
        """A running request's keys join (step +1) or leave (-1) the working set and the chain."""
        chain = None
        everyone = len(self._running) if step > 0 else -1
        crossed = []
        self.running_chunks += step * request.leaf.end
        node = request.leaf
        while node.parent is not None:
            previous = node.running
            node.running = running = previous + step
            if previous == 0 or running == 0:
                self.working_set_chunks += step * (len(node.keys) >> 3)
                if node.waiting:
                    crossed.append(node)
            if chain is None and running == everyone:
                chain = node.end
            node = node.parent
        self._shared_chain = (chain or 0) if step > 0 else None
        for node in crossed:  # deepest first: one climb usually carries the others' changes
            self._refresh(node)

    def _refresh(self, node: _Node) -> None:
        """Re-post ``node``'s key in its parent's heap, and climb while the posted keys change."""
        while node.parent is not None:
            top, entry = _top(node), node.entry
            key = (
                None
                if top is None
                else _key(top) + (0 if node.running else (len(node.keys) >> 3) << ARRIVAL_BITS)
            )
            if key == (None if entry is None else entry[0]):
                return
            parent = node.parent
            node.entry = None if key is None else (key, node)
            if key is not None:
                _push(parent, node.entry)
            node = parent
        _top(node)  # the root: drop stale entries now, so that an empty tree holds none

    @staticmethod
    def _unpost(node: _Node, parent: _Node) -> None:
        """``node``'s entry in ``parent``'s heap becomes stale (it moves or goes)."""
        node.entry = None
        _compact_if_stale(parent)


def _is_live(entry) -> bool:
    """Whether a heap entry (see :class:`_Node`) is live."""
    if type(entry) is _Request:
        return entry.waiting
    item = entry[1]
    return item.waiting if type(item) is _Request else item.entry is entry


def _key(entry) -> int:
    return entry.arrival if type(entry) is _Request else entry[0]


def _item(entry) -> "_Node | _Request":
    return entry if type(entry) is _Request else entry[1]


def _pair(entry) -> tuple:
    """A heap entry as a list holds it: ``(key, item)``."""
    return (entry.arrival, entry) if type(entry) is _Request else entry


def _entries(node: _Node) -> list:
    heap = node.heap
    return heap if type(heap) is list else [] if heap is None else [heap]


def _live_entries(node: _Node) -> dict:
    """The live entries of ``node``'s heap by their item's id (a request held twice: once)."""
    return {id(_item(entry)): entry for entry in _entries(node) if _is_live(entry)}


def _smallest_live(node: _Node, limit: int) -> list:
    """Up to ``limit`` live entries of ``node``'s heap, least key first (each item once): a
    best-first walk of the heap's array, O(visited x log)."""
    heap = node.heap
    if type(heap) is not list:
        return [] if heap is None or not _is_live(heap) else [heap]
    found, seen, frontier = [], set(), [(heap[0][0], 0)] if heap else []
    while frontier and len(found) < limit:
        _, i = heapq.heappop(frontier)
        entry = heap[i]
        if _is_live(entry) and id(_item(entry)) not in seen:
            seen.add(id(_item(entry)))
            found.append(entry)
        for j in (2 * i + 1, 2 * i + 2):
            if j < len(heap):
                heapq.heappush(frontier, (heap[j][0], j))
    return found


def _push(node: _Node, entry) -> None:
    """Add ``entry`` to ``node``'s heap: held alone while it is the only one."""
    heap = node.heap
    if type(heap) is list:
        heapq.heappush(heap, _pair(entry))
        _compact_if_stale(node)
    elif heap is None or heap is entry or not _is_live(heap):
        node.heap = entry  # empty, stale, or this request's own entry (live again on retract)
    else:
        node.heap = [_pair(heap), _pair(entry)]
        heapq.heapify(node.heap)


def _top(node: _Node):
    """The best live entry of ``node``'s heap (stale ones on top are dropped); None if none."""
    heap = node.heap
    if type(heap) is not list:
        if heap is not None and not _is_live(heap):
            node.heap = heap = None
        return heap
    while heap:
        if _is_live(heap[0]):
            return heap[0]
        heapq.heappop(heap)
    node.heap = None
    return None


def _compact_if_stale(node: _Node) -> None:
    """Keep ``node``'s heap within HEAP_ENTRIES_PER_SLOT per child and per request ending there
    (+ HEAP_MIN_ENTRIES): rebuilt from its live entries when it grows past that."""
    heap = node.heap
    slots = len(node.children) + node.ends
    if type(heap) is list and len(heap) > HEAP_ENTRIES_PER_SLOT * slots + HEAP_MIN_ENTRIES:
        node.heap = list(_live_entries(node).values())
        heapq.heapify(node.heap)


def _deficit(request: _Request) -> int:
    """Chunks of ``request``'s path that no running request holds."""
    missing, node = 0, request.leaf
    while node.parent is not None:
        if not node.running:
            missing += len(node.keys) >> 3
        node = node.parent
    return missing


def with_costs(
    state, cht: ChunkedHashTree, rid: Hashable, deficit: int, free_slots: int, kv_free: int
):
    """``state`` (an ``AgentState`` for waiting ``rid``) with its token costs, as the CHT sees."""
    chunk, chunks = cht.chunk_size, cht._lookup(rid).leaf.end
    shared_depth, group = cht.waiting_share(rid)
    return state._replace(
        group_waiting=group,
        new_tokens=min(deficit, chunks) * chunk,
        own_tokens=(chunks - shared_depth) * chunk,
        prompt_tokens=chunks * chunk,
        batch_unique_tokens=cht.working_set_chunks * chunk,
        batch_tokens=cht.running_chunks * chunk,
        free_slots=free_slots,
        kv_free_tokens=kv_free,
    )
