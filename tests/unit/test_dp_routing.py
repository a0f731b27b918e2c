"""Prefix-group routing for SGLang's data-parallel controller, and the CPU runtime's per-rank
core split."""

from __future__ import annotations

import random

from feather_cpu import threads_binding
from feather_sglang.sglang_integration.dp_routing import BALANCE_ABS, PrefixGroupRouter

CHUNK = 50


def prompts(groups: int, per_group: int, prefix: int = 400, question: int = 20, seed: int = 0):
    """(group, token ids), shuffled across groups as they would arrive."""
    items = [
        (
            g,
            [10_000 * (g + 1) + t for t in range(prefix)]
            + [9_000_000 + 100 * i + t for t in range(question)],
        )
        for g in range(groups)
        for i in range(per_group)
    ]
    random.Random(seed).shuffle(items)
    return items


def route(router, items, workers: int, active=None):
    """Route every prompt, counting each dispatch as load (no request finishes)."""
    loads, placed = [0] * workers, {}
    for group, tokens in items:
        worker = router.pick(tokens, loads, active or list(range(workers)))
        loads[worker] += 1
        placed.setdefault(group, set()).add(worker)
    return loads, placed


def test_groups_stay_on_one_worker_while_loads_stay_within_bounds():
    for seed in range(5):
        router = PrefixGroupRouter(CHUNK)
        loads, placed = route(router, prompts(groups=16, per_group=8, seed=seed), workers=2)
        # All 128 arrive before any finishes: the bound splits a few groups near the end.
        assert sum(len(workers) == 1 for workers in placed.values()) >= 10, placed
        assert max(loads) - min(loads) <= 0.15 * sum(loads) / 2
        assert router.by_group >= 128 - 16 - 6 * 2


def test_with_requests_finishing_every_group_stays_whole():
    # Loads are outstanding requests: as they finish, a group's worker keeps it.
    router, loads, placed = PrefixGroupRouter(CHUNK), [0, 0], {}
    for i, (group, tokens) in enumerate(prompts(groups=8, per_group=8)):
        worker = router.pick(tokens, loads, [0, 1])
        placed.setdefault(group, set()).add(worker)
        loads[worker] += 1
        if i % 2:  # one request finishes on each worker for every two dispatched
            loads = [max(x - 1, 0) for x in loads]
    assert all(len(workers) == 1 for workers in placed.values()), placed


def test_an_overloaded_group_spills_to_the_least_loaded_worker():
    router = PrefixGroupRouter(CHUNK)
    loads, placed = route(router, prompts(groups=1, per_group=60), workers=4)
    assert placed[0] == {0, 1, 2, 3}  # one group cannot hold one worker at 60 to 0
    assert max(loads) - min(loads) <= 0.02 * 60 / 4 + BALANCE_ABS + 1


def test_a_short_shared_prefix_does_not_make_a_group():
    # 60 shared tokens (a chat template's header) before 400 tokens of the request's own:
    # below half of the prompt, so requests are spread by load, not sent to one worker.
    items = [
        (0, list(range(60)) + [1_000_000 + 1000 * i + t for t in range(400)]) for i in range(32)
    ]
    loads, _ = route(PrefixGroupRouter(CHUNK), items, workers=2)
    assert loads == [16, 16]


def test_an_inactive_owner_is_not_used_and_memory_is_bounded():
    router = PrefixGroupRouter(CHUNK, max_keys=20)
    first = prompts(groups=1, per_group=1)[0][1]
    assert router.pick(first, [0, 0], [0, 1]) == 0
    assert router.pick(first, [0, 5], [1]) == 1  # worker 0 is gone
    route(router, prompts(groups=30, per_group=2), workers=2)
    assert len(router.homes) <= 20


def test_cores_are_split_evenly_among_ranks():
    assert threads_binding(2, [0, 1]) == "0|1"
    assert threads_binding(2, [0, 1, 2, 3]) == "0-1|2-3"
    assert threads_binding(2, [0, 2, 4, 6]) == "0,2|4,6"
    assert threads_binding(4, [0, 1]) is None  # fewer cores than ranks: SGLang's own rules
