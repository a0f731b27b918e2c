"""Run stop/add agents through the environment, exactly as the server drives them.

The server's agents (``feather_sglang.agents``: static, ucb, qlearning, ppo:PATH, dqn:PATH)
get the same calls as in a server: ``decide`` on each candidate, ``on_admit`` after an ADD,
``on_step`` once per decode step of a dispatched batch (its measured decode time split evenly
over its steps) and ``on_batch_empty`` when the batch has run. Two baseline names exist only here:
``always-add`` (the server's ``admit`` agent) and ``random``.
"""

from __future__ import annotations

import random

from feather_sglang.agents import Action, AdmitAgent, AgentState, StopAddAgent, make_agent
from feather_sglang.config import FeatherConfig

BASELINES = ("always-add", "random")


class RandomAgent(StopAddAgent):
    name = "random"

    def __init__(self, config, seed: int = 0) -> None:
        super().__init__(config)
        self.rng = random.Random(seed)

    def decide(self, state: AgentState) -> Action:
        return Action(self.rng.randrange(2))


def make(spec: str, seed: int = 0) -> StopAddAgent:
    """An agent by its ``--feather-agent`` spec, or a baseline name."""
    if spec == "always-add":
        return AdmitAgent(FeatherConfig())  # the server's admit agent: ADD, always
    if spec == "random":
        return RandomAgent(FeatherConfig(), seed)
    agent = make_agent(FeatherConfig(agent=spec))
    if hasattr(agent, "rng"):  # qlearning's exploration: one stream per evaluation seed
        agent.rng = random.Random(seed)
    return agent


def run_episode(
    env, agent: StopAddAgent, seed: int | None = None, options: dict | None = None
) -> dict:
    """One episode; returns the env's episode summary (mean batch throughput is the return)."""
    _, info = env.reset(seed=seed, options=options)
    agent.on_batch_empty()
    total = 0.0
    while True:
        if info["state"] is None:  # nothing to decide (the reset dispatched everything)
            break
        state = info["state"]
        action = agent.decide(state)
        if action is Action.ADD:
            agent.on_admit(state)
        _, reward, terminated, truncated, info = env.step(int(action))
        total += reward
        for batch in info["dispatched"]:
            steps = max(batch["decode_steps"], 1)
            for _ in range(steps):
                agent.on_step(batch["batch_size"], batch["decode_s"] / steps)
            agent.on_batch_empty()
        if terminated or truncated:
            break
    summary = dict(info.get("episode_summary", {}))
    summary.setdefault("mean_batch_throughput", total)
    return summary
