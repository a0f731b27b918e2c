"""The highest output throughput any stop/add agent can reach in a simulated regime.

Whatever an agent decides, the simulated server (:mod:`feather_rl.simulator`) must still do
this much work, one forward after another:

- **prefill**: every request's own prompt tokens, every prefix group's prefix at least once,
  and at least ``ceil(N / max_running)`` prefill forwards (each admits at most the batch cap);
- **decode**: every request's ``output - 1`` tokens after the first (the prefill's forward
  gives the first), ``D`` request-steps in all. A decode step runs at most ``B_max`` requests:
  the batch cap, and what the KV pool holds when each running request reserves its prompt and
  output tokens beside the prefixes of the groups it comes from (at least ``ceil(B / G_max)``
  groups for ``B`` requests, ``G_max`` the largest group). So there are at least
  ``S = max(output - 1, ceil(D / B_max))`` steps. A step costs
  ``fixed + per_request x batch + per_token x attended``: summed over steps, the per-request
  term is ``per_request x D`` and each request's own attended tokens add up exactly, whatever
  the batches. With per-request attention every request-step attends the prefix (``D`` times);
  with prefix-shared attention every step attends each group present once, and a group is
  present in at least ``output - 1`` steps, a step of ``B`` requests holds at least
  ``ceil(B / G_max)`` groups, and a step holds at least one.

With Poisson arrivals the run also lasts at least until the last arrival plus that request's
own prefill and decode. The bound is the output tokens over the larger of these durations,
with the step costs' expected (noise-free) values; :func:`feather_rl.simulator.max_throughput`
prices a seed's workload. Where an agent's throughput is close to the bound no decision can
gain much; where it is far, the bound may be loose (it ignores the arrival process beyond the
last request, and prefixes recomputed after eviction).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the simulator draws Poisson arrivals at capacity(): it imports this module
    from feather_rl.simulator import Regime, StepCosts


def min_duration_s(
    regime: Regime, costs: StepCosts, last_arrival_s: float = 0.0, largest_group: int | None = None
) -> float:
    """Seconds the simulated server needs at least for the regime's work (module docstring);
    ``largest_group``: requests in the workload's largest prefix group (default: all)."""
    n, own, out, prefix = (
        regime.requests,
        regime.question_len,
        regime.output_len,
        regime.prefix_len,
    )
    group = max(1, min(largest_group or n, n))
    prefills = math.ceil(n / regime.max_running)
    prefill = prefills * costs.prefill_fixed_s + costs.prefill_per_token_s * (
        n * own + regime.groups * prefix
    )
    d = n * (out - 1)
    if d == 0:
        return max(prefill, last_arrival_s + costs.prefill_s(own))
    b_max = batch_max(regime, group)
    steps = max(out - 1, math.ceil(d / b_max))
    a, b, c = costs.decode["prefix_shared" if regime.prefix_shared else "per_request"]
    own_attended = n * ((out - 1) * own + (out - 1) * out // 2)
    if regime.prefix_shared:  # once a step per group present: a group is present in at least
        # output - 1 steps, and a step of B requests holds at least ceil(B / group) groups
        groups_present = max(steps, min(regime.groups, n) * (out - 1), math.ceil(d / group))
        prefix_attended = prefix * groups_present
    else:
        prefix_attended = prefix * d
    decode = a * steps + b * d + c * (own_attended + prefix_attended)
    # the last request to arrive, alone: its own prefill, then its decode steps
    last = last_arrival_s + costs.prefill_s(own) + (out - 1) * (a + b + c * (prefix + own))
    return max(prefill + decode, last)


def batch_max(regime: Regime, largest_group: int) -> int:
    """The largest decode batch the KV pool and the batch cap allow: B requests reserve their
    prompt and output tokens, beside the prefixes of at least ceil(B / largest_group) groups."""
    per_request, prefix = regime.question_len + regime.output_len, regime.prefix_len
    pool, best = regime.pool_tokens(), 1
    for batch in range(1, min(regime.max_running, regime.requests) + 1):
        if math.ceil(batch / largest_group) * prefix + batch * per_request > pool:
            break
        best = batch
    return best


def capacity(regime: Regime, costs: StepCosts, largest_group: int | None = None) -> float:
    """The most requests/s any agent can serve on ``regime``'s server: its requests over the
    least time they need arriving at once (:func:`min_duration_s`). A Poisson ``load`` is a
    fraction of this, so ``load`` 1.0 is saturation for the best possible agent.
    ``largest_group`` as in :func:`min_duration_s` (default: equal groups)."""
    largest = largest_group or math.ceil(regime.requests / max(regime.groups, 1))
    return regime.requests / min_duration_s(regime, costs, 0.0, largest)
