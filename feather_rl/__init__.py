"""feather_rl: the stop/add agent learns from real batch throughput.

Importing it registers the Gymnasium environments ``feather/Serving-v0``
(:class:`feather_rl.serving_env.ServingEnv`: a simulated continuous-batching server, the one
agents are trained in) and ``feather/BatchFormation-v0`` (:class:`feather_rl.env.BatchFormationEnv`:
static batches priced by real runs). Executors (real, replay) are in
``feather_rl.executors``; the commands ``feather-record``, ``feather-train``, ``feather-eval`` in
``feather_rl.record``, ``feather_rl.train``, ``feather_rl.evaluate``.
"""

import gymnasium

ENV_ID = "feather/BatchFormation-v0"
SERVING_ENV_ID = "feather/Serving-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="feather_rl.env:BatchFormationEnv")
if SERVING_ENV_ID not in gymnasium.registry:
    gymnasium.register(id=SERVING_ENV_ID, entry_point="feather_rl.serving_env:ServingEnv")

__all__ = ["ENV_ID", "SERVING_ENV_ID"]
