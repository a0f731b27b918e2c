"""``feather-train``: train a stop/add policy with Stable-Baselines3 in ``feather/Serving-v0``.

    feather-train --algo ppo --timesteps 300000 --n-envs 4 --seed 0 --out results/runs/ppo-seed0
    feather-train --algo ppo --hyperparams learning_rate=1e-4 n_steps=2048 --tensorboard-log runs/tb ...
    feather-train --algo ppo --timesteps 300000 --out results/runs/ppo-seed0 --resume   # continue
    feather-train --env batch --workloads gsp,no-sharing ...   # static batches priced by real runs

``--env serving`` (the default) trains in the simulated continuous-batching server over the
regimes of :mod:`feather_rl.regimes`; ``--env batch`` in ``feather/BatchFormation-v0``.

Writes into ``--out``: ``model.zip`` (serve it with ``--feather-agent ppo:results/runs/ppo-seed0/model.zip``),
``checkpoints/step_N.zip`` every ``--checkpoint-every`` steps and ``latest.zip`` (what
``--resume`` continues from; DQN also keeps its replay buffer), ``best_model.zip`` and ``eval/``
(serving env: SB3's EvalCallback on the held-out regimes every ``--eval-every`` steps),
``monitor/`` or ``monitor.csv`` (one line per episode: return, length), ``progress.csv`` (SB3's
training statistics; with ``--tensorboard-log DIR``, TensorBoard event files too, in
``DIR/PPO_N`` or ``DIR/DQN_N`` as SB3 names them),
``learning_curve.png`` (episode return against timesteps, with the baselines' mean returns in
the same environment) and ``provenance.json``.
"""

from __future__ import annotations

import argparse
import ast
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
PPO_KWARGS = dict(
    n_steps=1024, batch_size=128, n_epochs=10, gamma=0.99, ent_coef=0.01, learning_rate=3e-4
)
DQN_KWARGS = dict(
    buffer_size=50_000,
    learning_starts=1_000,
    train_freq=4,
    target_update_interval=500,
    exploration_fraction=0.3,
    exploration_final_eps=0.02,
    learning_rate=5e-4,
    gamma=0.99,
)
# PPO's hyperparameters for the serving env, in rl-zoo3's format (the one place they are written).
HYPERPARAMS = Path(__file__).resolve().parent / "hyperparams" / "ppo.yml"
_ZOO_ONLY = ("n_envs", "n_timesteps", "policy", "normalize")


def serving_ppo_kwargs() -> dict:
    """SB3 keyword arguments for PPO in feather/Serving-v0, from ``hyperparams/ppo.yml``."""
    import yaml

    conf = yaml.safe_load(HYPERPARAMS.read_text())["feather/Serving-v0"]
    return {k: v for k, v in conf.items() if k not in _ZOO_ONLY}


BASELINE_EPISODES = 30


def make_env(
    workloads,
    executor: str,
    recording: str | None,
    monitor_path: Path | None = None,
    append: bool = False,
):
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor

    import feather_rl  # noqa: F401  registers the env

    env = gym.make(
        feather_rl.ENV_ID, workloads=tuple(workloads), executor=executor, recording=recording
    )
    if monitor_path is not None:
        # raw tokens/s per episode; a resumed run appends (SB3 writes the header only on a new file)
        env = Monitor(
            env, str(monitor_path), override_existing=not (append and monitor_path.exists())
        )
    return gym.wrappers.TransformReward(env, lambda r: r / REWARD_SCALE)


def make_serving_env(n_envs: int, seed: int, monitor_dir: Path):
    """``n_envs`` copies of ``feather/Serving-v0`` in one process (SB3's ``make_vec_env``), each
    with a Monitor file in ``monitor_dir`` (returns: -duration / always-add's duration)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import feather_rl

    env = make_vec_env(
        feather_rl.SERVING_ENV_ID, n_envs=n_envs, seed=seed, monitor_dir=str(monitor_dir)
    )
    return VecNormalize(env, norm_obs=False, norm_reward=True, gamma=serving_ppo_kwargs()["gamma"])


def baselines(workloads, executor: str, recording: str | None, seed: int) -> dict:
    """Mean episode return of the rule-based agents on the training workloads (for the plot)."""
    from feather_rl.episodes import make, run_episode

    env = make_env(workloads, executor, recording).unwrapped
    out = {}
    for spec in ("static", "always-add", "random"):
        agent = make(spec, seed)
        rets = [
            run_episode(env, agent, seed=seed + i)["mean_batch_throughput"]
            for i in range(BASELINE_EPISODES)
        ]
        out[spec] = float(np.mean(rets))
    return out


def serving_baselines(seed: int) -> dict:
    """Mean episode return of the rule-based agents in ``feather/Serving-v0`` (for the plot)."""
    from feather_rl.episodes import make
    from feather_rl.regimes import sample
    from feather_rl.simulator import StepCosts, simulate

    costs, rng = StepCosts.load(), np.random.default_rng(seed + 7)
    draws = [(sample(rng), int(rng.integers(2**31 - 1))) for _ in range(BASELINE_EPISODES)]
    ref = [simulate(r, s, make("always-add"), costs).duration_s for r, s in draws]
    return {
        name: float(
            np.mean(
                [-simulate(r, s, make(name), costs).duration_s / t for (r, s), t in zip(draws, ref)]
            )
        )
        for name in ("static", "admit", "throughput")
    } | {"always-add": -1.0}


def plot_curve(
    monitor_csv: Path,
    png: Path,
    base: dict,
    title: str,
    ylabel: str = "mean batch decode throughput (tokens/s)",
) -> None:
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
    ax.plot(steps[window - 1 :], smooth, lw=2, label=f"mean of {window}")
    for (name, value), style in zip(sorted(base.items()), ("--", ":", "-.")):
        ax.axhline(value, ls=style, color="gray", label=f"{name} ({value:.0f})")
    ax.set_xlabel("timesteps (decisions)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _monitor_rows(path: Path) -> list[tuple[float, int]]:
    """(return, length) per episode from a Monitor file, or from every one in a folder, in
    the order the episodes ended."""
    files = sorted(path.glob("*.monitor.csv")) if path.is_dir() else [path] if path.exists() else []
    rows = []
    for f in files:
        with open(f) as fh:
            lines = [line for line in fh if not line.startswith("#")]
        rows += [(float(r["t"]), float(r["r"]), int(r["l"])) for r in csv.DictReader(lines)]
    return [(r, n) for _, r, n in sorted(rows)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="feather-train",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--algo", choices=ALGOS, default="ppo")
    ap.add_argument(
        "--env",
        choices=("serving", "batch"),
        default="serving",
        help="serving: the simulated continuous-batching server (feather/Serving-v0); "
        "batch: static batches priced by real runs (feather/BatchFormation-v0)",
    )
    ap.add_argument(
        "--n-envs", type=int, default=4, help="parallel environments (serving env only)"
    )
    ap.add_argument(
        "--executor",
        choices=("replay", "real"),
        default="replay",
        help="replay: recorded real measurements (fast); real: run every batch on the model",
    )
    ap.add_argument(
        "--recording",
        default=None,
        help="replay recording (default: feather_rl/data/replay_tiny-llama.json)",
    )
    ap.add_argument(
        "--workloads",
        default=",".join(workload_specs.TRAIN_WORKLOADS),
        help="training workload specs separated by ';' or ',' between names "
        "(NAME, NAME:k=v,k=v, file:PATH); default: %(default)s",
    )
    ap.add_argument("--timesteps", type=int, default=30_000, help="decisions to train on in all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="output folder (default: results/runs/ALGO-seedN)")
    ap.add_argument(
        "--checkpoint-every", type=int, default=5_000, help="timesteps between checkpoints"
    )
    ap.add_argument(
        "--eval-every",
        type=int,
        default=25_000,
        help="serving env: timesteps between evaluations on the held-out regimes (SB3's EvalCallback; "
        "the best policy so far is written to OUT/best_model.zip); 0: none",
    )
    ap.add_argument(
        "--hyperparams",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="override SB3 hyperparameters of a new run, e.g. learning_rate=1e-4 n_steps=2048 "
        f"(defaults: {HYPERPARAMS.relative_to(HYPERPARAMS.parents[2])} for PPO in the serving env)",
    )
    ap.add_argument(
        "--tensorboard-log",
        "--tensorboard",
        dest="tensorboard_log",
        metavar="DIR",
        default=None,
        help="also log to TensorBoard, in DIR/PPO_N or DIR/DQN_N (SB3's tensorboard_log; "
        "needs the tensorboard package)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/latest.zip up to --timesteps. Stable-Baselines3 unpickles parts of "
        "the file (and DQN's replay buffer): resume only run folders you trust. Files whose "
        "contents do not match the manifest feather-train wrote are refused",
    )
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.hyperparams:
        key, eq, value = item.partition("=")
        if not eq or not key:
            ap.error(f"--hyperparams: expected KEY=VALUE, got {item!r}")
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value  # a plain string, e.g. a schedule's name
    if overrides and args.resume:
        ap.error("--hyperparams applies to a new run, not to --resume")
    if args.tensorboard_log:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            ap.error("--tensorboard-log needs the tensorboard package (pip install tensorboard)")

    import stable_baselines3 as sb3
    import torch
    from stable_baselines3.common.callbacks import (
        BaseCallback,
        CallbackList,
        CheckpointCallback,
        EvalCallback,
    )
    from stable_baselines3.common.logger import Logger, make_output_format
    from stable_baselines3.common.utils import get_latest_run_id
    from tqdm import tqdm

    torch.set_num_threads(1)
    workloads = split_workloads(args.workloads)
    out = Path(args.out or f"results/runs/{args.algo}-seed{args.seed}")
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    if args.n_envs < 1:
        ap.error(f"--n-envs must be >= 1, got {args.n_envs}")
    serving = args.env == "serving"
    if serving:
        (out / "monitor").mkdir(exist_ok=True)
        env = make_serving_env(args.n_envs, args.seed, out / "monitor")
    else:
        env = make_env(
            workloads, args.executor, args.recording, out / "monitor.csv", append=args.resume
        )
    cls = sb3.PPO if args.algo == "ppo" else sb3.DQN
    latest = out / "latest.zip"
    if args.resume:
        if not latest.exists():
            print(f"feather-train: --resume: {latest} does not exist", file=sys.stderr)
            return 2
        problem = _untrusted(latest, out / "replay_buffer.pkl")
        if problem:
            print(f"feather-train: --resume: {problem}", file=sys.stderr)
            return 2
        model = cls.load(latest, env=env, device="cpu")
        buffer = out / "replay_buffer.pkl"
        if args.algo == "dqn" and buffer.exists():
            model.load_replay_buffer(buffer)
    else:
        kwargs = (
            (serving_ppo_kwargs() if serving else PPO_KWARGS) if args.algo == "ppo" else DQN_KWARGS
        )
        try:
            model = cls(
                "MlpPolicy",
                env,
                seed=args.seed,
                device="cpu",
                verbose=0,
                tensorboard_log=args.tensorboard_log,
                **{**kwargs, **overrides},
            )
        except TypeError as e:
            ap.error(f"--hyperparams: {e}")
    formats = [make_output_format("csv", str(out))]
    if args.tensorboard_log:
        # SB3's layout: a new run in DIR/PPO_<latest + 1>; a resumed run continues the latest
        name = cls.__name__
        run_id = get_latest_run_id(args.tensorboard_log, name)
        if not (args.resume and run_id):
            run_id += 1
        tb_dir = Path(args.tensorboard_log) / f"{name}_{run_id}"
        formats.append(make_output_format("tensorboard", str(tb_dir)))
    model.set_logger(Logger(str(out), formats))
    done_before = model.num_timesteps
    remaining = args.timesteps - done_before
    if remaining <= 0:
        print(f"feather-train: {out} already has {done_before} >= {args.timesteps} timesteps")
        return 0

    info = {
        "algo": args.algo,
        "env": args.env,
        "n_envs": args.n_envs if serving else 1,
        "seed": args.seed,
        "executor": None if serving else args.executor,
        "workloads": "feather_rl.regimes.sample" if serving else workloads,
        "timesteps": args.timesteps,
        "hyperparameters": _hyperparameters(model),
        "overrides": overrides,
        "reward_scale": REWARD_SCALE,
    }
    if serving:
        from feather_rl.simulator import DEFAULT_CALIBRATION

        info["step_costs"] = json.loads(DEFAULT_CALIBRATION.read_text())
    elif args.executor == "replay":
        info["recording"] = env.unwrapped.executor.describe()

    class Progress(BaseCallback):
        def __init__(self):
            super().__init__()
            self.bar = tqdm(
                total=args.timesteps,
                initial=done_before,
                desc=f"feather-train {args.algo}",
                unit="step",
                file=sys.stderr,
            )

        def _on_step(self) -> bool:
            self.bar.update(self.model.num_timesteps - self.bar.n)
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    class PolicyCheckpoint(CheckpointCallback):
        """SB3's CheckpointCallback, writing feather policy files (servable, with provenance)."""

        def _on_step(self) -> bool:
            if self.n_calls % self.save_freq == 0:
                checkpoint(self.model, f"step_{self.num_timesteps}")
            return True

    class SaveBest(BaseCallback):
        def _on_step(self) -> bool:
            prov = provenance.record(
                training={
                    **info,
                    "timesteps_done": self.model.num_timesteps,
                    "best_mean_reward_heldout": float(self.parent.best_mean_reward),
                }
            )
            save_policy(self.model, out / "best_model.zip", args.algo, prov)
            return True

    n_envs = args.n_envs if serving else 1
    callbacks = [
        Progress(),
        PolicyCheckpoint(save_freq=max(args.checkpoint_every // n_envs, 1), save_path=str(out)),
    ]
    if serving and args.eval_every > 0:
        from stable_baselines3.common.monitor import Monitor
        from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

        from feather_rl.regimes import HELDOUT
        from feather_rl.serving_env import ServingEnv

        # wrapped as the training env is (SB3 syncs the normalisation; observations are raw)
        eval_env = VecNormalize(
            DummyVecEnv([lambda: Monitor(ServingEnv(regime_list=HELDOUT))]),
            norm_obs=False,
            norm_reward=False,
            training=False,
        )
        callbacks.append(
            EvalCallback(
                eval_env,
                n_eval_episodes=len(HELDOUT),
                eval_freq=max(args.eval_every // n_envs, 1),
                log_path=str(out / "eval"),
                callback_on_new_best=SaveBest(),
                deterministic=True,
                verbose=0,
            )
        )

    def checkpoint(m, name: str) -> None:
        prov = provenance.record(training={**info, "timesteps_done": m.num_timesteps})
        save_policy(m, out / "checkpoints" / f"{name}.zip", args.algo, prov)
        save_policy(m, latest, args.algo, prov)
        if args.algo == "dqn":
            m.save_replay_buffer(out / "replay_buffer.pkl")
            (out / "replay_buffer.pkl.sha256").write_text(_sha256(out / "replay_buffer.pkl") + "\n")

    started = time.time()
    model.learn(
        total_timesteps=remaining, callback=CallbackList(callbacks), reset_num_timesteps=False
    )
    train_s = time.time() - started
    checkpoint(model, f"step_{model.num_timesteps}")
    if serving:
        base = serving_baselines(args.seed)
    else:
        base = (
            baselines(workloads, args.executor, args.recording, args.seed)
            if args.executor == "replay"
            else {}
        )
    prov = provenance.record(
        training={
            **info,
            "timesteps_done": model.num_timesteps,
            "train_seconds_this_run": round(train_s, 1),
            "baselines_train_workloads": base,
        }
    )
    model_path = save_policy(model, out / "model.zip", args.algo, prov)
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    if serving:
        plot_curve(
            out / "monitor",
            out / "learning_curve.png",
            base,
            f"feather-train {args.algo}, seed {args.seed}, simulated server, {args.n_envs} envs",
            ylabel="return: -duration / always-add's duration",
        )
    else:
        plot_curve(
            out / "monitor.csv",
            out / "learning_curve.png",
            base,
            f"feather-train {args.algo}, seed {args.seed}, {args.executor} executor, "
            f"{len(workloads)} training workloads",
        )
    env.close()
    print(
        f"feather-train: {model.num_timesteps} timesteps ({train_s:.0f} s this run) -> {model_path}"
    )
    print(
        f"  serve it: python -m sglang.launch_server ... --schedule-policy feather --feather-agent {args.algo}:{model_path}"
    )
    return 0


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _untrusted(latest: Path, buffer: Path) -> str | None:
    """Why a run folder's files must not be unpickled (None: they are feather-train's own)."""
    import zipfile

    from feather_sglang.agents.learned import META_MEMBER, PolicyFileError, check_manifest

    try:
        with zipfile.ZipFile(latest) as zf:
            meta = json.loads(zf.read(META_MEMBER))
            check_manifest(zf, meta, str(latest))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        reason = (
            str(e)
            if isinstance(e, PolicyFileError)
            else f"{latest}: not a feather-train file ({e})"
        )
        return f"{reason}; refusing to unpickle it"
    if buffer.exists():
        digest = buffer.with_name(buffer.name + ".sha256")
        if not digest.exists() or digest.read_text().strip() != _sha256(buffer):
            return f"{buffer} does not match the digest feather-train wrote beside it; refusing to unpickle it"
    return None


def _hyperparameters(model) -> dict:
    keys = (
        "n_steps",
        "batch_size",
        "n_epochs",
        "gamma",
        "gae_lambda",
        "ent_coef",
        "learning_rate",
        "buffer_size",
        "learning_starts",
        "train_freq",
        "target_update_interval",
        "exploration_fraction",
        "exploration_final_eps",
    )
    return {
        k: getattr(model, k) for k in keys if isinstance(getattr(model, k, None), (int, float, str))
    }


def split_workloads(text: str) -> list[str]:
    """Workload specs from one command-line value: separated by ',' or ';'; a part that does not
    start with a workload name (or ``file:``) continues the previous spec's parameters, so
    ``gsp:groups=2,prompts_per_group=16,batchllm`` is two specs."""
    from feather_bench.workloads import is_workload_name

    specs: list[str] = []
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if is_workload_name(part.split(":", 1)[0]) or part.startswith("file:") or not specs:
            specs.append(part)
        else:
            specs[-1] += "," + part
    return specs


if __name__ == "__main__":
    raise SystemExit(main())
