"""Unit tests of the chunk hashes and the Chunked Hash Tree on hand-built examples."""

from __future__ import annotations

import numpy as np
import pytest

from feather_sglang.cht import CandidateView, ChunkedHashTree, MemoryFootprint, RequestState
from feather_sglang.chunk_hash import chunk_hashes

EMPTY_FOOTPRINT = MemoryFootprint(0, 0, 0, 0, 0, 0, 0, 0)


# ----- chunk hashes ----------------------------------------------------------------------


def test_hash_count_counts_partial_last_chunk():
    assert len(chunk_hashes(list(range(10)), 4)) == 3
    assert len(chunk_hashes(list(range(8)), 4)) == 2
    assert len(chunk_hashes(list(range(9)), 4)) == 3
    assert len(chunk_hashes([7], 50)) == 1


def test_empty_prompt_has_no_keys():
    assert chunk_hashes([], 4) == []
    assert chunk_hashes(np.array([], dtype=np.int64), 4) == []


def test_equal_prefixes_share_leading_hashes():
    a = chunk_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 3)
    b = chunk_hashes([1, 2, 3, 4, 5, 6, 0, 0, 0, 1], 3)
    assert a[:2] == b[:2]
    assert a[2] != b[2]


def test_hashes_are_cumulative():
    # Same second chunk after a different first chunk: every hash differs.
    a = chunk_hashes([1, 2, 5, 6], 2)
    b = chunk_hashes([3, 4, 5, 6], 2)
    assert a[0] != b[0] and a[1] != b[1]


def test_different_tokens_differ():
    assert chunk_hashes([1, 2, 3], 4) != chunk_hashes([1, 2, 4], 4)
    # A partial chunk differs from the full chunk it starts.
    assert chunk_hashes([1, 2, 3], 4) != chunk_hashes([1, 2, 3, 0], 4)


def test_chunk_size_boundaries():
    tokens = list(range(12))
    assert len(chunk_hashes(tokens, 1)) == 12
    assert len(chunk_hashes(tokens, 12)) == 1
    assert len(chunk_hashes(tokens, 100)) == 1
    assert chunk_hashes(tokens, 12) == chunk_hashes(tokens, 100)  # both are one whole chunk
    assert chunk_hashes(tokens, 5)[:2] == chunk_hashes(tokens[:10], 5)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_hashes(tokens, 0)


def test_list_tuple_numpy_inputs_agree():
    tokens = [5, 150_000, 0, 2**31 + 3, 42, 7, 9]
    expected = chunk_hashes(tokens, 3)
    assert chunk_hashes(tuple(tokens), 3) == expected
    assert chunk_hashes(iter(tokens), 3) == expected
    assert chunk_hashes(np.array(tokens, dtype=np.int64), 3) == expected
    assert chunk_hashes(np.array(tokens, dtype=np.uint64), 3) == expected
    small = [5, 17, 0, 3, 42]
    assert chunk_hashes(np.array(small, dtype=np.int32), 2) == chunk_hashes(small, 2)
    strided = np.arange(20, dtype=np.int64)[::2]
    assert chunk_hashes(strided, 3) == chunk_hashes(strided.tolist(), 3)


def test_bad_token_inputs_raise():
    with pytest.raises(ValueError, match="1-D"):
        chunk_hashes(np.zeros((2, 2), dtype=np.int64), 2)
    with pytest.raises(ValueError, match="integers"):
        chunk_hashes(np.zeros(4, dtype=np.float32), 2)
    with pytest.raises(ValueError, match="int64"):
        chunk_hashes([2**70], 2)


# ----- Chunked Hash Tree -----------------------------------------------------------------

# Chunk size 2: prompts below are written as chunks, "AB" etc. are distinct chunk contents.
A, B, C, D, E = [1, 1], [2, 2], [3, 3], [4, 4], [5, 5]


def prompt(*chunks: list[int]) -> list[int]:
    return [token for chunk in chunks for token in chunk]


@pytest.fixture
def tree() -> ChunkedHashTree:
    return ChunkedHashTree(chunk_size=2)


def test_deficits_follow_working_set(tree):
    tree.add_waiting("r1", prompt(A, B, C))
    tree.add_waiting("r2", prompt(A, B, D))
    tree.add_waiting("r3", prompt(E))
    assert [tree.deficit(r) for r in ("r1", "r2", "r3")] == [3, 3, 1]
    tree.admit("r1")
    assert tree.deficit("r2") == 1  # shares A, AB
    assert tree.deficit("r3") == 1
    tree.add_waiting("r4", prompt(A, B, C, D))
    assert tree.deficit("r4") == 1
    tree.finish("r1")
    assert [tree.deficit(r) for r in ("r2", "r3", "r4")] == [3, 1, 4]


def test_best_prefers_low_deficit_then_arrival(tree):
    assert tree.best() is None
    tree.add_waiting("long", prompt(A, B, C))
    tree.add_waiting("short1", prompt(E))
    tree.add_waiting("short2", prompt(D))
    assert tree.best() == "short1"  # deficit 1 ties with short2; short1 arrived first
    tree.add_waiting("run", prompt(A, B))
    tree.admit("run")
    assert tree.best() == "long"  # deficit now 1, arrived before short1
    tree.remove_waiting("long")
    assert tree.best() == "short1"
    tree.admit("short1")
    tree.admit("short2")
    assert tree.best() is None


def test_transitions_and_states(tree):
    tree.add_waiting("a", prompt(A, B))
    assert "a" in tree and "b" not in tree
    assert tree.state("a") is RequestState.WAITING and tree.state("a") == "waiting"
    assert (tree.num_waiting, tree.num_running) == (1, 0)
    tree.admit("a")
    assert tree.state("a") is RequestState.RUNNING
    assert (tree.num_waiting, tree.num_running) == (0, 1)
    tree.retract("a")
    assert tree.state("a") is RequestState.WAITING and tree.deficit("a") == 2
    tree.admit("a")
    tree.finish("a")
    assert "a" not in tree
    tree.add_waiting("a", prompt(A))  # a finished rid may come back
    tree.remove_waiting("a")
    assert "a" not in tree and tree.best() is None


def test_retract_keeps_arrival_order(tree):
    tree.add_waiting("first", prompt(C))
    tree.add_waiting("second", prompt(D))
    tree.admit("first")
    tree.retract("first")
    assert tree.best() == "first"


def test_remove_whatever_state(tree):
    tree.add_waiting("w", prompt(A))
    tree.add_waiting("r", prompt(A))
    tree.admit("r")
    tree.remove("w")
    tree.remove("r")
    assert tree.num_waiting == tree.num_running == 0
    assert tree.memory_footprint() == EMPTY_FOOTPRINT


def test_errors_name_the_request_and_state(tree):
    with pytest.raises(KeyError, match="ghost"):
        tree.admit("ghost")
    for method in (tree.finish, tree.retract, tree.remove, tree.deficit, tree.state):
        with pytest.raises(KeyError, match="not tracked"):
            method("ghost")
    tree.add_waiting("w", prompt(A))
    with pytest.raises(ValueError, match="already tracked"):
        tree.add_waiting("w", prompt(B))
    with pytest.raises(ValueError, match="'w' is waiting, expected running"):
        tree.finish("w")
    with pytest.raises(ValueError, match="expected running"):
        tree.retract("w")
    tree.admit("w")
    with pytest.raises(ValueError, match="'w' is running, expected waiting"):
        tree.admit("w")
    with pytest.raises(ValueError, match="expected waiting"):
        tree.remove_waiting("w")
    with pytest.raises(ValueError, match="expected waiting"):
        tree.candidate_view("w")
    with pytest.raises(ValueError, match="already tracked"):
        tree.add_waiting("w", prompt(B))
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkedHashTree(0)


def test_shared_chain(tree):
    assert tree.shared_chain_len() == 0
    for rid, chunks in {"x": (A, B, C), "y": (A, B, D), "z": (A, E), "e": ()}.items():
        tree.add_waiting(rid, prompt(*chunks))
    tree.admit("x")
    assert tree.shared_chain_len() == 3
    tree.admit("y")
    assert tree.shared_chain_len() == 2
    tree.admit("z")
    assert tree.shared_chain_len() == 1
    tree.admit("e")  # an empty prompt shares nothing
    assert tree.shared_chain_len() == 0
    tree.finish("e")
    tree.finish("z")
    assert tree.shared_chain_len() == 2
    tree.finish("x")
    tree.finish("y")
    assert tree.shared_chain_len() == 0


def test_candidate_view(tree):
    tree.add_waiting("alone", prompt(A, B, C))
    # Nothing runs: the chain would become the candidate's own prompt.
    assert tree.candidate_view("alone") == CandidateView(0, 3, 0, 3, 0)
    tree.add_waiting("run1", prompt(A, B, C, D))
    tree.add_waiting("run2", prompt(A, B, C, E))
    tree.add_waiting("c_ab", prompt(A, B, D))
    tree.add_waiting("c_abd", prompt(A, B, D, A))
    tree.add_waiting("c_e", prompt(E, A))
    tree.add_waiting("c_empty", [])
    tree.admit("run1")
    tree.admit("run2")
    assert tree.shared_chain_len() == 3
    # "alone" keeps the whole chain ABC; "run*" are running, no other waiter holds ABC.
    view = tree.candidate_view("alone")
    assert view == CandidateView(3, 3, 0, 0, 2) and view.chunk_loss == 0
    # c_ab shrinks the chain to AB, held by "alone" and "c_abd" among other waiters.
    view = tree.candidate_view("c_ab")
    assert view == CandidateView(3, 2, 2, 1, 2) and view.chunk_loss == 1
    assert tree.candidate_view("c_e") == CandidateView(3, 0, 0, 2, 2)
    assert tree.candidate_view("c_empty") == CandidateView(3, 0, 0, 0, 2)


def test_memory_returns_to_baseline(tree):
    assert tree.memory_footprint() == EMPTY_FOOTPRINT
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 1000, size=9).tolist()
    for i in range(300):
        tree.add_waiting(i, shared + rng.integers(0, 1000, size=i % 7).tolist())
    retracted = set()
    while tree.num_waiting:
        rid = tree.best()
        tree.admit(rid)
        if rid % 3 == 0 and rid not in retracted:
            retracted.add(rid)
            tree.retract(rid)
        elif rid % 2:
            tree.finish(rid)
    footprint = tree.memory_footprint()
    assert footprint.heap_entries == 0 and footprint.reverse_index_keys == 0
    assert footprint.working_set_keys > 0
    for rid in range(300):
        if rid in tree:
            tree.finish(rid)
    assert tree.memory_footprint() == EMPTY_FOOTPRINT
    assert tree.shared_chain_len() == 0 and tree.best() is None


def test_heap_stays_bounded_under_churn(tree):
    # Deficits of the waiters flip on every admit/finish of the runner: stale entries pile up
    # unless compaction drops them.
    for i in range(50):
        tree.add_waiting(f"w{i}", prompt(A, B, C))
    tree.add_waiting("runner", prompt(A, B))
    for _ in range(1000):
        tree.admit("runner")
        tree.retract("runner")
        assert tree.memory_footprint().heap_entries <= 3 * tree.num_waiting + 64 + 1
    assert tree.best() == "runner"  # deficit 2 against 3 for the w's


def test_identical_prompts_retracted_out_of_order_stay_bounded_and_ordered(tree):
    # Identical prompts end at one node; admitting and retracting one that is not the best
    # leaves its stale entry under the top, and the retraction may hold it twice until the
    # heap is rebuilt: the heap stays bounded and the order stays arrival order.
    for i in range(20):
        tree.add_waiting(i, prompt(A, B))
    for _ in range(500):
        for rid in (7, 13):
            tree.admit(rid)
            tree.retract(rid)
        assert tree.memory_footprint().heap_entries <= 3 * 20 + 8 + 1  # the node, the root
    assert tree.memory_footprint().live_heap_entries == 20 + 1  # one per request, the node
    order = []
    while tree.num_waiting:
        order.append(tree.best())
        tree.admit(order[-1])
    assert order == list(range(20))


def test_waiting_share_and_running_ids():
    cht = ChunkedHashTree(chunk_size=2)
    cht.add_waiting("a", [1, 2, 3, 4, 5, 6])
    cht.add_waiting("b", [1, 2, 3, 4, 9, 9])
    cht.add_waiting("c", [7, 7])
    assert cht.waiting_share("a") == (2, 2)
    assert cht.waiting_share("b") == (2, 2)
    assert cht.waiting_share("c") == (0, 1)
    cht.admit("b")
    assert cht.running_ids() == ["b"]
    assert cht.waiting_share("a") == (0, 1)  # b no longer waits


def test_chunk_hashes_of_sglang_token_arrays_match_lists():
    """SGLang keeps prompt ids as array('q'); they are hashed in place, equal to list input."""
    from array import array

    tokens = list(range(1, 238))
    for typecode in ("q", "l", "i"):
        assert chunk_hashes(array(typecode, tokens), 50) == chunk_hashes(tokens, 50)
    assert chunk_hashes(array("q"), 50) == []


def test_shared_prompts_reuse_keys_without_pinning_sglang_arrays():
    """A grouped prompt takes the keys of the nodes it repeats (compared, not re-hashed); the
    tree keeps SGLang's array('q') itself, so SGLang could still resize it."""
    from array import array

    cht = ChunkedHashTree(chunk_size=4)
    prefix = list(range(100, 140))  # 10 chunks
    first = array("q", prefix + [1, 2, 3])
    second = array("q", prefix + [7, 8, 9, 10, 11])
    cht.add_waiting("first", first)
    cht.add_waiting("second", second)
    node = cht._requests["second"].leaf
    keys = [*node.parent.key_list(), *node.key_list()]
    assert keys == chunk_hashes(second, 4)[node.parent.start :]
    assert cht.memory_footprint().nodes == 3  # the shared prefix, two own suffixes
    first.append(4)  # would raise BufferError if the tree held a buffer view of it
    second.extend([12, 13])


def test_branch_leaders_are_each_waiting_group_s_best_in_the_tournament_s_order(tree):
    assert tree.branch_leaders(4) == []
    tree.add_waiting("a1", prompt(A, B, C))
    tree.add_waiting("b1", prompt(B, C, D, E))
    tree.add_waiting("a2", prompt(A, B, D))
    tree.add_waiting("b2", prompt(B, C, D, A))
    tree.add_waiting("e", prompt(E))
    # (id, deficit, chunks): least deficit first, then arrival; one leader per group
    assert tree.branch_leaders(8) == [("e", 1, 1), ("a1", 3, 3), ("b1", 4, 4)]
    assert tree.branch_leaders(2) == [("e", 1, 1), ("a1", 3, 3)]
    tree.admit("a1")
    assert tree.branch_leaders(8) == [("a2", 1, 3), ("e", 1, 1), ("b1", 4, 4)]
    for rid in ("a2", "e"):
        tree.admit(rid)
    # every waiting request shares B, C, D: the leaders are where their paths part
    assert tree.branch_leaders(8) == [("b1", 4, 4), ("b2", 4, 4)]


def test_branch_leaders_are_the_least_of_thousands_of_branches(tree):
    for i in range(5000):
        tree.add_waiting(i, [i, i, 7])
    tree.admit(0)
    assert [rid for rid, _, _ in tree.branch_leaders(3)] == [1, 2, 3]
