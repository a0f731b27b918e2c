"""A shared-prefix workload sent concurrently to a real server, and greedy-output comparison
(used by the demo, the benchmarks and the end-to-end tests)."""

from __future__ import annotations

import concurrent.futures as cf
import random
import statistics
from dataclasses import dataclass

import requests

from feather_bench.tools.trace import read_trace

TOPICS = [
    "You are a meticulous travel agent. Plan trips with exact budgets, train times and hotels. ",
    "You are a patient math tutor. Explain every step, check the arithmetic twice, and be kind. ",
    "You are a pirate captain telling sea stories. Speak with salt, wind and old maps in mind. ",
]


def shared_prefix_prompts(
    groups: int, per_group: int, repeat: int = 6, seed: int = 0
) -> list[tuple[str, str]]:
    """(rid, prompt) pairs: ``groups`` long system prompts, each with ``per_group`` questions,
    shuffled so that arrival order mixes the groups (as in sglang's generated-shared-prefix)."""
    items = []
    for g in range(groups):
        system = TOPICS[g % len(TOPICS)] * repeat + f"(desk {g}) "
        for i in range(per_group):
            items.append(
                (f"g{g}-q{i}", system + f"Question {i}: what should I know about item {i * 7 + g}?")
            )
    random.Random(seed).shuffle(items)
    return items


def grouped_prompts(groups: int, per_group: int, seed: int = 0) -> list[tuple[str, str]]:
    """(rid, prompt): each group's system prompt differs from its first token on (a desk
    number, then a long role text), so that groups share no chunk with each other."""
    items = [
        (
            f"g{g}-q{i}",
            f"Desk {g}. " + TOPICS[g % len(TOPICS)] * 8 + f"Question {i}: item {i * 7 + g}?",
        )
        for g in range(groups)
        for i in range(per_group)
    ]
    random.Random(seed).shuffle(items)
    return items


@dataclass
class Output:
    rid: str
    text: str
    token_ids: list[int]
    top2: list[list[tuple[float, int]]]  # per output position: [(logprob, token id)] best first
    dp_rank: int | None = None  # the data-parallel worker that served it (--dp-size > 1)


def generate_all(
    url: str, prompts, max_new_tokens: int, concurrency: int | None = None, timeout_s: float = 600
):
    """POST every prompt to ``/generate`` at once (greedy); returns {rid: Output}."""

    def one(item):
        rid, text = item
        r = requests.post(
            url + "/generate",
            json={
                "rid": rid,
                "text": text,
                "sampling_params": {
                    "max_new_tokens": max_new_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
                "return_logprob": True,
                "top_logprobs_num": 2,
            },
            timeout=timeout_s,
        )
        r.raise_for_status()
        body = r.json()
        meta = body["meta_info"]
        ids = [t[1] for t in meta["output_token_logprobs"]]
        top2 = [[(lp, tid) for lp, tid, *_ in pos] for pos in meta["output_top_logprobs"]]
        return rid, Output(rid, body["text"], ids, top2, meta.get("dp_rank"))

    with cf.ThreadPoolExecutor(concurrency or len(prompts)) as pool:
        return dict(pool.map(one, prompts))


# NOTE: two logits closer than this (in log-probability) are a floating-point near-tie: batch
# composition changes the order of float additions in the matmuls, which moves logits by
# ~1e-6 relative in fp32; a scheduling bug (wrong KV, wrong request) moves them by whole units.
NEAR_TIE_LOGPROB_GAP = 1e-3


def compare_greedy(a: dict[str, Output], b: dict[str, Output]) -> list[str]:
    """Problems found comparing two runs of the same prompts; [] when equal.

    Where token i differs, it is accepted only if position i is a near-tie in both runs (the
    top-2 log-probabilities within NEAR_TIE_LOGPROB_GAP); the rest of that sequence is then
    not compared, as it continues from a different token.
    """
    problems = []
    assert a.keys() == b.keys()
    for rid in sorted(a):
        x, y = a[rid], b[rid]
        for i, (tx, ty) in enumerate(zip(x.token_ids, y.token_ids)):
            if tx == ty:
                continue
            gaps = [abs(o.top2[i][0][0] - o.top2[i][1][0]) for o in (x, y)]
            if max(gaps) > NEAR_TIE_LOGPROB_GAP:
                problems.append(
                    f"{rid}: token {i} differs ({tx} vs {ty}) with top-2 logprob gaps {gaps}"
                )
            break
        if len(x.token_ids) != len(y.token_ids):
            problems.append(f"{rid}: lengths {len(x.token_ids)} vs {len(y.token_ids)}")
    return problems


def group_of(rid: str) -> str:
    return rid.split("-", 1)[0]


def homogeneity(trace_path, rids) -> dict:
    """Decode-step statistics of how mixed the batches were, for the requests in ``rids``."""
    rids = set(rids)
    steps = [e for e in read_trace(trace_path) if e["mode"] == "decode" and set(e["rids"]) <= rids]
    if not steps:
        return {
            "decode_steps": 0,
            "mean_groups_per_step": float("nan"),
            "mean_shared_prefix_tokens": 0.0,
        }
    return {
        "decode_steps": len(steps),
        "mean_groups_per_step": statistics.mean(
            len({group_of(r) for r in e["rids"]}) for e in steps
        ),
        "mean_shared_prefix_tokens": statistics.mean(e["prefix_tokens"] for e in steps),
    }
