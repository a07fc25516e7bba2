#!/usr/bin/env bash
# Every check and measurement that needs a CUDA GPU, in one call (benchmarks/gpu_check.py has what runs, its caps
# and its sizes). Everything lands in $OUT (default: ./gpu_check_out); summary.md ends with the one table of every
# number.
#   source .gpu/install.sh && bash benchmarks/gpu_check.sh   # on the GPU machine (see ../shared/gpu/stage.sh)
#   python benchmarks/gpu_check.py --smoke --out /tmp/smoke  # the same plumbing, tiny and eager, on the CPU
#   source .gpu/install.sh && bash benchmarks/gpu_check.sh population   # a second call: populations of 16 and 64
#       members of the main job, and of 64 compiled and captured, against one run (benchmarks/population.py
#       --members), into $OUT/population.md
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tail -n +2
if [ "${1:-}" = population ]; then
    mkdir -p "$OUT"
    python3 benchmarks/population.py --members 16 64 --compiled 64 --captured 64 --device cuda --iterations 3 \
        --out "$OUT/population.json" 2>&1 | tee "$OUT/population.md"
    exit "${PIPESTATUS[0]}"
fi
exec python3 benchmarks/gpu_check.py --out "$OUT"
