"""``--dataset-name``: the workload from ``sglang.benchmark.datasets``, as ``sglang.bench_serving``
builds it from the same flags and seed, so feather-ab and bench_serving can send the same prompts.

=========================== ====================================================================
``generated-shared-prefix`` ``--gsp-num-groups`` system prompts of ``--gsp-system-prompt-len``
                            random tokens, each with ``--gsp-prompts-per-group`` questions of
                            ``--gsp-question-len`` tokens, ``--gsp-output-len`` output tokens
                            (``--num-prompts`` is not used: there are groups x prompts requests)
``random``                  ``--num-prompts`` prompts of ``--random-input-len`` tokens cut from
                            a local ShareGPT file (``--dataset-path``), ``--random-output-len``
``random-ids``              the same, from random token ids (no file needed)
``sharegpt``                ``--num-prompts`` conversations from a local ShareGPT JSON file
                            (``--dataset-path``; nothing is downloaded)
``file``                    a feather workload file (JSON Lines, ``--dataset-path``; the format
                            of ``--workload-file``)
=========================== ====================================================================

Like bench_serving, Python's and NumPy's global random generators are seeded with ``--seed``
before the dataset is built, and SGLang caches a generated-shared-prefix dataset on disk
(``~/.cache/sglang/benchmark``) under its parameters, seed and tokenizer class, so both tools
load the very same prompts. Prompts are sent as the token ids the model's tokenizer gives
(what the server would compute from the text).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from feather_bench.workloads import Workload, WorkloadError, WorkloadRequest, load_workload_file

DATASET_NAMES = ("generated-shared-prefix", "random", "random-ids", "sharegpt", "file")

# bench_serving's defaults, used with --dataset-name; feather's smaller built-in ``--workload gsp``
# has its own (FEATHER_GSP_DEFAULTS), sized for a CPU
GSP_DEFAULTS = {
    "gsp_num_groups": 64,
    "gsp_prompts_per_group": 16,
    "gsp_system_prompt_len": 2048,
    "gsp_question_len": 128,
    "gsp_output_len": 256,
}
FEATHER_GSP_DEFAULTS = {
    "gsp_num_groups": 4,
    "gsp_prompts_per_group": 8,
    "gsp_system_prompt_len": 512,
    "gsp_question_len": 32,
    "gsp_output_len": 16,
}
NUM_PROMPTS_DEFAULT = 1000
RANDOM_LEN_DEFAULT = 1024
# tokens of the system prompt that identify a generated-shared-prefix group (random tokens:
# two groups agree on the first 16 with negligible probability)
GROUP_KEY_TOKENS = 16


def resolve_gsp(args, defaults: dict) -> dict:
    """The --gsp-* values, ``defaults`` filling what was not given."""
    return {k: v if (v := getattr(args, k)) is not None else defaults[k] for k in defaults}


def problems(args) -> list[str]:
    """What is wrong with the dataset flags, each with what is allowed."""
    out = []
    name = args.dataset_name
    for k in (*GSP_DEFAULTS, "num_prompts", "random_input_len", "random_output_len"):
        v = getattr(args, k, None)
        if v is not None and v < 1:
            out.append(f"--{k.replace('_', '-')} must be >= 1, got {v}")
    if not 0 <= args.random_range_ratio <= 1:
        out.append(f"--random-range-ratio must be in [0, 1], got {args.random_range_ratio}")
    needs_path = name in ("sharegpt", "file", "random")
    if needs_path and not args.dataset_path:
        extra = "; or use --dataset-name random-ids, which needs none" if name == "random" else ""
        out.append(
            f"--dataset-name {name} needs --dataset-path (a local file; nothing is downloaded)"
            + extra
        )
    elif needs_path and not Path(args.dataset_path).is_file():
        out.append(f"--dataset-path: no file at {args.dataset_path}")
    if args.dataset_path and not needs_path:
        out.append(f"--dataset-path is not used by --dataset-name {name}")
    return out


def bench_serving_namespace(args) -> argparse.Namespace:
    """The ``args`` that ``sglang.benchmark.datasets.get_dataset`` reads, as bench_serving's
    parser would give them for the same flags."""
    gsp = resolve_gsp(args, GSP_DEFAULTS)
    return argparse.Namespace(
        dataset_name=args.dataset_name,
        dataset_path=args.dataset_path or "",
        num_prompts=args.num_prompts or NUM_PROMPTS_DEFAULT,
        seed=args.seed,
        random_input_len=args.random_input_len or RANDOM_LEN_DEFAULT,
        random_output_len=args.random_output_len or RANDOM_LEN_DEFAULT,
        random_range_ratio=args.random_range_ratio,
        sharegpt_output_len=args.sharegpt_output_len,
        sharegpt_context_len=None,
        prompt_suffix="",
        apply_chat_template=False,
        tokenize_prompt=False,
        gsp_range_ratio=1.0,
        gsp_fast_prepare=False,
        gsp_send_routing_key=False,
        gsp_num_turns=1,
        gsp_ordered=args.gsp_ordered,
        gsp_group_distribution="uniform",
        gsp_zipf_alpha=None,
        **gsp,
    )


def rows_to_workload(rows, tokenizer, name: str, params: dict, group_key: int = 0) -> Workload:
    """``DatasetRow`` s as a feather Workload (request ``i`` is ``name``'s i-th row). With
    ``group_key`` > 0, requests whose prompts share their first ``group_key`` tokens (after the
    tokenizer's special tokens) are one prefix group (for the homogeneity figures)."""
    skip = int(tokenizer.num_special_tokens_to_add())
    groups: dict[tuple, str] = {}
    reqs = []
    for i, row in enumerate(rows):
        prompt = row.prompt
        if not isinstance(prompt, str):
            raise WorkloadError(
                f"row {i}: a multi-turn or multimodal prompt; feather-ab sends text"
            )
        ids = tuple(tokenizer(prompt)["input_ids"])
        rid = f"r{i}"
        group = rid
        if group_key:
            group = groups.setdefault(ids[: skip + group_key], f"g{len(groups)}")
        reqs.append(
            WorkloadRequest(
                f"{group}-{rid}" if group_key else rid, ids, row.output_len, None, group
            )
        )
    return Workload(name, tuple(reqs), f"sglang.benchmark.datasets {name}", params)


def build(args, tokenizer) -> Workload:
    """The workload ``--dataset-name`` and its flags describe (checked by :func:`problems`)."""
    name = args.dataset_name
    if name == "file":
        return load_workload_file(args.dataset_path, tokenizer, args.max_new_tokens)
    import numpy as np
    from sglang.benchmark.datasets import get_dataset

    ns = bench_serving_namespace(args)
    random.seed(args.seed)  # as bench_serving, before the dataset is generated
    np.random.seed(args.seed)
    params = {"seed": args.seed}
    if name == "generated-shared-prefix":
        params.update({k[4:]: getattr(ns, k) for k in GSP_DEFAULTS}, ordered=ns.gsp_ordered)
        if args.num_prompts is not None:
            n = ns.gsp_num_groups * ns.gsp_prompts_per_group
            if args.num_prompts != n:
                print(
                    f"feather-ab: --num-prompts {args.num_prompts} is not used by "
                    f"generated-shared-prefix (as in bench_serving): it sends --gsp-num-groups x "
                    f"--gsp-prompts-per-group = {n} requests"
                )
    elif name.startswith("random"):
        params.update(
            num_prompts=ns.num_prompts,
            input_len=ns.random_input_len,
            output_len=ns.random_output_len,
            range_ratio=ns.random_range_ratio,
        )
    else:
        params.update(num_prompts=ns.num_prompts, output_len=ns.sharegpt_output_len)
    if ns.dataset_path:
        params["dataset_path"] = ns.dataset_path
    try:
        rows = get_dataset(ns, tokenizer)
    except (ValueError, OSError, KeyError) as e:
        raise WorkloadError(f"--dataset-name {name}: {e}") from None
    if not rows:
        raise WorkloadError(f"--dataset-name {name}: the dataset gave no requests")
    key = (
        min(GROUP_KEY_TOKENS, ns.gsp_system_prompt_len) if name == "generated-shared-prefix" else 0
    )
    return rows_to_workload(rows, tokenizer, name, params, key)
