"""The Optuna search of ``hparams_search=ppo_push_cube_optuna`` with and without pruning, on the same slots.

Both runs are real ``rlchain-train -m`` commands with the preset's search
space, sampler and seed and ``--trials`` trials, one after the other, on
``--slots`` slots of the devices launcher (on the 2-core CPU: 2 slots of one
thread). The unpruned run sets ``hydra.sweeper.pruner=none``; the pruned one
keeps the preset's pruner.

    python benchmarks/hpo.py                                   # CPU: 24 trials, 2 slots
    python benchmarks/hpo.py --device cuda --slots 8           # 8 trials at a time on one GPU

For each run it prints the env steps of all trials (``summary.json``
``global_step``, summed), the wall seconds of the whole sweep, the best
objective (the final eval success rate) with its trial, that trial's score on
fresh start states (``best_fresh``: ``best.pt`` on start states no evaluation
during training used, with its 95% interval) and the trials by state; then
the ratios. ``--json`` also writes them to a file. The sweep directories
(with ``optimization_history.png``) stay under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from rlchain.commands.report import load_jobs
from rlchain.run.summary import RunSummary


def run_search(name: str, extra: list[str], args: argparse.Namespace) -> dict:
    """Run one search into ``<out>/<name>`` and return what it reached.

    Raises:
        RuntimeError: the multirun exited non-zero (its stderr tail is included).
    """
    sweep_dir = (args.out / name).resolve()
    cmd = [
        sys.executable,
        "-m",
        "rlchain",
        "-m",
        "hparams_search=ppo_push_cube_optuna",
        f"hydra.sweep.dir={sweep_dir}",
        f"hydra.sweeper.n_trials={args.trials}",
        f"hydra.launcher.jobs_per_device={args.slots}",
        f"device={args.device}",
        *extra,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (args.out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    results = OmegaConf.to_container(OmegaConf.load(sweep_dir / "optimization_results.yaml"))
    best = RunSummary.read(results["best_job_dir"])
    fresh = best.best_fresh_objective if best is not None else None
    steps = sum(j.summary.global_step for j in load_jobs(sweep_dir) if j.summary is not None)
    return {
        "name": name,
        "wall_s": wall,
        "env_steps": steps,
        "best_value": results["best_value"],
        "best_trial": results["best_trial"],
        "best_params": results["best_params"],
        "best_fresh": fresh,
        "trials": results["trials"],
        "sweep_dir": str(sweep_dir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--slots", type=int, default=2, help="devices launcher: jobs_per_device")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where every trial runs")
    parser.add_argument("--out", type=Path, default=Path("multirun/hpo_benchmark"))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    runs = [run_search("unpruned", ["hydra.sweeper.pruner=none"], args), run_search("pruned", [], args)]
    print("| search | env steps | wall s | best objective (trial) | best.pt on fresh starts | trials by state |")
    print("|---|---:|---:|---:|---:|---|")
    for r in runs:
        fresh = r["best_fresh"]
        shown = f"{fresh['mean']:.3f} [{fresh['ci95_low']:.3f}, {fresh['ci95_high']:.3f}]" if fresh else "-"
        states = ", ".join(f"{v} {k}" for k, v in r["trials"].items())
        print(
            f"| {r['name']} | {r['env_steps'] / 1e6:.2f}M | {r['wall_s']:.0f} | {r['best_value']:.4f} "
            f"({r['best_trial']}) | {shown} | {states} |"
        )
    unpruned, pruned = runs
    print(
        f"pruned / unpruned: env steps {pruned['env_steps'] / unpruned['env_steps']:.2f}, "
        f"wall {pruned['wall_s'] / unpruned['wall_s']:.2f}, "
        f"best objective {pruned['best_value'] - unpruned['best_value']:+.4f}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
