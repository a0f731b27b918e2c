"""A short real training run (replay executor) improves on random; resume; feather-eval's JSON."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import feather_rl
from feather_rl import evaluate, policy_file, train
from feather_rl.episodes import make, run_episode
from feather_rl.workload_specs import FEATHER_8X8_P400
from feather_sglang.agents.features import OBS_FIELDS
from feather_sglang.agents.learned import PolicyFileError, load_policy

TRAIN_WORKLOADS = f"gsp,{FEATHER_8X8_P400},no-sharing"


def _mean_return(agent_spec: str, seeds=range(6)) -> float:
    env = gym.make(
        feather_rl.ENV_ID, workloads=tuple(train.split_workloads(TRAIN_WORKLOADS))
    ).unwrapped
    return statistics.fmean(
        run_episode(env, make(agent_spec, s), seed=100 + s)["mean_batch_throughput"] for s in seeds
    )


def test_short_ppo_run_beats_random_and_resumes(tmp_path):
    out = tmp_path / "run"
    args = [
        "--env",
        "batch",
        "--algo",
        "ppo",
        "--workloads",
        TRAIN_WORKLOADS,
        "--seed",
        "0",
        "--out",
        str(out),
        "--checkpoint-every",
        "2048",
    ]
    assert train.main([*args, "--timesteps", "4096"]) == 0
    for name in (
        "model.zip",
        "latest.zip",
        "monitor.csv",
        "progress.csv",
        "learning_curve.png",
        "provenance.json",
    ):
        assert (out / name).exists(), name
    assert (out / "checkpoints" / "step_2048.zip").exists()
    trained, random_ = _mean_return(f"ppo:{out / 'model.zip'}"), _mean_return("random")
    print(f"\n  trained {trained:.0f} tok/s vs random {random_:.0f} tok/s (4096 PPO steps)")
    assert trained > random_
    # resume continues from latest.zip and appends to the episode log
    episodes_before = len((out / "monitor.csv").read_text().splitlines())
    assert train.main([*args, "--timesteps", "5120", "--resume"]) == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["training"]["timesteps_done"] >= 5120 and prov["command"].startswith(
        ("feather-train", "python", "pytest")
    )
    assert len((out / "monitor.csv").read_text().splitlines()) > episodes_before
    # --resume refuses a latest.zip that feather-train did not write
    import zipfile

    with zipfile.ZipFile(out / "latest.zip", "a") as zf:
        zf.writestr("extra.pkl", b"not ours")
    assert train.main([*args, "--timesteps", "9000", "--resume"]) == 2


def test_eval_writes_rows_and_summary(tmp_path, capsys):
    from feather_bench.workloads import build_workload, load_tokenizer, write_workload_file
    from feather_rl.workload_specs import DEFAULT_TOKENIZER

    wfile = tmp_path / "heldout.jsonl"
    write_workload_file(
        build_workload(
            "gsp", load_tokenizer(str(DEFAULT_TOKENIZER)), 9, groups=3, prompts_per_group=5
        ),
        wfile,
    )
    shipped = evaluate.shipped_agents()
    assert shipped, "no shipped agent"
    out = tmp_path / "eval.json"
    assert (
        evaluate.main(
            [
                "--env",
                "batch",
                "--agents",
                ",".join(["static", "always-add", "random", "ucb", shipped[0]]),
                "--workloads",
                "multilevel",
                "--workload-file",
                str(wfile),
                "--seeds",
                "2",
                "--warmup-episodes",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert {(r["agent"], r["workload"]) for r in data["rows"]} >= {
        ("static", "multilevel"),
        ("static", f"file:{wfile}"),
    }
    assert all(len(r["rewards"]) == 2 and r["mean_reward"] > 0 for r in data["rows"])
    s = data["summary"]
    assert (
        s["trained"] == shipped[0] and s["trained_vs_static"] > 0 and s["trained_vs_always_add"] > 0
    )
    assert "trained_vs_static" in capsys.readouterr().out


def test_serving_env_training_uses_sb3_callbacks_and_overrides(tmp_path):
    """feather-train in feather/Serving-v0: parallel envs, SB3's checkpoint and evaluation
    callbacks (the best policy on the held-out regimes is a servable file), hyperparameter
    overrides recorded in the provenance, and clear errors for bad ones."""
    from feather_sglang.agents import make_agent
    from feather_sglang.config import FeatherConfig

    out = tmp_path / "serving"
    assert (
        train.main(
            [
                "--timesteps",
                "2048",
                "--n-envs",
                "2",
                "--checkpoint-every",
                "1024",
                "--eval-every",
                "1024",
                "--out",
                str(out),
                "--hyperparams",
                "n_steps=256",
                "batch_size=64",
            ]
        )
        == 0
    )
    for name in (
        "model.zip",
        "best_model.zip",
        "latest.zip",
        "eval/evaluations.npz",
        "checkpoints/step_1024.zip",
    ):
        assert (out / name).exists(), name
    assert json.loads((out / "provenance.json").read_text())["training"]["overrides"] == {
        "n_steps": 256,
        "batch_size": 64,
    }
    make_agent(
        FeatherConfig(agent=f"ppo:{out / 'best_model.zip'}")
    )  # loads: manifest, layout, weights

    with pytest.raises(SystemExit):
        train.main(
            ["--out", str(tmp_path / "x"), "--hyperparams", "no_such_knob=1", "--timesteps", "10"]
        )
    assert train.serving_ppo_kwargs()["gamma"] == 0.999  # from hyperparams/ppo.yml


def test_tensorboard_log_has_rollout_and_eval_scalars(tmp_path, monkeypatch):
    """--tensorboard-log DIR (SB3's tensorboard_log) writes event files in DIR/PPO_1 with the
    training statistics and EvalCallback's held-out reward; --tensorboard is the same flag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setattr(train, "BASELINE_EPISODES", 3)  # the plot's baselines: not tested here

    tb = tmp_path / "tb"
    args = [
        "--timesteps",
        "2048",
        "--n-envs",
        "2",
        "--eval-every",
        "2048",
        "--checkpoint-every",
        "100000",
        "--hyperparams",
        "n_steps=256",
        "batch_size=64",
    ]
    assert train.main([*args, "--out", str(tmp_path / "run"), "--tensorboard-log", str(tb)]) == 0
    acc = EventAccumulator(str(tb / "PPO_1"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"rollout/ep_rew_mean", "eval/mean_reward"} <= tags, sorted(tags)
    assert [e.step for e in acc.Scalars("eval/mean_reward")][-1] == 2048
    # the older spelling is an alias; a second run gets the next run folder, as in SB3
    # (--timesteps 0: the logger is set up, nothing is trained)
    run2 = [*args, "--timesteps", "0", "--out", str(tmp_path / "run2"), "--tensorboard", str(tb)]
    assert train.main(run2) == 0
    assert (tb / "PPO_2").is_dir()


def test_rl_zoo3_trains_from_the_same_hyperparameter_file(tmp_path):
    """The command in docs/rl.md: rl-zoo3 reads feather_rl/hyperparams/ppo.yml, and the model it
    writes becomes a policy file the server loads. rl-zoo3 is not part of the pinned install set
    (docs/rl.md): this runs in ``make rl-zoo``'s ``.venv-zoo``, or where rl_zoo3 imports."""
    repo = Path(__file__).resolve().parents[2]
    zoo_python = repo / ".venv-zoo" / "bin" / "python"
    if not zoo_python.exists():
        pytest.importorskip("rl_zoo3", reason="no rl_zoo3 and no .venv-zoo (make rl-zoo)")
        zoo_python = Path(sys.executable)
    cmd = [
        str(zoo_python),
        "-m",
        "rl_zoo3.train",
        "--algo",
        "ppo",
        "--env",
        feather_rl.SERVING_ENV_ID,
        "--gym-packages",
        "feather_rl",
        "--conf-file",
        str(train.HYPERPARAMS),
        "-n",
        "1000",
        "--log-folder",
        str(tmp_path / "logs"),
    ]
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (model,) = (tmp_path / "logs" / "ppo").glob("feather-Serving-v0_*/feather-Serving-v0.zip")
    with pytest.raises(PolicyFileError, match="feather_policy.json"):
        load_policy(model, "ppo")
    assert policy_file.main([str(model), str(tmp_path / "policy.zip")]) == 0
    policy = load_policy(tmp_path / "policy.zip", "ppo")
    assert policy.act(np.zeros(len(OBS_FIELDS), np.float32)) in (0, 1)
