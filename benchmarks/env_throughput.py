"""PushCube env throughput: env steps per second with random actions, eager, compiled and captured.

Usage: ``python benchmarks/env_throughput.py [--steps 200] [--repeats 3] [--num-envs 1 64 1024 8192]
[--modes eager compiled] [--devices cpu cuda] [--threads 1] [--json FILE]``

Prints one row per (device, mode, num_envs). Each row is the best of ``--repeats`` timed blocks of ``--steps``
steps after a warm-up; actions are drawn beforehand on the env's device so only the step is timed. Modes:

* ``eager``: ``env.step``;
* ``compiled``: ``env.step`` compiled whole as ``trainer.compile`` compiles a step
  (:func:`rlchain.core.compiling.compile_step`; the compile time is printed apart);
* ``graphed`` (CUDA): the eager step captured once as a CUDA graph (``torch.cuda.graph``) and replayed, the
  action copied into the graph's input first;
* ``compiled+graphed`` (CUDA): the compiled step captured and replayed the same way.

The step writes its state in place and reads nothing on the host, so a captured step replays the env exactly.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from rlchain.core.compiling import compile_step
from rlchain.core.envs import PushCubeEnv

MODES = ("eager", "compiled", "graphed", "compiled+graphed")


def stepper(env: PushCubeEnv, mode: str, action: torch.Tensor):
    """A function of the action that steps ``env`` in ``mode`` (compiled and warmed up, or captured)."""
    step = compile_step(env.step) if mode.startswith("compiled") else env.step
    if "graphed" not in mode:
        return step
    static = action.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as capture requires
        for _ in range(3):
            step(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(static)

    def replay(a: torch.Tensor) -> None:
        static.copy_(a)
        graph.replay()

    return replay


def measure(num_envs: int, device: str, mode: str, steps: int, repeats: int) -> tuple[float, float]:
    """``(best env steps/s over repeats blocks of steps batched steps, seconds to build the stepper)``."""
    env = PushCubeEnv(num_envs=num_envs, device=device, seed=0)
    env.reset()
    gen = torch.Generator(device=device).manual_seed(0)
    actions = [torch.rand(num_envs, 2, device=device, generator=gen) * 2 - 1 for _ in range(16)]
    start = time.perf_counter()
    step = stepper(env, mode, actions[0])
    for i in range(5):
        step(actions[i % 16])
    build_s = time.perf_counter() - start
    for i in range(15):
        step(actions[i % 16])
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(steps):
            step(actions[i % 16])
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    env.check_actions()
    return num_envs * steps / best, build_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 64, 1024, 8192])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["eager"])
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda where visible")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here, rewritten after each")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    if torch.cuda.is_available():
        print(f"GPU: {torch.cuda.get_device_name()}")
    print(f"{'device':<8}{'mode':<18}{'num_envs':>10}{'env steps/s':>16}{'build s':>9}")
    rows = []
    for device in devices:
        for mode in args.modes:
            if "graphed" in mode and not device.startswith("cuda"):
                continue
            for n in args.num_envs:
                sps, build_s = measure(n, device, mode, args.steps, args.repeats)
                print(f"{device:<8}{mode:<18}{n:>10}{sps:>16,.0f}{build_s:>9.1f}", flush=True)
                rows.append({"device": device, "mode": mode, "num_envs": n, "sps": sps, "build_s": build_s})
                if args.json is not None:
                    args.json.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
