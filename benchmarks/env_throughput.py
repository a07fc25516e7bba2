"""PushCube env throughput: env steps per second with random actions.

Usage: ``python benchmarks/env_throughput.py [--steps 200] [--repeats 3]``

Prints one row per (device, num_envs) for num_envs in 1, 64, 1024, 8192 on
the CPU, and on CUDA when a GPU is visible. Each row is the best of
``--repeats`` timed blocks of ``--steps`` steps after a warm-up; actions are
drawn beforehand on the env's device so only ``env.step`` is timed.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlchain.core.envs import PushCubeEnv


def measure(num_envs: int, device: str, steps: int, repeats: int) -> float:
    """Best env steps/s over ``repeats`` blocks of ``steps`` batched steps."""
    env = PushCubeEnv(num_envs=num_envs, device=device, seed=0)
    env.reset()
    gen = torch.Generator(device=device).manual_seed(0)
    actions = [torch.rand(num_envs, 2, device=device, generator=gen) * 2 - 1 for _ in range(16)]
    for i in range(20):
        env.step(actions[i % 16])
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(steps):
            env.step(actions[i % 16])
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return num_envs * steps / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 64, 1024, 8192])
    args = parser.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    print(f"{'device':<8}{'num_envs':>10}{'env steps/s':>16}")
    for device in devices:
        for n in args.num_envs:
            print(f"{device:<8}{n:>10}{measure(n, device, args.steps, args.repeats):>16,.0f}", flush=True)


if __name__ == "__main__":
    main()
