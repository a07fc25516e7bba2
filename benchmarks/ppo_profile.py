"""Where an iteration of PPO on push_cube spends its time: collection, GAE, the update's passes, Adam, evaluation.

Usage::

    python benchmarks/ppo_profile.py [--iterations 20] [--seed 0] [--compile] [--out FILE]

The ``push_cube_ppo`` preset, built as ``rlchain-train`` builds it, runs in
one process on one thread; each phase is timed around the function that does
it (the CPU runs every kernel before the call returns), with the library's
code unchanged:

* collect: ``SyncCollector.collect`` (env steps, acting and value forward passes, bootstrap values);
* GAE: ``compute_gae`` inside ``PPO.update``;
* Adam: the optimiser step of each minibatch (``rlchain.core.algorithms.update._adam_step``; with ``--compile``
  it is fused into the compiled minibatch step and counts under the update passes);
* update passes: the rest of ``PPO.update`` (minibatch gathers, forward and backward passes, the loss, gradient
  clipping, the observation statistics);
* eval: one evaluation of the preset (``num_eval_episodes`` deterministic episodes), shown per evaluation and per
  iteration (divided by ``eval_freq``).

With ``--compile``, the collection step and the minibatch step are
compiled first, as ``trainer.compile=true`` compiles them (the compile time
is printed, not counted in the phases).

Prints one markdown table (means over the iterations after two warm-up
ones) and writes the numbers as JSON to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from hydra.utils import instantiate
from ppo_floor import build_preset

import rlchain.core.algorithms.ppo as ppo_module
import rlchain.core.algorithms.update as update_module
from rlchain.core.algorithms.update import update_step
from rlchain.core.evaluation import evaluate

WARMUP = 2


class Clock:
    """Seconds spent in wrapped functions, by phase."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, phase: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - start

        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="compile as trainer.compile=true does")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    cfg, env, policy, algorithm, collector = build_preset(args.seed)
    compile_s = None
    if args.compile:
        start = time.perf_counter()
        for step in (collector.step, update_step(algorithm, collector.buffer.data)):
            step.compile()
        compile_s = time.perf_counter() - start
        print(f"compiled in {compile_s:.1f} s")
    eval_env = instantiate(cfg.env, num_envs=cfg.trainer.num_eval_envs, seed=args.seed + 1, _convert_="all")

    clock = Clock()
    ppo_module.compute_gae = clock.wrap("gae", ppo_module.compute_gae)
    update_module._adam_step = clock.wrap("adam", update_module._adam_step)
    collect, update = clock.wrap("collect", collector.collect), clock.wrap("update", algorithm.update)
    rows = []
    for i in range(WARMUP + args.iterations):
        clock.spent = {}
        collect()
        update(collector.buffer.data)
        if i >= WARMUP:
            rows.append(dict(clock.spent))
    mean = {"adam": 0.0, **{key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}}
    mean["update passes"] = mean["update"] - mean["gae"] - mean["adam"]
    start = time.perf_counter()
    evaluate(eval_env, policy, int(cfg.trainer.num_eval_episodes), seed=args.seed + 1)
    eval_s = time.perf_counter() - start
    mean["eval (per iteration)"] = eval_s / int(cfg.trainer.eval_freq)
    total = mean["collect"] + mean["update"] + mean["eval (per iteration)"]

    print(
        f"| phase | s / iteration | share |   (one evaluation: {eval_s:.3f} s every {cfg.trainer.eval_freq} iterations)"
    )
    print("|---|---:|---:|")
    for phase in ("collect", "gae", "update passes", "adam", "eval (per iteration)"):
        print(f"| {phase} | {mean[phase]:.4f} | {mean[phase] / total:.0%} |")
    print(f"| iteration | {total:.4f} | 100% |")
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {"iterations": args.iterations, "seed": args.seed, "compile_s": compile_s, "eval_s": eval_s, **mean},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
