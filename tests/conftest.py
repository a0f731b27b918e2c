from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("FEATHER_MODELS_DIR") or REPO / "models")
TINY_MODEL = MODELS / "tiny-llama"
SMOLLM2_MODEL = MODELS / "SmolLM2-135M-Instruct"


def _require(path: Path) -> Path:
    if not (path / "config.json").exists():
        pytest.fail(
            f"{path} is missing: run `make setup` (python -m feather_bench.setup_models) first"
        )
    return path


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return _require(TINY_MODEL)


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    return _require(SMOLLM2_MODEL)
