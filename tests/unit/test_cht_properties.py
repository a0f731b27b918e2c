"""Property tests: the Chunked Hash Tree against a brute-force model recomputed from scratch.

Random arrive / admit / finish / remove_waiting / retract sequences run over prompts built from
a few shared prefixes plus short random suffixes, with chunks of 2-4 tokens so that many levels
are shared partly. After every step each incremental quantity is compared with the model.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from feather_sglang.cht import (
    HEAP_ENTRIES_PER_SLOT,
    HEAP_MIN_ENTRIES,
    CandidateView,
    ChunkedHashTree,
    RequestState,
    _entries,
    _is_live,
)
from feather_sglang.chunk_hash import chunk_hashes

# Small token alphabet so that suffixes collide with each other and with the prefixes.
tokens = st.integers(min_value=0, max_value=3)
# Prefixes branch off one base at random depths, so chains diverge at deep levels too.
branch = st.tuples(st.integers(0, 16), st.lists(tokens, max_size=4))  # (cut, extra tokens)
branches = st.lists(branch, min_size=1, max_size=3)
prefixes = st.builds(
    lambda base, branches: [base[:cut] + branch for cut, branch in branches],
    st.lists(tokens, min_size=2, max_size=16),
    branches,
)
# (kind, rid, prefix index, suffix): rids 0..11 so that finished rids come back and
# duplicates of tracked ones are tried.
arrive = st.tuples(
    st.just("arrive"), st.integers(0, 11), st.integers(0, 2), st.lists(tokens, max_size=6)
)
# (kind, pick): pick chooses among the requests in the state the transition needs.
kinds = st.sampled_from(["admit", "admit", "finish", "remove_waiting", "retract"])
transition = st.tuples(kinds, st.integers(0, 63))
operations = st.lists(st.one_of(arrive, transition), min_size=10, max_size=50)


class BruteForceModel:
    """Keys, states and arrival order; everything else recomputed from them on demand."""

    def __init__(self) -> None:
        self.keys: dict[int, list[int]] = {}
        self.state: dict[int, str] = {}
        self.arrival: dict[int, int] = {}
        self.next_arrival = 0

    def ids(self, state: str) -> list[int]:
        return sorted(rid for rid, s in self.state.items() if s == state)

    def working_set(self) -> Counter:
        running = self.ids("running")
        return Counter((lvl, key) for rid in running for lvl, key in enumerate(self.keys[rid]))

    def deficit(self, rid: int) -> int:
        working_set = self.working_set()
        return sum((level, key) not in working_set for level, key in enumerate(self.keys[rid]))

    def best(self) -> int | None:
        waiting = self.ids("waiting")
        return min(waiting, key=lambda rid: (self.deficit(rid), self.arrival[rid]), default=None)

    def shared_chain(self) -> list[int]:
        running = [self.keys[rid] for rid in self.ids("running")]
        if not running:
            return []
        chain = []
        for level, key in enumerate(running[0]):
            if not all(len(keys) > level and keys[level] == key for keys in running):
                break
            chain.append(key)
        return chain

    def candidate_view(self, rid: int) -> CandidateView:
        keys, chain = self.keys[rid], self.shared_chain()
        if not self.ids("running"):
            after = len(keys)
        else:
            after = 0
            while after < min(len(chain), len(keys)) and keys[after] == chain[after]:
                after += 1
        waiting = 0
        if after:
            level = after - 1
            waiting = sum(
                len(self.keys[other]) > level and self.keys[other][level] == keys[level]
                for other in self.ids("waiting")
                if other != rid
            )
        batch_size = len(self.ids("running"))
        return CandidateView(len(chain), after, waiting, self.deficit(rid), batch_size)


def check_against_model(tree: ChunkedHashTree, model: BruteForceModel) -> None:
    waiting, running = model.ids("waiting"), model.ids("running")
    assert (tree.num_waiting, tree.num_running) == (len(waiting), len(running))
    for rid in waiting:
        assert tree.state(rid) is RequestState.WAITING
        assert tree.deficit(rid) == model.deficit(rid)
        assert tree.candidate_view(rid) == model.candidate_view(rid)
        keys = model.keys[rid]
        shared = 0  # leading levels another waiting request holds too
        while shared < len(keys) and any(
            other != rid and model.keys[other][: shared + 1] == keys[: shared + 1]
            for other in waiting
        ):
            shared += 1
        held = len(keys) - model.deficit(rid)  # leading levels the running batch holds
        assert tree.waiting_shared_beyond_running(rid) == (shared if shared > held else 0)
        group = {
            other for other in waiting if shared and model.keys[other][:shared] == keys[:shared]
        }
        assert tree.waiting_share(rid) == (shared, len(group) if shared else 1)
    for rid in running:
        assert tree.state(rid) is RequestState.RUNNING
    assert tree.best() == model.best()
    assert tree.shared_chain_len() == len(model.shared_chain())

    footprint = tree.memory_footprint()
    waiting_keys = [(level, key) for rid in waiting for level, key in enumerate(model.keys[rid])]
    assert footprint.requests == len(model.state)
    assert footprint.working_set_keys == len(model.working_set())
    assert tree.working_set_chunks == len(model.working_set())
    assert tree.running_chunks == sum(len(model.keys[rid]) for rid in running)
    assert footprint.reverse_index_keys == len(set(waiting_keys))
    assert footprint.reverse_index_holders == len(waiting_keys)
    assert footprint.levels == max((len(model.keys[rid]) for rid in model.state), default=0)
    # The keys the tree holds for each request (hashed or reused from a node's tokens) are
    # exactly its chunk hashes.
    for rid in model.state:
        node, path_keys = tree._requests[rid].leaf, []
        while node.parent is not None:
            path_keys[:0] = node.key_list()
            node = node.parent
        assert path_keys == model.keys[rid]
    # Path compression stays canonical: every node but the root ends where a request ends or
    # where paths branch, so there are at most two nodes per request.
    assert footprint.nodes <= 2 * len(model.state)
    stack = [tree._root]
    while stack:
        node = stack.pop()
        assert len(node.key_list()) == node.end - node.start
        if node is not tree._root:
            assert node.ends > 0 or len(node.children) >= 2
        for key, child in node.children.items():
            assert child.parent is node and child.start == node.end and child.key_list()[0] == key
            stack.append(child)
    # One live entry per waiting request and per node a waiting request passes (the
    # tournament's), each in the heap of the node it ends at or hangs from; stale ones bounded
    # by each heap's compaction.
    passed = sum(1 for node in _nodes(tree) if node.waiting)
    assert footprint.live_heap_entries == len(waiting) + passed
    for node in [tree._root, *_nodes(tree)]:
        live = {
            id(entry[1] if type(entry) is tuple else entry)
            for entry in _entries(node)
            if _is_live(entry)
        }
        expected = {id(tree._requests[rid]) for rid in waiting if tree._requests[rid].leaf is node}
        expected |= {id(child) for child in node.children.values() if child.waiting}
        assert live == expected
        slots = len(node.children) + node.ends
        assert len(_entries(node)) <= HEAP_ENTRIES_PER_SLOT * slots + HEAP_MIN_ENTRIES


def _nodes(tree):
    stack = list(tree._root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        yield node


@settings(max_examples=200, deadline=None)
@given(chunk_size=st.integers(2, 4), prefixes=prefixes, operations=operations)
def test_tree_matches_brute_force(chunk_size, prefixes, operations):
    tree, model = ChunkedHashTree(chunk_size), BruteForceModel()
    for operation in operations:
        if operation[0] == "arrive":
            _, rid, prefix_index, suffix = operation
            prompt = prefixes[prefix_index % len(prefixes)] + suffix
            if rid in model.state:
                try:
                    tree.add_waiting(rid, prompt)
                    raise AssertionError("duplicate rid accepted")
                except ValueError:
                    pass
            else:
                tree.add_waiting(rid, prompt)
                model.keys[rid] = chunk_hashes(prompt, chunk_size)
                model.state[rid] = "waiting"
                model.arrival[rid] = model.next_arrival
                model.next_arrival += 1
        else:
            kind, pick = operation
            source = model.ids("waiting" if kind in ("admit", "remove_waiting") else "running")
            if not source:
                continue
            rid = source[pick % len(source)]
            getattr(tree, kind)(rid)
            if kind == "admit":
                model.state[rid] = "running"
            elif kind == "retract":
                model.state[rid] = "waiting"  # keeps its arrival number
            else:
                del model.state[rid], model.keys[rid], model.arrival[rid]
        check_against_model(tree, model)

    for rid in list(model.state):
        tree.remove(rid)
    assert tree.memory_footprint() == type(tree.memory_footprint())(0, 0, 0, 0, 0, 0, 0, 0)


@settings(max_examples=200, deadline=None)
@given(
    a=st.lists(st.integers(0, 2), max_size=16),
    b=st.lists(st.integers(0, 2), max_size=16),
    chunk_size=st.integers(1, 5),
)
def test_hash_i_equal_iff_prefix_through_chunk_i_equal(a, b, chunk_size):
    hashes_a, hashes_b = chunk_hashes(a, chunk_size), chunk_hashes(b, chunk_size)
    assert len(hashes_a) == -(-len(a) // chunk_size)
    for i in range(min(len(hashes_a), len(hashes_b))):
        end = (i + 1) * chunk_size
        assert (hashes_a[i] == hashes_b[i]) == (a[:end] == b[:end])
    assert chunk_hashes(np.array(a, dtype=np.int64), chunk_size) == hashes_a
