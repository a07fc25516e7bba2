"""The task presets against their targets, and the ``env=gym`` adapter's overhead.

    python benchmarks/gym_suite.py                 # every row
    python benchmarks/gym_suite.py --only mujoco   # one kind: learning | mujoco | reference | overhead
    python benchmarks/gym_suite.py --only mujoco --preset gym_hopper_ppo --out runs/  # some presets, runs kept

Learning rows run ``rlchain-train experiment=<preset> seed=<s> device=cpu``
for each seed, two runs at a time, each with one thread
(``OMP_NUM_THREADS=1``) and pinned to a core of its own (``taskset``), and
read each run's ``metrics.jsonl``. Per seed: the eval return (deterministic,
``eval/avg_reward``, ``trainer.num_eval_episodes`` episodes) of the last
evaluation within the budget, the first env step at which it reached the bar,
the training seconds (collection + update + compilation: the ``time/``
columns SPS is computed from; evaluation is left out) and the wall seconds
of the whole command.

Targets:

* torch cart_pole, PPO: eval return 500 within 100k env steps;
* torch cart_pole, GRPO: eval return 500 within 300k env steps;
* gymnasium CartPole-v1 through env=gym, PPO: 500 within 100k env steps;
* gymnasium Pendulum-v1, PPO: eval return >= -200, mean of 3 seeds, within 200k
  (these four: the first evaluation of the seeds' mean curve at the bar);
* MuJoCo (``rlchain[mujoco]``), PPO, seeds 0, 1, 2, the mean over the seeds of
  the eval return at 1M env steps: HalfCheetah-v5 >= 5,800 with at most 250
  training seconds per seed, Hopper-v5 >= 2,400, Walker2d-v5 >= 3,400;
* adapter overhead: with a random policy, ``env=gym`` collection steps/s at
  least 0.9 of stepping the same ``gymnasium.make_vec`` env directly
  (Pendulum-v1 at 16, 32 and 64 envs; the median of 5 rounds).

Reference rows (a bar to compare against, not a target): the adapter
overhead on CartPole-v1 and HalfCheetah-v5 at 16 envs.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from vs_rsl_rl import finish, launch

#: (name, preset, seeds, bar on eval/avg_reward, env-step budget): the bar is reached within the budget
LEARNING = [
    ("torch cart_pole, PPO", "cart_pole_ppo", [0], 500.0, 100_000),
    ("torch cart_pole, GRPO", "cart_pole_grpo", [0], 500.0, 300_000),
    ("gymnasium CartPole-v1, PPO", "gym_cart_pole_ppo", [0], 500.0, 100_000),
    ("gymnasium Pendulum-v1, PPO", "gym_pendulum_ppo", [0, 1, 2], -200.0, 200_000),
]
#: (name, preset, seeds, bar on the seeds' mean eval return at the budget, budget, most training s per seed or None)
MUJOCO = [
    ("gymnasium HalfCheetah-v5, PPO", "gym_half_cheetah_ppo", [0, 1, 2], 5800.0, 1_000_000, 250.0),
    ("gymnasium Hopper-v5, PPO", "gym_hopper_ppo", [0, 1, 2], 2400.0, 1_000_000, None),
    ("gymnasium Walker2d-v5, PPO", "gym_walker2d_ppo", [0, 1, 2], 3400.0, 1_000_000, None),
]
#: (env id, num_envs) of the adapter-overhead rows: the target, then the references.
OVERHEAD = [("Pendulum-v1", 16), ("Pendulum-v1", 32), ("Pendulum-v1", 64)]
OVERHEAD_REFERENCE = [("CartPole-v1", 16), ("HalfCheetah-v5", 16)]


def read_run(run_dir: Path) -> tuple[list[tuple[int, float]], float]:
    """A run's ``metrics.jsonl``: ``(global_step, eval/avg_reward)`` of every evaluation, and the seconds of
    collection, update and compilation (its ``time/`` columns, which SPS counts; evaluation left out)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["global_step"], r["eval/avg_reward"]) for r in rows if "eval/avg_reward" in r]
    return curve, sum(r["time/collect_s"] + r["time/update_s"] + r.get("time/compile_s", 0.0) for r in rows)


def run_seeds(jobs: list[tuple[str, int]], out: Path) -> dict[tuple[str, int], dict]:
    """Train each ``(preset, seed)`` of ``jobs``, two at a time, one thread each, each pinned to a core of its
    own; a job starts on a core as soon as the one before it there ends.

    Returns per job: ``seed``, ``run_dir``, ``curve`` and ``training_s`` (:func:`read_run`), and ``wall_s``.

    Raises:
        RuntimeError: a run failed (with the tail of its log).
    """
    free = sorted(os.sched_getaffinity(0))[:2]
    queue, running, results = list(jobs), {}, {}
    while queue or running:
        while queue and free:
            (preset, seed), core = queue.pop(0), free.pop(0)
            run_dir = out / f"{preset}_{seed}"
            cmd = [
                sys.executable,
                "-m",
                "rlchain",
                f"experiment={preset}",
                f"seed={seed}",
                "device=cpu",
                "trainer.progress=false",
                f"hydra.run.dir={run_dir}",
            ]
            proc = launch(cmd, core, out / f"{preset}_{seed}.log", WANDB_MODE="disabled")
            running[proc] = (preset, seed, core, run_dir, time.perf_counter())
        while not (ended := [p for p in running if p.poll() is not None]):
            time.sleep(0.5)
        proc = ended[0]
        preset, seed, core, run_dir, start = running.pop(proc)
        free.append(core)
        finish(proc, f"{preset} seed {seed}")
        curve, seconds = read_run(run_dir)
        results[preset, seed] = {
            "seed": seed,
            "run_dir": str(run_dir),
            "curve": curve,
            "training_s": seconds,
            "wall_s": time.perf_counter() - start,
        }
    return results


def learning_row(name: str, preset: str, seeds: list[int], bar: float, budget: int, runs: dict) -> dict:
    """The seeds' mean eval curve of ``preset`` (``runs``: :func:`run_seeds`) against ``bar`` within ``budget``."""
    runs = [runs[preset, seed] for seed in seeds]
    curves = [r["curve"] for r in runs]
    steps = [s for s, _ in curves[0]]
    mean = [float(np.mean([c[i][1] for c in curves])) for i in range(min(len(c) for c in curves))]
    reached = next((s for s, v in zip(steps, mean) if v >= bar), None)
    within = [v for s, v in zip(steps, mean) if s <= budget]
    at_budget = within[-1] if within else float("nan")
    return {
        "name": name,
        "preset": preset,
        "seeds": seeds,
        "bar": bar,
        "budget": budget,
        "steps_to_bar": reached,
        "eval_return_at_budget": at_budget,
        "best_eval_return_within_budget": max(within),
        "met": reached is not None and reached <= budget,
        "wall_s_per_seed": float(np.mean([r["wall_s"] for r in runs])),
        "training_s_per_seed": float(np.mean([r["training_s"] for r in runs])),
    }


def mujoco_row(
    name: str, preset: str, seeds: list[int], bar: float, budget: int, max_training_s: float | None, runs: dict
) -> dict:
    """The mean over the seeds of ``preset``'s eval return at ``budget`` env steps (``runs``: :func:`run_seeds`)
    against ``bar``, and each seed's training seconds against ``max_training_s``."""
    runs = [runs[preset, seed] for seed in seeds]
    per_seed = []
    for r in runs:
        within = [(s, v) for s, v in r["curve"] if s <= budget]
        per_seed.append(
            {
                "seed": r["seed"],
                "global_step": within[-1][0],
                "eval_return": within[-1][1],
                "training_s": r["training_s"],
                "wall_s": r["wall_s"],
                "run_dir": r["run_dir"],
            }
        )
    mean = float(np.mean([r["eval_return"] for r in per_seed]))
    fast = max_training_s is None or all(r["training_s"] <= max_training_s for r in per_seed)
    return {
        "name": name,
        "preset": preset,
        "seeds": seeds,
        "bar": bar,
        "budget": budget,
        "max_training_s": max_training_s,
        "per_seed": per_seed,
        "mean_eval_return": mean,
        "met": mean >= bar and fast,
    }


class ReplayPolicy:
    """Replays a fixed list of random actions through ``get_action``, the one method the collector calls.

    A plain class, not a network: the harness itself should cost next to nothing.
    """

    has_critic = False

    def __init__(self, actions: list[torch.Tensor]) -> None:
        self.actions = itertools.cycle(actions)
        self.zeros = torch.zeros(actions[0].shape[0])  # log-prob and value: the collector copies them

    def get_action(self, td: TensorDict, deterministic: bool = False) -> TensorDict:
        td["action"], td["sample_log_prob"], td["value"] = next(self.actions), self.zeros, self.zeros
        return td


def overhead_round(env_id: str, num_envs: int, block: int = 256, repeats: int = 30) -> tuple[float, float]:
    """One round: ``(gymnasium steps/s, env=gym collection steps/s)`` with a random policy.

    Both sides replay the same 256 pre-sampled random actions, so the ratio is
    the cost of the adapter and the collector alone. They run in one process,
    alternating ``repeats`` blocks of ``block`` steps (a rollout of
    ``rollout_steps=block`` for rlchain), and each side reports its fastest
    block: on a shared machine the minimum is the stable statistic.
    """
    from rlchain.core.collector import SyncCollector
    from rlchain.core.envs import GymVecEnv

    raw = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    raw.reset(seed=0)
    raw.action_space.seed(0)
    actions = [raw.action_space.sample() for _ in range(256)]
    env = GymVecEnv(env_id, num_envs=num_envs)
    policy = ReplayPolicy([torch.from_numpy(a) for a in actions])
    collector = SyncCollector(env, policy, rollout_steps=block)
    collector.collect()  # first call resets
    direct, adapted = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for t in range(block):
            raw.step(actions[t % 256])
        direct.append(block * num_envs / (time.perf_counter() - start))
        start = time.perf_counter()
        collector.collect()
        adapted.append(block * num_envs / (time.perf_counter() - start))
    raw.close()
    env.close()
    return max(direct), max(adapted)


def overhead_row(env_id: str, num_envs: int, rounds: int = 5) -> dict:
    """:func:`overhead_round` ``rounds`` times, each with fresh envs: the median round and the spread.

    ``overhead_us`` is the time the adapter and the collector add to one
    vector step (all ``num_envs`` envs) in the median round, in microseconds.
    """
    results = sorted(
        (adapted / direct, direct, adapted)
        for direct, adapted in (overhead_round(env_id, num_envs) for _ in range(rounds))
    )
    ratio, direct, adapted = results[len(results) // 2]
    return {
        "name": f"adapter overhead ({env_id}, {num_envs} envs, sync)",
        "env_id": env_id,
        "num_envs": num_envs,
        "direct_SPS": direct,
        "rlchain_SPS": adapted,
        "ratio": ratio,
        "overhead_us": 1e6 * num_envs * (1 / adapted - 1 / direct),
        "ratios": [r[0] for r in results],
        "met": ratio >= 0.9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["learning", "mujoco", "reference", "overhead"], default=None)
    parser.add_argument("--preset", nargs="+", default=None, help="learning and MuJoCo rows: only these presets'")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each overhead row (its median is reported)")
    args = parser.parse_args()
    rows = []
    from rlchain.core.envs.gym_adapter import resolve_spec

    overhead = [(spec, True) for spec in OVERHEAD if args.only in (None, "overhead")]
    if args.only in (None, "reference"):
        overhead += [(spec, False) for spec in OVERHEAD_REFERENCE]
    for (env_id, num_envs), target in overhead:
        try:
            resolve_spec(env_id)  # raises, naming the extra, when a dependency is missing
        except ValueError as err:
            print(f"adapter overhead ({env_id}) skipped: {err}", flush=True)
            continue
        row = overhead_row(env_id, num_envs, rounds=args.rounds)
        rows.append(row)
        verdict = ("met" if row["met"] else "NOT met") if target else "reference"
        print(
            f"{row['name']}: median of {args.rounds} rounds: gymnasium {row['direct_SPS']:,.0f} steps/s, env=gym "
            f"collection {row['rlchain_SPS']:,.0f} steps/s, ratio {row['ratio']:.3f} (rounds "
            f"{min(row['ratios']):.3f}-{max(row['ratios']):.3f}), {row['overhead_us']:.1f} us per vector step "
            f"(target >= 0.9): {verdict}",
            flush=True,
        )
    chosen = set(args.preset or [spec[1] for spec in LEARNING + MUJOCO])
    learning = [spec for spec in LEARNING if args.only in (None, "learning") and spec[1] in chosen]
    mujoco = [spec for spec in MUJOCO if args.only in (None, "mujoco") and spec[1] in chosen]
    if mujoco and importlib.util.find_spec("mujoco") is None:
        print('MuJoCo rows skipped: they need pip install "rlchain[mujoco]"', flush=True)
        mujoco = []
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        runs = run_seeds([(spec[1], seed) for spec in learning + mujoco for seed in spec[2]], out)
        for spec in learning:
            row = learning_row(*spec, runs)
            rows.append(row)
            reached = "never" if row["steps_to_bar"] is None else f"{row['steps_to_bar']:,}"
            print(
                f"{row['name']} (seeds {row['seeds']}): eval return {row['bar']:g} reached at {reached} env steps "
                f"(budget {row['budget']:,}); eval return at budget {row['eval_return_at_budget']:.1f}, best "
                f"{row['best_eval_return_within_budget']:.1f}; {row['training_s_per_seed']:.0f} training s, "
                f"{row['wall_s_per_seed']:.0f} wall s per seed: {'met' if row['met'] else 'NOT met'}",
                flush=True,
            )
        for spec in mujoco:
            row = mujoco_row(*spec, runs)
            rows.append(row)
            seeds = "; ".join(
                f"seed {r['seed']}: {r['eval_return']:,.0f} at {r['global_step']:,} steps, "
                f"{r['training_s']:.0f} training s, {r['wall_s']:.0f} wall s"
                for r in row["per_seed"]
            )
            time_bar = f", at most {row['max_training_s']:g} training s per seed" if row["max_training_s"] else ""
            print(
                f"{row['name']}: mean eval return {row['mean_eval_return']:,.0f} (target >= {row['bar']:,g}"
                f"{time_bar}) ({seeds}): {'met' if row['met'] else 'NOT met'}",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
