"""Where the tools find models and write results, never inferred from the repository's layout.

Models: the directory named by ``FEATHER_MODELS_DIR``, by default ``models`` in the current
directory (``make setup`` fills it there). Results: ``results`` in the current directory, unless
a tool's own argument says otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

MODELS_ENV = "FEATHER_MODELS_DIR"
DEFAULT_MODEL = "SmolLM2-135M-Instruct"
RESULTS_DIR = Path("results")


def models_dir() -> Path:
    return Path(os.environ.get(MODELS_ENV) or "models")


def model_dir(name: str = DEFAULT_MODEL) -> Path:
    return models_dir() / name
