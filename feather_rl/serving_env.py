"""``feather/Serving-v0``: the stop/add decision inside a simulated continuous-batching server."""

from __future__ import annotations

import queue
import threading

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from feather_rl import regimes
from feather_rl.env import OBS_HIGH, OBS_LOW
from feather_rl.simulator import Regime, Server, StepCosts, simulate
from feather_sglang.agents.base import Action, AdmitAgent, AgentState
from feather_sglang.agents.features import OBS_DIM, observe
from feather_sglang.agents.throughput import ThroughputAgent


class _Abandoned(Exception):
    """The episode was reset before it ended: the server's thread unwinds."""


class _Bridge(ThroughputAgent):
    """The server-side agent: hands each decision to the environment and waits for its action.

    It keeps the throughput agent's step-time model, refined from the simulated steps exactly
    as a learned agent refines it in a server, so observations match the server's."""

    name = "rl-bridge"

    def __init__(self, config, server_now, to_env: queue.Queue, from_env: queue.Queue) -> None:
        super().__init__(config)
        self.server_now, self.to_env, self.from_env = server_now, to_env, from_env

    def decide(self, state: AgentState) -> Action:
        if state.batch_size == 0:
            return Action.ADD
        self.to_env.put(("decide", observe(state, self.model), state, self.server_now()))
        action = self.from_env.get()
        if action is None:
            raise _Abandoned
        return Action(action)


class ServingEnv(gym.Env):
    """Admit or stop, candidate by candidate, in a simulated SGLang server running feather.

    Each episode runs one workload through :class:`feather_rl.simulator.Server` (SGLang's
    admission, radix cache, prefill and decode around feather's real planner), in a regime
    drawn per reset (:func:`feather_rl.regimes.sample`) or given by
    ``options={"regime": Regime, "workload_seed": s}``.

    ## Action Space
    ``Discrete(2)``: 0 = STOP (end the pass; the batch runs), 1 = ADD (admit the candidate).

    ## Observation Space
    ``Box(low, high, (12,), float32)``: :mod:`feather_sglang.agents.features`, the vector a
    served policy reads.

    ## Rewards
    Minus the simulated seconds that pass until the next decision, over the seconds the same
    workload takes when every candidate is admitted (``always-add``): an episode's return is
    ``-duration / duration_always_add``, so -1 ties always-add and more is better. Throughput
    is output tokens over duration, so this maximises it.

    ## Starting State
    The workload's first arrivals waiting; a candidate joining an empty batch is admitted
    without asking (STOP would run nothing), as in the server.

    ## Episode End
    Terminated when every request has finished. ``info["result"]`` then holds the run's
    :class:`~feather_rl.simulator.Result` and ``info["reference_s"]`` always-add's duration.
    """

    metadata = {"render_modes": []}

    def __init__(
        self, regime_list: tuple[Regime, ...] | None = None, costs: StepCosts | None = None
    ) -> None:
        self.regime_list = regime_list
        self.costs = costs or StepCosts.load()
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(OBS_LOW, OBS_HIGH, (OBS_DIM,), np.float32)
        self._thread: threading.Thread | None = None
        self._to_env: queue.Queue = queue.Queue()
        self._from_env: queue.Queue = queue.Queue()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._abandon()
        options = options or {}
        if "regime" in options:
            regime = options["regime"]
        elif self.regime_list:
            regime = self.regime_list[int(self.np_random.integers(len(self.regime_list)))]
        else:
            regime = regimes.sample(self.np_random)
        wseed = int(options.get("workload_seed", self.np_random.integers(2**31 - 1)))
        self.regime, self.workload_seed = regime, wseed
        self.reference_s = simulate(regime, wseed, AdmitAgent(None), self.costs).duration_s
        self._to_env, self._from_env = queue.Queue(), queue.Queue()
        server: Server | None = None
        bridge = _Bridge(None, lambda: server.now, self._to_env, self._from_env)
        server = Server(regime, wseed, bridge, self.costs)
        self._start = 0.0
        self._thread = threading.Thread(target=self._serve, args=(server,), daemon=True)
        self._thread.start()
        obs, _, done, info = self._next()
        self._start = 0.0  # the first step's reward covers the time before the first decision too
        if done is not None:
            done = (done[0], -1.0, *done[2:])
        self._pending_done = done  # nothing to decide in this workload: the first step ends it
        return obs, info

    def step(self, action):
        if self._thread is None:
            raise RuntimeError("call reset() before step()")
        if self._pending_done is not None:
            return self._pending_done
        self._from_env.put(int(action))
        obs, reward, done, info = self._next()
        if done is not None:
            self._thread = None
            return done
        return obs, reward, False, False, info

    def close(self) -> None:
        self._abandon()

    # ---- the server's thread -----------------------------------------------------------------
    def _serve(self, server: Server) -> None:
        try:
            self._to_env.put(("done", server.run()))
        except _Abandoned:
            pass
        except BaseException as e:  # noqa: BLE001 - reported in the environment's thread
            self._to_env.put(("error", e))

    def _next(self):
        """(obs, reward, the finished step tuple or None, info) at the next decision or the end."""
        msg = self._to_env.get()
        if msg[0] == "error":
            self._thread = None
            raise msg[1]
        if msg[0] == "decide":
            _, obs, state, now = msg
            reward = -(now - self._start) / self.reference_s
            self._start = now
            return obs, reward, None, {"state": state, "regime": self.regime.name}
        result = msg[1]
        reward = -(result.duration_s - self._start) / self.reference_s
        info = {
            "state": None,
            "regime": self.regime.name,
            "result": result,
            "reference_s": self.reference_s,
        }
        zeros = np.zeros(OBS_DIM, dtype=np.float32)
        return zeros, reward, (zeros, reward, True, False, info), info

    def _abandon(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._from_env.put(None)
            self._thread.join()
        self._thread = None
        self._pending_done = None
