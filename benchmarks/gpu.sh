#!/usr/bin/env bash
# The default MQAR job on a lent GPU, in one go (killed at 5 minutes, keeping
# what it measured): matmul ceiling, step time and model-FLOP utilisation of
# softmax attention (plain and fused reads), DeltaNet and Gated DeltaNet, a
# 100M-class softmax model and Gated DeltaNet at T = 4096 and 16,384, then
# each default-job row's time to 0.99. Results (results.json, table.md, log.txt) go to $OUT, or to the
# folder given as the first argument.
#   bash benchmarks/gpu.sh                 # on the GPU machine, in the repository root
#   bash benchmarks/gpu.sh /tmp/x --tiny   # a CPU smoke of the same script
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:?set OUT or give a folder}}"
shift || true
mkdir -p "$out"
if [ -f .venv/bin/activate ]; then source .venv/bin/activate; fi
export WANDB_MODE=disabled XLA_PYTHON_CLIENT_PREALLOCATE=false
unset JAX_COMPILATION_CACHE_DIR  # compile time counts in time to 0.99
python -c 'import jax; print("devices:", jax.devices())' | tee "$out/log.txt"
timeout 290 python benchmarks/gpu.py --out "$out" "$@" 2>&1 | tee -a "$out/log.txt"
