#!/usr/bin/env bash
# The checks and measurements that need a CUDA GPU, in one run of under 8 minutes on one H100: each step under its
# own time cap (the caps sum to 450 s), its log in $OUT (default: ./gpu_check_out). At the end, in $OUT:
# summary.txt (each step's exit status and seconds), runs.jsonl (one JSON line per training run: env steps and
# seconds to eval success 0.9, SPS, compile seconds), sweep.json, and summary.md (all of it as tables).
#   bash benchmarks/gpu_check.sh
# Steps, most telling first (cap in seconds):
#   cuda           85  the cuda-marked tests (the captured steps against the compiled ones; the envs on CUDA)
#   main           45  the main job on CUDA (rlchain-train algorithm=grpo env=push_cube device=cuda) until eval
#                      success 0.9, eager (a training run stops there: SIGINT, it finishes its iteration and saves)
#   main_compiled  65  the same with trainer.compile=true
#   main_graphs    35  the same with trainer.compile=true trainer.cudagraphs=true
#   ppo_gpu        55  experiment=push_cube_ppo_gpu (4,096 envs, compiled and captured) until eval success 0.9
#   grpo_gpu       55  experiment=push_cube_grpo_gpu until eval success 0.9
#   export         20  rlchain-eval and rlchain-export (onnx) of main_graphs' best.pt (else the first run above that
#                      wrote one); the file run on the CPU
#   sweep          35  8 short jobs on the devices launcher with jobs_per_device 1, 4 and 8: wall seconds, each job's
#                      device from launcher.jsonl (benchmarks/sweep_throughput.py)
#   rsl_rl         25  benchmarks/vs_rsl_rl.py --device cuda at 4,096 envs, 3 iterations, one seed (SPS)
#   env            30  push_cube env steps/s at 4,096 and 65,536 envs: eager, eager captured as one CUDA graph,
#                      compiled and captured, compiled (benchmarks/env_throughput.py; the rows it reached in its cap)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
rm -f "$OUT/runs.jsonl" "$OUT/steps.jsonl" "$OUT/sweep.json"
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
  timeout -k 3 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-14s rc=%-3s %4ss of %ss' "$name" "$rc" "$((SECONDS - start))" "$limit")")
  printf '{"step": "%s", "rc": %d, "seconds": %d, "cap_s": %d}\n' "$name" "$rc" "$((SECONDS - start))" "$limit" \
    >> "$OUT/steps.jsonl"
  echo "== $name: rc=$rc, $((SECONDS - start)) s"
  tail -n 12 "$OUT/$name.log"
}
runs=$(mktemp -d)

# to_bar.py NAME BAR SECONDS RUN_DIR -- COMMAND...: a training run until its eval success first reaches BAR (or
# until SECONDS), then SIGINT; one JSON line of its metrics.jsonl to $OUT/runs.jsonl; exit 0 when BAR was reached.
cat > "$runs/to_bar.py" <<'PY'
import json, os, signal, subprocess, sys, time

name, bar, limit, run, cmd = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[6:]
metrics = os.path.join(run, "metrics.jsonl")


def rows():
    if not os.path.exists(metrics):
        return []
    with open(metrics) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


signal.signal(signal.SIGTERM, lambda *_: None)  # the step's timeout: the run gets it too; report what it did
began = time.perf_counter()
proc = subprocess.Popen(cmd)
seen_s = stopped = None
while proc.poll() is None:
    time.sleep(0.5)
    if stopped is None and any(r.get("eval/success_rate", -1.0) >= bar for r in rows()):
        seen_s = stopped = time.perf_counter() - began
    elif stopped is None and time.perf_counter() - began > limit:
        stopped = limit
    if stopped is not None and proc.returncode is None:
        proc.send_signal(signal.SIGINT)
        proc.wait()
wall_s = time.perf_counter() - began
done = rows()
evals = [r for r in done if "eval/success_rate" in r]
hit = next((r for r in evals if r["eval/success_rate"] >= bar), None)
skip = 2 if len(done) > 2 else 0  # SPS past the first rollouts: the warm-up and capture of the compiled steps
busy_s = sum(r["time/collect_s"] + r["time/update_s"] for r in done[skip:])
samples = done[-1]["global_step"] - (done[skip - 1]["global_step"] if skip else 0) if done else 0
to_hit = done[: done.index(hit) + 1] if hit else []
overrides = [a for a in cmd[1:] if not a.startswith("hydra.run.dir=")]
row = {
    "run": name,
    "overrides": " ".join(overrides),
    "rc": proc.returncode,
    f"steps_to_{bar}": hit and hit["global_step"],
    f"train_s_to_{bar}": hit and round(sum(r["time/collect_s"] + r["time/update_s"] for r in to_hit), 2),
    f"elapsed_s_to_{bar}": hit and round(hit["time/elapsed_s"], 2),
    f"wall_s_to_{bar}": seen_s and round(seen_s, 1),
    "SPS": round(samples / busy_s) if busy_s else None,
    "compile_s": next((round(r["time/compile_s"], 1) for r in done if "time/compile_s" in r), None),
    "collect_s": round(sum(r["time/collect_s"] for r in done[skip:]) / len(done[skip:]), 4) if done else None,
    "update_s": round(sum(r["time/update_s"] for r in done[skip:]) / len(done[skip:]), 4) if done else None,
    "eval_s": round(sum(r.get("time/eval_s", 0.0) for r in done), 1),
    "iterations": len(done),
    "global_step": done[-1]["global_step"] if done else 0,
    "best_success": max((r["eval/success_rate"] for r in evals), default=None),
    "wall_s": round(wall_s, 1),
}
print(json.dumps(row))
with open(os.path.join(os.environ["OUT"], "runs.jsonl"), "a") as f:
    f.write(json.dumps(row) + "\n")
sys.exit(0 if hit else 1)
PY
export OUT
to_bar() {  # to_bar NAME SECONDS OVERRIDES...: rlchain-train with OVERRIDES until eval success 0.9
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" python3 "$runs/to_bar.py" "$name" 0.9 "$((limit - 5))" "$runs/$name" -- \
    rlchain-train "$@" trainer.fresh_eval=false trainer.progress=false "hydra.run.dir=$runs/$name"
}

step cuda 85 python3 -m pytest -q -m cuda -p no:cacheprovider tests
# The main job reaches 0.9 by 1.54M env steps on the CPU (benchmarks/README.md): 40 iterations of 51,200 cover it.
main=(algorithm=grpo env=push_cube device=cuda trainer.iterations=40 trainer.eval_freq=4)
to_bar main 45 "${main[@]}"
to_bar main_compiled 65 "${main[@]}" trainer.compile=true
to_bar main_graphs 35 "${main[@]}" trainer.compile=true trainer.cudagraphs=true
to_bar ppo_gpu 55 experiment=push_cube_ppo_gpu
to_bar grpo_gpu 55 experiment=push_cube_grpo_gpu

cat > "$runs/onnx_cpu.py" <<'PY'
import sys
import numpy as np
import onnxruntime as ort
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
first = session.get_inputs()[0]
obs = np.random.default_rng(0).standard_normal([4, *first.shape[1:]]).astype(np.float32)
action = session.run(None, {first.name: obs})[0]
assert action.shape[0] == 4 and np.isfinite(action).all(), action
print("onnx on the CPU, 4 observations ->", action.tolist())
PY
trained=$runs/main_graphs
for name in main_graphs main_compiled main grpo_gpu ppo_gpu; do
  if [ -f "$runs/$name/checkpoints/best.pt" ]; then trained=$runs/$name; break; fi
done
step export 20 bash -c "echo 'run: $trained' && rlchain-eval $trained num_episodes=256 && \
rlchain-export $trained format=onnx output=$runs/policy.onnx && python3 $runs/onnx_cpu.py $runs/policy.onnx"
step sweep 35 python3 benchmarks/sweep_throughput.py --device cuda --jobs 8 --slots 1 4 8 --no-basic \
  --num-envs 512 --rollout-steps 16 --iterations 1 --json "$OUT/sweep.json" trainer.fresh_eval=false
step rsl_rl 25 python3 benchmarks/vs_rsl_rl.py --device cuda --num-envs 4096 --iterations 3 --seeds 0 --out "$runs/rsl"
step env 30 python3 benchmarks/env_throughput.py --devices cuda --num-envs 4096 65536 \
  --modes eager graphed compiled+graphed compiled --steps 200 --repeats 3

printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
python3 - "$OUT" > "$OUT/summary.md" 2>&1 <<'PY'
import json, os, sys
out = sys.argv[1]


def table(rows, keys):
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def jsonl(name):
    path = os.path.join(out, name)
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


print(open(os.path.join(out, "gpu.txt")).read())
print(table(jsonl("steps.jsonl"), ["step", "rc", "seconds", "cap_s"]))
runs = jsonl("runs.jsonl")
if runs:
    print(table(runs, [k for k in runs[0] if k != "overrides"]))
    print("\n".join(f"- {r['run']}: {r['overrides']}" for r in runs) + "\n")
if os.path.exists(os.path.join(out, "sweep.json")):
    sweep = json.load(open(os.path.join(out, "sweep.json")))
    rows = [
        {
            "slots": d["slots"],
            "wall_s": round(d["wall_s"], 1),
            "SPS": round(d["SPS"]),
            "speedup": round(d["speedup"], 2),
            "jobs": len(d["jobs"]),
            "devices": " ".join(sorted({str(j["device"]) for j in d["jobs"]})),
            "job_wall_s": " ".join(str(round(j["wall_s"] or 0, 1)) for j in d["jobs"]),
        }
        for d in sweep["devices"]
    ]
    print(f"sweep: {sweep['jobs']} jobs x {sweep['env_steps_per_job']:,} env steps, {sweep['cpu_cores']} CPU cores\n")
    print(table(rows, list(rows[0]) if rows else []))
for name in ("env", "rsl_rl"):  # their own tables, as they printed them
    if os.path.exists(os.path.join(out, f"{name}.log")):
        print(f"{name}.log:\n```\n" + "".join(open(os.path.join(out, f"{name}.log")).readlines()[-16:]) + "```\n")
PY
cat "$OUT/summary.md"
