#!/usr/bin/env bash
# The checks and measurements that need a CUDA GPU, in one run of under 8 minutes: each step under its own
# timeout, its log in $OUT (default: ./gpu_check_out), a summary of each step's exit and time at the end.
#   bash benchmarks/gpu_check.sh
# Steps, most telling first:
#   env       push_cube env steps/s at 4,096 and 65,536 envs: eager, compiled, eager captured as one CUDA graph,
#             compiled and captured (benchmarks/env_throughput.py)
#   cuda      the cuda-marked tests
#   main      the main job on CUDA for 40 iterations (SPS; collect and update seconds per iteration)
#   rsl_rl    benchmarks/vs_rsl_rl.py --device cuda at 4,096 envs, 20 iterations, one seed
#   sweep     an 8-job sweep: Hydra's basic launcher against the devices launcher with jobs_per_device 4
#   export    rlchain-eval and rlchain-export (onnx) of the CUDA-trained main job; the file run on the CPU
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
  >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
summary=()
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-8s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - start))")")
  echo "== $name: rc=$rc, $((SECONDS - start)) s"
  tail -n 12 "$OUT/$name.log"
}
runs=$(mktemp -d)

step env 180 python3 benchmarks/env_throughput.py --devices cuda --num-envs 4096 65536 \
  --modes eager compiled graphed compiled+graphed --steps 200 --repeats 3
step cuda 90 python3 -m pytest -q -m cuda -p no:cacheprovider tests
step main 60 rlchain-train algorithm=grpo env=push_cube device=cuda trainer.iterations=40 trainer.eval_freq=40 \
  trainer.progress=false "hydra.run.dir=$runs/main"
python3 - "$runs/main/metrics.jsonl" > "$OUT/main_sps.txt" 2>&1 <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
late = rows[5:] or rows
mean = lambda key: sum(r.get(key, 0.0) for r in late) / len(late)
print({k: rows[-1].get(k) for k in ("global_step", "charts/SPS", "eval/success_rate")},
      "collect_s", round(mean("time/collect_s"), 4), "update_s", round(mean("time/update_s"), 4))
PY
cat "$OUT/main_sps.txt"
step rsl_rl 100 python3 benchmarks/vs_rsl_rl.py --device cuda --num-envs 4096 --iterations 20 --seeds 0 --out "$runs/rsl"
step sweep 90 python3 benchmarks/sweep_throughput.py --device cuda --jobs 8 --slots 4 --iterations 5 \
  --json "$OUT/sweep.json"
cat > "$runs/onnx_cpu.py" <<'PY'
import sys
import numpy as np
import onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
first = session.get_inputs()[0]
print("onnx on the CPU:", session.run(None, {first.name: np.zeros([1, *first.shape[1:]], np.float32)})[0])
PY
step export 45 bash -c "rlchain-eval $runs/main num_episodes=64 && rlchain-export $runs/main format=onnx \
output=$runs/policy.onnx && python3 $runs/onnx_cpu.py $runs/policy.onnx"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
