"""``feather-ab``: one workload through SGLang once per configuration, in one invocation, and
what each configuration gave.

    feather-ab --workload g8x8-p2000-q24 --json results/ab/feather-8x100.json
    feather-ab --workload-file my.jsonl --mode online --request-rate 2
    feather-ab --workload gsp --gsp-groups 8 --policies fcfs,feather --backends feather
    feather-ab --workload g8x8-p400-q24                 # a named shape (SPECS in workloads.py)
    feather-ab --workload gsp:groups=8,prefix_len=400   # a built-in with other parameters

Every configuration (schedule policy x attention backend, and feather's agents) gets a fresh
SGLang with the same model, memory budget (``--max-total-tokens``, ``--max-running-requests``),
dtype and seed. Prints a table, writes JSON and a PNG chart, and checks that every
configuration produced the same greedy outputs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import replace
from pathlib import Path

from feather_bench.ab import report
from feather_bench.ab.metrics import compute, median_of
from feather_bench.ab.runner import ABConfig, Common, run_offline, run_online, scratch_dir
from feather_bench.paths import model_dir
from feather_bench.tools.machine import describe as describe_machine
from feather_bench.workloads import (
    ALIASES,
    SPECS,
    WORKLOADS,
    WorkloadError,
    build_workload,
    load_tokenizer,
    load_workload_file,
    parse_spec,
)
from feather_sglang.config import FeatherConfig

DEFAULT_MODEL = model_dir()
BASELINE_POLICIES = ("fcfs", "lpm", "dfs-weight")


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="feather-ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--workload",
        metavar="SPEC",
        help=f"a built-in workload ({', '.join(WORKLOADS)}), a named shape ({', '.join(SPECS)}) or "
        "NAME:key=value,... (generator parameters; see feather_bench/workloads.py)",
    )
    src.add_argument(
        "--workload-file",
        help="JSON Lines: {id, prompt|input_ids, max_new_tokens[, arrival_s, group]}",
    )
    g = p.add_argument_group("gsp workload")
    g.add_argument("--gsp-groups", type=int, default=4)
    g.add_argument("--gsp-prompts-per-group", type=int, default=8)
    g.add_argument("--gsp-prefix-len", type=int, default=512)
    g.add_argument("--gsp-question-len", type=int, default=32)
    g.add_argument("--gsp-output-len", type=int, default=16)
    g.add_argument(
        "--gsp-ordered", action="store_true", help="keep groups in order (default: shuffled)"
    )
    p.add_argument("--max-new-tokens", type=int, help="override every request's output length")
    p.add_argument(
        "--mode",
        choices=["offline", "online"],
        default="offline",
        help="offline: sglang.Engine, all requests at once; online: a real server over HTTP",
    )
    p.add_argument(
        "--request-rate",
        type=float,
        help="online: Poisson arrivals at this many requests/s "
        "(default: the file's arrival_s, else all at once)",
    )
    p.add_argument(
        "--policies",
        default="fcfs,lpm,dfs-weight,feather",
        help="comma-separated schedule policies",
    )
    p.add_argument(
        "--backends", default="torch_native,feather", help="comma-separated attention backends"
    )
    p.add_argument(
        "--feather-agents",
        default="admit",
        help="comma-separated agents to run feather with (default: %(default)s, the server's default)",
    )
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default) keeps greedy outputs comparable bit for bit",
    )
    p.add_argument(
        "--max-total-tokens",
        type=int,
        default=Common.max_total_tokens,
        help="KV pool size, the same for every configuration",
    )
    p.add_argument("--max-running-requests", type=int, default=Common.max_running_requests)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeats", type=int, default=1, help="runs per configuration (medians reported)"
    )
    p.add_argument(
        "--threads",
        type=int,
        help="torch/OpenMP threads of each SGLang run (default: torch's own "
        "choice, all cores); 1 keeps timings stable on a small machine that runs anything else",
    )
    p.add_argument("--json", help="write the results here (default results/ab/<workload>.json)")
    p.add_argument("--chart", help="PNG chart (default: next to --json)")
    p.add_argument("--work-dir", help="logs and traces (default: a new temporary directory)")
    return p.parse_args(argv)


def validate(args) -> tuple[list[ABConfig], list[str]]:
    """The configurations to run, or SystemExit(2) with what was wrong and what is allowed."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy, CacheAwarePolicy

    from feather_sglang.agents import validate_agent
    from feather_sglang.sglang_integration import install_hooks

    install_hooks()  # adds feather to SGLang's attention backend choices
    allowed_policies = [p.value for p in (*CacheAwarePolicy, *CacheAgnosticPolicy)] + ["feather"]
    problems = []
    policies, backends, agents = _csv(args.policies), _csv(args.backends), _csv(args.feather_agents)
    for p in policies:
        if p not in allowed_policies:
            problems.append(
                f"--policies: unknown policy {p!r}; allowed: {', '.join(allowed_policies)}"
            )
    for b in backends:
        if b not in ATTENTION_BACKEND_CHOICES:
            problems.append(
                f"--backends: unknown attention backend {b!r}; allowed: {', '.join(ATTENTION_BACKEND_CHOICES)}"
            )
    if args.workload:
        try:
            if parse_spec(args.workload)[0] == "file":
                problems.append(
                    f"--workload {args.workload!r}: give a workload file with --workload-file"
                )
        except WorkloadError as e:
            problems.append(f"--workload: {e}")
    for a in agents:
        try:
            validate_agent(a)  # loads and checks a ppo:/dqn: file now, not after other runs
        except ValueError as e:
            problems.append(f"--feather-agents: {e}")
    for name, v in [
        ("--repeats", args.repeats),
        ("--max-running-requests", args.max_running_requests),
        ("--max-total-tokens", args.max_total_tokens),
        ("--threads", args.threads or 1),
    ]:
        if v < 1:
            problems.append(f"{name} must be >= 1, got {v}")
    if args.request_rate is not None and args.mode != "online":
        problems.append("--request-rate needs --mode online")
    if not policies or not backends:
        problems.append("--policies and --backends must each name at least one")
    if not (Path(args.model) / "config.json").exists():
        problems.append(f"--model: no model at {args.model} (run `make setup`)")
    if problems:
        for line in problems:
            print(f"feather-ab: error: {line}", file=sys.stderr)
        sys.exit(2)
    configs = []
    for backend in backends:
        for policy in policies:
            for agent in agents if policy == "feather" else [None]:
                named = policy == "feather" and (len(agents) > 1 or agent != FeatherConfig().agent)
                configs.append(ABConfig(policy, backend, agent if named else None))
    return configs, policies


def load(args):
    tokenizer = load_tokenizer(args.model)
    if args.workload_file:
        workload = load_workload_file(
            args.workload_file, tokenizer, default_max_new_tokens=args.max_new_tokens
        )
    elif args.workload == "gsp":  # the bare name takes the --gsp-* options
        workload = build_workload(
            "gsp",
            tokenizer,
            args.seed,
            groups=args.gsp_groups,
            prompts_per_group=args.gsp_prompts_per_group,
            prefix_len=args.gsp_prefix_len,
            question_len=args.gsp_question_len,
            output_len=args.gsp_output_len,
            shuffle=not args.gsp_ordered,
        )
    else:
        name, params = parse_spec(args.workload)  # checked in validate()
        workload = build_workload(name, tokenizer, args.seed, **params)
        shape = ALIASES.get(args.workload, args.workload)
        if shape in SPECS:  # reported (and its JSON named) by the shape's name
            workload = replace(workload, name=shape)
    if args.max_new_tokens:
        workload = workload.with_max_new_tokens(args.max_new_tokens)
    if args.request_rate is not None:
        workload = workload.with_poisson_arrivals(args.request_rate, args.seed)

    def kv_tokens(r):
        return len(r.input_ids) + r.max_new_tokens

    longest = max(workload.requests, key=kv_tokens)
    need = kv_tokens(longest)
    if (
        need > args.max_total_tokens
    ):  # SGLang would reject it mid-run, after other configurations ran
        raise WorkloadError(
            f"--max-total-tokens {args.max_total_tokens} cannot hold request {longest.rid!r} "
            f"({len(longest.input_ids)} prompt + {longest.max_new_tokens} output tokens); "
            f"use at least {need}"
        )
    if args.mode == "offline" and any(r.arrival_s for r in workload.requests):
        print(
            "feather-ab: offline mode sends every request at once; the arrival times are used with --mode online"
        )
    return workload


def main(argv=None) -> None:
    args = parse_args(argv)
    configs, _ = validate(args)
    try:
        workload = load(args)
    except WorkloadError as e:
        print(f"feather-ab: error: {e}", file=sys.stderr)
        sys.exit(2)
    common = Common(
        args.model,
        args.dtype,
        args.max_total_tokens,
        args.max_running_requests,
        args.seed,
        args.threads,
    )
    work_dir = Path(args.work_dir) if args.work_dir else scratch_dir()
    json_path = Path(args.json or f"results/ab/{workload.name}.json")
    chart_path = Path(args.chart) if args.chart else json_path.with_suffix(".png")
    s = workload.summary()
    print(
        f"feather-ab: workload {s['name']}: {s['requests']} requests, {s['prompt_tokens']} prompt tokens, "
        f"{s['output_tokens']} output tokens, {s['groups']} prefix groups; mode {args.mode}; "
        f"{len(configs)} configurations x {args.repeats} run(s); logs in {work_dir}",
        flush=True,
    )
    run = run_online if args.mode == "online" else run_offline
    per_config: dict[ABConfig, list[dict]] = {c: [] for c in configs}
    outputs: dict[ABConfig, dict] = {}
    total = len(configs) * args.repeats
    for rep in range(args.repeats):
        # NOTE: configurations interleaved across repeats, so slow drift of a noisy machine
        # spreads over all of them instead of favouring the ones that ran first
        for i, config in enumerate(configs):
            n = rep * len(configs) + i + 1
            print(f"[{n}/{total}] {config.name} ...", flush=True)
            result = run(workload, config, common, work_dir / f"rep{rep}")
            figures = compute(result, workload)
            per_config[config].append(figures)
            outputs.setdefault(config, {r.rid: r for r in result.records})
            print(
                f"[{n}/{total}] {config.name}: {figures['output_tok_s']:.1f} output tok/s, "
                f"TTFT p99 {figures['ttft_p99_s']:.2f} s, makespan {figures['makespan_s']:.1f} s",
                flush=True,
            )
    rows = []
    for config in configs:
        med = median_of(per_config[config])
        rows.append(
            {
                "policy": config.policy,
                "attention_backend": config.attention_backend,
                "agent": config.agent or ("static" if config.policy == "feather" else None),
                "config": config.name,
                **med,
                "repeats": len(per_config[config]),
                "output_tok_s_runs": [r["output_tok_s"] for r in per_config[config]],
            }
        )
    mismatches = report.check_greedy(outputs)
    result = {
        "machine": describe_machine(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "feather-ab " + " ".join(sys.argv[1:] if argv is None else argv),
        "workload": s,
        "common": {
            "model": Path(args.model).name,
            "dtype": args.dtype,
            "max_total_tokens": args.max_total_tokens,
            "max_running_requests": args.max_running_requests,
            "seed": args.seed,
            "mode": args.mode,
            "threads": args.threads,
            "repeats": args.repeats,
        },
        "rows": rows,
        "greedy_outputs_identical": not mismatches,
        "greedy_mismatches": mismatches[:20],
        "summary": report.summary(rows, BASELINE_POLICIES),
    }
    print()
    print(report.table(rows))
    print()
    print(report.summary_text(result["summary"]))
    print(
        "greedy outputs: "
        + (
            "identical in every configuration"
            if not mismatches
            else f"{len(mismatches)} MISMATCH(ES), first: {mismatches[0]}"
        )
    )
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1, default=float))
    report.chart(result, chart_path)
    print(f"wrote {json_path} and {chart_path}")
    if mismatches:
        sys.exit(1)


if __name__ == "__main__":
    main()
