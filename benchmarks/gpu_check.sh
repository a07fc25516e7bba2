#!/usr/bin/env bash
# Every check and measurement that needs a CUDA GPU, in one call (benchmarks/gpu_check.py has what runs, its caps
# and its sizes). Everything lands in $OUT (default: ./gpu_check_out); summary.md ends with the one table of every
# number.
#   source .gpu/install.sh && bash benchmarks/gpu_check.sh   # on the GPU machine (see ../shared/gpu/stage.sh)
#   python benchmarks/gpu_check.py --smoke --out /tmp/smoke  # the same plumbing, tiny and eager, on the CPU
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tail -n +2
exec python3 benchmarks/gpu_check.py --out "$OUT"
