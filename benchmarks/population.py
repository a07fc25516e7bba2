"""One sweep two ways: jobs of the devices launcher (one process per job) against one population per shape.

Usage: ``python benchmarks/population.py [--sweep seeds|grid|both] [--iterations N] [--jobs-per-device 2]
[--out FILE]``

The sweeps:

* ``seeds``: 8 seeds of the main job (``rlchain-train`` with its defaults);
* ``grid``: a 4 x 4 grid of ``algorithm.learning_rate`` and ``algorithm.ent_coef`` of ``experiment=push_cube_ppo``.

Each sweep runs twice, one way after the other, each with the whole machine and the same slots:
``rlchain-train -m ... hydra/launcher=devices hydra.launcher.jobs_per_device=J`` (``J`` jobs at once, the CPU's
cores shared among them), then ``rlchain-train -m ... hydra/launcher=population
hydra.launcher.jobs_per_device=J`` (the sweep split into ``J`` populations, one per slot, trained at once). Reported per way: the wall time of the command,
the aggregate env steps per second (every job's ``global_step`` over that wall time), and each job's final
evaluation success rate (mean and std over the jobs, and job by job). ``--iterations`` shortens every job
(``trainer.iterations``) where the full sweep would take too long; the table says so. Writes a markdown table
to stdout and, with ``--out``, the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEPS = {
    "seeds": ["seed=range(8)"],
    "grid": [
        "experiment=push_cube_ppo",
        "algorithm.learning_rate=3e-4,1e-3,2e-3,4e-3",
        "algorithm.ent_coef=0,0.003,0.01,0.03",
    ],
}


def run(sweep: str, way: str, root: Path, iterations: int | None, jobs_per_device: int) -> dict:
    """Run ``sweep`` one ``way`` in ``root``; its wall time, aggregate env steps/s and each job's result."""
    out = root / f"{sweep}_{way}"
    launcher = [f"hydra/launcher={way}", f"hydra.launcher.jobs_per_device={jobs_per_device}"]
    extra = [f"trainer.iterations={iterations}"] if iterations else []
    args = [*SWEEPS[sweep], *launcher, *extra, "trainer.progress=false", f"hydra.sweep.dir={out}"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rlchain", "-m", *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{sweep} via {way} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    jobs = []
    for summary in sorted(out.glob("*/summary.json"), key=lambda p: int(p.parent.name)):
        data = json.loads(summary.read_text())
        jobs.append(
            {
                "job": int(summary.parent.name),
                "global_step": data["global_step"],
                "success": data["final"].get("eval/success_rate"),
            }
        )
    steps = sum(j["global_step"] for j in jobs)
    return {
        "sweep": sweep,
        "way": way,
        "wall_s": wall,
        "env_steps": steps,
        "env_steps_per_s": steps / wall,
        "jobs": jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", choices=("seeds", "grid", "both"), default="both")
    parser.add_argument("--iterations", type=int, help="trainer.iterations of every job (default: the configs')")
    parser.add_argument("--jobs-per-device", type=int, default=2, help="the devices launcher's jobs at once")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON here")
    args = parser.parse_args()
    sweeps = ("seeds", "grid") if args.sweep == "both" else (args.sweep,)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for sweep in sweeps:
            for way in ("devices", "population"):
                results.append(run(sweep, way, Path(tmp), args.iterations, args.jobs_per_device))
                print(f"{sweep} via {way}: {results[-1]['wall_s']:.0f} s", file=sys.stderr, flush=True)
    budget = f"trainer.iterations={args.iterations}" if args.iterations else "the configs' iterations"
    print(f"{os.cpu_count()} CPU(s); devices launcher: {args.jobs_per_device} jobs at once; {budget}")
    print("| sweep | way | wall s | aggregate env steps/s | ratio | final eval success (mean ± std) |")
    print("|---|---|---:|---:|---:|---|")
    for sweep in sweeps:
        base = next(r for r in results if r["sweep"] == sweep and r["way"] == "devices")
        for r in (x for x in results if x["sweep"] == sweep):
            success = [j["success"] for j in r["jobs"] if j["success"] is not None]
            spread = f"{statistics.mean(success):.3f} ± {statistics.stdev(success):.3f}" if len(success) > 1 else "-"
            ratio = r["env_steps_per_s"] / base["env_steps_per_s"]
            print(
                f"| {sweep} | {r['way']} | {r['wall_s']:.0f} | {r['env_steps_per_s']:,.0f} | {ratio:.2f}x | {spread} |"
            )
    for r in results:
        print(f"{r['sweep']} via {r['way']}: " + ", ".join(f"{j['job']}: {j['success']}" for j in r["jobs"]))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
