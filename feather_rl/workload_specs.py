"""Workloads for the environment: built-in names (with optional parameters) and JSONL files.

A spec is ``NAME`` (``gsp``, ``g8x8-p2000-q24``, ``g8x50-p400-q24``, ``g4x16-p2000-q200``,
``multilevel``, ``no-sharing``, or an alias from ``ALIASES``), a named shape (``g8x8-p400-q24``,
``g4x8-p1000-q100``: ``SPECS`` in
``feather_bench/workloads.py``, which parses specs), ``NAME:key=value,key=value`` (generator
parameters, e.g.
``gsp:groups=8,prompts_per_group=4``), or ``file:PATH`` (a workload file in the A/B tool's JSON
Lines format). Built-ins are rebuilt per seed (other text, other shuffle); a file is the same
every episode.
"""

from __future__ import annotations

from functools import lru_cache

from feather_bench.paths import model_dir
from feather_bench.workloads import (
    SPECS,
    Workload,
    WorkloadError,
    build_workload,
    load_tokenizer,
    load_workload_file,
    parse_spec,
)
from feather_sglang.chunk_hash import chunk_hashes

DEFAULT_TOKENIZER = model_dir("tiny-llama")  # SmolLM2's tokenizer
# feather-8x100 with 400-token prompts: within the replay recording's prompt lengths (the A/B
# tool's feather-8x100 has 2,000-token prompts, outside them).
FEATHER_8X8_P400 = SPECS["g8x8-p400-q24"]
# Training mixes the three A/B shapes and a few gsp variants; batchllm's shape, multilevel (and
# any workload file) are held out for evaluation.
TRAIN_WORKLOADS = (
    "gsp",
    FEATHER_8X8_P400,
    "no-sharing",
    "gsp:groups=2,prompts_per_group=16,prefix_len=256",
    "gsp:groups=8,prompts_per_group=4,prefix_len=800,question_len=64",
    "gsp:groups=16,prompts_per_group=2,prefix_len=300",
)
# The held-out batchllm shape is the one the shipped agents were evaluated on: BatchLLM's sizes
# halved (the A/B tool's ``batchllm`` is now the unhalved one, 4x the prefill work per episode).
BATCHLLM_HALF = SPECS["g4x8-p1000-q100"]
HELDOUT_WORKLOADS = (BATCHLLM_HALF, "multilevel")


@lru_cache(maxsize=64)
def load(
    spec: str, seed: int, tokenizer_path: str = str(DEFAULT_TOKENIZER)
) -> tuple[Workload, tuple[tuple[int, ...], ...]]:
    """(workload, its prompts' token ids), built once per (spec, seed)."""
    tokenizer = load_tokenizer(tokenizer_path)
    name, params = parse_spec(spec)
    if name == "file":
        workload = load_workload_file(params["path"], tokenizer)
    else:
        workload = build_workload(name, tokenizer, seed, **params)
    if len(workload.requests) < 2:
        raise WorkloadError(
            f"workload {spec!r} has {len(workload.requests)} request(s); batch formation needs >= 2"
        )
    return workload, tuple(r.input_ids for r in workload.requests)


@lru_cache(maxsize=64)
def keys(
    spec: str, seed: int, chunk_size: int, tokenizer_path: str = str(DEFAULT_TOKENIZER)
) -> tuple[list[int], ...]:
    """Cumulative chunk hashes of each request (what the CHT tracks), cached per workload."""
    _, prompts = load(spec, seed, tokenizer_path)
    return tuple(chunk_hashes(p, chunk_size) for p in prompts)
