"""feather_rl: the stop/add agent learns from real batch throughput.

Importing it registers the Gymnasium environment ``feather/BatchFormation-v0``
(:class:`feather_rl.env.BatchFormationEnv`). Executors (real, replay) are in
``feather_rl.executors``; the commands ``feather-record``, ``feather-train``, ``feather-eval`` in
``feather_rl.record``, ``feather_rl.train``, ``feather_rl.evaluate``.
"""

import gymnasium

ENV_ID = "feather/BatchFormation-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="feather_rl.env:BatchFormationEnv")

__all__ = ["ENV_ID"]
