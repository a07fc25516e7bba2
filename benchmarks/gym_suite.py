"""The cart_pole and env=gym targets: learning runs of the presets and the adapter's overhead.

    python benchmarks/gym_suite.py                 # every row
    python benchmarks/gym_suite.py --only overhead # one kind: learning | reference | overhead

Learning rows run ``rlchain-train experiment=<preset> seed=<s>`` and read
each run's ``metrics.jsonl``: the first env step at which the deterministic
eval return (``eval/avg_reward``) reached the bar, and the eval return at the
budget (mean over seeds where there are several).

Targets:

* torch cart_pole, PPO: eval return 500 within 100k env steps;
* torch cart_pole, GRPO: eval return 500 within 300k env steps;
* gymnasium CartPole-v1 through env=gym, PPO: 500 within 100k env steps;
* gymnasium Pendulum-v1, PPO: eval return >= -200, mean of 3 seeds, within 200k;
* adapter overhead: with a random policy, ``env=gym`` collection steps/s at
  least 0.9 of stepping the same ``gymnasium.make_vec`` env directly
  (Pendulum-v1 at 16, 32 and 64 envs; the median of 5 rounds).

Reference rows (a bar to compare against, not a target): HalfCheetah-v5,
PPO, 3 seeds, eval return 3000 within 1M env steps; the adapter overhead on
CartPole-v1 and HalfCheetah-v5 at 16 envs. The HalfCheetah rows run only when
the ``rlchain[mujoco]`` extra is installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

#: (name, preset, seeds, bar on eval/avg_reward, env-step budget)
LEARNING = [
    ("torch cart_pole, PPO", "cart_pole_ppo", [0], 500.0, 100_000),
    ("torch cart_pole, GRPO", "cart_pole_grpo", [0], 500.0, 300_000),
    ("gymnasium CartPole-v1, PPO", "gym_cart_pole_ppo", [0], 500.0, 100_000),
    ("gymnasium Pendulum-v1, PPO", "gym_pendulum_ppo", [0, 1, 2], -200.0, 200_000),
]
REFERENCE = [
    ("gymnasium HalfCheetah-v5, PPO", "gym_half_cheetah_ppo", [0, 1, 2], 3000.0, 1_000_000),
]
#: (env id, num_envs) of the adapter-overhead rows: the target, then the references.
OVERHEAD = [("Pendulum-v1", 16), ("Pendulum-v1", 32), ("Pendulum-v1", 64)]
OVERHEAD_REFERENCE = [("CartPole-v1", 16), ("HalfCheetah-v5", 16)]


def eval_curve(run_dir: Path) -> list[tuple[int, float]]:
    """``(global_step, eval/avg_reward)`` of every evaluation of a run."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["global_step"], r["eval/avg_reward"]) for r in rows if "eval/avg_reward" in r]


def learning_row(name: str, preset: str, seeds: list[int], bar: float, budget: int, tmp: Path) -> dict:
    """Train ``preset`` for each seed and measure it against ``bar`` within ``budget`` env steps."""
    curves, walls = [], []
    for seed in seeds:
        run_dir = tmp / f"{preset}_{seed}"
        env = {**os.environ, "WANDB_MODE": "disabled"}
        cmd = [sys.executable, "-m", "rlchain", f"experiment={preset}", f"seed={seed}", "device=cpu",
               "trainer.progress=false", f"hydra.run.dir={run_dir}"]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        curves.append(eval_curve(run_dir))
    steps = [s for s, _ in curves[0]]
    mean = [float(np.mean([c[i][1] for c in curves])) for i in range(min(len(c) for c in curves))]
    reached = next((s for s, v in zip(steps, mean) if v >= bar), None)
    within = [v for s, v in zip(steps, mean) if s <= budget]
    at_budget = within[-1] if within else float("nan")
    return {
        "name": name, "preset": preset, "seeds": seeds, "bar": bar, "budget": budget,
        "steps_to_bar": reached, "eval_return_at_budget": at_budget, "best_eval_return_within_budget": max(within),
        "met": reached is not None and reached <= budget, "wall_s_per_seed": float(np.mean(walls)),
    }  # fmt: skip


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
    from rlchain.collector import SyncCollector
    from rlchain.envs import GymVecEnv

    raw = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})  # fmt: skip
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
    results = sorted((adapted / direct, direct, adapted) for direct, adapted in
                     (overhead_round(env_id, num_envs) for _ in range(rounds)))  # fmt: skip
    ratio, direct, adapted = results[len(results) // 2]
    return {"name": f"adapter overhead ({env_id}, {num_envs} envs, sync)", "env_id": env_id, "num_envs": num_envs,
            "direct_SPS": direct, "rlchain_SPS": adapted, "ratio": ratio, "overhead_us": 1e6 * num_envs * (1 / adapted - 1 / direct),
            "ratios": [r[0] for r in results], "met": ratio >= 0.9}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["learning", "reference", "overhead"], default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each overhead row (its median is reported)")
    args = parser.parse_args()
    rows = []
    from rlchain.envs.gym_adapter import resolve_spec

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
        print(f"{row['name']}: median of {args.rounds} rounds: gymnasium {row['direct_SPS']:,.0f} steps/s, env=gym "
              f"collection {row['rlchain_SPS']:,.0f} steps/s, ratio {row['ratio']:.3f} (rounds "
              f"{min(row['ratios']):.3f}-{max(row['ratios']):.3f}), {row['overhead_us']:.1f} us per vector step "
              f"(target >= 0.9): {verdict}", flush=True)  # fmt: skip
    specs = [(spec, "met", "NOT met") for spec in LEARNING if args.only in (None, "learning")]
    if args.only in (None, "reference"):
        if importlib.util.find_spec("mujoco") is None:
            print('reference rows skipped: they need pip install "rlchain[mujoco]"', flush=True)
        else:
            specs += [(spec, "reached", "not reached") for spec in REFERENCE]
    with tempfile.TemporaryDirectory() as tmp:
        for spec, yes, no in specs:
            row = learning_row(*spec, Path(tmp))
            rows.append(row)
            reached = "never" if row["steps_to_bar"] is None else f"{row['steps_to_bar']:,}"
            print(f"{row['name']} (seeds {row['seeds']}): eval return {row['bar']:g} reached at {reached} env steps "
                  f"(budget {row['budget']:,}); eval return at budget {row['eval_return_at_budget']:.1f}, best "
                  f"{row['best_eval_return_within_budget']:.1f}; {row['wall_s_per_seed']:.0f} s per seed: "
                  f"{yes if row['met'] else no}", flush=True)  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
