#!/usr/bin/env bash
# The prepared GPU check (`make test-gpu`, or `bash bench/gpu_check.sh` on a GPU host with torch
# and cuda-python): the `gpu` tests, then the GPU micro-benchmarks -> results/gpu.json.
# Needs no vLLM. Budget: well under 5 minutes on one H100/H200.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "${KVPOOL_RESULTS:-results}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PYTHON" -m pytest -m gpu -p no:cacheprovider -o addopts="--strict-markers -ra" tests/ -q
"$PYTHON" -m bench.gpu_bench
"$PYTHON" -m bench.gpu_attention
# The colocation headline on real hardware (needs vLLM and a local model): set KVPOOL_GPU_MODEL.
if [ -n "${KVPOOL_GPU_MODEL:-}" ]; then
  "$PYTHON" -m bench.bench_colocation --backend cuda --model "$KVPOOL_GPU_MODEL" \
    --budget "${KVPOOL_GPU_BUDGET:-8589934592}" --offload-bytes "${KVPOOL_GPU_OFFLOAD:-4294967296}" \
    --heavy-rate 20 --prompt-tokens 1000 3000 --max-tokens 64 256
fi
