"""``feather-ab``: one workload through SGLang once per configuration, in one invocation, and
what each configuration gave.

    feather-ab --workload g8x8-p2000-q24 --output-file results/ab/feather-8x100.json
    feather-ab --dataset-name generated-shared-prefix --gsp-num-groups 8 --gsp-prompts-per-group 8 \\
        --gsp-system-prompt-len 512 --gsp-output-len 16 --mode online
    feather-ab --base-url http://127.0.0.1:30000 --dataset-name random-ids --num-prompts 64 \\
        --random-input-len 256 --random-output-len 32 --flush-cache
    feather-ab --workload-file my.jsonl --mode online --request-rate 2 \\
        --server-args "--dp-size 2 --load-balance-method prefix_group"
    feather-ab --workload g8x8-p400-q24                 # a named shape (SPECS in workloads.py)
    feather-ab --workload gsp:groups=8,prefix_len=400   # a built-in with other parameters

Every configuration (schedule policy x attention backend, and feather's agents) gets a fresh
SGLang with the same model, memory budget (``--max-total-tokens``, ``--max-running-requests``),
dtype, seed and ``--server-args``. With ``--base-url`` nothing is started: the workload goes to
the server already running there, whose configuration (``/server_info``) is recorded. Prints a
table, writes JSON (serving figures under ``sglang.bench_serving``'s names and units) and a PNG
chart, and checks that every configuration produced the same greedy outputs.

Workload sources: ``--dataset-name`` (bench_serving's datasets and flags, built by
``sglang.benchmark.datasets``), ``--workload`` (feather's built-ins) or ``--workload-file``.
On a host with an accelerator the defaults are bf16 and SGLang's own attention backend as the
baseline (``--backends default,feather``); on a CPU fp32 and torch_native.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from feather_bench.ab import datasets, report
from feather_bench.ab.metrics import compute, median_of
from feather_bench.ab.runner import (
    DEFAULT_BACKEND,
    ABConfig,
    Common,
    run_base_url,
    run_offline,
    run_online,
    scratch_dir,
)
from feather_bench.paths import model_dir
from feather_bench.tools.machine import describe as describe_machine
from feather_bench.tools.machine import round_order
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
DEFAULT_POLICIES = "fcfs,lpm,dfs-weight,feather"
# flags feather-ab sets itself on every server it starts; --server-args must not repeat them
OWN_SERVER_FLAGS = {
    "--model-path": "--model",
    "--model": "--model",
    "--schedule-policy": "--policies",
    "--attention-backend": "--backends",
    "--feather-agent": "--feather-agents",
    "--host": None,
    "--port": None,
}
# options that describe the servers feather-ab starts, meaningless with --base-url
START_ONLY = (
    "policies",
    "backends",
    "feather_agents",
    "dtype",
    "max_total_tokens",
    "max_running_requests",
    "threads",
    "server_args",
)


def accelerator() -> bool:
    from feather_cpu import accelerator_present

    return accelerator_present()


def default_dtype(on_accelerator: bool) -> str:
    return "bfloat16" if on_accelerator else "float32"


def default_backends(on_accelerator: bool) -> str:
    return f"{DEFAULT_BACKEND},feather" if on_accelerator else "torch_native,feather"


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="feather-ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--dataset-name",
        choices=datasets.DATASET_NAMES,
        help="a bench_serving dataset, built by sglang.benchmark.datasets from the flags below "
        "(see feather_bench/ab/datasets.py); file: a feather JSONL file at --dataset-path",
    )
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
    d = p.add_argument_group("dataset (bench_serving's flags)")
    d.add_argument("--dataset-path", help="the local file of sharegpt, random and file")
    d.add_argument(
        "--num-prompts",
        type=int,
        help=f"requests of random and sharegpt (default {datasets.NUM_PROMPTS_DEFAULT})",
    )
    d.add_argument("--random-input-len", type=int, help="default 1024")
    d.add_argument("--random-output-len", type=int, help="default 1024")
    d.add_argument("--random-range-ratio", type=float, default=0.0)
    d.add_argument("--sharegpt-output-len", type=int, help="default: the conversation's own")
    g = p.add_argument_group(
        "generated-shared-prefix (--dataset-name generated-shared-prefix, defaults "
        + ", ".join(f"{v}" for v in datasets.GSP_DEFAULTS.values())
        + "; --workload gsp, defaults "
        + ", ".join(f"{v}" for v in datasets.FEATHER_GSP_DEFAULTS.values())
        + ")"
    )
    g.add_argument("--gsp-num-groups", "--gsp-groups", dest="gsp_num_groups", type=int)
    g.add_argument("--gsp-prompts-per-group", type=int)
    g.add_argument(
        "--gsp-system-prompt-len", "--gsp-prefix-len", dest="gsp_system_prompt_len", type=int
    )
    g.add_argument("--gsp-question-len", type=int)
    g.add_argument("--gsp-output-len", type=int)
    g.add_argument(
        "--gsp-ordered", action="store_true", help="keep groups in order (default: shuffled)"
    )
    p.add_argument("--max-new-tokens", type=int, help="override every request's output length")
    s = p.add_argument_group("server")
    s.add_argument(
        "--base-url",
        help="run against the SGLang server already running here (nothing is started; "
        "--policies, --backends and the other server options are refused)",
    )
    s.add_argument(
        "--flush-cache",
        action="store_true",
        help="--base-url: POST /flush_cache before every repeat (servers feather-ab starts are "
        "always flushed after the warm-up)",
    )
    s.add_argument(
        "--trace",
        help="--base-url: the server's batch trace file (its FEATHER_BATCH_TRACE), for the "
        "homogeneity figures",
    )
    s.add_argument(
        "--mode",
        choices=["offline", "online"],
        help="offline (default): sglang.Engine, all requests at once; online: a real server over "
        "HTTP (the only mode with --base-url)",
    )
    s.add_argument(
        "--request-rate",
        type=float,
        help="online: Poisson arrivals at this many requests/s "
        "(default: the file's arrival_s, else all at once)",
    )
    s.add_argument("--policies", help=f"comma-separated schedule policies ({DEFAULT_POLICIES})")
    s.add_argument(
        "--backends",
        help="comma-separated attention backends; 'default': SGLang's own choice "
        "(default: torch_native,feather on a CPU, default,feather on an accelerator)",
    )
    s.add_argument(
        "--feather-agents",
        help="comma-separated agents to run feather with (default: admit, the server's default)",
    )
    s.add_argument(
        "--model",
        help=f"a local model directory or a Hugging Face hub id, passed to SGLang as given "
        f"(default {DEFAULT_MODEL}; with --base-url: the server's model, for the tokenizer)",
    )
    s.add_argument(
        "--dtype",
        help="default float32 on a CPU (greedy outputs comparable bit for bit), "
        "bfloat16 on an accelerator",
    )
    s.add_argument(
        "--max-total-tokens",
        type=int,
        help=f"KV pool size, the same for every configuration (default {Common.max_total_tokens})",
    )
    s.add_argument(
        "--max-running-requests",
        type=int,
        help=f"default {Common.max_running_requests}",
    )
    s.add_argument(
        "--server-args",
        default="",
        help='any further SGLang server flags for every server started, e.g. "--dp-size 2 '
        '--load-balance-method prefix_group" (offline: the same as sglang.Engine arguments)',
    )
    s.add_argument(
        "--threads",
        type=int,
        help="torch/OpenMP threads of each SGLang run (default: torch's own "
        "choice, all cores); 1 keeps timings stable on a small machine that runs anything else",
    )
    p.add_argument("--seed", type=int, default=0, help="dataset and server seed")
    p.add_argument(
        "--repeats", type=int, default=1, help="runs per configuration (medians reported)"
    )
    p.add_argument(
        "--output-file",
        "--json",
        dest="output_file",
        help="write the results here (default results/ab/<workload>.json)",
    )
    p.add_argument("--chart", help="PNG chart (default: next to --output-file)")
    p.add_argument("--work-dir", help="logs and traces (default: a new temporary directory)")
    return p.parse_args(argv)


def looks_local(model: str) -> bool:
    """A path (absolute, relative with ./ or ../, ~) rather than a hub id (``org/name``)."""
    return model.startswith(("/", "./", "../", "~")) or Path(model).exists()


def parse_server_args(text: str) -> tuple[list[str], dict, list[str]]:
    """``--server-args`` as (tokens for the command line, the same as sglang.Engine keyword
    arguments, problems)."""
    import argparse as ap

    from sglang.srt.server_args import ServerArgs

    try:
        tokens = shlex.split(text)
    except ValueError as e:
        return [], {}, [f"--server-args: {e}"]
    out = []
    for t in tokens:
        flag = t.split("=", 1)[0]
        if flag in OWN_SERVER_FLAGS:
            instead = OWN_SERVER_FLAGS[flag]
            out.append(
                f"--server-args: {flag} is set by feather-ab"
                + (f"; use feather-ab's {instead}" if instead else "")
            )

    class Parser(ap.ArgumentParser):
        def error(self, message):  # a message for feather-ab's list, not SGLang's usage text
            raise ValueError(message)

    parser = Parser(add_help=False)
    ServerArgs.add_cli_args(parser)
    if not any("--feather-agent" in a.option_strings for a in parser._actions):
        from feather_sglang.sglang_integration.args import add_cli_args_after

        add_cli_args_after(None, parser)  # feather's flags and choices, as on a server
    base = ["--model-path", "m"]
    try:
        given, unknown = parser.parse_known_args(base + tokens)
        defaults = vars(parser.parse_known_args(base)[0])
    except ValueError as e:
        return tokens, {}, out + [f"--server-args {text!r}: {e}"]
    if unknown:
        flags = [u for u in unknown if u.startswith("-")] or unknown
        out.append(
            f"--server-args: not SGLang server flags: {', '.join(flags)} "
            "(see python -m sglang.launch_server --help)"
        )
    kwargs = {k: v for k, v in vars(given).items() if v != defaults.get(k)}
    return tokens, kwargs, out


def validate(args) -> tuple[list[ABConfig], list[str]]:
    """The configurations to run, or SystemExit(2) with what was wrong and what is allowed.
    Fills the defaults that depend on the host (dtype, backends) and the mode."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy, CacheAwarePolicy

    from feather_sglang.agents import validate_agent
    from feather_sglang.sglang_integration import install_hooks

    install_hooks()  # adds feather to SGLang's attention backend choices
    problems = []
    if args.base_url:
        given = [f"--{k.replace('_', '-')}" for k in START_ONLY if getattr(args, k)]
        if given:
            problems.append(
                f"{', '.join(given)}: these describe the servers feather-ab starts; with "
                "--base-url the server is already running (its policy, backend and settings "
                "are read from its /server_info): drop them"
            )
        if args.mode == "offline":
            problems.append("--mode offline runs sglang.Engine in-process: drop it with --base-url")
        args.mode = "online"
        if not args.base_url.startswith(("http://", "https://")):
            problems.append(
                f"--base-url must start with http:// or https://, got {args.base_url!r}"
            )
        args.base_url = args.base_url.rstrip("/")
        if args.trace and not Path(args.trace).is_file():
            problems.append(f"--trace: no file at {args.trace}")
    else:
        for flag, v in (("--flush-cache", args.flush_cache), ("--trace", args.trace)):
            if v:
                problems.append(f"{flag} needs --base-url (started servers are always flushed)")
    args.mode = args.mode or "offline"
    on_acc = accelerator()
    args.dtype = args.dtype or default_dtype(on_acc)
    args.policies = args.policies or DEFAULT_POLICIES
    args.backends = args.backends or default_backends(on_acc)
    args.feather_agents = args.feather_agents or FeatherConfig().agent
    allowed_policies = [p.value for p in (*CacheAwarePolicy, *CacheAgnosticPolicy)] + ["feather"]
    allowed_backends = [DEFAULT_BACKEND, *ATTENTION_BACKEND_CHOICES]
    policies, backends, agents = _csv(args.policies), _csv(args.backends), _csv(args.feather_agents)
    if not args.base_url:
        for p in policies:
            if p not in allowed_policies:
                problems.append(
                    f"--policies: unknown policy {p!r}; allowed: {', '.join(allowed_policies)}"
                )
        for b in backends:
            if b not in allowed_backends:
                problems.append(
                    f"--backends: unknown attention backend {b!r}; allowed: "
                    f"{', '.join(allowed_backends)}"
                )
        for a in agents:
            try:
                validate_agent(a)  # loads and checks a ppo:/dqn: file now, not after other runs
            except ValueError as e:
                problems.append(f"--feather-agents: {e}")
        if not policies or not backends:
            problems.append("--policies and --backends must each name at least one")
    if args.workload:
        try:
            if parse_spec(args.workload)[0] == "file":
                problems.append(
                    f"--workload {args.workload!r}: give a workload file with --workload-file"
                )
        except WorkloadError as e:
            problems.append(f"--workload: {e}")
    if args.dataset_name:
        problems += datasets.problems(args)
    else:
        dataset_only = [
            ("--dataset-path", args.dataset_path),
            ("--num-prompts", args.num_prompts),
            ("--random-input-len", args.random_input_len),
            ("--random-output-len", args.random_output_len),
            ("--sharegpt-output-len", args.sharegpt_output_len),
        ]
        given = [flag for flag, v in dataset_only if v is not None]
        if given:
            problems.append(f"{', '.join(given)}: used only with --dataset-name")
        gsp_given = [k for k in datasets.GSP_DEFAULTS if getattr(args, k) is not None]
        if gsp_given and args.workload != "gsp":
            problems.append(
                "--gsp-* options: used only with --dataset-name generated-shared-prefix or "
                "--workload gsp"
            )
    args.server_args_list, args.server_kwargs = [], {}
    if args.server_args:
        args.server_args_list, args.server_kwargs, more = parse_server_args(args.server_args)
        problems += more
    for name, v in [
        ("--repeats", args.repeats),
        ("--max-running-requests", args.max_running_requests or 1),
        ("--max-total-tokens", args.max_total_tokens or 1),
        ("--threads", args.threads or 1),
    ]:
        if v < 1:
            problems.append(f"{name} must be >= 1, got {v}")
    args.max_total_tokens = args.max_total_tokens or Common.max_total_tokens
    args.max_running_requests = args.max_running_requests or Common.max_running_requests
    if args.request_rate is not None and args.mode != "online":
        problems.append("--request-rate needs --mode online")
    if args.model and looks_local(args.model) and not Path(args.model).expanduser().is_dir():
        problems.append(
            f"--model: no model at {args.model} (a local directory, e.g. `make setup`'s, or a "
            "Hugging Face hub id such as HuggingFaceTB/SmolLM2-135M-Instruct)"
        )
    if problems:
        for line in problems:
            print(f"feather-ab: error: {line}", file=sys.stderr)
        sys.exit(2)
    if args.base_url:
        return [], []
    args.model = str(Path(args.model).expanduser()) if args.model else str(DEFAULT_MODEL)
    configs = []
    for backend in backends:
        for policy in policies:
            for agent in agents if policy == "feather" else [None]:
                named = policy == "feather" and (len(agents) > 1 or agent != FeatherConfig().agent)
                configs.append(ABConfig(policy, backend, agent if named else None))
    return configs, policies


def load(args):
    try:
        tokenizer = load_tokenizer(args.model)
    except (OSError, ValueError) as e:
        raise WorkloadError(f"--model {args.model}: cannot load its tokenizer ({e})") from None
    if args.workload_file:
        workload = load_workload_file(
            args.workload_file, tokenizer, default_max_new_tokens=args.max_new_tokens
        )
    elif args.dataset_name:
        workload = datasets.build(args, tokenizer)
    elif args.workload == "gsp":  # the bare name takes the --gsp-* options
        gsp = datasets.resolve_gsp(args, datasets.FEATHER_GSP_DEFAULTS)
        workload = build_workload(
            "gsp",
            tokenizer,
            args.seed,
            groups=gsp["gsp_num_groups"],
            prompts_per_group=gsp["gsp_prompts_per_group"],
            prefix_len=gsp["gsp_system_prompt_len"],
            question_len=gsp["gsp_question_len"],
            output_len=gsp["gsp_output_len"],
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
    # SGLang would reject it mid-run, after other configurations ran
    if not args.base_url and need > args.max_total_tokens:
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


def connect(args) -> tuple[list[ABConfig], dict]:
    """--base-url: the server's configuration, or SystemExit(2) saying why there is none."""
    import requests

    from feather_bench.ab.client import server_info

    try:
        info = server_info(args.base_url)
    except (requests.RequestException, RuntimeError, ValueError) as e:
        print(
            f"feather-ab: error: --base-url {args.base_url}: no SGLang server answers there ({e})",
            file=sys.stderr,
        )
        sys.exit(2)
    if not args.model:  # the tokenizer of the model the server runs
        args.model = info.get("tokenizer_path") or info.get("model_path")
    config = ABConfig(
        str(info.get("schedule_policy") or "unknown"),
        str(info.get("attention_backend") or DEFAULT_BACKEND),
    )
    return [config], info


def dp_size_of(args, info: dict | None) -> int:
    if info and info.get("dp_size"):
        return int(info["dp_size"])
    return int(args.server_kwargs.get("dp_size") or 1)


def main(argv=None) -> None:
    args = parse_args(argv)
    configs, _ = validate(args)
    info = None
    if args.base_url:
        configs, info = connect(args)
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
        extra_engine_kwargs=args.server_kwargs,
        extra_server_args=tuple(args.server_args_list),
    )
    work_dir = Path(args.work_dir) if args.work_dir else scratch_dir()
    json_path = Path(args.output_file or f"results/ab/{workload.name}.json")
    chart_path = Path(args.chart) if args.chart else json_path.with_suffix(".png")
    s = workload.summary()
    where = f"the server at {args.base_url}" if args.base_url else f"mode {args.mode}"
    print(
        f"feather-ab: workload {s['name']}: {s['requests']} requests, {s['prompt_tokens']} prompt tokens, "
        f"{s['output_tokens']} output tokens, {s['groups']} prefix groups; {where}; "
        f"{len(configs)} configurations x {args.repeats} run(s); logs in {work_dir}",
        flush=True,
    )
    if args.base_url:

        def run(workload, config, common, work):
            trace = Path(args.trace) if args.trace else None
            return run_base_url(workload, config, args.base_url, args.flush_cache, trace)
    else:
        run = run_online if args.mode == "online" else run_offline
    per_config: dict[ABConfig, list[dict]] = {c: [] for c in configs}
    outputs: dict[ABConfig, dict] = {}
    servers: dict[ABConfig, dict] = {}
    failed: dict[ABConfig, dict] = {}
    total = len(configs) * args.repeats
    for rep in range(args.repeats):
        # configurations interleaved across repeats, so slow drift of a noisy machine spreads
        # over all of them instead of favouring the ones that run first
        for i, config in enumerate(round_order(configs, rep)):
            n = rep * len(configs) + i + 1
            if config in failed:
                continue
            print(f"[{n}/{total}] {config.name} ...", flush=True)
            try:
                result = run(workload, config, common, work_dir / f"rep{rep}")
            except RuntimeError as e:  # the server or engine failed: the others go on
                failed[config] = {"config": config.name, "run": rep + 1, "error": str(e)}
                print(
                    f"[{n}/{total}] {config.name} failed, left out of the other runs: {e}",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            if result.server_info:
                servers.setdefault(config, result.server_info)
            figures = compute(result, workload, dp_size_of(args, result.server_info))
            per_config[config].append(figures)
            outputs.setdefault(config, {r.rid: r for r in result.records})
            print(
                f"[{n}/{total}] {config.name}: {figures['output_throughput']:.1f} output tok/s, "
                f"TTFT p99 {figures['p99_ttft_ms']:.0f} ms, duration {figures['duration']:.1f} s"
                + (
                    f", load spread {figures['workers']['load_spread']:.2f} over "
                    f"{figures['workers']['dp_size']} workers"
                    if "workers" in figures
                    else ""
                ),
                flush=True,
            )
    from feather_bench.ab.client import server_summary

    if not outputs:
        print("feather-ab: error: every configuration failed; nothing to compare", file=sys.stderr)
        sys.exit(1)
    rows = []
    for config in (c for c in configs if per_config[c]):
        med = median_of(per_config[config])
        rows.append(
            {
                "policy": config.policy,
                "attention_backend": config.attention_backend,
                "agent": config.agent or ("static" if config.policy == "feather" else None),
                "config": config.name,
                **med,
                "repeats": len(per_config[config]),
                "output_throughput_runs": [r["output_throughput"] for r in per_config[config]],
                **({"server": server_summary(servers[config])} if config in servers else {}),
            }
        )
    mismatches = report.check_greedy(outputs)
    result = {
        "machine": describe_machine(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "feather-ab " + " ".join(sys.argv[1:] if argv is None else argv),
        "workload": s,
        "common": {
            "model": Path(args.model).name if looks_local(args.model) else args.model,
            "dtype": None if args.base_url else args.dtype,
            "max_total_tokens": None if args.base_url else args.max_total_tokens,
            "max_running_requests": None if args.base_url else args.max_running_requests,
            "server_args": args.server_args_list,
            "seed": args.seed,
            "mode": "base-url" if args.base_url else args.mode,
            "base_url": args.base_url,
            "flush_cache": bool(args.flush_cache) if args.base_url else True,
            "threads": args.threads,
            "repeats": args.repeats,
            "accelerator": accelerator(),
        },
        "rows": rows,
        "greedy_outputs_identical": not mismatches,
        "greedy_mismatches": mismatches[:20],
        "summary": report.summary(rows, BASELINE_POLICIES),
    }
    if failed:
        result["failed"] = list(failed.values())
    if info is not None:
        result["server"] = server_summary(info)
    print()
    print(report.table(rows))
    print()
    print(report.summary_text(result["summary"]))
    for row in rows:
        if "workers" in row:
            w = row["workers"]
            print(
                f"{row['config']}: requests per worker {w['requests_per_worker']}, "
                f"load spread (max-min)/mean {w['load_spread']:.2f}"
            )
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
    for f in failed.values():
        print(f"not measured: {f['config']} (run {f['run']}: {f['error']})", file=sys.stderr)
    if mismatches or failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
