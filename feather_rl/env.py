"""The batch-formation environment: feather's own CHT offers candidates, an executor pays throughput."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from feather_rl import workload_specs
from feather_rl.executors.real import DEFAULT_MAX_TOTAL_TOKENS
from feather_sglang.agents.base import Action, AgentState
from feather_sglang.agents.features import OBS_DIM, observe
from feather_sglang.agents.throughput import StepTimeModel
from feather_sglang.cht import ChunkedHashTree, with_costs

# The observation space: every feature in [0, 1] but chunk_loss, in [-1, 1] (features.observe).
OBS_LOW = np.zeros(OBS_DIM, dtype=np.float32)
OBS_LOW[1] = -1.0
OBS_HIGH = np.ones(OBS_DIM, dtype=np.float32)
DEFAULT_CHUNK_SIZE = 50  # feather's default --feather-chunk-size
# NOTE: 32 running requests: the A/B workloads have 30-64 requests, so a batch cannot simply
# take everything and the agent must choose what runs together.
DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_STEPS = 4096


class BatchFormationEnv(gym.Env):
    """Form decode batches from a workload's waiting requests, one ADD/STOP decision at a time.

    An episode schedules one workload (drawn per reset from ``workloads``, or given by
    ``options={"workload": spec, "workload_seed": s}``): all its requests wait in feather's
    :class:`~feather_sglang.cht.ChunkedHashTree`. Each step offers the CHT's best candidate (the
    waiting request with the fewest chunks missing from the batch being formed) and the agent
    says ADD or STOP. On STOP the batch is dispatched: the executor runs it (``RealExecutor``) or
    looks it up in a recording of real runs (``ReplayExecutor``), its requests finish, and the
    next batch starts empty.

    ## Action Space
    ``Discrete(2)``: 0 = STOP (dispatch the batch as it is), 1 = ADD (admit the candidate), as
    :class:`feather_sglang.agents.Action`.

    ## Observation Space
    ``Box(low, high, (12,), float32)``: the layout of :mod:`feather_sglang.agents.features`,
    which the server's learned agents read too (the step-time model behind its predicted gain
    is the per-request one: the replayed batches ran on torch_native attention).

    ## Rewards
    At each dispatch, the batch's decode throughput (output tokens/s, measured) times its share
    of the workload's requests: every request's decision is credited with the throughput of the
    batch it ran in, so an episode's return is the request-weighted mean batch decode throughput
    (tokens/s). Steps that dispatch nothing give 0.

    ## Starting State
    Every request of the workload waiting, in the workload's order (arrival times are not
    simulated), nothing running; the first request of each batch is admitted without asking
    (STOP on an empty batch would run nothing).

    ## Episode End
    Terminated when no request is left waiting (the last batch is dispatched then). Truncated
    after ``max_steps`` decisions. Dispatches the agent is not asked about: when the batch holds
    ``max_batch`` requests or the candidate's new tokens would exceed ``kv_capacity_tokens``.

    ``info``: ``state`` (the candidate's :class:`AgentState`), ``dispatched`` (this step's batches:
    size, tokens/s, decode seconds, shared fraction), and at the episode's end ``episode``
    (mean batch throughput, workload decode tokens/s, batches).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        workloads: tuple[str, ...] | list[str] = workload_specs.TRAIN_WORKLOADS,
        executor: Any = "replay",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_batch: int = DEFAULT_MAX_BATCH,
        kv_capacity_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
        max_steps: int = DEFAULT_MAX_STEPS,
        tokenizer_path: str = str(workload_specs.DEFAULT_TOKENIZER),
        recording: str | None = None,
    ) -> None:
        if not workloads:
            raise ValueError("workloads: give at least one workload spec")
        for spec in workloads:
            workload_specs.parse_spec(spec)  # fail now on a bad name
        self.workloads = tuple(workloads)
        self.executor = _make_executor(executor, recording)
        self.chunk_size, self.max_batch, self.max_steps = chunk_size, max_batch, max_steps
        self.kv_capacity_tokens, self.tokenizer_path = kv_capacity_tokens, tokenizer_path
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(OBS_LOW, OBS_HIGH, (OBS_DIM,), np.float32)
        self._cht: ChunkedHashTree | None = None
        # the replayed batches ran on per-request attention (torch_native)
        self._model = StepTimeModel(prefix_shared=False)

    # ---- Gymnasium API ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        spec = (
            options.get("workload")
            or self.workloads[int(self.np_random.integers(len(self.workloads)))]
        )
        wseed = int(options.get("workload_seed", self.np_random.integers(2**31 - 1)))
        self.workload_spec, self.workload_seed = spec, wseed
        workload, self._prompts = workload_specs.load(spec, wseed, self.tokenizer_path)
        self._output_len = [r.max_new_tokens for r in workload.requests]
        self._cht = ChunkedHashTree(self.chunk_size)
        for rid, keys in enumerate(
            workload_specs.keys(spec, wseed, self.chunk_size, self.tokenizer_path)
        ):
            self._cht.add_waiting_keys(rid, keys)
        self._batch: list[int] = []
        self._used_tokens = 0
        self._steps = 0
        self._episode = {"return": 0.0, "decode_tokens": 0, "decode_s": 0.0, "batches": 0}
        dispatched: list[dict] = []
        self._advance(dispatched)
        return self._obs(), self._info(dispatched, done=False)

    def step(self, action):
        if self._cht is None:
            raise RuntimeError("call reset() before step()")
        if self._candidate is None:
            raise RuntimeError("the episode has ended; call reset()")
        dispatched: list[dict] = []
        if Action(int(action)) is Action.ADD:
            self._admit(self._candidate)
        else:
            self._dispatch(dispatched)
        self._steps += 1
        self._advance(dispatched)
        reward = float(sum(d["reward"] for d in dispatched))
        terminated = self._candidate is None
        truncated = not terminated and self._steps >= self.max_steps
        return (
            self._obs(),
            reward,
            terminated,
            truncated,
            self._info(dispatched, done=terminated or truncated),
        )

    def close(self) -> None:
        self.executor.close()

    # ---- batch formation -------------------------------------------------------------------
    def _advance(self, dispatched: list[dict]) -> None:
        """Admit or dispatch without asking until a decision is due; ``_candidate`` None: done."""
        cht = self._cht
        while True:
            rid = cht.best()
            if rid is None:
                if self._batch:
                    self._dispatch(dispatched)
                self._candidate, self._state = None, None
                return
            view = cht.candidate_view(rid)
            new_tokens = self._new_tokens(rid, view.deficit)
            if self._batch and (
                len(self._batch) >= self.max_batch
                or self._used_tokens + new_tokens > self.kv_capacity_tokens
            ):
                self._dispatch(dispatched)
                continue
            if not self._batch:
                self._admit(rid)
                continue
            self._candidate = rid
            self._state = with_costs(
                AgentState(
                    batch_size=len(self._batch),
                    chunks_before=view.chunks_before,
                    chunks_after=view.chunks_after,
                    waiting=view.waiting,
                    queue_len=cht.num_waiting,
                    memory_headroom=max(0.0, 1.0 - self._used_tokens / self.kv_capacity_tokens),
                ),
                cht,
                rid,
                view.deficit,
                self.max_batch - len(self._batch),
                self.kv_capacity_tokens - self._used_tokens,
            )
            return

    def _new_tokens(self, rid: int, deficit: int) -> int:
        """Prompt tokens of ``rid`` in chunks no batch member holds (its KV to allocate)."""
        return min(deficit * self.chunk_size, len(self._prompts[rid]))

    def _admit(self, rid: int) -> None:
        self._used_tokens += self._new_tokens(rid, self._cht.deficit(rid))
        self._cht.admit(rid)
        self._batch.append(rid)

    def _dispatch(self, dispatched: list[dict]) -> None:
        batch, total = self._batch, len(self._prompts)
        m = self.executor.measure(
            [self._prompts[r] for r in batch], max(self._output_len[r] for r in batch)
        )
        reward = len(batch) / total * m.tokens_per_s
        for rid in batch:
            self._cht.finish(rid)
        ep = self._episode
        ep["return"] += reward
        ep["decode_tokens"] += m.decode_tokens
        ep["decode_s"] += m.decode_s
        ep["batches"] += 1
        dispatched.append(
            {
                "batch_size": len(batch),
                "tokens_per_s": m.tokens_per_s,
                "decode_s": m.decode_s,
                "decode_steps": m.output_len - 1,
                "shared_frac": m.key.shared_frac,
                "reward": reward,
            }
        )
        self._batch, self._used_tokens = [], 0

    def _obs(self) -> np.ndarray:
        if self._state is None:
            return np.zeros(OBS_DIM, dtype=np.float32)
        return observe(self._state, self._model)

    def _info(self, dispatched: list[dict], done: bool) -> dict:
        info = {"state": self._state, "dispatched": dispatched, "workload": self.workload_spec}
        if done:
            ep = self._episode
            info["episode_summary"] = {
                "workload": self.workload_spec,
                "workload_seed": self.workload_seed,
                "mean_batch_throughput": ep["return"],
                "workload_tokens_per_s": ep["decode_tokens"] / ep["decode_s"]
                if ep["decode_s"]
                else 0.0,
                "batches": ep["batches"],
                "decisions": self._steps,
            }
        return info


def _make_executor(executor: Any, recording: str | None):
    if executor == "replay":
        from feather_rl.executors.replay import DEFAULT_RECORDING, ReplayExecutor

        return ReplayExecutor(recording or DEFAULT_RECORDING)
    if executor == "real":
        from feather_rl.executors.real import RealExecutor

        return RealExecutor(str(workload_specs.DEFAULT_TOKENIZER), max_batch=DEFAULT_MAX_BATCH)
    if hasattr(executor, "measure"):
        return executor
    raise ValueError(
        f"executor must be 'replay', 'real' or an object with measure(), got {executor!r}"
    )
