#!/usr/bin/env bash
# The prepared GPU check (`make test-gpu`, or `bash bench/gpu_check.sh` on a GPU host), one run,
# well under 10 minutes on one H100/H200, results as JSON in $KVPOOL_RESULTS (default results/):
#   gpu_check.json   the summary: preflight (python, torch, triton, cuda-bindings, device), every
#                    gpu test's outcome (zero page, reserve, device memory, CUDA graph replayed
#                    across a shrink and a grow, pinned tier store), and the two files below
#   gpu.json         VMM map/unmap cold vs reserve, the shared zero page, whole-block vs per-layer
#                    copies and the CPU tier's pinned copies against the copy engine's peak
#   gpu_attention.json  the decode-attention proxy in both layouts on VMM pages
# Needs torch with CUDA, triton, cuda-python (cuda-bindings), pytest, hypothesis: what the lent
# H200 machine's python3 holds (Python 3.12, torch 2.11). No vLLM, no network, nothing installed.
# Only the gpu test files are collected (the others import the server's and operator's packages).
# `--preflight` checks the modules and collects the gpu tests, then stops (CI runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
RESULTS="${KVPOOL_RESULTS:-results}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 KVPOOL_RESULTS="$RESULTS"
mkdir -p "$RESULTS"
mapfile -t GPU_TESTS < <(grep -rl --include='test_*.py' '^pytestmark = pytest.mark.gpu' tests | sort)
PYTEST=("$PYTHON" -m pytest -p no:cacheprovider -o addopts="--strict-markers -ra" "${GPU_TESTS[@]}")

"$PYTHON" -m bench.gpu_summary preflight
if [ "${1:-}" = "--preflight" ]; then
  "${PYTEST[@]}" --collect-only -q
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
status=0
"${PYTEST[@]}" -q --junitxml="$RESULTS/gpu_tests.xml" || status=$?
"$PYTHON" -m bench.gpu_bench || status=$?
"$PYTHON" -m bench.gpu_attention || status=$?
"$PYTHON" -m bench.gpu_summary summary
# The colocation headline on real hardware (needs vLLM and a local model): set KVPOOL_GPU_MODEL.
# Its calibration sets the rates from what one engine serves on this device.
if [ -n "${KVPOOL_GPU_MODEL:-}" ]; then
  "$PYTHON" -m bench.bench_colocation --backend cuda --model "$KVPOOL_GPU_MODEL" \
    --budget "${KVPOOL_GPU_BUDGET:-8589934592}" --offload-bytes "${KVPOOL_GPU_OFFLOAD:-4294967296}"
fi
exit "$status"
