"""How much faster rlchain's PPO iteration on PushCube could get at most: its time against its floor.

Usage::

    python benchmarks/ppo_floor.py [--iterations 20] [--seed 0] [--vs-rsl-rl DIR/results.json] [--out FILE]

The floor of an iteration is the work that any PPO of the ``push_cube_ppo``
preset runs in eager PyTorch, whatever its code around that work:

* collection: ``rollout_steps`` steps of the env (``env.step`` on the
  rollout's own actions) and, per step, the forward passes of the actor and
  critic MLPs on the step's observations, under ``torch.no_grad``;
* update: for each of the update's ``n_epochs x rollout / batch_size``
  minibatches, the forward and backward passes of the actor and critic MLPs
  on the minibatch's observations (a sum as the loss: no distribution, no
  PPO loss, no gradient clipping, no optimiser step, no minibatch gather).

All of it runs in one process with one thread, after the real iterations it
is compared with, on the data they produced: the iteration is timed as the
trainer times it (``SyncCollector.collect``, then ``PPO.update``), the floor
on that iteration's rollout. ``headroom = iteration / floor`` bounds how much
faster rlchain's iteration could become by changing its own code (the same
kernels, the same env). With ``--vs-rsl-rl`` (the ``results.json`` of
``vs_rsl_rl.py``), the ceiling of the SPS ratio against rsl_rl is that
run's mean SPS ratio times the headroom.

Prints one markdown table (means over the iterations after two warm-up
ones) and writes the numbers as JSON to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch
from hydra.utils import instantiate
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_rsl_rl import compose_config

from rlchain.core.buffer import minibatches
from rlchain.core.collector import SyncCollector

WARMUP = 2


def timed(fn) -> float:
    """Wall seconds of ``fn()``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def collection_floor(env, policy, rollout: TensorDict) -> float:
    """Seconds of the rollout's env steps and bare actor and critic forwards (see the module docstring)."""

    @torch.no_grad()
    def run() -> None:
        obs, _ = env.reset()
        for action in rollout["action"].unbind(0):
            x = policy._features(obs)
            policy.actor(x), policy.critic(x)
            obs = env.step(action)[0]

    return timed(run)


def update_floor(policy, rollout: TensorDict, n_epochs: int, batch_size: int) -> float:
    """Seconds of the bare actor and critic forward and backward passes over the update's minibatches."""
    generator = torch.Generator().manual_seed(0)
    batches = [
        batch["obs"] for _ in range(n_epochs) for batch in minibatches(rollout.reshape(-1), batch_size, generator)
    ]

    def run() -> None:
        for obs in batches:
            x = policy._features(obs)
            policy.zero_grad(set_to_none=True)
            (policy.actor(x).sum() + policy.critic(x).sum()).backward()

    return timed(run)


def build_preset(seed: int, experiment: str = "push_cube_ppo", *overrides: str):
    """The ``experiment`` preset on the CPU (with ``overrides``), built in ``rlchain-train``'s order from seed
    ``seed``: ``(cfg, env, policy, algorithm, collector)``."""
    cfg = compose_config([f"experiment={experiment}", f"seed={seed}", "device=cpu", *overrides])
    torch.manual_seed(seed)
    env = instantiate(cfg.env, _convert_="all")
    policy = instantiate(
        cfg.policy,
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        _convert_="all",
    )
    algorithm = instantiate(cfg.algorithm, policy=policy, _convert_="all")
    collector = SyncCollector(env, policy, int(cfg.trainer.rollout_steps), reset_options=algorithm.reset_options)
    return cfg, env, policy, algorithm, collector


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20, help="iterations timed after 2 warm-up ones")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vs-rsl-rl", type=Path, help="results.json of benchmarks/vs_rsl_rl.py")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    cfg, env, policy, algorithm, collector = build_preset(args.seed)
    floor_env = instantiate(cfg.env, _convert_="all")

    rows = []
    for i in range(WARMUP + args.iterations):
        row = {"collect_s": timed(collector.collect)}
        rollout = collector.buffer.data
        row["collect_floor_s"] = collection_floor(floor_env, policy, rollout)
        row["update_floor_s"] = update_floor(policy, rollout, algorithm.cfg.n_epochs, algorithm.cfg.batch_size)
        row["update_s"] = timed(partial(algorithm.update, rollout))  # last: it changes the policy
        if i >= WARMUP:
            rows.append(row)

    mean = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
    mean["iteration_s"] = mean["collect_s"] + mean["update_s"]
    mean["floor_s"] = mean["collect_floor_s"] + mean["update_floor_s"]
    mean["headroom"] = mean["iteration_s"] / mean["floor_s"]
    print("| phase | rlchain s/iter | floor s/iter | rlchain / floor |")
    print("|---|---:|---:|---:|")
    for name, key in (("collection", "collect"), ("update", "update"), ("iteration", None)):
        now, floor = (mean[f"{key}_s"], mean[f"{key}_floor_s"]) if key else (mean["iteration_s"], mean["floor_s"])
        print(f"| {name} | {now:.4f} | {floor:.4f} | {now / floor:.2f} |")
    if args.vs_rsl_rl is not None:
        measured = json.loads(args.vs_rsl_rl.read_text())["mean"]["ratio_rlchain_over_rsl_rl"]["SPS"]
        mean["sps_ratio_measured"], mean["sps_ratio_ceiling"] = measured, measured * mean["headroom"]
        print(
            f"\nSPS ratio against rsl_rl: measured {measured:.2f}, ceiling {mean['sps_ratio_ceiling']:.2f} "
            f"(measured x headroom {mean['headroom']:.2f})"
        )
    if args.out is not None:
        args.out.write_text(json.dumps({"iterations": args.iterations, "seed": args.seed, **mean}, indent=2))


if __name__ == "__main__":
    main()
