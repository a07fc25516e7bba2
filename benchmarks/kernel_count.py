"""Operator calls per env step, collection step and minibatch update: the CPU's proxy for a GPU's kernel launches.

Usage: ``python benchmarks/kernel_count.py [--num-envs 4096] [--steps 50] [--out FILE]``

On a GPU every operator that reaches torch's dispatcher is at least one kernel launch (8-10 us of host time),
so a loop of small ops is launch-bound. Counted on the CPU, in one process:

* eager: every aten call that reaches the dispatcher, counted by a ``TorchDispatchMode``;
* compiled (``torch.compile(fn, fullgraph=True)``, inductor): the kernels inductor generated for the graph
  (each launched once per call) plus the aten calls the compiled call still dispatches (its externs: matrix
  products, copies), counted by the profiler; and the graph breaks ``torch._dynamo.explain`` finds.

The env steps are push_cube's (state observations) and cart_pole's at ``--num-envs`` envs. The collection step
and the PPO/GRPO minibatch update are counted eager, from the ``push_cube_ppo`` and ``push_cube_grpo`` presets:
a collection step is the difference between rollouts of 16 and 8 steps, over 8; a minibatch update the
difference between updates of 2 epochs and 1, over the minibatches of an epoch.

Last, the CPU env steps/s of the push_cube step eager and compiled at ``--num-envs`` envs, on one thread, in the
same run. Prints a markdown table; ``--out`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch._inductor.metrics as inductor_metrics
from torch.utils._python_dispatch import TorchDispatchMode

from rlchain.core.envs import CartPoleEnv, PushCubeEnv


class AtenCalls(TorchDispatchMode):
    """Counts the aten operator calls that reach the dispatcher inside its ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def eager_calls(fn, *args) -> int:
    """Aten calls of one eager call of ``fn(*args)``."""
    with AtenCalls() as count:
        fn(*args)
    return count.calls


def compiled_calls(fn, *args) -> tuple[int, int, int]:
    """``(graph breaks, kernels generated, aten calls dispatched per call)`` of ``fn`` compiled whole."""
    breaks = torch._dynamo.explain(fn)(*args).graph_break_count
    torch._dynamo.reset()
    inductor_metrics.reset()
    compiled = torch.compile(fn, fullgraph=True)
    compiled(*args)
    kernels = inductor_metrics.generated_kernel_count
    compiled(*args)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        compiled(*args)
    dispatched = sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    )
    return breaks, kernels, dispatched


def env_rows(num_envs: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, env, action in (
        ("push_cube step", PushCubeEnv(num_envs=num_envs), torch.rand(num_envs, 2, generator=gen) * 2 - 1),
        ("cart_pole step", CartPoleEnv(num_envs=num_envs), torch.randint(0, 2, (num_envs,), generator=gen)),
    ):
        eager = eager_calls(env.step, action)
        breaks, kernels, dispatched = compiled_calls(env.step, action)
        rows.append(
            {"what": name, "eager": eager, "compiled": kernels + dispatched, "kernels": kernels, "breaks": breaks}
        )
    return rows


def training_rows() -> list[dict]:
    from ppo_floor import build_preset

    from rlchain.core.collector import SyncCollector

    rows = []
    for algo in ("ppo", "grpo"):
        cfg, env, policy, algorithm, collector = build_preset(0, f"push_cube_{algo}")
        if algo == "ppo":
            counts = []
            for steps in (8, 16):
                short = SyncCollector(env, policy, steps, reset_options=algorithm.reset_options)
                short.collect()
                counts.append(eager_calls(short.collect))
            rows.append({"what": "collection step (push_cube_ppo)", "eager": (counts[1] - counts[0]) // 8})
        collector.collect()
        data = collector.buffer.data
        counts = []
        for epochs in (1, 2):
            algorithm.cfg.n_epochs = epochs
            counts.append(eager_calls(algorithm.update, data))
        minibatches = max(1, data.numel() // int(cfg.algorithm.batch_size))
        rows.append(
            {"what": f"{algo} minibatch update (push_cube_{algo})", "eager": (counts[1] - counts[0]) // minibatches}
        )
    return rows


def steps_per_second(step, action: torch.Tensor, num_envs: int, steps: int) -> float:
    for _ in range(5):
        step(action)
    start = time.perf_counter()
    for _ in range(steps):
        step(action)
    return num_envs * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=50, help="timed steps of the env-steps/s comparison")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = env_rows(args.num_envs) + training_rows()
    print(f"torch {torch.__version__}, one CPU thread, {args.num_envs} envs")
    print("| what | aten calls eager | launches compiled (kernels + dispatched) | graph breaks (fullgraph) |")
    print("|---|---:|---:|---:|")
    for row in rows:
        compiled = (
            f"{row['compiled']} ({row['kernels']} + {row['compiled'] - row['kernels']})" if "compiled" in row else "-"
        )
        print(f"| {row['what']} | {row['eager']} | {compiled} | {row.get('breaks', '-')} |")

    action = torch.rand(args.num_envs, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
    eager_env, compiled_env = PushCubeEnv(num_envs=args.num_envs), PushCubeEnv(num_envs=args.num_envs)
    compiled_step = torch.compile(compiled_env.step, fullgraph=True)
    compiled_step(action)
    sps = {}
    for _ in range(2):  # alternated, best of two: the two share the machine's state
        for name, step in (("eager", eager_env.step), ("compiled", compiled_step)):
            sps[name] = max(sps.get(name, 0.0), steps_per_second(step, action, args.num_envs, args.steps))
    ratio = sps["compiled"] / sps["eager"]
    print(
        f"push_cube env steps/s on one thread at {args.num_envs} envs: eager {sps['eager']:,.0f}, "
        f"compiled {sps['compiled']:,.0f} ({ratio:.2f}x)"
    )
    if args.out is not None:
        args.out.write_text(json.dumps({"num_envs": args.num_envs, "rows": rows, "env_steps_per_s": sps}, indent=2))


if __name__ == "__main__":
    main()
