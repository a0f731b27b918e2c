"""An SGLang server in simulated time: continuous batching, a radix cache, feather's own planner.

The simulator plays SGLang's part around feather's real :class:`AdmissionPlanner` (CHT,
starvation bound, prefix leader, rollback of picks the server cannot take), with the clock
set to simulated seconds:

- **Admission** (SGLang's ``PrefillAdder``): the planner's picks in order, while the KV pool
  can hold each pick's new tokens (its prefix, unless cached, plus its own prompt and output
  tokens, reserved in full) after evicting cached prefixes no running request uses, least
  recently used first, and while the pass's new prompt tokens stay within the prefill budget.
- **Prefill**: one forward of the admitted requests; a prefix not in the cache is computed by
  every request of the pass that needs it (SGLang does not share within a prefill batch).
- **Decode**: one token per running request per step, each step's time from
  :class:`~feather_sglang.agents.throughput.StepTimeModel`'s form with calibrated
  coefficients (``feather_rl/data/step_costs_cpu.json``, from real servers' logs), times a
  lognormal noise. A request leaves when its output is done; its prefix stays cached.
- **Arrivals**: all at once, or Poisson at a fraction of the server's capacity: the most
  requests/s any agent can serve (:func:`feather_rl.bound.capacity`).

A regime (:class:`Regime`) fixes the workload's shape and the server's configuration; a seed
draws group sizes, token ids and arrival times. :func:`simulate` runs an agent through one
workload and returns the server's throughput and latencies.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from feather_rl.bound import capacity, min_duration_s
from feather_sglang.agents import ServerShape, StopAddAgent
from feather_sglang.config import FeatherConfig
from feather_sglang.planner import AdmissionPlanner

DEFAULT_CALIBRATION = Path(__file__).resolve().parent / "data" / "step_costs_cpu.json"
VOCAB = 49_152  # SmolLM2's vocabulary: token ids are drawn below it
NOISE_SIGMA = 0.05  # step-time noise (lognormal sigma) seen on the CPU machine's decode steps


@dataclass(frozen=True)
class StepCosts:
    """Seconds of a forward step: decode per backend kind, prefill per new token."""

    decode: dict  # "prefix_shared" / "per_request" -> (fixed_s, per_request_s, per_token_s)
    prefill_fixed_s: float
    prefill_per_token_s: float

    @classmethod
    def load(cls, path: str | Path = DEFAULT_CALIBRATION) -> "StepCosts":
        """Read a calibration as ``feather-calibrate`` writes it; ValueError says what is wrong."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read step costs {path}: {e}") from None
        try:
            decode = {k: tuple(float(x) for x in v) for k, v in data["decode"].items()}
            costs = cls(decode, float(data["prefill_fixed_s"]), float(data["prefill_per_token_s"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(
                f"{path} is not a step-cost calibration (feather-calibrate --out): {e!r}"
            ) from None
        kinds = {"prefix_shared", "per_request"}
        if set(decode) != kinds or any(len(v) != 3 for v in decode.values()):
            raise ValueError(
                f"{path}: 'decode' must map {sorted(kinds)} to [fixed_s, per_request_s, per_token_s]"
            )
        values = [*decode["prefix_shared"], *decode["per_request"], costs.prefill_fixed_s]
        if not all(math.isfinite(x) and x >= 0 for x in [*values, costs.prefill_per_token_s]):
            raise ValueError(f"{path}: step costs must be finite and >= 0")
        return costs

    def decode_s(self, prefix_shared: bool, batch: int, attended_tokens: int) -> float:
        a, b, c = self.decode["prefix_shared" if prefix_shared else "per_request"]
        return a + b * batch + c * attended_tokens

    def prefill_s(self, new_tokens: int) -> float:
        return self.prefill_fixed_s + self.prefill_per_token_s * new_tokens


@dataclass(frozen=True)
class Regime:
    """A workload's shape and the server it runs on.

    ``kv_groups``: the KV pool holds this many groups' prefixes plus their requests' own and
    output tokens (None: the pool holds the whole workload). ``load``: Poisson arrivals at this
    fraction of the server's capacity, :func:`feather_rl.bound.capacity` (None: all at once).
    ``zipf``: group sizes drawn with this Zipf exponent (0: equal groups).
    """

    name: str
    groups: int
    requests: int
    prefix_len: int
    question_len: int = 32
    output_len: int = 32
    prefix_shared: bool = True
    kv_groups: float | None = None
    max_running: int = 256
    load: float | None = None
    zipf: float = 0.0
    prefill_budget: int = 16_384  # SGLang's default --max-prefill-tokens

    def pool_tokens(self) -> int:
        per_group = self.prefix_len + math.ceil(self.requests / self.groups) * (
            self.question_len + self.output_len
        )
        if self.kv_groups is None:  # room for the whole workload, four times over (SGLang sizes
            # the pool from free memory: ~700K tokens for SmolLM2 on the CPU machine)
            return 4 * (
                self.groups * self.prefix_len
                + self.requests * (self.question_len + self.output_len)
            )
        return max(
            int(self.kv_groups * per_group), self.prefix_len + self.question_len + self.output_len
        )

    def server(self) -> ServerShape:
        return ServerShape(self.prefix_shared, self.max_running, self.pool_tokens(), "bfloat16")


@dataclass
class _Request:
    rid: int
    group: int
    own: int
    output: int
    arrival: float
    tokens: np.ndarray
    admitted_at: float = -1.0
    first_token_at: float = -1.0
    generated: int = 0


@dataclass
class Result:
    """What a run measured: the numbers bench_serving reports, in simulated seconds."""

    regime: str
    seed: int
    output_tokens: int
    duration_s: float
    output_throughput: float
    mean_ttft_s: float
    p99_ttft_s: float
    decode_steps: int
    prefill_tokens: int
    evicted_prefixes: int
    stops: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _largest_group(groups) -> int:
    """How many requests the largest prefix group holds (``groups``: each request's group)."""
    return int(np.bincount(groups).max())


def workload(regime: Regime, seed: int, costs: StepCosts) -> list[_Request]:
    """The regime's requests for ``seed``: group sizes, token ids, arrival times."""
    rng = np.random.default_rng(seed)
    if regime.zipf > 0:
        weights = 1.0 / np.arange(1, regime.groups + 1) ** regime.zipf
        groups = rng.choice(regime.groups, size=regime.requests, p=weights / weights.sum())
    else:
        groups = np.arange(regime.requests) % regime.groups
    rng.shuffle(groups)
    prefixes = rng.integers(0, VOCAB, size=(regime.groups, regime.prefix_len))
    arrivals = np.zeros(regime.requests)
    if regime.load is not None:
        rate = regime.load * capacity(regime, costs, _largest_group(groups))
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=regime.requests))
        arrivals -= arrivals[0]
    reqs = []
    for rid, g in enumerate(groups):
        own = rng.integers(0, VOCAB, size=regime.question_len)
        reqs.append(
            _Request(
                rid,
                int(g),
                regime.question_len,
                regime.output_len,
                float(arrivals[rid]),
                np.concatenate((prefixes[g], own)),
            )
        )
    return reqs


class Server:
    """One simulated server running one workload; ``run`` drives it to the end."""

    def __init__(
        self,
        regime: Regime,
        seed: int,
        agent: StopAddAgent,
        costs: StepCosts | None = None,
        config: FeatherConfig | None = None,
        noise_sigma: float = NOISE_SIGMA,
    ) -> None:
        self.regime, self.seed = regime, seed
        self.noise_sigma = noise_sigma
        self.costs = costs or StepCosts.load()
        self.now = 0.0
        self.config = config or FeatherConfig(agent="static")
        self.planner = AdmissionPlanner(self.config, clock=lambda: self.now)
        self.planner.agent = agent
        agent.bind_server(regime.server())
        self.rng = np.random.default_rng(seed + 1)
        self.pending = workload(regime, seed, self.costs)  # by arrival time
        self.requests = {r.rid: r for r in self.pending}
        self.pending.reverse()
        self.waiting: set[int] = set()
        self.running: dict[int, _Request] = {}
        self.capacity = regime.pool_tokens()
        self.cache: OrderedDict[int, int] = (
            OrderedDict()
        )  # group -> prefix tokens cached (LRU first)
        self.refs: dict[int, int] = {}  # group -> running requests using its prefix
        self.reserved = 0  # running requests' own + output tokens
        self.decode_steps = self.prefill_tokens = self.evicted = 0

    # ---- memory --------------------------------------------------------------------------
    def _used(self) -> int:
        return self.reserved + sum(self.cache.values())

    def _evictable(self, keep: int = -1) -> int:
        return sum(t for g, t in self.cache.items() if not self.refs.get(g) and g != keep)

    def _make_room(self, need: int, keep: int) -> bool:
        free = self.capacity - self._used()
        if need <= free:
            return True
        if need > free + self._evictable(keep):
            return False
        for g in [g for g in self.cache if not self.refs.get(g) and g != keep]:
            free += self.cache.pop(g)
            self.evicted += 1
            if need <= free:
                break
        return True

    # ---- one scheduling pass, then one forward --------------------------------------------
    def _arrive(self) -> None:
        while self.pending and self.pending[-1].arrival <= self.now:
            r = self.pending.pop()
            self.waiting.add(r.rid)
            self.planner.on_enqueue(r.rid, r.tokens)

    def _pass(self) -> None:
        if not self.waiting or len(self.running) >= self.regime.max_running:
            return
        prefix = self.regime.prefix_len
        free = self.capacity - self._used() + self._evictable()
        plan = self.planner.plan(
            self.regime.max_running - len(self.running),
            cached_prefix_tokens=lambda rid: prefix
            if self.requests[rid].group in self.cache
            else 0,
            token_budget=self.regime.prefill_budget,
            kv_free_tokens=free,
            kv_capacity_tokens=self.capacity,
        )
        admitted, new_tokens, cached_before = [], 0, set(self.cache)
        for rid in plan.rids:
            r = self.requests[rid]
            cached = r.group in self.cache
            tokens = r.own + (0 if r.group in cached_before else prefix)
            if admitted and new_tokens + tokens > self.regime.prefill_budget:
                break
            if not self._make_room(r.own + r.output + (0 if cached else prefix), r.group):
                break
            if not cached:
                self.cache[r.group] = prefix
            self.cache.move_to_end(r.group)
            self.refs[r.group] = self.refs.get(r.group, 0) + 1
            self.reserved += r.own + r.output
            new_tokens += tokens
            admitted.append(rid)
        self.planner.end_pass(admitted)
        if not admitted:
            return
        for rid in admitted:
            self.waiting.discard(rid)
            self.running[rid] = self.requests[rid]
            self.requests[rid].admitted_at = self.now
        seconds = self._noisy(self.costs.prefill_s(new_tokens))
        self.now += seconds
        self.prefill_tokens += new_tokens
        self.planner.on_step(len(admitted), seconds, decode=False)
        for rid in admitted:  # the prefill's forward gives each its first token
            self._emit(self.requests[rid])

    def _decode(self) -> None:
        running = self.running
        groups = {r.group for r in running.values()}
        own = sum(r.own + r.generated for r in running.values())
        attended = (
            len(groups) if self.regime.prefix_shared else len(running)
        ) * self.regime.prefix_len + own
        seconds = self._noisy(
            self.costs.decode_s(self.regime.prefix_shared, len(running), attended)
        )
        self.planner.on_step(len(running), seconds, decode=True)
        self.now += seconds
        self.decode_steps += 1
        for r in list(running.values()):
            self._emit(r)

    def _emit(self, r: _Request) -> None:
        if r.generated == 0:
            r.first_token_at = self.now
        r.generated += 1
        if r.generated >= r.output:
            del self.running[r.rid]
            self.reserved -= r.own + r.output
            self.refs[r.group] -= 1
            self.planner.forget(r.rid)

    def _noisy(self, seconds: float) -> float:
        return seconds * float(self.rng.lognormal(0.0, self.noise_sigma))

    def run(self) -> Result:
        while self.pending or self.waiting or self.running:
            self._arrive()
            self._pass()
            if self.running:
                self._decode()
            elif self.pending and not self.waiting:
                self.now = max(self.now, self.pending[-1].arrival)
            elif self.waiting:
                raise RuntimeError(
                    f"{self.regime.name}: a waiting request cannot be admitted into an empty "
                    f"server (KV pool {self.capacity} tokens)"
                )
        return self._result()

    def _result(self) -> Result:
        reqs = list(self.requests.values())
        ttft = np.array([r.first_token_at - r.arrival for r in reqs])
        start = min(r.arrival for r in reqs)
        tokens = sum(r.output for r in reqs)
        duration = self.now - start
        return Result(
            self.regime.name,
            self.seed,
            tokens,
            duration,
            tokens / duration,
            float(ttft.mean()),
            float(np.percentile(ttft, 99)),
            self.decode_steps,
            self.prefill_tokens,
            self.evicted,
            dict(self.planner.stats.stops),
        )


def simulate(
    regime: Regime, seed: int, agent: StopAddAgent, costs: StepCosts | None = None
) -> Result:
    return Server(regime, seed, agent, costs).run()


def max_throughput(regime: Regime, seed: int, costs: StepCosts) -> float:
    """Output tokens/s no agent can exceed on ``regime``'s workload for ``seed`` (the same
    arrival times and groups as :func:`simulate`): :mod:`feather_rl.bound`."""
    reqs = workload(regime, seed, costs)
    last_arrival = max(r.arrival for r in reqs)
    tokens = sum(r.output for r in reqs)
    largest = _largest_group([r.group for r in reqs])
    return tokens / min_duration_s(regime, costs, last_arrival, largest)


def regime_with(regime: Regime, **changes) -> Regime:
    return replace(regime, **changes)
