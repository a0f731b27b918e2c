"""``feather-train``: train a stop/add policy with Stable-Baselines3 in ``feather/BatchFormation-v0``.

    feather-train --algo ppo --timesteps 30000 --seed 0 --out results/runs/ppo-seed0
    feather-train --algo ppo --timesteps 60000 --out results/runs/ppo-seed0 --resume   # continue

Writes into ``--out``: ``model.zip`` (serve it with ``--feather-agent ppo:results/runs/ppo-seed0/model.zip``),
``checkpoints/step_N.zip`` every ``--checkpoint-every`` steps and ``latest.zip`` (what
``--resume`` continues from; DQN also keeps its replay buffer), ``monitor.csv`` (one line per
episode: return in tokens/s, length), ``progress.csv`` (SB3's training statistics),
``learning_curve.png`` (episode return against timesteps, with the baselines' mean returns in
the same environment) and ``provenance.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

from feather_rl import provenance, workload_specs
from feather_rl.policy_file import save_policy

# NOTE: rewards are tokens/s (hundreds to thousands); dividing by 1000 keeps value targets and
# TD errors near 1 for the optimisers. A constant scale changes no optimal decision.
REWARD_SCALE = 1000.0
ALGOS = ("ppo", "dqn")
# Hyper-parameters: SB3 defaults except where episodes of 30-64 decisions call for less.
PPO_KWARGS = dict(n_steps=1024, batch_size=128, n_epochs=10, gamma=0.99, ent_coef=0.01, learning_rate=3e-4)
DQN_KWARGS = dict(buffer_size=50_000, learning_starts=1_000, train_freq=4, target_update_interval=500,
                  exploration_fraction=0.3, exploration_final_eps=0.02, learning_rate=5e-4, gamma=0.99)
BASELINE_EPISODES = 30


def make_env(workloads, executor: str, recording: str | None, monitor_path: Path | None = None, append: bool = False):
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor

    import feather_rl  # noqa: F401  registers the env

    env = gym.make(feather_rl.ENV_ID, workloads=tuple(workloads), executor=executor, recording=recording)
    if monitor_path is not None:
        # raw tokens/s per episode; a resumed run appends (SB3 writes the header only on a new file)
        env = Monitor(env, str(monitor_path), override_existing=not (append and monitor_path.exists()))
    return gym.wrappers.TransformReward(env, lambda r: r / REWARD_SCALE)


def baselines(workloads, executor: str, recording: str | None, seed: int) -> dict:
    """Mean episode return of the rule-based agents on the training workloads (for the plot)."""
    from feather_rl.episodes import make, run_episode

    env = make_env(workloads, executor, recording).unwrapped
    out = {}
    for spec in ("static", "always-add", "random"):
        agent = make(spec, seed)
        rets = [run_episode(env, agent, seed=seed + i)["mean_batch_throughput"] for i in range(BASELINE_EPISODES)]
        out[spec] = float(np.mean(rets))
    return out


def plot_curve(monitor_csv: Path, png: Path, base: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _monitor_rows(monitor_csv)
    if not rows:
        return
    steps = np.cumsum([r[1] for r in rows])
    rets = np.array([r[0] for r in rows])
    window = max(1, min(50, len(rets) // 10))
    smooth = np.convolve(rets, np.ones(window) / window, mode="valid")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rets, ".", ms=2, alpha=0.3, label="episode return")
    ax.plot(steps[window - 1:], smooth, lw=2, label=f"mean of {window}")
    for (name, value), style in zip(sorted(base.items()), ("--", ":", "-.")):
        ax.axhline(value, ls=style, color="gray", label=f"{name} ({value:.0f})")
    ax.set_xlabel("timesteps (decisions)")
    ax.set_ylabel("mean batch decode throughput (tokens/s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _monitor_rows(path: Path) -> list[tuple[float, int]]:
    if not path.exists():
        return []
    with open(path) as f:
        lines = [line for line in f if not line.startswith("#")]
    return [(float(r["r"]), int(r["l"])) for r in csv.DictReader(lines)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="feather-train", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", choices=ALGOS, default="ppo")
    ap.add_argument("--executor", choices=("replay", "real"), default="replay",
                    help="replay: recorded real measurements (fast); real: run every batch on the model")
    ap.add_argument("--recording", default=None, help="replay recording (default: feather_rl/data/replay_tiny-llama.json)")
    ap.add_argument("--workloads", default=",".join(workload_specs.TRAIN_WORKLOADS),
                    help="training workload specs separated by ';' or ',' between names "
                         "(NAME, NAME:k=v,k=v, file:PATH); default: %(default)s")
    ap.add_argument("--timesteps", type=int, default=30_000, help="decisions to train on in all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="output folder (default: results/runs/ALGO-seedN)")
    ap.add_argument("--checkpoint-every", type=int, default=5_000, help="timesteps between checkpoints")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/latest.zip up to --timesteps")
    args = ap.parse_args(argv)

    import stable_baselines3 as sb3
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import configure
    from tqdm import tqdm

    torch.set_num_threads(1)
    workloads = split_workloads(args.workloads)
    out = Path(args.out or f"results/runs/{args.algo}-seed{args.seed}")
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    env = make_env(workloads, args.executor, args.recording, out / "monitor.csv", append=args.resume)
    cls = sb3.PPO if args.algo == "ppo" else sb3.DQN
    latest = out / "latest.zip"
    if args.resume:
        if not latest.exists():
            print(f"feather-train: --resume: {latest} does not exist", file=sys.stderr)
            return 2
        model = cls.load(latest, env=env, device="cpu")
        buffer = out / "replay_buffer.pkl"
        if args.algo == "dqn" and buffer.exists():
            model.load_replay_buffer(buffer)
    else:
        kwargs = PPO_KWARGS if args.algo == "ppo" else DQN_KWARGS
        model = cls("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **kwargs)
    model.set_logger(configure(str(out), ["csv"]))
    done_before = model.num_timesteps
    remaining = args.timesteps - done_before
    if remaining <= 0:
        print(f"feather-train: {out} already has {done_before} >= {args.timesteps} timesteps")
        return 0

    info = {"algo": args.algo, "executor": args.executor, "workloads": workloads, "seed": args.seed,
            "timesteps": args.timesteps, "hyperparameters": PPO_KWARGS if args.algo == "ppo" else DQN_KWARGS,
            "reward_scale": REWARD_SCALE}
    if args.executor == "replay":
        info["recording"] = env.unwrapped.executor.describe()

    class Progress(BaseCallback):
        def __init__(self):
            super().__init__()
            self.bar = tqdm(total=args.timesteps, initial=done_before, desc=f"feather-train {args.algo}",
                            unit="step", file=sys.stderr)
            self.next_checkpoint = (done_before // args.checkpoint_every + 1) * args.checkpoint_every

        def _on_step(self) -> bool:
            self.bar.update(self.model.num_timesteps - self.bar.n)
            if self.model.num_timesteps >= self.next_checkpoint:
                self.next_checkpoint += args.checkpoint_every
                checkpoint(self.model, f"step_{self.model.num_timesteps}")
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    def checkpoint(m, name: str) -> None:
        prov = provenance.record(training={**info, "timesteps_done": m.num_timesteps})
        save_policy(m, out / "checkpoints" / f"{name}.zip", args.algo, prov)
        save_policy(m, latest, args.algo, prov)
        if args.algo == "dqn":
            m.save_replay_buffer(out / "replay_buffer.pkl")

    started = time.time()
    model.learn(total_timesteps=remaining, callback=Progress(), reset_num_timesteps=False)
    train_s = time.time() - started
    checkpoint(model, f"step_{model.num_timesteps}")
    base = baselines(workloads, args.executor, args.recording, args.seed) if args.executor == "replay" else {}
    prov = provenance.record(training={**info, "timesteps_done": model.num_timesteps,
                                       "train_seconds_this_run": round(train_s, 1),
                                       "baselines_train_workloads": base})
    model_path = save_policy(model, out / "model.zip", args.algo, prov)
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    plot_curve(out / "monitor.csv", out / "learning_curve.png", base,
               f"feather-train {args.algo}, seed {args.seed}, {args.executor} executor, "
               f"{len(workloads)} training workloads")
    env.close()
    print(f"feather-train: {model.num_timesteps} timesteps ({train_s:.0f} s this run) -> {model_path}")
    print(f"  serve it: python -m sglang.launch_server ... --schedule-policy feather --feather-agent {args.algo}:{model_path}")
    return 0


def split_workloads(text: str) -> list[str]:
    """Workload specs from one command-line value: separated by ',' or ';'; a part that does not
    start with a workload name (or ``file:``) continues the previous spec's parameters, so
    ``gsp:groups=2,prompts_per_group=16,batchllm`` is two specs."""
    from feather_sglang.workloads import WORKLOADS

    specs: list[str] = []
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if part.split(":", 1)[0] in (*WORKLOADS, "file") or not specs:
            specs.append(part)
        else:
            specs[-1] += "," + part
    return specs


if __name__ == "__main__":
    raise SystemExit(main())
