"""Writing a trained policy file: Stable-Baselines3's ``.zip`` plus feather's metadata member.

The server reads it with :func:`feather_sglang.agents.learned.load_policy` (``ppo:PATH``,
``dqn:PATH``): SB3's own ``PPO.load``/``DQN.load`` still read the file (they ignore the extra
member), so training can resume from it.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from feather_sglang.agents.features import CHUNK_SCALE, COUNT_SCALE, OBS_FIELDS, OBS_VERSION
from feather_sglang.agents.learned import META_MEMBER, manifest_of

# SB3's default MlpPolicy activations: PPO's actor-critic uses tanh, DQN's QNetwork ReLU.
ACTIVATION = {"ppo": "tanh", "dqn": "relu"}


def save_policy(model, path: str | Path, algo: str, provenance: dict | None = None) -> Path:
    """``model.save(path)`` and add ``feather_policy.json`` (algorithm, observation layout,
    activation, provenance)."""
    path = Path(path)
    if path.suffix != ".zip":  # SB3 appends .zip itself; say where the file really is
        path = path.with_name(path.name + ".zip")
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    meta = {
        "algo": algo,
        "activation": ACTIVATION[algo],
        # the observations it was trained on (the server checks version and fields)
        "obs_version": OBS_VERSION,
        "obs_fields": list(OBS_FIELDS),
        "scales": {"chunk": CHUNK_SCALE, "count": COUNT_SCALE},
        "provenance": provenance or {},
    }
    with zipfile.ZipFile(path) as zf:
        meta["manifest"] = manifest_of(zf)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr(META_MEMBER, json.dumps(meta, indent=1))
    return path


def set_meta(path: str | Path, meta: dict) -> None:
    """Rewrite a policy file's metadata member (e.g. to change the layout in a test)."""
    path = Path(path)
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if n != META_MEMBER}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    with zipfile.ZipFile(path) as zf:
        meta = {**meta, "manifest": manifest_of(zf)}
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr(META_MEMBER, json.dumps(meta, indent=1))


def main(argv: list[str] | None = None) -> int:
    """``python -m feather_rl.policy_file SRC DST``: a policy trained elsewhere on
    ``feather/Serving-v0`` (rl-zoo3's ``logs/ppo/.../feather-Serving-v0.zip``) as a policy file
    the server loads."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m feather_rl.policy_file", description=main.__doc__
    )
    parser.add_argument("src", help="an SB3 .zip trained on feather/Serving-v0")
    parser.add_argument("dst", help="the policy file to write (.zip)")
    parser.add_argument("--algo", choices=sorted(ACTIVATION), default="ppo")
    args = parser.parse_args(argv)
    from stable_baselines3 import DQN, PPO

    from feather_rl.serving_env import ServingEnv

    model = {"ppo": PPO, "dqn": DQN}[args.algo].load(args.src, device="cpu")
    expected = ServingEnv().observation_space.shape
    if model.observation_space.shape != expected:
        parser.error(
            f"{args.src}: observations of shape {model.observation_space.shape}; "
            f"feather/Serving-v0 gives {expected}"
        )
    path = save_policy(model, args.dst, args.algo, {"imported_from": str(args.src)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
