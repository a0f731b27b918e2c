"""Feather across data-parallel workers, in simulated time: which router keeps batches homogeneous.

    python -m feather_rl.scaleout --json results/scaleout/projection.json
    python -m feather_rl.scaleout --workers 4,16 --groups 32 --prefixes 8192 --routers round_robin,prefix_group

A cluster of N workers, each a :class:`feather_rl.simulator.Server` running feather's real
:class:`~feather_sglang.planner.AdmissionPlanner` with the default ``admit`` agent, behind a
router that sends each request to one worker when it arrives. The workers run in lockstep:
before each arrival every worker is advanced to the arrival's time, so the router sees each
worker's true outstanding requests (routed there and not finished), the load SGLang's
data-parallel controller and sglang-router count. Routers (:data:`ROUTERS`):

- ``round_robin``: worker ``i mod N`` for the i-th request (``--dp-size N``'s default, and
  sglang-router's ``round_robin``). Every group lands on every worker.
- ``prefix_group``: feather's own router, the class SGLang's data-parallel controller runs with
  ``--load-balance-method prefix_group``: the least-loaded home of the request's longest
  chunk-aligned prefix (at least half the prompt) while its load stays within 1.02 times the
  mean plus 3 requests; when every home is above that, the least-loaded worker, which becomes
  one more home of the prefix ("consistent hashing with bounded loads").
- ``cache_aware``: a model of sglang-router's / smg's ``cache_aware`` policy: per worker, the
  prompts routed there (their chained chunk hashes, :data:`MATCH_CHUNK` tokens a chunk, standing
  in for the router's approximate character tree, never evicted). While the loads are balanced
  the request goes to the worker with the longest prefix match if the matched fraction of the
  prompt exceeds ``cache_threshold``, else to the least-loaded worker; once
  ``max - min > balance_abs`` and ``max > balance_rel * min``, to the least-loaded worker.

The workloads (:class:`Shape`) follow the Feather paper's: G prefix groups of equal size,
prefixes of 2K-20K tokens, 32-token questions, outputs drawn from 32-128 tokens, all requests
arriving at once (an offline batch) or Poisson at a fraction of the cluster's capacity. A
worker's KV pool holds ``kv_groups`` prefixes plus a full batch's own tokens (see
``docs/scale-out.md`` for every assumption). Step times are the simulator's CPU-calibrated
costs: the ratios between routers are the projection, not the absolute tokens/s.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from feather_bench.argtypes import ints
from feather_rl import provenance
from feather_rl.bound import capacity
from feather_rl.simulator import (
    DEFAULT_CALIBRATION,
    VOCAB,
    Regime,
    Server,
    StepCosts,
    _Request,
)
from feather_sglang.agents import ServerShape, make_agent
from feather_sglang.chunk_hash import chunk_hashes
from feather_sglang.config import FeatherConfig
from feather_sglang.sglang_integration.dp_routing import PrefixGroupRouter

MATCH_CHUNK = 64  # cache_aware's match granularity, in tokens
# smg's command-line defaults for cache_aware (sglang-router's older defaults were 0.5 / 32 / 1.0001);
# with prefixes of thousands of tokens and 32-token questions any threshold below ~0.9 routes alike
CACHE_THRESHOLD, BALANCE_ABS, BALANCE_REL = 0.3, 64, 1.5


# ---- workload -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """A cluster workload and the configuration of each worker.

    ``requests_per_worker`` sizes the workload to the cluster (at least
    ``min_requests_per_group`` per group); ``kv_groups``: a worker's KV pool holds this many
    prefixes besides the question and longest output of every request an even split gives a
    worker; ``load``: Poisson arrivals at this fraction of the cluster's capacity, N times
    :func:`~feather_rl.bound.capacity` of a worker's share (None: all at once).
    """

    groups: int
    prefix_len: int
    prefix_shared: bool = True
    question_len: int = 32
    output_min: int = 32
    output_max: int = 128
    requests_per_worker: int = 64
    min_requests_per_group: int = 8
    kv_groups: float = 4.0
    max_running: int = 256
    load: float | None = None
    prefill_budget: int = 16_384

    @property
    def backend(self) -> str:
        return "prefix_shared" if self.prefix_shared else "per_request"

    @property
    def name(self) -> str:
        return f"{self.groups}x{self.prefix_len}/{self.backend}"

    def requests(self, workers: int) -> int:
        return max(workers * self.requests_per_worker, self.groups * self.min_requests_per_group)

    def pool_tokens(self, workers: int) -> int:
        per_worker = math.ceil(self.requests(workers) / workers)
        return int(self.kv_groups * self.prefix_len) + per_worker * (
            self.question_len + self.output_max
        )

    def worker_regime(self, workers: int) -> Regime:
        """One worker's share, as a simulator regime (for :func:`~feather_rl.bound.capacity`)."""
        per_worker = math.ceil(self.requests(workers) / workers)
        groups = max(1, math.ceil(self.groups / workers))
        per_group = self.prefix_len + math.ceil(per_worker / groups) * (
            self.question_len + self.output_max
        )
        return Regime(
            f"{self.name}/worker",
            groups=groups,
            requests=per_worker,
            prefix_len=self.prefix_len,
            question_len=self.question_len,
            output_len=(self.output_min + self.output_max) // 2,
            prefix_shared=self.prefix_shared,
            kv_groups=self.pool_tokens(workers) / per_group,
            max_running=self.max_running,
            prefill_budget=self.prefill_budget,
        )


def workload(
    shape: Shape, workers: int, seed: int, costs: StepCosts
) -> tuple[list[_Request], np.ndarray]:
    """The requests (by arrival time, ``tokens`` left empty) and the groups' prefixes: a request's
    prompt is ``prefix[group] + question``, built when it is routed (see :func:`prompt`)."""
    rng = np.random.default_rng(seed)
    n = shape.requests(workers)
    groups = np.arange(n) % shape.groups
    rng.shuffle(groups)
    prefixes = rng.integers(0, VOCAB, size=(shape.groups, shape.prefix_len))
    questions = rng.integers(0, VOCAB, size=(n, shape.question_len))
    outputs = rng.integers(shape.output_min, shape.output_max + 1, size=n)
    arrivals = np.zeros(n)
    if shape.load is not None:
        rate = shape.load * workers * capacity(shape.worker_regime(workers), costs)
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
        arrivals -= arrivals[0]
    reqs = [
        _Request(
            rid,
            int(groups[rid]),
            shape.question_len,
            int(outputs[rid]),
            float(arrivals[rid]),
            questions[rid],
        )
        for rid in range(n)
    ]
    return reqs, prefixes


def prompt(r: _Request, prefixes: np.ndarray) -> np.ndarray:
    return np.concatenate((prefixes[r.group], r.tokens))


# ---- workers --------------------------------------------------------------------------------
class Worker(Server):
    """A simulated SGLang server fed by a router instead of its own workload.

    Requests join through :meth:`accept` at the worker's current time; :meth:`advance` runs
    the server's loop (one scheduling pass, then one forward) until its clock reaches a time.
    """

    def __init__(
        self,
        index: int,
        shape: Shape,
        workers: int,
        seed: int,
        costs: StepCosts,
        config: FeatherConfig,
    ) -> None:
        regime = shape.worker_regime(workers)
        agent = make_agent(config)
        super().__init__(
            Regime(
                regime.name,
                1,
                0,
                shape.prefix_len,
                question_len=shape.question_len,
                output_len=regime.output_len,
                prefix_shared=shape.prefix_shared,
                max_running=shape.max_running,
                prefill_budget=shape.prefill_budget,
            ),
            seed * 1009 + index,
            agent,
            costs,
            config,
        )
        self.index = index
        self.capacity = shape.pool_tokens(workers)
        agent.bind_server(
            ServerShape(shape.prefix_shared, shape.max_running, self.capacity, "bfloat16")
        )
        self.finished: list[int] = []
        self.batch_groups = 0  # sum over decode steps of the prefix groups in the batch
        self.batch_requests = 0  # ... and of the requests

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def accept(self, r: _Request, tokens: np.ndarray) -> None:
        self.requests[r.rid] = r
        self.waiting.add(r.rid)
        self.planner.on_enqueue(r.rid, tokens)

    def step(self) -> None:
        self._pass()
        if self.running:
            self._decode()
        elif self.waiting:
            raise RuntimeError(
                f"{self.regime.name}: a waiting request cannot be admitted into an empty "
                f"worker (KV pool {self.capacity} tokens)"
            )

    def advance(self, until: float) -> None:
        while self.now < until and (self.waiting or self.running):
            self.step()
        self.now = max(self.now, until)

    def drain(self) -> None:
        while self.waiting or self.running:
            self.step()

    def _decode(self) -> None:
        self.batch_groups += len({r.group for r in self.running.values()})
        self.batch_requests += len(self.running)
        super()._decode()

    def _emit(self, r: _Request) -> None:
        super()._emit(r)
        if r.generated == r.output:
            self.finished.append(r.rid)


# ---- routers --------------------------------------------------------------------------------
class Router:
    name = "router"

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def pick(self, tokens: np.ndarray, loads: np.ndarray) -> int:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.next = 0

    def pick(self, tokens, loads):
        i, self.next = self.next, (self.next + 1) % self.workers
        return i


class PrefixGroup(Router):
    """feather's own router, the one SGLang's data-parallel controller runs with
    ``--load-balance-method prefix_group`` (:class:`PrefixGroupRouter`): the worker that already
    serves the request's longest chunk-aligned prefix, within bounded loads."""

    name = "prefix_group"

    def __init__(self, workers: int, chunk_size: int = FeatherConfig().chunk_size) -> None:
        super().__init__(workers)
        self.router = PrefixGroupRouter(chunk_size)
        self.active = list(range(workers))

    def pick(self, tokens, loads):
        return self.router.pick(tokens, loads.tolist(), self.active)


class CacheAware(Router):
    """A model of the router's ``cache_aware`` policy (module docstring)."""

    name = "cache_aware"

    def __init__(
        self,
        workers: int,
        threshold: float = CACHE_THRESHOLD,
        balance_abs: int = BALANCE_ABS,
        balance_rel: float = BALANCE_REL,
    ) -> None:
        super().__init__(workers)
        self.threshold, self.balance_abs, self.balance_rel = threshold, balance_abs, balance_rel
        self.tree: dict[int, dict[int, int]] = {}  # chunk hash -> {worker: last routing there}
        self.clock = 0

    def _match(self, hashes: list[int]) -> tuple[int, int]:
        """(chunks matched, the worker that saw them last) for the longest match; hashes chain,
        so a prompt's k-th hash is present only if its first k are."""
        tree, lo, hi = self.tree, 0, len(hashes)
        while lo < hi:  # the number of leading hashes present
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in tree:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return 0, -1
        tenants = tree[hashes[lo - 1]]
        return lo, max(tenants, key=tenants.__getitem__)

    def pick(self, tokens, loads):
        hashes = chunk_hashes(tokens, MATCH_CHUNK)
        hi, lo = int(loads.max()), int(loads.min())
        imbalanced = hi - lo > self.balance_abs and hi > self.balance_rel * lo
        choice = -1
        if not imbalanced:
            matched, worker = self._match(hashes)
            if (
                worker >= 0
                and min(matched * MATCH_CHUNK, len(tokens)) / len(tokens) > self.threshold
            ):
                choice = worker
        if choice < 0:
            choice = int(np.argmin(loads))
        self.clock += 1
        for h in hashes:
            self.tree.setdefault(h, {})[choice] = self.clock
        return choice


ROUTERS: dict[str, type[Router]] = {r.name: r for r in (RoundRobin, PrefixGroup, CacheAware)}


# ---- one cluster run ------------------------------------------------------------------------
@dataclass
class ClusterResult:
    """What a cluster run measured (simulated seconds)."""

    shape: str
    backend: str
    groups: int
    prefix_len: int
    router: str
    workers: int
    seed: int
    requests: int
    output_tokens: int
    makespan_s: float
    throughput: float  # output tokens / makespan
    per_worker_requests: list = field(default_factory=list)
    spread: float | None = 0.0  # max / min - 1 of per_worker_requests (None if a worker got none)
    idle_workers: int = 0  # workers that got no request
    prefix_tokens: int = 0  # prefix tokens prefilled, all workers
    prefix_tokens_once: int = 0  # groups x prefix: each group's prefix computed once in the cluster
    workers_per_group: float = 0.0  # mean number of workers a group's requests went to
    groups_per_batch: float = 0.0  # mean prefix groups in a decode batch, over all workers' steps
    batch_size: float = 0.0  # mean requests in a decode batch
    mean_ttft_s: float = 0.0
    evicted_prefixes: int = 0
    finished: list = field(default_factory=list, repr=False)  # request ids as they finished (tests)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("finished")
        return d


def run(
    shape: Shape,
    workers: int,
    router: str | Router,
    seed: int = 0,
    costs: StepCosts | None = None,
    config: FeatherConfig | None = None,
) -> ClusterResult:
    """One workload through ``workers`` simulated workers behind ``router``."""
    costs = costs or StepCosts.load()
    config = config or FeatherConfig()
    route = ROUTERS[router](workers) if isinstance(router, str) else router
    reqs, prefixes = workload(shape, workers, seed, costs)
    pool = [Worker(i, shape, workers, seed, costs, config) for i in range(workers)]
    placed: dict[int, set[int]] = {}  # group -> workers
    counts = np.zeros(workers, dtype=int)
    loads = np.zeros(workers)
    for r in reqs:
        for i, w in enumerate(pool):
            w.advance(r.arrival)
            loads[i] = w.outstanding
        tokens = prompt(r, prefixes)
        i = route.pick(tokens, loads)
        r.tokens = np.empty(0, dtype=np.int64)  # the planner keeps its hashes, not the prompt
        pool[i].accept(r, tokens)
        counts[i] += 1
        placed.setdefault(r.group, set()).add(i)
    for w in pool:
        w.drain()
    output = sum(r.output for r in reqs)
    makespan = max(w.now for w in pool) - min(r.arrival for r in reqs)
    steps = sum(w.decode_steps for w in pool)
    own = shape.question_len * len(reqs)
    ttft = np.array([r.first_token_at - r.arrival for r in reqs])
    return ClusterResult(
        shape.name,
        shape.backend,
        shape.groups,
        shape.prefix_len,
        route.name,
        workers,
        seed,
        len(reqs),
        output,
        makespan,
        output / makespan,
        counts.tolist(),
        float(counts.max() / counts.min() - 1) if counts.min() else None,
        int((counts == 0).sum()),
        sum(w.prefill_tokens for w in pool) - own,
        shape.groups * shape.prefix_len,
        float(np.mean([len(v) for v in placed.values()])),
        sum(w.batch_groups for w in pool) / max(steps, 1),
        sum(w.batch_requests for w in pool) / max(steps, 1),
        float(ttft.mean()),
        sum(w.evicted for w in pool),
        [rid for w in pool for rid in w.finished],
    )


# ---- the projection grid --------------------------------------------------------------------
GROUPS = (8, 32, 100)
PREFIXES = (2048, 8192, 20_000)
WORKERS = (4, 8, 16, 32, 64)


def grid(
    groups=GROUPS, prefixes=PREFIXES, backends=("prefix_shared", "per_request"), **shape
) -> list[Shape]:
    return [
        Shape(g, p, prefix_shared=(b == "prefix_shared"), **shape)
        for b in backends
        for g in groups
        for p in prefixes
    ]


def table(rows: list[dict], routers: list[str]) -> str:
    """A markdown table, one line per shape and worker count: round robin's throughput, the other
    routers' over it, and per router (in ``routers``' order) the prefix tokens prefilled over the
    minimum (each group's prefix once in the cluster), the prefix groups in a mean decode batch
    and the spread of requests per worker (max / min - 1)."""
    by = {(r["shape"], r["workers"], r["router"]): r for r in rows}
    keys = sorted(
        {(r["backend"], r["groups"], r["prefix_len"], r["shape"], r["workers"]) for r in rows}
    )
    base = "round_robin" if "round_robin" in routers else routers[0]
    others = [r for r in routers if r != base]
    short = "/".join(_SHORT.get(r, r) for r in routers)
    head = (
        ["backend", "groups", "prefix", "N", f"{_SHORT.get(base, base)} tok/s"]
        + [f"{_SHORT.get(r, r)} / {_SHORT.get(base, base)}" for r in others]
        + [f"prefill x ({short})", f"groups/batch ({short})", f"spread ({short})"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for backend, g, p, name, n in keys:
        cells = [by.get((name, n, r)) for r in routers]
        if any(c is None for c in cells):
            continue
        ref = by[(name, n, base)]["throughput"]
        row = [backend, str(g), str(p), str(n), f"{ref:.1f}"]
        row += [f"{by[(name, n, r)]['throughput'] / ref:.2f}" for r in others]
        row.append(" / ".join(f"{c['prefix_tokens'] / c['prefix_tokens_once']:.1f}" for c in cells))
        row.append(" / ".join(f"{c['groups_per_batch']:.1f}" for c in cells))
        row.append(
            " / ".join(
                f"{c['spread']:.2f}" if c["spread"] is not None else f"{c['idle_workers']} idle"
                for c in cells
            )
        )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


_SHORT = {"round_robin": "rr", "prefix_group": "pg", "cache_aware": "ca"}


def summary_table(summ: dict) -> str:
    """The summary as a markdown table: backend and worker count down, routers across."""
    cols = sorted({k.split("/")[0] for k in summ})
    rows = sorted({(k.split("/")[1], int(k.split("N=")[1])) for k in summ})
    lines = [
        "| backend | N | " + " | ".join(f"{c} / rr: geomean (min-max)" for c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for backend, n in rows:
        cells = []
        for c in cols:
            v = summ.get(f"{c}/{backend}/N={n}")
            cells.append("" if v is None else f"{v['geomean']:.2f} ({v['min']:.2f}-{v['max']:.2f})")
        lines.append(f"| {backend} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict], routers: list[str]) -> dict:
    """Geometric mean, min and max over shapes of each router's throughput over round robin's,
    per worker count and backend."""
    by = {(r["shape"], r["workers"], r["router"]): r["throughput"] for r in rows}
    out: dict = {}
    for r in routers:
        if r == "round_robin" or "round_robin" not in routers:
            continue
        for row in rows:
            if row["router"] != r or (row["shape"], row["workers"], "round_robin") not in by:
                continue
            key = f"{r}/{row['backend']}/N={row['workers']}"
            out.setdefault(key, []).append(
                row["throughput"] / by[(row["shape"], row["workers"], "round_robin")]
            )
    return {
        k: {
            "geomean": float(np.exp(np.mean(np.log(v)))),
            "min": min(v),
            "max": max(v),
            "shapes": len(v),
        }
        for k, v in out.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m feather_rl.scaleout",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--json", type=Path, help="write the rows, a summary and provenance here")
    ap.add_argument(
        "--workers", type=ints, default=WORKERS, help="worker counts (default %(default)s)"
    )
    ap.add_argument(
        "--groups", type=ints, default=GROUPS, help="prefix groups (default %(default)s)"
    )
    ap.add_argument(
        "--prefixes",
        type=ints,
        default=PREFIXES,
        help="prefix lengths in tokens (default %(default)s)",
    )
    ap.add_argument(
        "--backends",
        default="prefix_shared,per_request",
        help="decode attention cost kinds: prefix_shared (feather's backend), per_request",
    )
    ap.add_argument("--routers", default=",".join(ROUTERS), help="routers (default %(default)s)")
    ap.add_argument("--requests-per-worker", type=int, default=Shape.requests_per_worker)
    ap.add_argument(
        "--kv-groups",
        type=float,
        default=Shape.kv_groups,
        help="prefixes a worker's KV pool holds, besides a full batch's own tokens (default %(default)s)",
    )
    ap.add_argument("--max-running", type=int, default=Shape.max_running)
    ap.add_argument(
        "--load",
        type=float,
        default=None,
        help="Poisson arrivals at this fraction of the cluster's capacity (default: all at once)",
    )
    ap.add_argument("--seeds", type=ints, default=(0,), help="workload seeds (default %(default)s)")
    ap.add_argument(
        "--costs", type=Path, default=DEFAULT_CALIBRATION, help="step-cost calibration JSON"
    )
    ap.add_argument(
        "--from-json", type=Path, help="print the tables of a written projection, run nothing"
    )
    args = ap.parse_args(argv)
    if args.from_json:
        import json

        data = json.loads(args.from_json.read_text())
        routers = list(dict.fromkeys(r["router"] for r in data["rows"]))
        print(summary_table(data["summary"]) + "\n\n" + table(data["rows"], routers))
        return 0
    routers = [r for r in args.routers.split(",") if r]
    for r in routers:
        if r not in ROUTERS:
            ap.error(f"unknown router {r!r}; allowed: {', '.join(ROUTERS)}")
    backends = [b for b in args.backends.split(",") if b]
    try:
        costs = StepCosts.load(args.costs)
    except ValueError as e:
        ap.error(f"--costs: {e}")
    shapes = grid(
        args.groups,
        args.prefixes,
        backends,
        requests_per_worker=args.requests_per_worker,
        kv_groups=args.kv_groups,
        max_running=args.max_running,
        load=args.load,
    )
    jobs = [
        (s, n, r, seed)
        for s in shapes
        for n in args.workers
        for r in routers
        for seed in args.seeds
    ]
    from tqdm import tqdm

    started = time.time()
    rows = []
    for s, n, r, seed in tqdm(jobs, desc="scale-out", unit="run", file=sys.stderr):
        rows.append(run(s, n, r, seed, costs).as_dict())
    if len(args.seeds) > 1:  # one row per (shape, workers, router): throughput averaged over seeds
        rows = _mean_over_seeds(rows)
    text = table(rows, routers)
    summ = summary(rows, routers)
    print(summary_table(summ) + "\n\n" + text)
    if args.json:
        import json

        calibration = json.loads(Path(args.costs).read_text()).get("provenance")
        out = {
            "rows": rows,
            "summary": summ,
            "table": text,
            "provenance": provenance.record(
                seconds=round(time.time() - started, 1),
                costs=_repo_path(args.costs),
                costs_provenance=calibration,
            ),
        }
        provenance.write_json(args.json, out)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _repo_path(path: Path) -> str:
    repo = Path(__file__).resolve().parents[1]
    try:
        return str(Path(path).resolve().relative_to(repo))
    except ValueError:
        return str(path)


def _mean_over_seeds(rows: list[dict]) -> list[dict]:
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["shape"], r["workers"], r["router"]), []).append(r)
    out = []
    for runs in groups.values():
        row = dict(runs[0])
        for k in (
            "makespan_s",
            "throughput",
            "prefix_tokens",
            "workers_per_group",
            "groups_per_batch",
            "batch_size",
            "mean_ttft_s",
        ):
            row[k] = float(np.mean([r[k] for r in runs]))
        spreads = [r["spread"] for r in runs]
        row["spread"] = None if None in spreads else float(np.mean(spreads))
        row["idle_workers"] = max(r["idle_workers"] for r in runs)
        row["seed"] = [r["seed"] for r in runs]
        out.append(row)
    return out


if __name__ == "__main__":
    sys.exit(main())
