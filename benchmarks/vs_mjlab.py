"""rlchain's PPO against mjlab's own training (its registered rsl_rl runner and settings) on mjlab's cartpoles.

Usage::

    pip install -e ".[mjlab]"
    python benchmarks/vs_mjlab.py [--tasks balance swingup] [--seeds 0 1 2] [--iterations N] [--num-envs 256] [--out DIR]
    python benchmarks/vs_mjlab.py --env-only [--tasks swingup] [--rounds 4]      # the env alone, both adapters
    python benchmarks/vs_mjlab.py --side mjlab --task T --seed S --out DIR --iterations N --num-envs E

What runs, for each task (``Mjlab-Cartpole-Balance``, ``Mjlab-Cartpole-Swingup``) and seed:

* rlchain: ``rlchain-train experiment=mjlab_cartpole_<task>_ppo seed=S device=cpu env.num_envs=E
  trainer.iterations=N`` as a subprocess: ``env=mjlab`` (:class:`rlchain.core.envs.MjlabEnv`), the preset's
  settings, which are mjlab's registered ones for the task (see the preset's YAML); its ``metrics.jsonl``
  gives each iteration's ``time/collect_s`` and ``time/update_s`` and the evaluations.
* mjlab: this file with ``--side mjlab``, which trains as mjlab's own ``train`` script does: the task's
  registered env cfg with ``scene.num_envs = E`` and ``seed = S``, ``ManagerBasedRlEnv`` on the CPU,
  ``RslRlVecEnvWrapper`` with the registered ``clip_actions``, the task's registered runner class (mjlab's
  ``MjlabOnPolicyRunner``) with its registered rsl_rl settings and ``max_iterations = N``, and
  ``learn(init_at_random_ep_len=True)``, unmodified. A wrapper around the runner's ``logger.log`` records
  each iteration's ``collect_time`` and ``learn_time`` and evaluates.

Both sides are evaluated alike, every ``trainer.eval_freq`` iterations of the preset and after the last, with
rlchain's own deterministic ``evaluate`` (``num_eval_episodes`` episodes on a separate ``MjlabEnv`` of
``num_eval_envs`` envs seeded S + 1, as rlchain's trainer does; the mjlab side's actor mean through a small
adapter), so "return at equal env steps" is one protocol's number on both sides.

How it measures: both sides of a seed run at the same time, one thread each (``OMP_NUM_THREADS=1``), pinned
with ``taskset -c`` to separate cores, swapped between seeds (``vs_rsl_rl.launch``). Training SPS = env steps /
(collect + update seconds); evaluation, logging and checkpoints fall outside both. It prints a markdown table
(per task and seed, and the means over the seeds, with the ratios rlchain / mjlab) and writes
``DIR/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_rsl_rl import _rsl_rl_classes, compose_config, finish, git_state, launch, mean, record_iterations  # noqa: E402

TASKS = {"balance": "Mjlab-Cartpole-Balance", "swingup": "Mjlab-Cartpole-Swingup"}


def preset(task: str) -> str:
    """The rlchain preset of a task key: ``mjlab_cartpole_<task>_ppo``."""
    return f"mjlab_cartpole_{task}_ppo"


def run_mjlab(task: str, seed: int, out: Path, iterations: int, num_envs: int) -> None:
    """Train with mjlab's registered runner on ``task`` and write ``out/metrics.jsonl`` (keys as rlchain's)."""
    import torch
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.rl import MjlabOnPolicyRunner, RslRlVecEnvWrapper
    from mjlab.tasks.registry import load_env_cfg, load_rl_cfg, load_runner_cls
    from mjlab.utils.torch import configure_torch_backends

    from rlchain.core.envs import MjlabEnv
    from rlchain.core.evaluation import evaluate

    torch.set_num_threads(1)
    cfg = compose_config([f"experiment={preset(task)}", f"seed={seed}", "device=cpu"])
    eval_freq, episodes = int(cfg.trainer.eval_freq), int(cfg.trainer.num_eval_episodes)
    out.mkdir(parents=True, exist_ok=True)

    configure_torch_backends()  # as mjlab's train
    env_cfg, agent = load_env_cfg(TASKS[task]), load_rl_cfg(TASKS[task])
    env_cfg.scene.num_envs, env_cfg.seed, agent.seed, agent.max_iterations = num_envs, seed, seed, iterations
    agent.logger = "tensorboard"  # mjlab registers W&B; the log writer is outside the timed phases
    env = RslRlVecEnvWrapper(ManagerBasedRlEnv(cfg=env_cfg, device="cpu"), clip_actions=agent.clip_actions)
    runner_cls = load_runner_cls(TASKS[task]) or MjlabOnPolicyRunner
    runner = runner_cls(env, asdict(agent), str(out / "log"), "cpu")
    eval_env = MjlabEnv(task=TASKS[task], num_envs=int(cfg.trainer.num_eval_envs), seed=seed + 1, device="cpu")

    policy = _rsl_rl_classes()[1](runner.alg.actor, runner.alg.critic, group=None)  # mjlab's groups as they are
    metrics = record_iterations(
        runner,
        out / "metrics.jsonl",
        num_envs * int(agent.num_steps_per_env),
        iterations,
        eval_freq,
        lambda: evaluate(eval_env, policy, num_episodes=episodes, seed=seed + 1),
    )
    runner.learn(num_learning_iterations=iterations, init_at_random_ep_len=True)
    metrics.close()


def step_time(side: str, task: str, num_envs: int, steps: int = 400) -> float:
    """Milliseconds per step of ``task`` with random actions and spread episode starts: mjlab's env as its runner
    steps it (``auto_reset=True``), or rlchain's ``MjlabEnv`` (the terminal observation, then the reset)."""
    import contextlib
    import io

    import torch

    torch.set_num_threads(1)
    if side == "rlchain":
        from rlchain.core.envs import MjlabEnv

        env = MjlabEnv(task=TASKS[task], num_envs=num_envs, seed=0)
        env.reset()
        env.spread_episode_starts()
    else:
        from mjlab.envs import ManagerBasedRlEnv
        from mjlab.tasks.registry import load_env_cfg

        cfg = load_env_cfg(TASKS[task])
        cfg.scene.num_envs, cfg.seed = num_envs, 0
        with contextlib.redirect_stdout(io.StringIO()):
            env = ManagerBasedRlEnv(cfg, device="cpu")
        env.reset()
        env.episode_length_buf.copy_(torch.randint_like(env.episode_length_buf, high=env.max_episode_length))
    actions = torch.randn(steps + 50, num_envs, int(env.single_action_space.shape[0]))
    for action in actions[:50]:
        env.step(action)
    start = time.perf_counter()
    for action in actions[50:]:
        env.step(action)
    return (time.perf_counter() - start) / steps * 1e3


def env_only(args: argparse.Namespace) -> None:
    """The env alone: rlchain's adapter against mjlab's env as its runner steps it, both at once, pinned to the two
    cores and swapped between the rounds (``--rounds``); prints ms per step and the ratio of the means."""
    cpus = sorted(os.sched_getaffinity(0))
    cores = cpus[:2] if len(cpus) >= 2 else cpus * 2
    out = (args.out or Path(tempfile.mkdtemp(prefix="rlchain-vs-mjlab-env-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {"rlchain": [], "mjlab": []}
    for task in args.tasks:
        for index in range(args.rounds):
            procs = {}
            for side, core in zip(("rlchain", "mjlab"), cores if index % 2 == 0 else cores[::-1]):
                cmd = [sys.executable, str(Path(__file__).resolve()), "--side", f"env-{side}", "--task", task]
                procs[side] = launch([*cmd, "--num-envs", str(args.num_envs)], core, out / f"{task}_{side}_{index}.log")
            for side, proc in procs.items():
                finish(proc, side)
                times[side].append(float(proc.log_path.read_text().split()[-1]))
            print(
                f"{TASKS[task]} round {index}: rlchain {times['rlchain'][-1]:.2f} ms/step, mjlab {times['mjlab'][-1]:.2f}"
            )
    rl, mj = mean(times["rlchain"]), mean(times["mjlab"])
    print(f"mean: rlchain {rl:.2f} ms/step, mjlab {mj:.2f} ms/step; rlchain's env steps/s: {mj / rl:.3f}x mjlab's")


def read_run(path: Path) -> dict[str, Any]:
    """Totals of one side's ``metrics.jsonl``: env steps, seconds, SPS and the evaluations' returns."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    collect, update = sum(r["time/collect_s"] for r in rows), sum(r["time/update_s"] for r in rows)
    evals = [(r["eval/global_step"], r["eval/avg_reward"]) for r in rows if "eval/avg_reward" in r]
    return {
        "env_steps": rows[-1]["global_step"],
        "collect_s": collect,
        "update_s": update,
        "SPS": rows[-1]["global_step"] / (collect + update),
        "final_eval_return": evals[-1][1],
        "evals": evals,
    }


def benchmark(args: argparse.Namespace) -> None:
    """Run both sides for every task and seed, print the table and write ``results.json``."""
    out = (args.out or Path(tempfile.mkdtemp(prefix="rlchain-vs-mjlab-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    cores = cpus[:2] if len(cpus) >= 2 else cpus * 2
    train = shutil.which("rlchain-train")
    train_cmd = [train] if train else [sys.executable, "-m", "rlchain"]
    results: dict[str, Any] = {"git": git_state(), "num_envs": args.num_envs, "tasks": {}}
    table = ["| task | seed | env steps | SPS rlchain | SPS mjlab | SPS ratio | final eval return rlchain | mjlab |"]
    table.append("|---|---|---|---|---|---|---|---|")
    for task in args.tasks:
        cfg = compose_config([f"experiment={preset(task)}"])
        iterations = args.iterations.get(task) or int(cfg.trainer.iterations)
        per_seed: dict[int, Any] = {}
        for index, seed in enumerate(args.seeds):
            rl_dir, mj_dir = out / f"{task}_rlchain_seed{seed}", out / f"{task}_mjlab_seed{seed}"
            rl_cmd = [
                *train_cmd,
                f"experiment={preset(task)}",
                f"seed={seed}",
                "device=cpu",
                f"env.num_envs={args.num_envs}",
                f"trainer.iterations={iterations}",
                "trainer.fresh_eval=false",
                f"trainer.output_dir={rl_dir}",
                f"hydra.run.dir={rl_dir}",
                "trainer.progress=false",
            ]
            mj_cmd = [sys.executable, str(Path(__file__).resolve()), "--side", "mjlab", "--task", task]
            mj_cmd += ["--seed", str(seed), "--out", str(mj_dir), "--iterations", str(iterations)]
            mj_cmd += ["--num-envs", str(args.num_envs)]
            rl_core, mj_core = (cores[0], cores[1]) if index % 2 == 0 else (cores[1], cores[0])
            print(f"{task} seed {seed}:", flush=True)
            rl = launch(rl_cmd, rl_core, out / f"{task}_rlchain_seed{seed}.log")
            mj = launch(mj_cmd, mj_core, out / f"{task}_mjlab_seed{seed}.log")
            finish(rl, "rlchain")
            finish(mj, "mjlab")
            rl_res, mj_res = read_run(rl_dir / "metrics.jsonl"), read_run(mj_dir / "metrics.jsonl")
            per_seed[seed] = {"rlchain": rl_res, "mjlab": mj_res, "SPS_ratio": rl_res["SPS"] / mj_res["SPS"]}
            table.append(
                f"| {TASKS[task]} | {seed} | {rl_res['env_steps']:,} | {rl_res['SPS']:,.0f} | {mj_res['SPS']:,.0f} | "
                f"{rl_res['SPS'] / mj_res['SPS']:.2f}x | {rl_res['final_eval_return']:.2f} | "
                f"{mj_res['final_eval_return']:.2f} |"
            )
        sides = {side: [per_seed[s][side] for s in args.seeds] for side in ("rlchain", "mjlab")}
        means = {
            side: {key: mean([r[key] for r in runs]) for key in ("SPS", "final_eval_return")}
            for side, runs in sides.items()
        }
        means["SPS_ratio"] = means["rlchain"]["SPS"] / means["mjlab"]["SPS"]
        results["tasks"][task] = {"iterations": iterations, "seeds": per_seed, "mean": means}
        table.append(
            f"| {TASKS[task]} | mean | {sides['rlchain'][0]['env_steps']:,} | {means['rlchain']['SPS']:,.0f} | "
            f"{means['mjlab']['SPS']:,.0f} | {means['SPS_ratio']:.2f}x | "
            f"{means['rlchain']['final_eval_return']:.2f} | {means['mjlab']['final_eval_return']:.2f} |"
        )
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print("\n".join(table))
    print(f"\nresults: {out / 'results.json'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--side", choices=["mjlab", "env-rlchain", "env-mjlab"], help="one side (the benchmark starts these)"
    )
    parser.add_argument("--env-only", action="store_true", help="time the env alone: rlchain's adapter against mjlab's")
    parser.add_argument("--rounds", type=int, default=4, help="with --env-only: rounds per task (cores swapped)")
    parser.add_argument("--task", choices=sorted(TASKS), help="with --side: the task")
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=["balance", "swingup"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, help="iterations of every run (default: each preset's)")
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.side == "mjlab":
        run_mjlab(args.task, args.seed, args.out, args.iterations, args.num_envs)
        return
    if args.side in ("env-rlchain", "env-mjlab"):
        print(f"{step_time(args.side[4:], args.task, args.num_envs):.3f}")
        return
    if args.env_only:
        env_only(args)
        return
    args.iterations = dict.fromkeys(TASKS, args.iterations)
    benchmark(args)


if __name__ == "__main__":
    main()
