"""The stop/add agent interface: every agent (static rule, bandit, Q-learning, trained) plugs in here."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from enum import IntEnum
from typing import TYPE_CHECKING, ClassVar, NamedTuple

if TYPE_CHECKING:
    from feather_sglang.config import FeatherConfig


class Action(IntEnum):
    """What to do with the best waiting candidate. Values match a gymnasium ``Discrete(2)``."""

    STOP = 0  # dispatch the batch as it is; the candidate keeps waiting
    ADD = 1  # admit the candidate into the batch


class AgentState(NamedTuple):
    """What an agent sees about one candidate (all lengths in chunks of ``chunk_size`` tokens).

    batch_size:    requests in the batch if the candidate is not added (running + admitted
                   earlier in this pass).
    chunks_before: depth of the prefix shared by every request of the batch (0 if empty).
    chunks_after:  that depth if the candidate joins (the candidate's own length if empty).
    waiting:       waiting requests that hold the chain key at depth ``chunks_after`` (they
                   could join later without shrinking the chain further).
    queue_len:     requests waiting in all.
    memory_headroom: fraction of the KV cache's token capacity still free with this pass's
                   earlier picks counted as used, in [0, 1] (1.0 where unknown).

    What the batch and the candidate cost, in tokens (0 where unknown), for agents that
    predict a step's time (:mod:`feather_sglang.agents.throughput`):

    group_waiting: waiting requests sharing the candidate's deepest prefix shared with any
                   other waiting request, the candidate included (1: it shares none).
    new_tokens:    prompt tokens of the candidate that no running request holds.
    own_tokens:    prompt tokens of the candidate beyond that shared prefix.
    prompt_tokens: the candidate's prompt length.
    batch_unique_tokens: prompt tokens of the batch, each shared chunk counted once.
    batch_tokens:  prompt tokens of the batch, per request.
    free_slots:    requests this pass may still admit, the candidate included.
    kv_free_tokens: KV cache tokens free or evictable, this pass's earlier picks deducted
                   (-1: unknown).

    NOTE: a NamedTuple (immutable, like the frozen dataclass it was) because the planner
    builds one per pick and a NamedTuple builds ~2.5x faster.
    """

    batch_size: int
    chunks_before: int
    chunks_after: int
    waiting: int
    queue_len: int
    memory_headroom: float = 1.0
    group_waiting: int = 1
    new_tokens: int = 0
    own_tokens: int = 0
    prompt_tokens: int = 0
    batch_unique_tokens: int = 0
    batch_tokens: int = 0
    free_slots: int = 1
    kv_free_tokens: int = -1

    @property
    def delta(self) -> int:
        """The paper's delta: chain depth lost if the candidate joins (negative: gained)."""
        return self.chunks_before - self.chunks_after

    @property
    def loss(self) -> int:
        """Chain depth lost if the candidate joins, never negative."""
        return max(self.delta, 0)


class ServerShape(NamedTuple):
    """What of the server's configuration a batch's cost depends on."""

    prefix_shared_attention: bool  # the attention backend reads a shared prefix once per group
    max_running_requests: int
    kv_capacity_tokens: int
    dtype: str = "unknown"


class StopAddAgent(ABC):
    """Decides, candidate by candidate, whether to keep admitting into the running batch.

    Life cycle per scheduling pass: ``decide`` for the best candidate; on ADD the policy
    admits it and calls ``on_admit``; the next best candidate is asked about, until STOP or
    nothing is left. ``on_batch_empty`` marks the start of a new batch (nothing running).
    ``on_step`` reports each executed forward step (for learners whose reward is throughput).
    """

    name: ClassVar[str]
    # True: the planner fills AgentState's token costs (three more O(path) walks per pick).
    wants_costs: ClassVar[bool] = False
    # The agent's own settings: field name -> (type, feather_sglang.options.opt(...)). They
    # become FeatherConfig fields (``--feather-<name>`` flags), whichever agent is chosen.
    options: ClassVar[dict[str, tuple[type, object]]] = {}

    @staticmethod
    def check_options(config: "FeatherConfig") -> None:
        """Checks across this agent's settings (each field's own check has run); raises
        FeatherConfigError."""

    def __init__(self, config: "FeatherConfig") -> None:
        self.config = config

    @abstractmethod
    def decide(self, state: AgentState) -> Action: ...

    def on_admit(self, state: AgentState) -> None:
        """The candidate described by ``state`` was admitted."""

    def on_batch_empty(self) -> None:
        """Nothing is running: the next admission starts a new batch."""

    def on_step(self, batch_size: int, step_time_s: float) -> None:
        """One forward step of ``batch_size`` requests took ``step_time_s`` seconds."""

    def on_decode_step(
        self, batch_size: int, unique_tokens: int, tokens: int, step_time_s: float
    ) -> None:
        """One decode step of ``batch_size`` requests over ``tokens`` prompt tokens
        (``unique_tokens`` with shared chunks counted once) took ``step_time_s`` seconds."""

    def bind_server(self, server: "ServerShape") -> None:
        """The server this agent decides for (called once the scheduler is set up)."""

    def describe(self) -> str:
        """What the agent has learned so far, for the scheduler's periodic log line ('' if nothing)."""
        return ""

    # NOTE: a plan can be cut short by the scheduler (token budget, memory) after the agent
    # has seen its admissions; the planner then restores this checkpoint and replays
    # ``on_admit`` for the admissions that really happened.
    def checkpoint(self) -> object:
        """A copy of whatever ``on_admit``/``on_batch_empty`` change (default: all attributes
        but the config)."""
        return copy.deepcopy({k: v for k, v in vars(self).items() if k != "config"})

    def restore(self, checkpoint: object) -> None:
        vars(self).update(copy.deepcopy(checkpoint))
