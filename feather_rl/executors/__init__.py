"""Executors: what a dispatched batch's decode throughput is. ``RealExecutor`` runs it on the
real model; ``ReplayExecutor`` looks it up in a recording of the real executor."""

from feather_rl.executors.batch import BatchKey, Measurement
from feather_rl.executors.real import RealExecutor
from feather_rl.executors.replay import DEFAULT_RECORDING, RecordingError, ReplayExecutor

__all__ = [
    "BatchKey",
    "Measurement",
    "RealExecutor",
    "ReplayExecutor",
    "RecordingError",
    "DEFAULT_RECORDING",
]
