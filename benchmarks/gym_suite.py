"""The cart_pole and env=gym targets: learning runs of the presets and the adapter's overhead.

    python benchmarks/gym_suite.py                 # every row
    python benchmarks/gym_suite.py --only overhead # one row: learning | overhead

Learning rows run ``rlchain-train +experiment=<preset> seed=<s>`` and read
each run's ``metrics.jsonl``: the first env step at which the deterministic
eval return (``eval/avg_reward``) reached the bar, and the eval return at the
budget (mean over seeds where there are several).

Targets:

* torch cart_pole, PPO: eval return 500 within 100k env steps;
* torch cart_pole, GRPO: eval return 500 within 300k env steps;
* gymnasium CartPole-v1 through env=gym, PPO: 500 within 100k env steps;
* gymnasium Pendulum-v1, PPO: eval return >= -200, mean of 3 seeds, within 200k;
* adapter overhead: with a random policy, ``env=gym`` collection steps/s at
  least 0.9 of stepping the same ``gymnasium.make_vec`` env directly.
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
        cmd = [sys.executable, "-m", "rlchain.train", f"+experiment={preset}", f"seed={seed}", "device=cpu",
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


class RandomPolicy(torch.nn.Module):
    """Uniform random actions with the policy interface the collector calls (no network)."""

    has_critic = False

    def __init__(self, action_space: gym.Space, seed: int = 0) -> None:
        super().__init__()
        self.action_space = action_space
        self.generator = torch.Generator().manual_seed(seed)

    def get_action(self, td: TensorDict, deterministic: bool = False) -> TensorDict:
        n = td.batch_size[0]
        if isinstance(self.action_space, gym.spaces.Discrete):
            action = torch.randint(int(self.action_space.n), (n,), generator=self.generator)
        else:
            low, high = (torch.as_tensor(b) for b in (self.action_space.low, self.action_space.high))
            action = low + (high - low) * torch.rand(n, *self.action_space.shape, generator=self.generator)
        td.set("action", action)
        td.set("sample_log_prob", torch.zeros(n))
        td.set("value", torch.zeros(n))
        return td


def overhead_row(env_id: str = "Pendulum-v1", num_envs: int = 16, steps: int = 4000, repeats: int = 3) -> dict:
    """Random-policy collection steps/s through env=gym against gymnasium's own vector env."""
    from rlchain.collector import SyncCollector
    from rlchain.envs import GymVecEnv

    raw = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})  # fmt: skip
    raw.reset(seed=0)
    raw.action_space.seed(0)
    actions = [raw.action_space.sample() for _ in range(256)]
    direct = []
    for _ in range(repeats):
        start = time.perf_counter()
        for t in range(steps):
            raw.step(actions[t % 256])
        direct.append(steps * num_envs / (time.perf_counter() - start))
    raw.close()

    env = GymVecEnv(env_id, num_envs=num_envs)
    collector = SyncCollector(env, RandomPolicy(env.single_action_space), rollout_steps=steps)
    collector.collect()  # first call resets
    adapted = []
    for _ in range(repeats):
        start = time.perf_counter()
        collector.collect()
        adapted.append(steps * num_envs / (time.perf_counter() - start))
    env.close()
    ratio = max(adapted) / max(direct)
    return {"name": f"adapter overhead ({env_id}, {num_envs} envs, sync)", "direct_SPS": max(direct),
            "rlchain_SPS": max(adapted), "ratio": ratio, "met": ratio >= 0.9}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["learning", "overhead"], default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for num_envs in (16, 64) if args.only in (None, "overhead") else ():
        row = overhead_row(num_envs=num_envs, steps=64_000 // num_envs)
        rows.append(row)
        print(f"{row['name']}: gymnasium {row['direct_SPS']:,.0f} steps/s, env=gym collection "
              f"{row['rlchain_SPS']:,.0f} steps/s, ratio {row['ratio']:.3f} (target >= 0.9): "
              f"{'met' if row['met'] else 'NOT met'}", flush=True)  # fmt: skip
    if args.only in (None, "learning"):
        with tempfile.TemporaryDirectory() as tmp:
            for spec in LEARNING:
                row = learning_row(*spec, Path(tmp))
                rows.append(row)
                reached = "never" if row["steps_to_bar"] is None else f"{row['steps_to_bar']:,}"
                print(f"{row['name']} (seeds {row['seeds']}): eval return {row['bar']:g} reached at {reached} env steps "
                      f"(budget {row['budget']:,}); eval return at budget {row['eval_return_at_budget']:.1f}, best "
                      f"{row['best_eval_return_within_budget']:.1f}; {row['wall_s_per_seed']:.0f} s per seed: "
                      f"{'met' if row['met'] else 'NOT met'}", flush=True)  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
