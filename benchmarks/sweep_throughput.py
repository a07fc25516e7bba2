"""Wall time of one sweep of short push_cube PPO jobs: Hydra's basic launcher against the devices launcher.

Both runs are real ``rlchain-train -m`` commands over the same ``--jobs``
seeds. The basic launcher runs the jobs one after another in the launching
process (torch's default thread count); the devices launcher runs them on
``--slots`` parallel slots of one device (on the CPU, each slot gets
cores // slots threads).

    python benchmarks/sweep_throughput.py                        # CPU: 8 jobs, 2 slots
    python benchmarks/sweep_throughput.py --device cuda --slots 4 --num-envs 4096

Prints both wall times (seconds, including process start-up), the env steps
per second of the whole sweep and their ratio; ``--json`` also writes them
to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_sweep(launcher_args: list[str], job_args: list[str], seeds: str, cwd: Path) -> float:
    """Run one multirun in ``cwd`` and return its wall time in seconds.

    Raises:
        RuntimeError: the multirun exited non-zero (its stderr tail is included).
    """
    env = {**os.environ, "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "rlchain", "-m", f"seed={seeds}", *launcher_args, *job_args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=8, help="jobs in the sweep (seeds 0..jobs-1)")
    parser.add_argument("--slots", type=int, default=2, help="devices launcher: jobs_per_device")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where every job runs")
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--rollout-steps", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    job_args = [
        f"env.num_envs={args.num_envs}",
        f"trainer.rollout_steps={args.rollout_steps}",
        f"trainer.iterations={args.iterations}",
        f"trainer.eval_freq={args.iterations}",
        "trainer.num_eval_envs=64",
        "trainer.num_eval_episodes=64",
        "trainer.progress=false",
        f"algorithm.batch_size={min(2048, args.num_envs * args.rollout_steps)}",
    ]
    if args.device == "cuda":
        basic = ["hydra/launcher=basic", "device=cuda"]
        devices = ["hydra.launcher.devices=[0]", f"hydra.launcher.jobs_per_device={args.slots}"]
    else:
        basic = ["hydra/launcher=basic", "device=cpu"]
        devices = ["hydra.launcher.devices=[cpu]", f"hydra.launcher.jobs_per_device={args.slots}", "device=cpu"]
    seeds = ",".join(str(i) for i in range(args.jobs))
    steps = args.jobs * args.iterations * args.rollout_steps * args.num_envs

    with tempfile.TemporaryDirectory() as tmp:
        basic_s = run_sweep(basic, job_args, seeds, Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        devices_s = run_sweep(devices, job_args, seeds, Path(tmp))

    results = {
        "device": args.device,
        "jobs": args.jobs,
        "slots": args.slots,
        "cpu_cores": len(os.sched_getaffinity(0)),
        "env_steps_per_job": steps // args.jobs,
        "basic_wall_s": basic_s,
        "devices_wall_s": devices_s,
        "basic_SPS": steps / basic_s,
        "devices_SPS": steps / devices_s,
        "speedup": basic_s / devices_s,
    }
    print(
        f"{args.jobs} push_cube PPO jobs x {steps // args.jobs:,} env steps on {args.device} "
        f"({results['cpu_cores']} CPU cores)"
    )
    print(f"{'launcher':<34}{'wall s':>10}{'sweep SPS':>14}")
    print(f"{'basic (one job at a time)':<34}{basic_s:>10.1f}{results['basic_SPS']:>14,.0f}")
    print(f"{f'devices ({args.slots} slots)':<34}{devices_s:>10.1f}{results['devices_SPS']:>14,.0f}")
    print(f"speedup (basic / devices): {results['speedup']:.2f}x")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
