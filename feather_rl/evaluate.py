"""``feather-eval``: stop/add agents side by side, in the simulated server or on static batches.

    feather-eval --json results/rl/eval.json
    feather-eval --agents static,always-add,ppo:results/runs/ppo-seed0/model.zip --regimes memory-bound/feather
    feather-eval --env batch --workload-file my.jsonl

``--env serving`` (the default): every agent serves every held-out regime of
:data:`feather_rl.regimes.HELDOUT` once per seed in :class:`feather_rl.simulator.Server`; the
reward is the simulated server's output throughput (tokens/s). The summary gives, for the
trained agent, the geometric mean over regimes of its throughput over static's and over
always-add's (``trained_vs_static``, ``trained_vs_always_add``), over the better of the two
(``trained_vs_best_fixed``), and the lowest per-regime ratio of each.

``--env batch``: every agent runs every workload once per seed (the seed draws the workload's text and order);
the reward of an episode is its return: the request-weighted mean decode throughput of the
batches it formed (tokens/s). Online learners (ucb, qlearning) first learn for
``--warmup-episodes`` episodes on the training workloads, one fresh learner per seed. Prints a
table and writes ``{"rows": [...], "summary": {"trained_vs_static", "trained_vs_always_add", ...}}``
(ratios of mean reward over all evaluated workloads and seeds; spread = standard deviation over
seeds of each seed's mean).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from feather_bench.tools.machine import cpu_label
from feather_bench.tools.markdown import command_block, wrap
from feather_rl import provenance, workload_specs
from feather_rl.episodes import make, run_episode

AGENTS_DIR = Path(__file__).resolve().parent / "agents"
DEFAULT_AGENTS = ("static", "always-add", "random", "ucb", "qlearning")
SERVING_AGENTS = ("static", "always-add", "admit", "throughput")
EVAL_SEED = 1_000_000  # evaluation seeds start here; training draws its own
ONLINE = ("ucb", "qlearning")
BOUND = "bound"  # serving rows: the throughput no agent can exceed (feather_rl.bound)


def shipped_agents() -> list[str]:
    """``ppo:PATH`` / ``dqn:PATH`` for every policy file shipped under feather_rl/agents/."""
    return [
        f"{p.stem.split('_')[0]}:{p}"
        for p in sorted(AGENTS_DIR.glob("*.zip"))
        if p.stem.split("_")[0] in ("ppo", "dqn")
    ]


def evaluate(agents, workloads, seeds, env, warmup_episodes: int = 20, progress=None) -> list[dict]:
    """One row per (agent, workload): rewards per seed, mean, spread over seeds."""
    rows = []
    for spec in agents:
        per = {w: {"rewards": [], "throughput": [], "batches": []} for w in workloads}
        for seed in seeds:
            agent = make(spec, seed)
            if spec.split(":")[0] in ONLINE:
                for i in range(warmup_episodes):  # learns online; not counted
                    run_episode(
                        env,
                        agent,
                        seed=10_000 * (seed + 1) + i,
                        options={
                            "workload": workload_specs.TRAIN_WORKLOADS[
                                i % len(workload_specs.TRAIN_WORKLOADS)
                            ]
                        },
                    )
            for w in workloads:
                s = run_episode(
                    env, agent, seed=seed, options={"workload": w, "workload_seed": seed}
                )
                per[w]["rewards"].append(s["mean_batch_throughput"])
                per[w]["throughput"].append(s.get("workload_tokens_per_s", 0.0))
                per[w]["batches"].append(s.get("batches", 0))
                if progress is not None:
                    progress.update()
        for w in workloads:
            r = per[w]["rewards"]
            rows.append(
                {
                    "agent": spec,
                    "workload": w,
                    "seeds": list(seeds),
                    "rewards": [round(x, 2) for x in r],
                    "mean_reward": statistics.fmean(r),
                    "std_over_seeds": statistics.pstdev(r),
                    "workload_tokens_per_s": statistics.fmean(per[w]["throughput"]),
                    "batches": statistics.fmean(per[w]["batches"]),
                }
            )
    return rows


def evaluate_serving(agents, regime_list, seeds, progress=None, costs=None) -> list[dict]:
    """One row per (agent, regime): the simulated server's output throughput per seed."""
    from feather_rl.simulator import StepCosts, max_throughput, simulate

    costs, rows = costs or StepCosts.load(), []
    for spec in agents:
        for regime in regime_list:
            results = [
                simulate(regime, EVAL_SEED + seed, make(spec, seed), costs) for seed in seeds
            ]
            if progress is not None:
                progress.update(len(seeds))
            tput = [r.output_throughput for r in results]
            rows.append(
                {
                    "agent": spec,
                    "workload": regime.name,
                    "seeds": list(seeds),
                    "rewards": [round(x, 3) for x in tput],
                    "mean_reward": statistics.fmean(tput),
                    "std_over_seeds": statistics.pstdev(tput),
                    "p99_ttft_s": statistics.fmean(r.p99_ttft_s for r in results),
                    "evicted_prefixes": statistics.fmean(r.evicted_prefixes for r in results),
                }
            )
    for regime in regime_list:  # what no agent can exceed (feather_rl.bound)
        bound = [max_throughput(regime, EVAL_SEED + seed, costs) for seed in seeds]
        rows.append(
            {
                "agent": BOUND,
                "workload": regime.name,
                "seeds": list(seeds),
                "rewards": [round(x, 3) for x in bound],
                "mean_reward": statistics.fmean(bound),
                "std_over_seeds": statistics.pstdev(bound),
            }
        )
    return rows


def summarize_serving(rows, trained: str | None) -> dict:
    """Geometric means over regimes of each agent's throughput ratio to the fixed rules."""
    mean = {(r["agent"], r["workload"]): r["mean_reward"] for r in rows}
    agents = list(dict.fromkeys(r["agent"] for r in rows))
    regimes = list(dict.fromkeys(r["workload"] for r in rows))

    def ratios(agent, base):
        return [mean[agent, w] / base(w) for w in regimes]

    def geomean(xs):
        return math.exp(statistics.fmean(math.log(x) for x in xs))

    fixed = {
        "static": lambda w: mean["static", w],
        "always_add": lambda w: mean["always-add", w],
        "best_fixed": lambda w: max(mean["static", w], mean["always-add", w]),
    }
    summary = {
        "geomean_vs_always_add": {
            a: round(geomean(ratios(a, fixed["always_add"])), 4) for a in agents
        }
    }
    if BOUND in agents:  # the room any agent has over the fixed rules
        for name in ("always_add", "best_fixed"):
            rs = ratios(BOUND, fixed[name])
            summary[f"bound_vs_{name}"] = round(geomean(rs), 4)
            summary[f"bound_vs_{name}_max"] = round(max(rs), 4)
    if trained is not None:
        summary["trained"] = trained
        for name, base in fixed.items():
            rs = ratios(trained, base)
            summary[f"trained_vs_{name}"] = round(geomean(rs), 4)
            summary[f"trained_vs_{name}_min"] = round(min(rs), 4)
    return summary


def serving_table(rows, summary) -> str:
    agents = list(dict.fromkeys(r["agent"] for r in rows))
    regimes = list(dict.fromkeys(r["workload"] for r in rows))
    mean = {(r["agent"], r["workload"]): r for r in rows}
    lines = [f"{'regime':<28}" + "".join(f"{_short(a):>24}" for a in agents)]
    for w in regimes:
        lines.append(
            f"{w:<28}"
            + "".join(
                f"{mean[a, w]['mean_reward']:>16.1f} ± {mean[a, w]['std_over_seeds']:<5.1f}"
                for a in agents
            )
        )
    lines.append(
        f"{'geomean vs always-add':<28}"
        + "".join(f"{summary['geomean_vs_always_add'][a]:>24.4f}" for a in agents)
    )
    for key in ("trained_vs_static", "trained_vs_always_add", "trained_vs_best_fixed"):
        if key in summary:
            lines.append(
                f"{key}: {summary[key]:.4f} (geomean), lowest regime {summary[key + '_min']:.4f}"
            )
    if "bound_vs_always_add" in summary:
        lines.append(bound_sentence(summary))
    return "\n".join(lines)


def bound_sentence(summary: dict) -> str:
    """What the bound says of the room any agent has over the fixed rules."""
    return (
        f"no agent can exceed {BOUND!r}: at most {summary['bound_vs_always_add']:.3f}x always-add "
        f"(geomean; {summary['bound_vs_always_add_max']:.3f}x in the roomiest regime) and "
        f"{summary['bound_vs_best_fixed']:.3f}x the better fixed rule "
        f"({summary['bound_vs_best_fixed_max']:.3f}x)"
    )


def serving_markdown(data: dict, json_path: str) -> str:
    """A docs page section from a serving evaluation's JSON: the command, then one table."""
    rows, summary, prov = data["rows"], data["summary"], data["provenance"]
    agents = list(dict.fromkeys(r["agent"] for r in rows))
    regimes = list(dict.fromkeys(r["workload"] for r in rows))
    by = {(r["agent"], r["workload"]): r for r in rows}
    m = prov["machine"]
    commit = ((prov.get("git") or {}).get("commit") or "?")[:12]
    lines = [
        *command_block(prov["command"]),
        "",
        wrap(
            f"Run {prov['date']} on {cpu_label(m)}, commit {commit}; "
            f"{len(rows[0]['seeds'])} seeds per regime; simulated output tok/s, mean over seeds; "
            f"from `{json_path}`."
        ),
        "",
        "| regime | " + " | ".join(f"`{_short(a)}`" for a in agents) + " |",
        "|---|" + "---:|" * len(agents),
    ]
    for w in regimes:
        lines.append(
            f"| {w} | " + " | ".join(f"{by[a, w]['mean_reward']:.1f}" for a in agents) + " |"
        )
    lines.append(
        "| **geomean vs always-add** | "
        + " | ".join(f"**{summary['geomean_vs_always_add'][a]:.3f}**" for a in agents)
        + " |"
    )
    if "trained" in summary:
        lines += [
            "",
            wrap(
                f"Trained agent `{_short(summary['trained'])}`: "
                + "; ".join(
                    f"{k.removeprefix('trained_vs_').replace('_', '-')} {summary[k]:.3f}x (lowest regime {summary[k + '_min']:.3f}x)"
                    for k in ("trained_vs_static", "trained_vs_always_add", "trained_vs_best_fixed")
                )
                + "."
            ),
        ]
    if "bound_vs_always_add" in summary:
        bound = bound_sentence(summary)
        lines += ["", wrap(bound[0].upper() + bound[1:] + ".")]
    return "\n".join(lines)


def overall(rows, agent: str) -> tuple[float, float]:
    """Mean reward of ``agent`` over all workloads and seeds, and the spread over seeds of
    each seed's mean over workloads."""
    mine = [r for r in rows if r["agent"] == agent]
    per_seed = [
        statistics.fmean(r["rewards"][i] for r in mine) for i in range(len(mine[0]["rewards"]))
    ]
    return statistics.fmean(per_seed), statistics.pstdev(per_seed)


def summarize(rows, trained: str | None) -> dict:
    agents = list(dict.fromkeys(r["agent"] for r in rows))
    means = {a: overall(rows, a) for a in agents}
    summary = {
        "mean_reward": {a: round(m, 2) for a, (m, _) in means.items()},
        "std_over_seeds": {a: round(s, 2) for a, (_, s) in means.items()},
    }
    if trained is not None:
        summary["trained"] = trained
        for name, key in (("static", "trained_vs_static"), ("always-add", "trained_vs_always_add")):
            if name in means:
                summary[key] = round(means[trained][0] / means[name][0], 4)
    return summary


def table(rows, summary) -> str:
    lines = [
        f"{'agent':<52} {'workload':<28} {'reward tok/s (mean ± sd over seeds)':>36} {'workload tok/s':>14} {'batches':>7}"
    ]
    for r in rows:
        lines.append(
            f"{_short(r['agent']):<52} {r['workload']:<28} {r['mean_reward']:>26.1f} ± {r['std_over_seeds']:<7.1f}"
            f" {r['workload_tokens_per_s']:>14.1f} {r['batches']:>7.1f}"
        )
    lines.append("")
    for a, m in summary["mean_reward"].items():
        lines.append(
            f"{_short(a):<52} {'ALL':<28} {m:>26.1f} ± {summary['std_over_seeds'][a]:<7.1f}"
        )
    for key in ("trained_vs_static", "trained_vs_always_add"):
        if key in summary:
            lines.append(f"{key}: {summary[key]:.4f}")
    return "\n".join(lines)


def _short(spec: str) -> str:
    name, colon, path = spec.partition(":")
    return f"{name}:{Path(path).name}" if colon else spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feather-eval",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--env",
        choices=("serving", "batch"),
        default="serving",
        help="serving: the simulated server over held-out regimes; batch: static batches priced by real runs",
    )
    ap.add_argument(
        "--agents",
        default=None,
        help="comma-separated: static, always-add, throughput, random, ucb, qlearning, ppo:PATH, dqn:PATH "
        "(default, serving: static, always-add, throughput and every shipped feather_rl/agents/*.zip; "
        "batch: static, always-add, random, ucb, qlearning and the shipped files)",
    )
    ap.add_argument(
        "--regimes",
        default=None,
        help="serving: comma-separated held-out regime names (default: all of feather_rl.regimes.HELDOUT)",
    )
    ap.add_argument(
        "--workloads",
        default=",".join(workload_specs.HELDOUT_WORKLOADS),
        help="batch: workload specs (default: the held-out %(default)s)",
    )
    ap.add_argument(
        "--workload-file",
        action="append",
        default=[],
        help="batch: a JSONL workload file (A/B tool format); repeatable",
    )
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    ap.add_argument(
        "--executor",
        choices=("replay", "real"),
        default="replay",
        help="batch: how batches are priced",
    )
    ap.add_argument("--recording", default=None, help="batch: replay recording")
    ap.add_argument(
        "--warmup-episodes",
        type=int,
        default=20,
        help="batch: online learners' episodes before evaluation",
    )
    ap.add_argument(
        "--trained",
        default=None,
        help="which agent the summary ratios are for (default: the first ppo:/dqn:)",
    )
    ap.add_argument(
        "--costs",
        type=Path,
        default=None,
        help="serving: the simulator's step costs, a JSON file as feather-calibrate writes "
        "(default: feather_rl/data/step_costs_cpu.json)",
    )
    ap.add_argument("--json", default=None, help="write rows and summary to this JSON file")
    ap.add_argument(
        "--report",
        metavar="JSON",
        default=None,
        help="print a serving evaluation's JSON as a markdown table (for the docs) and exit",
    )
    args = ap.parse_args(argv)
    if args.report:
        try:
            data = json.loads(Path(args.report).read_text())
        except (OSError, ValueError) as e:
            ap.error(f"--report: cannot read {args.report}: {e}")
        if data.get("provenance", {}).get("env") != "serving":
            ap.error(
                f"--report: {args.report} is not a serving evaluation (feather-eval --env serving --json ...)"
            )
        print(serving_markdown(data, args.report))
        return 0
    if args.seeds < 1:
        ap.error(f"--seeds must be >= 1, got {args.seeds}")

    from tqdm import tqdm

    serving = args.env == "serving"
    default_agents = SERVING_AGENTS if serving else DEFAULT_AGENTS
    agents = args.agents.split(",") if args.agents else [*default_agents, *shipped_agents()]
    for spec in agents:
        try:
            make(spec)
        except ValueError as e:
            ap.error(f"--agents: {e}")
    if args.costs is not None and args.env != "serving":
        ap.error("--costs applies to --env serving only")
    seeds = list(range(args.seeds))
    trained = args.trained or next((a for a in agents if a.split(":")[0] in ("ppo", "dqn")), None)
    started = time.time()
    if serving:
        from feather_rl import regimes
        from feather_rl.simulator import DEFAULT_CALIBRATION, StepCosts

        costs_path = args.costs or DEFAULT_CALIBRATION
        try:
            costs = StepCosts.load(costs_path)
        except ValueError as e:
            ap.error(f"--costs: {e}")
        if not {"static", "always-add"} <= set(agents):
            ap.error(
                "--agents: the serving summary compares with static and always-add; include both"
            )
        try:
            chosen = (
                [regimes.by_name(n) for n in args.regimes.split(",")]
                if args.regimes
                else list(regimes.HELDOUT)
            )
        except ValueError as e:
            ap.error(f"--regimes: {e}")
        with tqdm(
            total=len(agents) * len(seeds) * len(chosen),
            desc="feather-eval",
            unit="run",
            file=sys.stderr,
        ) as bar:
            rows = evaluate_serving(agents, chosen, seeds, bar, costs)
        summary = summarize_serving(rows, trained)
        print(serving_table(rows, summary))
        context = {
            "env": "serving",
            "regimes": [r.__dict__ for r in chosen],
            "step_costs": json.loads(Path(costs_path).read_text()),
            "eval_seed_base": EVAL_SEED,
        }
    else:
        import gymnasium as gym

        import feather_rl
        from feather_rl.train import split_workloads

        workloads = split_workloads(args.workloads) + [f"file:{p}" for p in args.workload_file]
        env = gym.make(
            feather_rl.ENV_ID,
            workloads=tuple(workloads),
            executor=args.executor,
            recording=args.recording,
        ).unwrapped
        with tqdm(
            total=len(agents) * len(seeds) * len(workloads),
            desc="feather-eval",
            unit="episode",
            file=sys.stderr,
        ) as bar:
            rows = evaluate(agents, workloads, seeds, env, args.warmup_episodes, bar)
        summary = summarize(rows, trained)
        print(table(rows, summary))
        context = {
            "env": "batch",
            "workloads": workloads,
            "warmup_episodes": args.warmup_episodes,
            "executor": env.executor.describe()
            if hasattr(env.executor, "describe")
            else args.executor,
        }
        env.close()
    if args.json:
        out = {
            "rows": rows,
            "summary": summary,
            "provenance": provenance.record(**context, seconds=round(time.time() - started, 1)),
        }
        provenance.write_json(args.json, out)
        print(f"feather-eval: -> {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
