"""The stop/add agent interface that every agent plugs into (``docs/design.md``, "The agents")."""

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
    """What an agent sees about one candidate; each field: ``docs/design.md``, "The agents"."""

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
        return max(self.delta, 0)


class ServerShape(NamedTuple):
    """What of the server's configuration a batch's cost depends on."""

    prefix_shared_attention: bool  # the attention backend reads a shared prefix once per group
    max_running_requests: int
    kv_capacity_tokens: int
    dtype: str = "unknown"


class StopAddAgent(ABC):
    """Decides, candidate by candidate, whether to keep admitting into the running batch."""

    name: ClassVar[str]
    takes_path: ClassVar[bool] = False  # named ``name:PATH``, with a file to load
    # True: the planner fills AgentState's token costs (three more O(path) walks per pick).
    wants_costs: ClassVar[bool] = False
    # field name -> opt(...): FeatherConfig fields (``--feather-<name>``) for any agent.
    options: ClassVar[dict[str, object]] = {}

    @staticmethod
    def check_options(config: "FeatherConfig") -> None:
        """Checks across this agent's options; raises FeatherConfigError."""

    def __init__(self, config: "FeatherConfig") -> None:
        self.config = config

    @abstractmethod
    def decide(self, state: AgentState) -> Action: ...

    def on_admit(self, state: AgentState) -> None: ...

    def on_batch_empty(self) -> None:
        """Nothing is running: the next admission starts a new batch."""

    def on_step(self, batch_size: int, step_time_s: float) -> None: ...

    def on_decode_step(
        self, batch_size: int, unique_tokens: int, tokens: int, step_time_s: float
    ) -> None:
        """A decode step over ``tokens`` prompt tokens (``unique_tokens``: shared chunks once)."""

    def bind_server(self, server: "ServerShape") -> None: ...

    def describe(self) -> str:
        """What the agent has learned so far, for the periodic log line ('' if nothing)."""
        return ""

    def checkpoint(self) -> object:
        """A copy of whatever ``on_admit``/``on_batch_empty`` change (default: all but config)."""
        return copy.deepcopy({k: v for k, v in vars(self).items() if k != "config"})

    def restore(self, checkpoint: object) -> None:
        vars(self).update(copy.deepcopy(checkpoint))


class StatelessAgent(StopAddAgent):
    """An agent that ``on_admit`` and ``on_batch_empty`` leave unchanged: nothing to checkpoint."""

    def checkpoint(self) -> object:
        return None

    def restore(self, checkpoint: object) -> None:
        pass


class AdmitAgent(StatelessAgent):
    """The default: always ADD, in the CHT's order (why: ``docs/design.md``, "The agents")."""

    name = "admit"

    def decide(self, state: AgentState) -> Action:
        return Action.ADD
