#!/usr/bin/env bash
# Creates .venv-zoo/: rl-zoo3 beside feather_rl, apart from .venv (rl-zoo3's dependencies
# conflict with the pinned serving set; docs/rl.md). The environment needs neither SGLang nor
# transformers: torch (CPU build), rl-zoo3 and what feather_rl imports.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-zoo
[ -x $VENV/bin/python ] || $PY -m venv $VENV
PIP="$VENV/bin/python -m pip --disable-pip-version-check"
source scripts/torch_index.sh
pins='^(--extra-index-url|torch|numpy|xxhash|tqdm|matplotlib)[ =]'
$PIP install -q -r <(lock feather_cpu/requirements-cpu.txt | grep -E "$pins") "rl_zoo3==2.9.2" \
  2> >(grep -v "^WARNING: Location" >&2)
$PIP install -q --no-deps --no-build-isolation -e .
echo "setup: $VENV ready ($($VENV/bin/python -c 'import rl_zoo3, stable_baselines3 as sb3; print("rl_zoo3", rl_zoo3.__version__, "stable-baselines3", sb3.__version__)'))"
