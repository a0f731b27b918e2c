"""Stable-Baselines3 policies served as a numpy forward pass (the file: ``docs/rl.md``)."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from feather_sglang.agents.base import Action, AgentState
from feather_sglang.agents.features import OBS_DIM, OBS_FIELDS, OBS_VERSION, observe
from feather_sglang.agents.throughput import ThroughputAgent

META_MEMBER = "feather_policy.json"
WEIGHTS_MEMBER = "policy.pth"
# An MLP policy for 12 observations is tens of KB.
MAX_MEMBER_BYTES = 64 << 20
# Where each algorithm's MLP lives in SB3's state dict (hidden layers, then the output layer).
_LAYER_PREFIXES = {
    "ppo": ("mlp_extractor.policy_net.", "action_net."),
    "dqn": ("q_net.q_net.", None),  # SB3's QNetwork: one Sequential, the last Linear is the output
}
_ACTIVATIONS = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}


class PolicyFileError(ValueError):
    """A policy file cannot be served; the message says which file and what is wrong."""


def manifest_of(zf: zipfile.ZipFile) -> dict[str, str]:
    """SHA-256 of every member of an open policy file but the metadata member, which records it."""
    names = sorted(set(zf.namelist()) - {META_MEMBER})
    return {n: hashlib.sha256(zf.read(n)).hexdigest() for n in names}


def check_manifest(zf: zipfile.ZipFile, meta: dict, where: str) -> None:
    """Raise :class:`PolicyFileError` unless the members are those ``meta`` records, none huge."""
    big = [i.filename for i in zf.infolist() if i.file_size > MAX_MEMBER_BYTES]
    if big:
        raise PolicyFileError(
            f"{where}: member(s) {', '.join(big)} exceed {MAX_MEMBER_BYTES >> 20} MiB; "
            "not a feather-train policy file"
        )
    if meta.get("manifest") != manifest_of(zf):
        raise PolicyFileError(
            f"{where}: its members do not match the manifest feather-train records; only "
            "files written by feather-train (and unchanged since) are loaded"
        )


@dataclass(frozen=True)
class NumpyPolicy:
    """An MLP, ``weights[i]`` (in, out); its output: a logit or Q-value per action."""

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    activation: str

    def act(self, obs: np.ndarray) -> Action:
        act, x = _ACTIVATIONS[self.activation], obs
        for w, b in zip(self.weights[:-1], self.biases[:-1]):
            x = act(x @ w + b)
        out = x @ self.weights[-1] + self.biases[-1]
        return Action.ADD if out[1] >= out[0] else Action.STOP


def load_policy(path: str | Path, algo: str) -> NumpyPolicy:
    """Read a ``feather-train`` model file for ``algo`` ('ppo' or 'dqn') into numpy."""
    path = Path(path)
    where = f"{algo}:{path}"
    if not path.is_file():
        raise PolicyFileError(
            f"{where}: no such file (train one with feather-train, or use the shipped "
            "feather_rl/agents/*.zip)"
        )
    if not zipfile.is_zipfile(path):
        raise PolicyFileError(f"{where}: not a Stable-Baselines3 model file (.zip)")
    with zipfile.ZipFile(path) as zf:
        try:
            meta = json.loads(zf.read(META_MEMBER))
        except KeyError:
            raise PolicyFileError(
                f"{where}: has no {META_MEMBER}; only models written by feather-train "
                "record the observation layout they were trained on"
            ) from None
        except ValueError as e:
            raise PolicyFileError(f"{where}: {META_MEMBER} is not valid JSON ({e})") from None
        if meta.get("algo") != algo:
            raise PolicyFileError(
                f"{where}: the file holds a {meta.get('algo')!r} policy, not {algo!r}; "
                f"use --feather-agent {meta.get('algo')}:{path}"
            )
        if meta.get("obs_version") != OBS_VERSION or meta.get("obs_fields") != list(OBS_FIELDS):
            raise PolicyFileError(
                f"{where}: incompatible observation layout: trained on version {meta.get('obs_version')} "
                f"{meta.get('obs_fields')}, this server observes version {OBS_VERSION} {list(OBS_FIELDS)}; "
                "retrain with feather-train"
            )
        activation = meta.get("activation")
        if activation not in _ACTIVATIONS:
            raise PolicyFileError(
                f"{where}: unknown activation {activation!r}; allowed: {', '.join(_ACTIVATIONS)}"
            )
        if WEIGHTS_MEMBER not in zf.namelist():
            raise PolicyFileError(f"{where}: has no {WEIGHTS_MEMBER} (the network's weights)")
        check_manifest(zf, meta, where)
        data = io.BytesIO(zf.read(WEIGHTS_MEMBER))
    import torch  # only here, once, at load time

    try:
        state_dict = torch.load(data, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a start-up error
        raise PolicyFileError(f"{where}: cannot read {WEIGHTS_MEMBER}: {e}") from None
    weights, biases = _extract_layers(state_dict, algo, where)
    if not all(np.isfinite(a).all() for a in (*weights, *biases)):
        raise PolicyFileError(
            f"{where}: the network has non-finite weights (NaN or inf); retrain it"
        )
    if weights[0].shape[0] != OBS_DIM or weights[-1].shape[1] != 2:
        raise PolicyFileError(
            f"{where}: incompatible network: input {weights[0].shape[0]} (expected {OBS_DIM} "
            f"observations), output {weights[-1].shape[1]} (expected 2 actions)"
        )
    for a, b in zip(weights, weights[1:]):
        if a.shape[1] != b.shape[0]:
            raise PolicyFileError(f"{where}: layer shapes do not chain: {a.shape} then {b.shape}")
    return NumpyPolicy(tuple(weights), tuple(biases), activation)


def _extract_layers(state_dict: dict, algo: str, where: str) -> tuple[list, list]:
    hidden, out = _LAYER_PREFIXES[algo]
    weight_keys = [k for k in state_dict if k.startswith(hidden) and k.endswith(".weight")]
    indices = sorted({int(k[len(hidden) :].split(".")[0]) for k in weight_keys})
    prefixes = [f"{hidden}{i}." for i in indices] + ([out] if out else [])
    weights, biases = [], []
    for prefix in prefixes:
        try:
            w, b = state_dict[prefix + "weight"], state_dict[prefix + "bias"]
        except KeyError:
            raise PolicyFileError(
                f"{where}: the weights have no {prefix}weight/bias: not an SB3 {algo} MlpPolicy"
            ) from None
        weights.append(np.ascontiguousarray(w.detach().cpu().numpy().T, dtype=np.float32))
        biases.append(np.ascontiguousarray(b.detach().cpu().numpy(), dtype=np.float32))
    if not weights:
        raise PolicyFileError(f"{where}: no {algo} network weights found")
    return weights, biases


_CACHE: dict[tuple[str, str, float], NumpyPolicy] = {}


def cached_policy(path: str, algo: str) -> NumpyPolicy:
    """load_policy, once per (file, mtime): the config validates the file, the agent reuses it."""
    resolved = Path(path).resolve()
    key = (str(resolved), algo, resolved.stat().st_mtime if resolved.is_file() else -1.0)
    if key not in _CACHE:
        _CACHE[key] = load_policy(path, algo)
    return _CACHE[key]


class LearnedAgent(ThroughputAgent):
    """A trained policy's greedy action (the throughput agent's model feeds its observation)."""

    takes_path = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self.policy = cached_policy(config.agent.partition(":")[2], self.name)

    @classmethod
    def validate(cls, path: str) -> None:
        cached_policy(path, cls.name)

    def decide(self, state: AgentState) -> Action:
        if state.batch_size == 0:
            return Action.ADD
        return self.policy.act(observe(state, self.model))


class PPOAgent(LearnedAgent):
    name = "ppo"


class DQNAgent(LearnedAgent):
    name = "dqn"
