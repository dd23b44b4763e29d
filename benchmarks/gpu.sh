#!/usr/bin/env bash
# The unified table on a lent GPU, in one go (killed after GPU_SECONDS, 420 unless
# set, keeping what it measured; benchmarks/gpu.py says the order): the matmul
# ceiling in float32 and bfloat16, every row's step time and model-FLOP
# utilisation on the default MQAR job, then on a 100M-class model in float32
# and bfloat16, Gated DeltaNet at T = 4096 and 16,384, and each default-job
# row's time to 0.99. The first line names the devices: a CUDA install that
# fell back to the CPU shows there. Results (results.json, table.md, log.txt)
# go to $OUT, or to the folder given as the first argument.
#   make setup EXTRAS=cuda12 && bash benchmarks/gpu.sh    # on the GPU machine, in the repository root
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
timeout "${GPU_SECONDS:-420}" python benchmarks/gpu.py --out "$out" "$@" 2>&1 | tee -a "$out/log.txt"
