"""``feather-eval``: stop/add agents side by side in ``feather/BatchFormation-v0``.

    feather-eval --json results/eval.json
    feather-eval --agents static,always-add,ppo:results/runs/ppo-seed0/model.zip --workload-file my.jsonl

Every agent runs every workload once per seed (the seed draws the workload's text and order);
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
import statistics
import sys
import time
from pathlib import Path

from feather_rl import provenance, workload_specs
from feather_rl.episodes import make, run_episode

AGENTS_DIR = Path(__file__).resolve().parent / "agents"
DEFAULT_AGENTS = ("static", "always-add", "random", "ucb", "qlearning")
ONLINE = ("ucb", "qlearning")


def shipped_agents() -> list[str]:
    """``ppo:PATH`` / ``dqn:PATH`` for every policy file shipped under feather_rl/agents/."""
    return [f"{p.stem.split('_')[0]}:{p}" for p in sorted(AGENTS_DIR.glob("*.zip"))
            if p.stem.split("_")[0] in ("ppo", "dqn")]


def evaluate(agents, workloads, seeds, env, warmup_episodes: int = 20, progress=None) -> list[dict]:
    """One row per (agent, workload): rewards per seed, mean, spread over seeds."""
    rows = []
    for spec in agents:
        per = {w: {"rewards": [], "throughput": [], "batches": []} for w in workloads}
        for seed in seeds:
            agent = make(spec, seed)
            if spec.split(":")[0] in ONLINE:
                for i in range(warmup_episodes):  # learns online; not counted
                    run_episode(env, agent, seed=10_000 * (seed + 1) + i,
                                options={"workload": workload_specs.TRAIN_WORKLOADS[i % len(workload_specs.TRAIN_WORKLOADS)]})
            for w in workloads:
                s = run_episode(env, agent, seed=seed, options={"workload": w, "workload_seed": seed})
                per[w]["rewards"].append(s["mean_batch_throughput"])
                per[w]["throughput"].append(s.get("workload_tokens_per_s", 0.0))
                per[w]["batches"].append(s.get("batches", 0))
                if progress is not None:
                    progress.update()
        for w in workloads:
            r = per[w]["rewards"]
            rows.append({"agent": spec, "workload": w, "seeds": list(seeds), "rewards": [round(x, 2) for x in r],
                         "mean_reward": statistics.fmean(r), "std_over_seeds": statistics.pstdev(r),
                         "workload_tokens_per_s": statistics.fmean(per[w]["throughput"]),
                         "batches": statistics.fmean(per[w]["batches"])})
    return rows


def overall(rows, agent: str) -> tuple[float, float]:
    """Mean reward of ``agent`` over all workloads and seeds, and the spread over seeds of
    each seed's mean over workloads."""
    mine = [r for r in rows if r["agent"] == agent]
    per_seed = [statistics.fmean(r["rewards"][i] for r in mine) for i in range(len(mine[0]["rewards"]))]
    return statistics.fmean(per_seed), statistics.pstdev(per_seed)


def summarize(rows, trained: str | None) -> dict:
    agents = list(dict.fromkeys(r["agent"] for r in rows))
    means = {a: overall(rows, a) for a in agents}
    summary = {"mean_reward": {a: round(m, 2) for a, (m, _) in means.items()},
               "std_over_seeds": {a: round(s, 2) for a, (_, s) in means.items()}}
    if trained is not None:
        summary["trained"] = trained
        for name, key in (("static", "trained_vs_static"), ("always-add", "trained_vs_always_add")):
            if name in means:
                summary[key] = round(means[trained][0] / means[name][0], 4)
    return summary


def table(rows, summary) -> str:
    lines = [f"{'agent':<52} {'workload':<28} {'reward tok/s (mean ± sd over seeds)':>36} {'workload tok/s':>14} {'batches':>7}"]
    for r in rows:
        lines.append(f"{_short(r['agent']):<52} {r['workload']:<28} {r['mean_reward']:>26.1f} ± {r['std_over_seeds']:<7.1f}"
                     f" {r['workload_tokens_per_s']:>14.1f} {r['batches']:>7.1f}")
    lines.append("")
    for a, m in summary["mean_reward"].items():
        lines.append(f"{_short(a):<52} {'ALL':<28} {m:>26.1f} ± {summary['std_over_seeds'][a]:<7.1f}")
    for key in ("trained_vs_static", "trained_vs_always_add"):
        if key in summary:
            lines.append(f"{key}: {summary[key]:.4f}")
    return "\n".join(lines)


def _short(spec: str) -> str:
    name, colon, path = spec.partition(":")
    return f"{name}:{Path(path).name}" if colon else spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="feather-eval", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", default=None,
                    help="comma-separated: static, always-add, random, ucb, qlearning, ppo:PATH, dqn:PATH "
                         "(default: the five rule/online agents and every shipped feather_rl/agents/*.zip)")
    ap.add_argument("--workloads", default=",".join(workload_specs.HELDOUT_WORKLOADS),
                    help="workload specs (default: the held-out %(default)s)")
    ap.add_argument("--workload-file", action="append", default=[], help="a JSONL workload file (A/B tool format); repeatable")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    ap.add_argument("--executor", choices=("replay", "real"), default="replay")
    ap.add_argument("--recording", default=None)
    ap.add_argument("--warmup-episodes", type=int, default=20, help="online learners' episodes before evaluation")
    ap.add_argument("--trained", default=None, help="which agent the summary ratios are for (default: the first ppo:/dqn:)")
    ap.add_argument("--json", default=None, help="write rows and summary to this JSON file")
    args = ap.parse_args(argv)

    import gymnasium as gym
    from tqdm import tqdm

    import feather_rl
    from feather_rl.train import split_workloads

    agents = args.agents.split(",") if args.agents else [*DEFAULT_AGENTS, *shipped_agents()]
    workloads = split_workloads(args.workloads) + [f"file:{p}" for p in args.workload_file]
    seeds = list(range(args.seeds))
    trained = args.trained or next((a for a in agents if a.split(":")[0] in ("ppo", "dqn")), None)
    env = gym.make(feather_rl.ENV_ID, workloads=tuple(workloads), executor=args.executor,
                   recording=args.recording).unwrapped
    started = time.time()
    with tqdm(total=len(agents) * len(seeds) * len(workloads), desc="feather-eval", unit="episode", file=sys.stderr) as bar:
        rows = evaluate(agents, workloads, seeds, env, args.warmup_episodes, bar)
    summary = summarize(rows, trained)
    print(table(rows, summary))
    if args.json:
        out = {"rows": rows, "summary": summary,
               "provenance": provenance.record(executor=env.executor.describe() if hasattr(env.executor, "describe") else args.executor,
                                               workloads=workloads, warmup_episodes=args.warmup_episodes,
                                               seconds=round(time.time() - started, 1))}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"feather-eval: -> {args.json}")
    env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
