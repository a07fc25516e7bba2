"""A privileged critic on a noisy PushCube: env steps to the success bar with and without the critic's group.

Usage: ``python benchmarks/privileged_critic.py [--noise 0.05] [--seeds 0 1 2] [--out DIR] [overrides ...]``

PushCube with ``env.obs_noise_std`` (Gaussian noise, in metres and m/s, on every feature the actor observes) and
``env.privileged_critic=true`` (the observation as the groups ``actor``, noisy, and ``critic``, exact), trained
with the tuned PPO preset (``experiment=push_cube_ppo``) in two arms:

* ``privileged``: the critic sees the ``critic`` group (the policy's default where the env has one);
* ``blind``: ``policy.critic_obs=[actor]``, the critic sees what the actor sees.

The actor, its noise and everything else are the same. Each arm and seed runs in a process of its own, one torch
thread each, the two arms of a seed at once, pinned to separate cores where the machine has two. It prints one
row per arm and seed: env steps until the eval success rate first reaches 0.6 and 0.9, the final and best eval
success and the final explained variance of the value function.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARMS = {"privileged": [], "blind": ["policy.critic_obs=[actor]"]}
BARS = (0.6, 0.9)


def command(arm: str, seed: int, noise: float, run_dir: Path, extra: list[str]) -> list[str]:
    """The ``rlchain-train`` command line of one arm and seed."""
    return [
        sys.executable,
        "-m",
        "rlchain",
        "experiment=push_cube_ppo",
        f"env.obs_noise_std={noise}",
        "env.privileged_critic=true",
        *ARMS[arm],
        f"seed={seed}",
        "device=cpu",
        f"hydra.run.dir={run_dir}",
        "trainer.progress=false",
        "trainer.fresh_eval=false",
        *extra,
    ]


def row(arm: str, seed: int, run_dir: Path) -> dict[str, object]:
    """The table's row of a finished run, from its ``metrics.jsonl``."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/success_rate" in r]
    reached = {bar: next((r["global_step"] for r in evals if r["eval/success_rate"] >= bar), None) for bar in BARS}
    train = [r for r in rows if "losses/explained_variance" in r]
    return {
        "arm": arm,
        "seed": seed,
        **{f"steps_to_{bar}": reached[bar] for bar in BARS},
        "final_success": evals[-1]["eval/success_rate"],
        "best_success": max(r["eval/success_rate"] for r in evals),
        "explained_variance": sum(r["losses/explained_variance"] for r in train[-10:]) / len(train[-10:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--noise", type=float, default=0.05, help="env.obs_noise_std (default 0.05)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary directory)")
    parser.add_argument("overrides", nargs="*", help="more rlchain-train overrides, e.g. trainer.iterations=200")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="privileged_critic_"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    results = []
    for seed in args.seeds:
        procs = []
        for i, arm in enumerate(ARMS):
            run_dir = out / f"{arm}_seed{seed}"
            pin = ["taskset", "-c", str(cores[i % len(cores)])] if len(cores) >= 2 else []
            cmd = pin + command(arm, seed, args.noise, run_dir, args.overrides)
            procs.append((arm, run_dir, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)))
        for arm, run_dir, proc in procs:
            if proc.wait() != 0:
                raise SystemExit(f"{arm} seed {seed} failed: see {run_dir}")
            results.append(row(arm, seed, run_dir))
            print(json.dumps(results[-1]), flush=True)
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
