"""Scale-out simulation: routers place prefix groups as documented, workers conserve requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from feather_rl import scaleout
from feather_rl.scaleout import CacheAware, PrefixGroup, Shape, run, workload
from feather_rl.simulator import StepCosts
from feather_sglang.config import FeatherConfig
from feather_sglang.sglang_integration import dp_routing

# 4 groups of 64 requests over 4 workers; the pool holds every group a worker gets, under either router
GROUPED = Shape(
    groups=4, prefix_len=512, prefix_shared=False, output_min=8, output_max=16, kv_groups=8
)


@pytest.fixture(scope="module")
def costs():
    return StepCosts.load()


@pytest.fixture(scope="module")
def grouped(costs):
    return {r: run(GROUPED, 4, r, seed=3, costs=costs) for r in scaleout.ROUTERS}


def _bound(mean: float) -> float:
    """The most requests dp_routing's bounded loads let a group's worker hold (offline, so the
    loads it sees are the requests routed so far)."""
    return (1 + dp_routing.BALANCE_REL_SLACK) * mean + dp_routing.BALANCE_ABS


def test_prefix_group_keeps_each_group_on_few_workers_within_the_shipped_routers_load_bound(
    grouped,
):
    res, rr = grouped["prefix_group"], grouped["round_robin"]
    mean = res.requests / 4
    assert max(res.per_worker_requests) <= _bound(mean)  # 1.02 x 64 + 3
    # a group's home takes its requests while within the bound; when every home is above it,
    # the least-loaded worker becomes one more home: a few workers a group, not all four
    assert res.workers_per_group <= 2.5 < rr.workers_per_group
    assert res.evicted_prefixes == 0
    assert res.prefix_tokens <= 0.6 * rr.prefix_tokens
    assert res.groups_per_batch < rr.groups_per_batch / 1.5


def test_round_robin_puts_every_group_on_every_worker_each_computing_the_prefix(grouped):
    res = grouped["round_robin"]
    assert res.workers_per_group == 4.0
    assert res.per_worker_requests == [64, 64, 64, 64]
    assert res.evicted_prefixes == 0
    # once per worker a group lands on, no more (the prefix leader computes it; the rest hit the cache)
    assert res.prefix_tokens == 4 * GROUPED.groups * GROUPED.prefix_len
    assert res.groups_per_batch > 1.5 * grouped["prefix_group"].groups_per_batch


def test_prefix_group_beats_round_robin_with_per_request_attention_when_the_pool_holds_few_groups(
    costs,
):
    shape = Shape(
        groups=8, prefix_len=1024, prefix_shared=False, output_min=8, output_max=16, kv_groups=2
    )
    rr, pg = (run(shape, 4, r, seed=0, costs=costs) for r in ("round_robin", "prefix_group"))
    assert pg.evicted_prefixes < rr.evicted_prefixes / 4
    assert pg.prefix_tokens <= rr.prefix_tokens / 2
    assert pg.throughput > 1.15 * rr.throughput


@pytest.mark.parametrize("router", list(scaleout.ROUTERS))
@pytest.mark.parametrize("load", [None, 0.8])
def test_every_request_finishes_exactly_once_and_every_output_token_is_counted(costs, router, load):
    shape = Shape(
        groups=5,
        prefix_len=256,
        prefix_shared=True,
        output_min=4,
        output_max=24,
        requests_per_worker=16,
        kv_groups=1.5,
        load=load,
    )
    res = run(shape, 3, router, seed=1, costs=costs)
    reqs, _ = workload(shape, 3, 1, costs)
    assert sorted(res.finished) == list(range(len(reqs)))
    assert res.output_tokens == sum(r.output for r in reqs)
    assert sum(res.per_worker_requests) == len(reqs) == res.requests
    assert res.throughput == pytest.approx(res.output_tokens / res.makespan_s)
    if load is not None:  # arrivals spread over time: the makespan covers them
        assert res.makespan_s > max(r.arrival for r in reqs)


def test_prefix_group_spills_a_large_group_but_bounds_each_workers_load(costs):
    # 2 groups over 8 workers: each group must spread; no worker may exceed the shipped bound
    shape = Shape(
        groups=2,
        prefix_len=256,
        prefix_shared=True,
        output_min=4,
        output_max=8,
        requests_per_worker=64,
    )
    res = run(shape, 8, "prefix_group", seed=2, costs=costs)
    assert res.workers_per_group > 1  # it did spill
    assert res.workers_per_group < 8  # ... but not over every worker
    assert max(res.per_worker_requests) <= _bound(res.requests / 8)
    assert res.idle_workers == 0


def test_scaleouts_prefix_group_is_the_shipped_router():
    """The same prompts and loads through scaleout's router and dp_routing's pick alike."""
    rng = np.random.default_rng(1)
    prefixes = rng.integers(0, 1000, (5, 300))
    ours, shipped = PrefixGroup(4), dp_routing.PrefixGroupRouter(FeatherConfig().chunk_size)
    assert isinstance(ours.router, dp_routing.PrefixGroupRouter)
    picks = []
    for _ in range(200):
        tokens = np.concatenate((prefixes[rng.integers(5)], rng.integers(0, 1000, 32)))
        loads = rng.integers(0, 12, 4)
        pick = ours.pick(tokens, loads.astype(float))
        assert pick == shipped.pick(tokens.tolist(), loads.tolist(), [0, 1, 2, 3])
        picks.append(pick)
    assert len(set(picks)) == 4


def test_prefix_group_router_follows_the_longest_owned_prefix_and_spills_past_the_bound():
    chunk = FeatherConfig().chunk_size
    router = PrefixGroup(3)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 1000, 12 * chunk)
    fresh = lambda n: rng.integers(0, 1000, n)  # noqa: E731
    assert (
        router.pick(a, np.array([5.0, 1.0, 3.0])) == 1
    )  # first sight: least loaded, which owns a's chunks
    # shares 8 of 10 chunks with a: a's worker, though not the least loaded
    assert (
        router.pick(np.concatenate((a[: 8 * chunk], fresh(2 * chunk))), np.array([1.0, 2.0, 1.0]))
        == 1
    )
    # shares 4 of 10 chunks (under MIN_SHARE): the least loaded, which owns the 6 chunks after them
    b = np.concatenate((a[: 4 * chunk], fresh(6 * chunk)))
    assert router.pick(b, np.array([1.0, 2.0, 0.0])) == 2
    # the longest owned prefix wins: b's 10 chunks (worker 2) over the 4 it shares with a (worker 1)
    assert router.pick(np.concatenate((b, fresh(chunk))), np.array([1.0, 0.0, 2.0])) == 2
    # bounded loads: a's worker takes it while its load + 1 <= 1.02 x the mean (with it) + 3
    assert router.pick(a, np.array([0.0, 3.0, 0.0])) == 1  # 4 <= 1.02 x 4 / 3 + 3
    assert router.pick(a, np.array([0.0, 4.0, 0.0])) == 0  # 5 > 1.02 x 5 / 3 + 3: least loaded
    # a spill does not move the group: with the loads balanced again, a goes back to worker 1
    assert router.pick(np.concatenate((a, fresh(chunk))), np.array([3.0, 3.0, 3.0])) == 1


def test_cache_aware_follows_the_longest_match_while_balanced_and_the_least_loaded_when_not():
    router = CacheAware(3)
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 1000, 512)
    ask = lambda: np.concatenate((prefix, rng.integers(0, 1000, 32)))  # noqa: E731
    assert router.pick(ask(), np.array([2.0, 0.0, 1.0])) == 1  # nothing matches: least loaded
    assert router.pick(ask(), np.array([2.0, 30.0, 1.0])) == 1  # balanced (30 - 1 <= 64): the match
    assert router.pick(ask(), np.array([2.0, 100.0, 1.0])) == 2  # imbalanced: least loaded
    other = rng.integers(0, 1000, 544)
    assert router.pick(other, np.array([0.0, 3.0, 1.0])) == 0  # no match above the threshold


def test_cli_writes_rows_summary_and_provenance(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert (
        scaleout.main(
            [
                "--workers",
                "2",
                "--groups",
                "2",
                "--prefixes",
                "256",
                "--backends",
                "per_request",
                "--requests-per-worker",
                "8",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 3
    assert {"command", "date", "machine", "git"} <= set(data["provenance"])
    assert data["provenance"]["costs_provenance"]["command"].startswith(
        "python -m feather_rl.calibrate"
    )
    assert "prefix_group/per_request/N=2" in data["summary"]
    printed = capsys.readouterr().out
    assert "| per_request | 2 | 256 | 2 |" in printed  # the table
    assert "| per_request | 2 | 1." in printed or "| per_request | 2 | 0." in printed  # the summary
    assert scaleout.main(["--from-json", str(out)]) == 0
    assert capsys.readouterr().out == printed
