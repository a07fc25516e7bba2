"""Operator calls per env step, collection step and minibatch update: the CPU's proxy for a GPU's kernel launches.

Usage: ``python benchmarks/kernel_count.py [--num-envs 4096] [--steps 50] [--out FILE]``;
``python benchmarks/kernel_count.py --population``: a population's steps at P=1 and P=16 (:func:`population_rows`).

On a GPU every operator that reaches torch's dispatcher is at least one kernel launch (8-10 us of host time),
so a loop of small ops is launch-bound. Counted on the CPU, in one process:

* eager: every aten call that reaches the dispatcher, counted by a ``TorchDispatchMode``;
* compiled (``torch.compile(fn, fullgraph=True)``, inductor): the generated kernels one call launches (their
  calls in the ``call`` function of the code inductor generated, a fused kernel once per call site) plus the aten
  calls the compiled call still dispatches (its externs: matrix products, copies), counted by the profiler; and
  the graph breaks ``torch._dynamo.explain`` finds.

The env steps are push_cube's (state observations) and cart_pole's at ``--num-envs`` envs. The collection step
(``SyncCollector._collect_step``: act, env step, the row written) and the minibatch update
(``MinibatchUpdate._indexed_step``: loss, backward, clip, Adam) come from the ``push_cube_ppo`` and ``push_cube_grpo``
presets at ``--num-envs`` envs, each counted eager and compiled whole as ``trainer.compile=true`` compiles them.

Last, the CPU env steps/s of the push_cube step at ``--num-envs`` envs, on one thread, in the same run: eager,
compiled as ``trainer.compile`` compiles it (:func:`rlchain.core.compiling.compile_step`) and compiled with
inductor's default options. Prints a markdown table; ``--out`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlchain.core.compiling import compile_step
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


class GeneratedCode:
    """The Python modules inductor generates while its ``with`` block compiles (their source, in order)."""

    def __enter__(self) -> list[str]:
        from torch._inductor import codecache

        self.cache, self.sources = codecache.PyCodeCache, []
        self.load = self.cache.load_by_key_path

        def load(key, path, *args, **kwargs):
            self.sources.append(Path(path).read_text())
            return self.load(key, path, *args, **kwargs)

        self.cache.load_by_key_path = load
        return self.sources

    def __exit__(self, *exc) -> None:
        self.cache.load_by_key_path = self.load


def kernel_calls(sources: list[str]) -> int:
    """The kernels one call of the compiled graphs launches: the calls of generated kernels in each module's
    ``call`` function (a kernel run on several tensors counts once per call)."""
    return sum(
        len(re.findall(r"^\s+((?:cpp|triton)_\w+)(?:\.run)?\(", source[source.find("def call(") :], re.M))
        for source in sources
    )


def compiled_calls(fn, *args, autograd: bool = False) -> tuple[int, int, int]:
    """``(graph breaks, generated kernels launched per call, aten calls dispatched per call)`` of ``fn`` compiled
    whole; ``autograd`` traces a backward inside ``fn`` (the minibatch update) as ``trainer.compile`` does."""
    with torch._dynamo.config.patch(trace_autograd_ops=autograd):
        breaks = torch._dynamo.explain(fn)(*args).graph_break_count
        torch._dynamo.reset()
        # As trainer.compile compiles each: a step with compile_step, the update with inductor's defaults.
        compiled = torch.compile(fn, fullgraph=True) if autograd else compile_step(fn)
        with GeneratedCode() as sources:
            compiled(*args)
        compiled(*args)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            compiled(*args)
    dispatched = sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    )
    return breaks, kernel_calls(sources), dispatched


def _row(what: str, fn, *args, autograd: bool = False) -> dict:
    eager = eager_calls(fn, *args)
    breaks, kernels, dispatched = compiled_calls(fn, *args, autograd=autograd)
    return {"what": what, "eager": eager, "compiled": kernels + dispatched, "kernels": kernels, "breaks": breaks}


def env_rows(num_envs: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    return [
        _row(name, env.step, action)
        for name, env, action in (
            ("push_cube step", PushCubeEnv(num_envs=num_envs), torch.rand(num_envs, 2, generator=gen) * 2 - 1),
            ("cart_pole step", CartPoleEnv(num_envs=num_envs), torch.randint(0, 2, (num_envs,), generator=gen)),
        )
    ]


def training_rows(num_envs: int) -> list[dict]:
    from ppo_floor import build_preset

    from rlchain.core.buffer import minibatch_order

    rows = []
    for algo in ("ppo", "grpo"):
        cfg, env, policy, algorithm, collector = build_preset(0, f"push_cube_{algo}", f"env.num_envs={num_envs}")
        collector._start_rollout()
        rows.append(_row(f"collection step (push_cube_{algo})", collector._collect_step))
        algorithm.update(collector.collect().data)  # stages the update's samples, as every update does
        updater = algorithm.updater
        samples = updater._samples
        order = minibatch_order(samples, algorithm.cfg.batch_size, torch.Generator(), out=updater._order_buffer[0])
        updater._order = order.repeat(64, 1)[None]  # room for every call the counts make

        def step(updater=updater):
            return updater._indexed_step()

        rows.append(_row(f"{algo} minibatch update (push_cube_{algo})", step, autograd=True))
    return rows


def population_rows(envs_per_member: int, sizes: tuple[int, ...] = (1, 16)) -> list[dict]:
    """Eager aten calls of a population's collection step and of one of its minibatch steps
    (:mod:`rlchain.core.population`: each member's code under ``torch.vmap``) at each population size of ``sizes``,
    ``envs_per_member`` envs each, PPO on push_cube; and the solo run's, for the cost of a population of one."""
    from rlchain.core.algorithms import PPO
    from rlchain.core.collector import SyncCollector
    from rlchain.core.policies import ActorCritic
    from rlchain.core.population import Population

    def member(seed: int, num_envs: int):
        torch.manual_seed(seed)
        env = PushCubeEnv(num_envs=num_envs, seed=seed)
        policy = ActorCritic(env.single_observation_space, env.single_action_space)
        algorithm = PPO(policy, batch_size=envs_per_member * 4, n_epochs=1)
        policy.seed_actions(seed)
        return env, policy, algorithm

    rows = []
    env, policy, algorithm = member(0, envs_per_member)
    solo = SyncCollector(env, policy, 8)
    solo._start_rollout()
    rows.append({"what": "solo collection step (push_cube_ppo)", "eager": eager_calls(solo._collect_step)})
    data = solo.collect().data
    algorithm.update(data)
    updater = algorithm.updater
    updater._position.zero_()  # the epoch's first minibatch again
    rows.append({"what": "solo minibatch update", "eager": eager_calls(updater._indexed_step)})
    for size in sizes:
        seeds = list(range(size))
        engine = Population([member(s, envs_per_member)[2] for s in seeds], seeds, envs_per_member)
        big = PushCubeEnv(num_envs=size * envs_per_member)
        big.split_into_members(seeds)
        collector = SyncCollector(big, engine.policy, 8)
        collector._start_rollout()
        rows.append({"what": f"population collection step, P={size}", "eager": eager_calls(collector._collect_step)})
        data = collector.collect().data
        engine.update(data)  # as every update: the samples staged, the orders drawn
        engine.updater._position.zero_()  # the epoch's first minibatch again
        rows.append(
            {"what": f"population minibatch update, P={size}", "eager": eager_calls(engine.updater._indexed_step)}
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
    parser.add_argument(
        "--population",
        action="store_true",
        help="only the eager calls of a population's steps at P=1 and P=16 (and the solo run's), 256 envs each",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.population:
        print(f"torch {torch.__version__}, one CPU thread, 256 envs per member, PPO on push_cube, eager")
        print("| what | aten calls |\n|---|---:|")
        for row in population_rows(256):
            print(f"| {row['what']} | {row['eager']} |")
        return
    rows = env_rows(args.num_envs) + training_rows(args.num_envs)
    print(f"torch {torch.__version__}, one CPU thread, {args.num_envs} envs")
    print("| what | aten calls eager | launches compiled (kernels + dispatched) | graph breaks (fullgraph) |")
    print("|---|---:|---:|---:|")
    for row in rows:
        compiled = (
            f"{row['compiled']} ({row['kernels']} + {row['compiled'] - row['kernels']})" if "compiled" in row else "-"
        )
        print(f"| {row['what']} | {row['eager']} | {compiled} | {row.get('breaks', '-')} |")

    action = torch.rand(args.num_envs, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
    envs = [PushCubeEnv(num_envs=args.num_envs) for _ in range(3)]
    steps = {
        "eager": envs[0].step,
        "compiled": compile_step(envs[1].step),  # as trainer.compile compiles it
        "torch.compile": torch.compile(envs[2].step, fullgraph=True),  # inductor's default options
    }
    for name in ("compiled", "torch.compile"):
        steps[name](action)
    sps = {}
    for _ in range(4):  # alternated, best of four: they share the machine's state
        for name, step in steps.items():
            sps[name] = max(sps.get(name, 0.0), steps_per_second(step, action, args.num_envs, args.steps))
    print(
        f"push_cube env steps/s on one thread at {args.num_envs} envs: eager {sps['eager']:,.0f}, compiled "
        f"{sps['compiled']:,.0f} ({sps['compiled'] / sps['eager']:.2f}x; with inductor's default options "
        f"{sps['torch.compile']:,.0f}, {sps['torch.compile'] / sps['eager']:.2f}x)"
    )
    if args.out is not None:
        args.out.write_text(json.dumps({"num_envs": args.num_envs, "rows": rows, "env_steps_per_s": sps}, indent=2))


if __name__ == "__main__":
    main()
