"""Every check and measurement that needs a CUDA GPU, in one call, each step sized to its cap.

Usage::

    bash benchmarks/gpu_check.sh                 # the same: python benchmarks/gpu_check.py --out "$OUT"
    python benchmarks/gpu_check.py --smoke --out DIR   # the plumbing on the CPU, each step tiny and eager

Two phases, so that the timed runs compile nothing from cold and still report what a cold compile costs:

1. **warm** (its steps at once, one cap): the ``cuda``-marked tests; and one iteration of every compiled
   configuration the timed runs use (the main job compiled, both GPU presets, rlchain's side of the rsl_rl
   comparison, the env throughput's compiled steps), each compiling from nothing into one shared inductor cache
   (``$OUT/inductor_cache``). Their ``compile_s`` are the cold compile times (with the others compiling beside
   them: each gets ``TORCHINDUCTOR_COMPILE_THREADS`` of the cores).
2. **timed** (one at a time, each under its own cap, nothing else running): the main job until eval success 0.9
   eager, compiled and compiled + CUDA graphs; both GPU presets until 0.9; rlchain's PPO against rsl_rl at
   4,096 envs; push_cube env steps/s; the devices-launcher sweep at 1, 4 and 8 jobs per device; ``rlchain-eval``
   of the best checkpoint and its ONNX export run on the CPU.

A training run until a bar stops with SIGINT once its ``metrics.jsonl`` shows eval success >= 0.9 (it finishes
its iteration and saves), or at its cap. What is written to ``--out``: one log per step, ``steps.jsonl`` (each
step's exit status, seconds and cap), ``runs.jsonl`` (one line per training run), ``sweep.json``, ``env.json``,
``rsl_rl.json`` and ``summary.md``, whose last section is the one table of every number. The caps (seconds)
sum to 545: with the install, one call stays under the device's 10 minutes even where every step runs to its cap;
on a healthy H100 or H200 the whole check is meant to take under 8 minutes (the sizes behind each cap are in
``STEPS``' comments; measured on a GPU, the real times are in ``summary.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
BAR = 0.9
#: The table's column of compile seconds: the timed run's (from the warm cache) and the warm run's (cold).
COMPILE = "compile s (warm cache; cold)"


@dataclass
class Step:
    """One command of the check: its name, cap (s) and command. ``run_dir``: a training run's directory (a line of
    ``runs.jsonl`` at its end); ``bar``: it is stopped once its eval success reaches this."""

    name: str
    cap: float
    command: list[str]
    run_dir: Path | None = None
    bar: float | None = None
    environ: dict[str, str] = field(default_factory=dict)


def train_command(overrides: dict[str, object], run_dir: Path) -> list[str]:
    """``rlchain-train`` with ``overrides`` (``key: value``; ``value`` None for a bare group choice) into ``run_dir``:
    no progress bar, no fresh evaluation at the end."""
    train = shutil.which("rlchain-train")
    head = [train] if train else [sys.executable, "-m", "rlchain"]
    settings = {**overrides, "trainer.fresh_eval": "false", "trainer.progress": "false", "hydra.run.dir": run_dir}
    return [*head, *(f"{key}={value}" for key, value in settings.items())]


def plan(out: Path, smoke: bool) -> tuple[list[Step], list[Step]]:
    """The warm steps (run at once) and the timed steps (one at a time)."""
    runs = out / "runs"
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(out / "inductor_cache"), "TRITON_CACHE_DIR": str(out / "triton_cache")}
    warm_env = {**cache, "TORCHINDUCTOR_COMPILE_THREADS": "3"}  # six warm steps share the machine's cores
    py = sys.executable
    # The main job reaches 0.9 by about 1.5M env steps (benchmarks/README.md): 40 iterations of 51,200 cover it.
    main = {"algorithm": "grpo", "env": "push_cube", "device": "cuda", "trainer.iterations": 40, "trainer.eval_freq": 4}
    ppo_gpu, grpo_gpu = {"experiment": "push_cube_ppo_gpu"}, {"experiment": "push_cube_grpo_gpu"}
    compiled = {"trainer.compile": "true"}
    graphs = {**compiled, "trainer.cudagraphs": "true"}
    sizes, rsl_envs, rsl_iterations, warm_modes = ["4096", "65536"], 4096, 10, "compiled"
    env_modes, env_steps = ["eager", "graphed", "compiled+graphed", "compiled"], ["--steps", "200", "--repeats", "3"]
    sweep, slots, tests = ["--num-envs", "512", "--rollout-steps", "16"], ["1", "4", "8"], ["tests"]
    device = "cuda"
    if smoke:  # the same steps on the CPU, tiny and eager: the plumbing, in a minute or two
        device = "cpu"
        compiled = graphs = {"trainer.compile": "false", "trainer.cudagraphs": "false"}
        tiny = {"device": "cpu", "env.num_envs": 16, "trainer.iterations": 2, "trainer.eval_freq": 1, **graphs}
        tiny |= {"trainer.num_eval_envs": 8, "trainer.num_eval_episodes": 8}
        main |= {**tiny, "trainer.rollout_steps": 100, "algorithm.batch_size": 400}
        ppo_gpu |= {**tiny, "algorithm.batch_size": 96}
        grpo_gpu |= {**tiny, "algorithm.batch_size": 400}
        sizes, rsl_envs, rsl_iterations, warm_modes = ["64"], 64, 2, "eager"
        env_modes, env_steps = ["eager"], ["--steps", "5", "--repeats", "1"]
        sweep, slots = ["--num-envs", "16", "--rollout-steps", "8"], ["1", "2"]
        tests = ["tests/core/test_captured_steps.py"]  # its cuda tests skip here
    one_iteration = {"trainer.iterations": 1, "trainer.eval_freq": 1}
    # rlchain's side of the rsl_rl comparison, composed as benchmarks/vs_rsl_rl.py composes it
    rsl_side = {"experiment": "push_cube_ppo", "device": device, "env.num_envs": rsl_envs, **graphs}
    rsl = ["--num-envs", str(rsl_envs), "--iterations", str(rsl_iterations), "--device", device, "--seeds", "0"]
    rsl += ["--inductor-cache", cache["TORCHINDUCTOR_CACHE_DIR"]] + ([] if smoke else ["--cudagraphs"])

    def warm_run(name: str, overrides: dict[str, object]) -> Step:
        return Step(name, 150, train_command({**overrides, **one_iteration}, runs / name), runs / name, None, warm_env)

    warm = [
        Step(
            "cuda_tests",
            150,
            [py, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *tests],
            environ=warm_env,
        ),
        warm_run("warm_main", {**main, **graphs}),
        warm_run("warm_ppo_gpu", ppo_gpu),
        warm_run("warm_grpo_gpu", grpo_gpu),
        warm_run("warm_rsl_rl", rsl_side),
        Step(
            "warm_env",
            150,
            [py, str(BENCHMARKS / "env_throughput.py"), "--devices", device, "--num-envs", *sizes]
            + ["--modes", warm_modes, "--steps", "1", "--repeats", "1"],
            environ=warm_env,
        ),
    ]
    to_bar = [  # name, cap, overrides; eager at 43.8k env steps/s on an H200 (1.5M steps in ~35 s + 10 evaluations)
        ("main", 80, main),
        ("main_compiled", 55, {**main, **compiled}),  # compiles from the warm cache, then trains
        ("main_graphs", 45, {**main, **graphs}),
        ("ppo_gpu", 40, ppo_gpu),  # 1.77M env steps to 0.9 at >= 2M env steps/s: compile, then seconds
        ("grpo_gpu", 40, grpo_gpu),
    ]
    bar = 0.0 if smoke else BAR  # the smoke's runs stop at their first evaluation, as a run that reached 0.9 does
    timed = [Step(name, cap, train_command(o, runs / name), runs / name, bar, dict(cache)) for name, cap, o in to_bar]
    timed += [
        Step(
            "rsl_rl",
            50,  # 10 iterations of 131,072 env steps on each side, one after the other, and an evaluation each
            [py, str(BENCHMARKS / "vs_rsl_rl.py"), *rsl, "--out", str(runs / "rsl_rl")],
            environ=dict(cache),
        ),
        Step(
            "env",
            40,  # two sizes, four modes, 3 x 200 steps each, the compiled steps from the warm cache
            [py, str(BENCHMARKS / "env_throughput.py"), "--devices", device, "--num-envs", *sizes, "--modes"]
            + [*env_modes, *env_steps, "--json", str(out / "env.json")],
            environ=dict(cache),
        ),
        Step(
            "sweep",
            55,  # 8 jobs of 8,192 env steps at 1, 4 and 8 per device: 32 s with 1 (an H200), less with more
            [py, str(BENCHMARKS / "sweep_throughput.py"), "--device", device, "--jobs", "8", "--slots", *slots]
            + [
                "--no-basic",
                *sweep,
                "--iterations",
                "1",
                "--json",
                str(out / "sweep.json"),
                "trainer.fresh_eval=false",
            ],
        ),
        Step("export", 35, [py, str(BENCHMARKS / "gpu_check.py"), "--export", str(runs), "--out", str(out)]),
    ]
    return warm, timed


def run_step(step: Step, out: Path) -> subprocess.Popen:
    """Start ``step``'s command (its output to ``out/<name>.log``), in a process group of its own."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled", **step.environ)
    log = (out / f"{step.name}.log").open("w")
    proc = subprocess.Popen(
        step.command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
    )
    log.close()
    proc.began = time.perf_counter()  # type: ignore[attr-defined]
    proc.seen = None  # type: ignore[attr-defined]
    return proc


def metrics(run_dir: Path) -> list[dict]:
    """The whole rows of ``run_dir/metrics.jsonl`` so far."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines(keepends=True) if line.endswith("\n")]


def supervise(steps: list[Step], procs: list[subprocess.Popen], out: Path) -> None:
    """Wait for ``procs``: a training run gets SIGINT once its eval success reaches ``BAR``, every step SIGINT at its
    cap and SIGKILL 10 s later; record each step in ``steps.jsonl`` (and each training run in ``runs.jsonl``)."""
    live = dict(zip(range(len(steps)), procs))
    stopped: dict[int, float] = {}
    while live:
        time.sleep(0.5)
        now = time.perf_counter()
        for i, proc in list(live.items()):
            step = steps[i]
            elapsed = now - proc.began  # type: ignore[attr-defined]
            if proc.poll() is not None:
                record(step, proc, elapsed, out)
                del live[i]
                continue
            reached = step.bar is not None and any(
                r.get("eval/success_rate", -1) >= step.bar for r in metrics(step.run_dir)
            )
            if i not in stopped and (reached or elapsed > step.cap):
                if reached:
                    proc.seen = elapsed  # type: ignore[attr-defined]
                stopped[i] = now
                os.killpg(proc.pid, signal.SIGINT)
            elif i in stopped and now - stopped[i] > 10:
                os.killpg(proc.pid, signal.SIGKILL)


def record(step: Step, proc: subprocess.Popen, seconds: float, out: Path) -> None:
    """One line of ``steps.jsonl``, and of ``runs.jsonl`` for a training run (its rows summed as the table shows)."""
    cut = seconds > step.cap and proc.seen is None  # type: ignore[attr-defined]
    line = {"step": step.name, "rc": proc.returncode, "seconds": round(seconds, 1), "cap_s": step.cap, "cut": cut}
    with (out / "steps.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(
        f"== {step.name}: rc={proc.returncode}, {seconds:.0f} s of {step.cap:.0f}{' (cut at its cap)' if cut else ''}"
    )
    print("".join((out / f"{step.name}.log").read_text(errors="replace").splitlines(keepends=True)[-6:]), flush=True)
    if step.run_dir is None:
        return
    rows = metrics(step.run_dir)
    evals = [r for r in rows if "eval/success_rate" in r]
    hit = next((r for r in evals if step.bar is not None and r["eval/success_rate"] >= step.bar), None)
    to_hit = rows[: rows.index(hit) + 1] if hit else []
    skip = 2 if len(rows) > 2 else 0  # SPS past the first iterations: the CUDA graphs are recorded in the first
    busy = sum(r["time/collect_s"] + r["time/update_s"] for r in rows[skip:])
    samples = rows[-1]["global_step"] - (rows[skip - 1]["global_step"] if skip else 0) if rows else 0
    run = {
        "run": step.name,
        "overrides": " ".join(a for a in step.command if "=" in a and not a.startswith("hydra.run.dir")),
        "bar": step.bar,
        "steps_to_bar": hit and hit["global_step"],
        "train_s_to_bar": hit and round(sum(r["time/collect_s"] + r["time/update_s"] for r in to_hit), 2),
        "wall_s_to_bar": proc.seen and round(proc.seen, 1),  # type: ignore[attr-defined]
        "SPS": round(samples / busy) if busy else None,
        "compile_s": next((round(r["time/compile_s"], 1) for r in rows if "time/compile_s" in r), None),
        "iterations": len(rows),
        "best_success": max((r["eval/success_rate"] for r in evals), default=None),
        "wall_s": round(seconds, 1),
    }
    with (out / "runs.jsonl").open("a") as f:
        f.write(json.dumps(run) + "\n")


def export(runs: Path, out: Path) -> None:
    """``rlchain-eval`` of the best checkpoint of the first timed run that wrote one, ``rlchain-export`` of it to
    ONNX, and the ONNX file run on the CPU with onnxruntime; ``out/export.json``."""
    import numpy as np
    import onnxruntime as ort

    names = ("main_graphs", "main_compiled", "main", "grpo_gpu", "ppo_gpu")
    trained = next((runs / n for n in names if (runs / n / "checkpoints" / "best.pt").is_file()), None)
    if trained is None:
        raise SystemExit("no timed run wrote checkpoints/best.pt")
    began = time.perf_counter()
    evaluation = subprocess.run(
        [shutil.which("rlchain-eval") or "rlchain-eval", str(trained), "num_episodes=256"],
        capture_output=True,
        text=True,
    )
    eval_s = time.perf_counter() - began
    print(evaluation.stdout[-2000:], evaluation.stderr[-2000:])
    onnx = runs / "policy.onnx"
    exported = subprocess.run(
        [shutil.which("rlchain-export") or "rlchain-export", str(trained), "format=onnx", f"output={onnx}"],
        capture_output=True,
        text=True,
    )
    print(exported.stdout[-1000:], exported.stderr[-2000:])
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    first = session.get_inputs()[0]
    obs = np.random.default_rng(0).standard_normal([4, *first.shape[1:]]).astype(np.float32)
    action = session.run(None, {first.name: obs})[0]
    ok = (
        evaluation.returncode == 0
        and exported.returncode == 0
        and action.shape[0] == 4
        and bool(np.isfinite(action).all())
    )
    report = trained / "checkpoints" / "eval.json"
    success = json.loads(report.read_text())["metrics"]["success_rate"]["mean"] if report.exists() else None
    result = {
        "run": trained.name,
        "eval_rc": evaluation.returncode,
        "eval_s": round(eval_s, 1),
        "eval_success": success,
        "export_rc": exported.returncode,
        "onnx_cpu_actions": np.asarray(action).round(4).tolist(),
        "ok": ok,
    }
    (out / "export.json").write_text(json.dumps(result) + "\n")
    print(json.dumps(result))
    raise SystemExit(0 if ok else 1)


def summary(out: Path) -> str:
    """``summary.md``: the machine, each step, and the one table of every number."""

    def jsonl(name: str) -> list[dict]:
        path = out / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def table(rows: list[dict], keys: list[str]) -> str:
        lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k in keys) + " |" for r in rows]
        return "\n".join(lines) + "\n"

    def load(name: str) -> dict | None:
        path = out / name
        return json.loads(path.read_text()) if path.exists() else None

    text = [(out / "gpu.txt").read_text() if (out / "gpu.txt").exists() else "", "## Steps\n"]
    text.append(table(jsonl("steps.jsonl"), ["step", "rc", "seconds", "cap_s", "cut"]))
    runs = {r["run"]: r for r in jsonl("runs.jsonl")}
    rows: list[dict] = []
    warmed = {"main": "warm_main", "main_compiled": "warm_main", "main_graphs": "warm_main"}
    for name in ("main", "main_compiled", "main_graphs", "ppo_gpu", "grpo_gpu"):
        r, cold = runs.get(name, {}), runs.get(warmed.get(name, f"warm_{name}"), {}).get("compile_s")
        rows.append(
            {
                "what": f"{name} to eval success {r.get('bar', BAR)}",
                "env steps": r.get("steps_to_bar") or "not reached",
                "train s": r.get("train_s_to_bar"),
                "wall s": r.get("wall_s_to_bar"),
                "SPS": r.get("SPS"),
                COMPILE: f"{r['compile_s']}; {cold}" if r.get("compile_s") is not None else None,
            }
        )
    rsl = load("runs/rsl_rl/results.json")
    if rsl is not None:
        mean = rsl["mean"]
        rows.append(
            {
                "what": f"PPO at {rsl['num_envs']} envs: rlchain (compiled, graphs) / rsl_rl",
                "SPS": f"{mean['rlchain']['SPS_without_compile']:,.0f} / {mean['rsl_rl']['SPS']:,.0f} = "
                f"{mean['ratio_rlchain_over_rsl_rl']['SPS_without_compile']:.2f}x",
            }
        )
    for row in (load("env.json") or {}).get("rows", []):
        rows.append(
            {"what": f"push_cube env step, {row['mode']}, {row['num_envs']:,} envs", "SPS": f"{row['sps']:,.0f}"}
        )
    sweep = load("sweep.json")
    for d in (sweep or {}).get("devices", []):
        devices = " ".join(str(j["device"]) for j in d["jobs"])
        rows.append(
            {
                "what": f"sweep of {sweep['jobs']} jobs, {d['slots']} per device (each job's device: {devices})",
                "wall s": round(d["wall_s"], 1),
                "SPS": round(d["SPS"]),
            }
        )
    exported = load("export.json")
    if exported is not None:
        rows.append(
            {
                "what": f"rlchain-eval of {exported['run']}, 256 episodes; ONNX export run on the CPU",
                "wall s": exported["eval_s"],
                "env steps": f"eval success {exported['eval_success']}",
                "SPS": "ONNX ok" if exported["ok"] else "failed",
            }
        )
    text += ["## Every number\n", table(rows, ["what", "env steps", "train s", "wall s", "SPS", COMPILE])]
    return "\n".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    parser.add_argument("--smoke", action="store_true", help="every step tiny, eager, on the CPU: the plumbing")
    parser.add_argument("--export", type=Path, default=None, help=argparse.SUPPRESS)  # the export step itself
    args = parser.parse_args()
    out = args.out.resolve()
    if args.export is not None:
        export(args.export, out)
        return
    if (out / "gpu.txt").exists():  # an earlier check's output
        shutil.rmtree(out)
    elif out.exists() and any(out.iterdir()):
        raise SystemExit(f"gpu_check: {out} holds files of its own: choose an empty --out")
    (out / "runs").mkdir(parents=True)
    import torch

    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name() if cuda else "no CUDA device"
    (out / "gpu.txt").write_text(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}\n")
    print((out / "gpu.txt").read_text(), flush=True)
    if not cuda and not args.smoke:
        raise SystemExit("gpu_check: no CUDA device here (--smoke runs its plumbing on the CPU)")
    began = time.perf_counter()
    warm, timed = plan(out, args.smoke)
    supervise(warm, [run_step(step, out) for step in warm], out)
    for step in timed:
        supervise([step], [run_step(step, out)], out)
    text = summary(out)
    (out / "summary.md").write_text(text)
    print(text)
    print(f"gpu_check: {time.perf_counter() - began:.0f} s; {out / 'summary.md'}")


if __name__ == "__main__":
    main()
