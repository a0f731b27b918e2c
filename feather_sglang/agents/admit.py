"""The default stop/add agent: admit every candidate, in the CHT's order.

The CHT offers candidates in the order that keeps the batch's shared prefix deepest, so
admitting them in that order already forms the most homogeneous batch the server can run, and
SGLang's own admission (its ``PrefillAdder``) stops exactly where the KV pool, the batch cap or
the prefill budget does; what it refuses goes back to waiting. Leaving room unused does not
make the batch faster: a decode step's time is affine in the batch size and the tokens it
attends to (measured on this project's servers), so a request served now, in a bigger batch,
shares the step's fixed cost, and the attention it adds is work it would do later anyway. A
STOP from the agent on memory grounds costs throughput too: the CHT sees KV in whole chunks
and without the output tokens SGLang reserves, so it stops early. ``docs/rl.md`` has the
measurements, in the simulated server and in real ones.
"""

from __future__ import annotations

from feather_sglang.agents.base import Action, AgentState, StopAddAgent


class AdmitAgent(StopAddAgent):
    """Always ADD (see the module docstring)."""

    name = "admit"

    def decide(self, state: AgentState) -> Action:
        return Action.ADD

    def checkpoint(self) -> object:  # stateless
        return None

    def restore(self, checkpoint: object) -> None:
        pass
