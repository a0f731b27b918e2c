#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, in under 10 minutes,
#   1. the GPU kernel tests (decode and extend):  pytest -m gpu tests/kernels
#   2. the attention benchmark on GPU: feather's fused Triton kernel vs SGLang's Triton decode
#      kernel vs FlashInfer's cascade attention (where flashinfer imports), with a correctness
#      check of every kernel against the torch reference before it is timed
#      (python -m feather_bench.attention_gpu; table printed, JSON written).
#
#   bash scripts/gpu_check.sh [OUTDIR]      # OUTDIR default: $OUT if set, else results/
#   make gpu-check
#
# Writes OUTDIR/gpu_check.log (everything printed) and OUTDIR/bench_attention_gpu.json.
# Robust on a bare machine: says what is missing (GPU, torch, triton, pytest, sglang,
# flashinfer) and runs what it can; without a GPU it runs the CPU smoke check
# (feather_bench.attention_gpu --smoke under TRITON_INTERPRET=1) and exits 2.
# Python: $PYTHON if set, else the first of .venv/bin/python, python3, python whose torch sees
# a CUDA GPU (the project's .venv holds a CPU torch), else the first that imports torch.
# SGLang's decode kernel: the sglang package where it imports, else its source files
# (feather_bench.attention_gpu --sglang-src; by default .venv/lib/python3*/site-packages/sglang/
# kernels/ops/attention, which can be copied to a GPU machine that lacks sglang).
# Exit status: 0 all passed, 1 a step failed or timed out, 2 no GPU (GPU checks not run).
#
#   3. where sglang imports: a real server with --schedule-policy feather --attention-backend
#      feather and CUDA graphs left at SGLang's default (feather turns them off, with a log
#      line), answering one request (GPU_CHECK_MODEL, default models/tiny-llama).

set -u
cd "$(dirname "$0")/.." || exit 1
OUTDIR=${1:-${OUT:-results}}
mkdir -p "$OUTDIR" || exit 1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# NOTE: seconds per step, kept so the whole script stays under 5 minutes on an H200
# (Triton compiles included): tests 110 (decode and extend) + benchmark 170 (it
# starts no new cell after 125). Measured on an H200 without SGLang: 29 + 59 s, 104 s in all.
TESTS_TIMEOUT=${GPU_CHECK_TESTS_TIMEOUT:-110}
BENCH_TIMEOUT=${GPU_CHECK_BENCH_TIMEOUT:-170}
BENCH_BUDGET=${GPU_CHECK_BENCH_BUDGET:-125}
SERVER_TIMEOUT=${GPU_CHECK_SERVER_TIMEOUT:-240}

pick_python() {
    local cand first_torch=""
    for cand in ${PYTHON:-} .venv/bin/python python3 python; do
        command -v "$cand" >/dev/null 2>&1 || continue
        if "$cand" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
                >/dev/null 2>&1; then
            echo "$cand"; return
        fi
        if [ -z "$first_torch" ] && "$cand" -c "import torch" >/dev/null 2>&1; then
            first_torch=$cand
        fi
    done
    if [ -n "$first_torch" ]; then echo "$first_torch"; return; fi
    for cand in ${PYTHON:-} .venv/bin/python python3 python; do
        command -v "$cand" >/dev/null 2>&1 && { echo "$cand"; return; }
    done
}

step_status() {  # rc -> word
    case "$1" in
        0) echo "PASS" ;;
        124|137) echo "TIMEOUT (rc $1)" ;;
        skip) echo "SKIPPED" ;;
        *) echo "FAIL (rc $1)" ;;
    esac
}

main() {
    local start=$SECONDS
    local rev="? (no git)"
    if rev=$(git rev-parse --short HEAD 2>/dev/null); then
        git diff --quiet HEAD -- 2>/dev/null || rev="$rev + uncommitted changes"
    else
        rev="? (no git checkout)"
    fi
    echo "== feather-sglang GPU check: $(date -u '+%Y-%m-%d %H:%M:%S UTC') on ${HOSTNAME:-?}"
    echo "   repo $rev, output in $OUTDIR"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
            --format=csv,noheader 2>&1 | sed 's/^/   nvidia-smi: /'
    else
        echo "   nvidia-smi: MISSING (no NVIDIA driver tools on PATH)"
    fi

    local PY
    PY=$(pick_python)
    if [ -z "$PY" ]; then
        echo "python: MISSING (no python3 on PATH): nothing can run"
        return 1
    fi
    echo "   python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
    "$PY" -m feather_bench.gpu_check versions

    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
            >/dev/null 2>&1; then
        echo
        echo "== NO NVIDIA GPU visible to torch (or no torch): the GPU kernel tests and the GPU benchmark"
        echo "   cannot run here. Running the CPU smoke check instead (correctness only)."
        if "$PY" -c "import torch, triton" >/dev/null 2>&1; then
            TRITON_INTERPRET=1 timeout 240 "$PY" -m feather_bench.attention_gpu --smoke \
                --json "$OUTDIR/bench_attention_gpu_smoke.json"
            echo "== smoke check: $(step_status $?)"
        else
            echo "   (torch or triton MISSING: smoke check skipped)"
        fi
        echo "== GPU check NOT DONE (no GPU), $((SECONDS - start)) s"
        return 2
    fi

    local rc_tests rc_bench
    echo
    echo "== 1/3 GPU kernel tests: pytest -m gpu tests/kernels (timeout ${TESTS_TIMEOUT} s)"
    if "$PY" -c "import pytest" >/dev/null 2>&1; then
        timeout "$TESTS_TIMEOUT" "$PY" -m pytest -m gpu tests/kernels -q -rs \
            -p no:cacheprovider --junitxml="$OUTDIR/gpu_tests.xml"
        rc_tests=$?
    else
        echo "   pytest MISSING: GPU kernel tests skipped"
        rc_tests=skip
    fi
    echo "== GPU kernel tests: $(step_status "$rc_tests"), $((SECONDS - start)) s so far"

    echo
    echo "== 2/3 attention benchmark on GPU (timeout ${BENCH_TIMEOUT} s)"
    timeout "$BENCH_TIMEOUT" "$PY" -m feather_bench.attention_gpu \
        --json "$OUTDIR/bench_attention_gpu.json" --budget-s "$BENCH_BUDGET"
    rc_bench=$?
    echo "== attention benchmark: $(step_status "$rc_bench") (rc 1 = a kernel did not match the reference)"

    echo
    local rc_server=skip model=${GPU_CHECK_MODEL:-models/tiny-llama}
    echo "== 3/3 a feather server on the GPU, CUDA graphs at SGLang's default (timeout ${SERVER_TIMEOUT} s)"
    if "$PY" -c "import sglang.srt.entrypoints.http_server" >/dev/null 2>&1 && [ -d "$model" ]; then
        timeout "$SERVER_TIMEOUT" "$PY" -m feather_bench.gpu_check server "$model" "$OUTDIR/gpu_server.log"
        rc_server=$?
    else
        echo "   sglang does not import here, or no $model: server check skipped"
    fi
    echo "== feather server: $(step_status "$rc_server")"

    echo
    echo "== GPU check done in $((SECONDS - start)) s: tests $(step_status "$rc_tests"), benchmark $(step_status "$rc_bench"), server $(step_status "$rc_server")"
    [ -f "$OUTDIR/bench_attention_gpu.json" ] && echo "   JSON: $OUTDIR/bench_attention_gpu.json"
    case "$rc_server" in 0|skip) ;; *) return 1 ;; esac
    [ "$rc_tests" = 0 ] && [ "$rc_bench" = 0 ] && return 0
    return 1
}

main "$@" 2>&1 | tee "$OUTDIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
