"""Replays recorded measurements of the real executor: no model runs, no invented formula.

A recording (``feather-record``) is JSON: ``{"provenance": {...}, "measurements": [...]}``, each
measurement a :class:`Measurement` of a real batch. A lookup takes the measurements of the same
attention backend and returns the throughput of the recorded batch with the same
:class:`BatchKey` (the mean if recorded more than once) or, where none is, the inverse-distance
weighted mean of the ``k`` nearest recorded keys (``BatchKey.coords``): always a convex
combination of real measurements, never outside their range.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from feather_rl.executors.batch import BatchKey, Measurement

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_RECORDING = DATA_DIR / "replay_tiny-llama.json"
# NOTE: 4 neighbours bracket a query in batch size and in sharing on the recorded grid.
NEAREST_K = 4


class RecordingError(ValueError):
    """A recording file is missing or malformed."""


class ReplayExecutor:
    """Throughput of a batch from a recording of the real executor (see module docstring)."""

    def __init__(
        self,
        recording: str | Path = DEFAULT_RECORDING,
        backend: str | None = None,
        k: int = NEAREST_K,
    ):
        path = Path(recording)
        if not path.is_file():
            raise RecordingError(f"recording {path} does not exist; make one with feather-record")
        try:
            data = json.loads(path.read_text())
            measurements = [Measurement.from_json(m) for m in data["measurements"]]
            self.provenance = data["provenance"]
        except (ValueError, KeyError, TypeError) as e:
            raise RecordingError(f"recording {path} is malformed: {e!r}") from None
        backends = sorted({m.backend for m in measurements})
        self.backend = backend or (backends[0] if len(backends) == 1 else "feather")
        self.measurements = [m for m in measurements if m.backend == self.backend]
        if not self.measurements:
            raise RecordingError(
                f"recording {path} has no measurements for backend {self.backend!r} "
                f"(it has {', '.join(backends) or 'none'})"
            )
        self.path = path
        self.k = k
        self.output_len = self.measurements[0].output_len
        self._coords = [m.key.coords() for m in self.measurements]

    def throughput(self, key: BatchKey) -> float:
        """Decode tokens/s of a batch with ``key``, from the recorded measurements."""
        exact = [m.tokens_per_s for m in self.measurements if m.key == key]
        if exact:
            return sum(exact) / len(exact)
        q = key.coords()
        dists = sorted(
            (math.dist(q, c), m.tokens_per_s) for c, m in zip(self._coords, self.measurements)
        )
        nearest = dists[: self.k]
        if nearest[0][0] < 1e-9:
            same = [t for d, t in nearest if d < 1e-9]
            return sum(same) / len(same)
        weights = [1.0 / d**2 for d, _ in nearest]
        return sum(w * t for w, (_, t) in zip(weights, nearest)) / sum(weights)

    def measure(self, prompts, output_len: int) -> Measurement:
        key = BatchKey.of([tuple(p) for p in prompts])
        tokens_per_s = self.throughput(key)
        decode_tokens = key.batch_size * (output_len - 1)
        return Measurement(
            key, decode_tokens, decode_tokens / tokens_per_s, output_len, self.backend
        )

    def describe(self) -> dict:
        return {
            "recording": str(self.path),
            "backend": self.backend,
            "measurements": len(self.measurements),
            "recorded": self.provenance,
        }

    def close(self) -> None:
        pass
