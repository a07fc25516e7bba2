"""Wall time of one sweep of short push_cube PPO jobs: Hydra's basic launcher against the devices launcher.

Every run is a real ``rlchain-train -m`` command over the same ``--jobs``
seeds. The basic launcher runs the jobs one after another in the launching
process (torch's default thread count); the devices launcher runs them on
``--slots`` parallel slots of one device (on the CPU, each slot gets
cores // slots threads), once for each value of ``--slots`` given.

    python benchmarks/sweep_throughput.py                        # CPU: 8 jobs, 2 slots
    python benchmarks/sweep_throughput.py --device cuda --slots 4 --num-envs 4096
    python benchmarks/sweep_throughput.py --device cuda --slots 1 4 8 --no-basic   # jobs_per_device 1, 4 and 8
    python benchmarks/sweep_throughput.py --iterations 2 trainer.fresh_eval=false  # Hydra overrides for every job

Prints each wall time (seconds, including process start-up), the env steps
per second of the whole sweep and the speedup over the basic launcher (over
the first devices sweep with ``--no-basic``); ``--json`` also writes them to a
file, rewritten as each sweep ends, with each job's slot, device and wall
seconds from the devices launcher's ``launcher.jsonl``.
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

from rlchain.run.summary import JobRecord


def run_sweep(launcher_args: list[str], job_args: list[str], seeds: str, cwd: Path) -> float:
    """Run one multirun in ``cwd`` (its sweep directory ``cwd/sweep``) and return its wall time in seconds.

    Raises:
        RuntimeError: the multirun exited non-zero (its stderr tail is included).
    """
    env = {**os.environ, "WANDB_MODE": "disabled"}
    sweep_dir = f"hydra.sweep.dir={cwd / 'sweep'}"
    cmd = [sys.executable, "-m", "rlchain", "-m", f"seed={seeds}", sweep_dir, *launcher_args, *job_args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall


def job_records(sweep_dir: Path) -> list[dict[str, object]]:
    """Each job's slot, device and wall seconds as the devices launcher recorded them (``launcher.jsonl``)."""
    records = JobRecord.read_all(sweep_dir)
    return [
        {"job": r.job, "slot": r.slot, "device": r.device, "status": r.status, "wall_s": r.wall_s}
        for _, r in sorted(records.items())
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=8, help="jobs in the sweep (seeds 0..jobs-1)")
    parser.add_argument(
        "--slots", type=int, nargs="+", default=[2], help="devices launcher: jobs_per_device, one sweep for each"
    )
    parser.add_argument(
        "--basic", action=argparse.BooleanOptionalAction, default=True, help="also run Hydra's basic launcher"
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where every job runs")
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--rollout-steps", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "overrides", nargs="*", help="extra Hydra overrides for every job, e.g. trainer.fresh_eval=false"
    )
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
        *args.overrides,
    ]
    if args.device == "cuda":
        basic = ["hydra/launcher=basic", "device=cuda"]
        devices = ["hydra.launcher.devices=[0]"]
    else:
        basic = ["hydra/launcher=basic", "device=cpu"]
        devices = ["hydra.launcher.devices=[cpu]", "device=cpu"]
    seeds = ",".join(str(i) for i in range(args.jobs))
    steps = args.jobs * args.iterations * args.rollout_steps * args.num_envs
    results: dict[str, object] = {
        "device": args.device,
        "jobs": args.jobs,
        "cpu_cores": len(os.sched_getaffinity(0)),
        "env_steps_per_job": steps // args.jobs,
        "devices": [],
    }

    def write() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=2) + "\n")

    print(
        f"{args.jobs} push_cube PPO jobs x {steps // args.jobs:,} env steps on {args.device} "
        f"({results['cpu_cores']} CPU cores)"
    )
    over = "basic" if args.basic else "the first"
    print(f"{'launcher':<34}{'wall s':>10}{'sweep SPS':>14}  speedup over {over}", flush=True)
    if args.basic:
        with tempfile.TemporaryDirectory() as tmp:
            basic_s = run_sweep(basic, job_args, seeds, Path(tmp))
        results.update(basic_wall_s=basic_s, basic_SPS=steps / basic_s)
        print(f"{'basic (one job at a time)':<34}{basic_s:>10.1f}{steps / basic_s:>14,.0f}  1.00x", flush=True)
        write()
    for slots in args.slots:
        with tempfile.TemporaryDirectory() as tmp:
            wall = run_sweep([*devices, f"hydra.launcher.jobs_per_device={slots}"], job_args, seeds, Path(tmp))
            jobs = job_records(Path(tmp) / "sweep")
        base = results.get("basic_wall_s") or (results["devices"][0]["wall_s"] if results["devices"] else wall)
        results["devices"].append(
            {"slots": slots, "wall_s": wall, "SPS": steps / wall, "speedup": base / wall, "jobs": jobs}
        )
        used = ", ".join(sorted({str(job["device"]) for job in jobs}))
        label = f"devices ({slots} slots)"
        print(f"{label:<34}{wall:>10.1f}{steps / wall:>14,.0f}  {base / wall:.2f}x, jobs on {used}", flush=True)
        write()


if __name__ == "__main__":
    main()
