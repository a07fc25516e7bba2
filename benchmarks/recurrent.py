"""Recurrent policies: a task that needs memory against sb3-contrib's RecurrentPPO, and what recurrence costs.

    python benchmarks/recurrent.py                  # both parts
    python benchmarks/recurrent.py --only memory    # CartPole without velocities, seeds 0-2
    python benchmarks/recurrent.py --only cost      # push_cube_ppo's SPS, MLP against GRU and LSTM

``memory``: CartPole without its velocities (observation ``[x, theta]``;
sb3-contrib's CartPoleNoVel-v1). For each seed, rlchain's
``experiment=cart_pole_no_vel_ppo`` (an LSTM policy; rl-zoo's RecurrentPPO
settings for the task: 8 envs x 32 steps, 20 epochs of one minibatch of 256,
lr 1e-3 decayed linearly, gamma 0.98, gae_lambda 0.8, LSTM 64 before MLPs of
[64], ReLU, observation normalisation, 100k env steps) and sb3-contrib's
``RecurrentPPO`` with rl-zoo's settings (``MlpLstmPolicy``, the same numbers,
``VecNormalize`` of the observations) on gymnasium's CartPole-v1 with the
velocities taken out run at the same time, one thread each, pinned to separate
cores. Both are evaluated every 2,560 env steps on 16 deterministic episodes.
Per run: the first env step whose evaluation returns 500, the training
seconds to it (collection and update; evaluation left out of both), and the
wall seconds of the whole run. Then the same preset with an MLP policy
(``policy.rnn_type=null``) on the same seeds: it should not reach 500.

``cost``: the ``push_cube_ppo`` preset (512 envs x 32 steps, MLPs of
[128, 128]) for 20 iterations with its MLP policy and with a GRU and an LSTM
of 128 (the MLP's width) and 256 (the default ``rnn_hidden_size``) before
the MLPs, each beside an MLP run on the other core: SPS over the run (the
first two iterations left out), and the collection and update seconds per
iteration. The ratio is recurrent / MLP.

Results go to ``--out`` (a JSON file per part) and are printed as tables.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vs_rsl_rl import finish, launch

SEEDS = [0, 1, 2]
PRESET = "cart_pole_no_vel_ppo"
BUDGET = 100_000
EVAL_EVERY = 2_560  # env steps: rlchain's eval_freq 10 x 8 envs x 32 steps
EVAL_EPISODES = 16
BAR = 500.0
COST_ITERATIONS = 20
COST_POLICIES = {"mlp": []} | {
    f"{rnn} {size}": [f"policy.rnn_type={rnn}", f"policy.rnn_hidden_size={size}"]
    for size in (128, 256)
    for rnn in ("gru", "lstm")
}


def rlchain_cmd(preset: str, seed: int, run_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlchain",
        f"experiment={preset}",
        f"seed={seed}",
        "device=cpu",
        "trainer.progress=false",
        "trainer.fresh_eval=false",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]


def rlchain_curve(run_dir: Path) -> list[dict]:
    """Each evaluation of a run: env step, eval return, training seconds so far (collection + update)."""
    curve, training = [], 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        training += row.get("time/collect_s", 0.0) + row.get("time/update_s", 0.0)
        if "eval/avg_reward" in row:
            curve.append({"step": row["global_step"], "return": row["eval/avg_reward"], "training_s": training})
    return curve


def sb3_run(seed: int, out: Path) -> None:
    """sb3-contrib's RecurrentPPO with rl-zoo's CartPoleNoVel-v1 settings; writes its curve to ``out``."""
    import gymnasium as gym
    import numpy as np
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(1)

    class NoVelocities(gym.ObservationWrapper):
        """CartPole-v1 observing ``[x, theta]`` (rl-zoo's CartPoleNoVel-v1)."""

        def __init__(self, env: gym.Env) -> None:
            super().__init__(env)
            high = env.observation_space.high[[0, 2]]
            self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

        def observation(self, obs):
            return obs[[0, 2]].astype(np.float32)

    make = lambda: Monitor(NoVelocities(gym.make("CartPole-v1")))  # noqa: E731
    env = VecNormalize(DummyVecEnv([make] * 8), norm_obs=True, norm_reward=False)
    env.seed(seed)
    eval_env = VecNormalize(DummyVecEnv([make]), norm_obs=True, norm_reward=False, training=False)
    eval_env.seed(seed + 10_000)
    curve: list[dict] = []

    class Evaluate(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.eval_s, self.start = 0.0, time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps % EVAL_EVERY:
                return True
            began = time.perf_counter()
            eval_env.obs_rms = env.obs_rms
            returns, _ = evaluate_policy(self.model, eval_env, EVAL_EPISODES, deterministic=True)
            self.eval_s += time.perf_counter() - began
            training = time.perf_counter() - self.start - self.eval_s
            curve.append({"step": self.num_timesteps, "return": float(returns), "training_s": training})
            return True

    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=lambda remaining: 1e-3 * remaining,  # rl-zoo's lin_0.001
        clip_range=lambda remaining: 0.2 * remaining,  # lin_0.2
        policy_kwargs=dict(
            ortho_init=False,
            activation_fn=torch.nn.ReLU,
            lstm_hidden_size=64,
            enable_critic_lstm=True,
            net_arch=dict(pi=[64], vf=[64]),
        ),
        seed=seed,
        device="cpu",
    )
    model.learn(BUDGET, callback=Evaluate())
    out.write_text(json.dumps(curve))


def first_at_bar(curve: list[dict]) -> dict | None:
    return next((point for point in curve if point["return"] >= BAR), None)


def memory(out: Path) -> dict:
    rows = []
    for seed in SEEDS:
        started = time.perf_counter()
        run_dir = out / f"lstm_{seed}"
        procs = {
            "rlchain": launch(rlchain_cmd(PRESET, seed, run_dir), 0, out / f"lstm_{seed}.log", WANDB_MODE="disabled"),
            "sb3": launch(
                [sys.executable, __file__, "--sb3-run", str(seed), str(out / f"sb3_{seed}.json")],
                1,
                out / f"sb3_{seed}.log",
            ),
        }
        walls = {}
        for name, proc in procs.items():
            finish(proc, f"{name} seed {seed}")
            walls[name] = time.perf_counter() - started
        curves = {"rlchain": rlchain_curve(run_dir), "sb3": json.loads((out / f"sb3_{seed}.json").read_text())}
        for name, curve in curves.items():
            reached = first_at_bar(curve)
            rows.append(
                {
                    "policy": "rlchain LSTM" if name == "rlchain" else "sb3-contrib RecurrentPPO",
                    "seed": seed,
                    "steps_to_500": reached and reached["step"],
                    "training_s_to_500": reached and round(reached["training_s"], 1),
                    "best_return": max(p["return"] for p in curve),
                    "final_return": curve[-1]["return"],
                    "run_wall_s": round(walls[name], 1),
                }
            )
    for pair in (SEEDS[:2], SEEDS[2:]):  # the MLP, two seeds at a time
        procs = {
            seed: launch(
                rlchain_cmd(PRESET, seed, out / f"mlp_{seed}", "policy.rnn_type=null"),
                core,
                out / f"mlp_{seed}.log",
                WANDB_MODE="disabled",
            )
            for core, seed in enumerate(pair)
        }
        for seed, proc in procs.items():
            finish(proc, f"MLP seed {seed}")
            curve = rlchain_curve(out / f"mlp_{seed}")
            reached = first_at_bar(curve)
            rows.append(
                {
                    "policy": "rlchain MLP",
                    "seed": seed,
                    "steps_to_500": reached and reached["step"],
                    "training_s_to_500": reached and round(reached["training_s"], 1),
                    "best_return": max(p["return"] for p in curve),
                    "final_return": curve[-1]["return"],
                    "run_wall_s": None,
                }
            )
    return {"rows": rows}


def cost(out: Path) -> dict:
    overrides = [
        f"trainer.iterations={COST_ITERATIONS}",
        f"trainer.eval_freq={COST_ITERATIONS}",
        "trainer.save_freq=1000",
    ]
    results = {}
    names = list(COST_POLICIES)
    for index, recurrent_name in enumerate(names[1:]):  # the MLP beside each recurrent policy
        procs = {}
        for core, name in enumerate(["mlp", recurrent_name]):
            run_dir = out / f"cost_{name.replace(' ', '_')}_{index}"
            cmd = rlchain_cmd("push_cube_ppo", 0, run_dir, *overrides, *COST_POLICIES[name])
            procs[name] = (launch(cmd, core, out / f"{run_dir.name}.log", WANDB_MODE="disabled"), run_dir)
        for name, (proc, run_dir) in procs.items():
            finish(proc, name)
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            rows = [r for r in rows if "time/collect_s" in r][2:]  # the first iterations warm up
            collect = sum(r["time/collect_s"] for r in rows) / len(rows)
            update = sum(r["time/update_s"] for r in rows) / len(rows)
            steps = 512 * 32
            results.setdefault(name, []).append(
                {"sps": steps / (collect + update), "collect_s": collect, "update_s": update}
            )
    mlp = results["mlp"]
    table = []
    for name in names[1:]:
        (rec,) = results[name]
        beside = mlp[names.index(name) - 1]  # the MLP run beside it
        table.append(
            {
                "policy": name,
                "sps": round(rec["sps"]),
                "mlp_sps_beside": round(beside["sps"]),
                "ratio": round(rec["sps"] / beside["sps"], 2),
                "collect_s": round(rec["collect_s"], 2),
                "mlp_collect_s": round(beside["collect_s"], 2),
                "update_s": round(rec["update_s"], 2),
                "mlp_update_s": round(beside["update_s"], 2),
            }
        )
    return {"rows": table}


def show(rows: list[dict]) -> None:
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(str(row[k]) for k in keys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("memory", "cost"))
    parser.add_argument("--out", type=Path, default=Path("benchmark_runs/recurrent"))
    parser.add_argument("--sb3-run", nargs=2, metavar=("SEED", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_run:
        sb3_run(int(args.sb3_run[0]), Path(args.sb3_run[1]))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for part, run in (("memory", memory), ("cost", cost)):
        if args.only in (None, part):
            result = run(args.out)
            (args.out / f"{part}.json").write_text(json.dumps(result, indent=2))
            print(f"\n{part}:")
            show(result["rows"])


if __name__ == "__main__":
    main()
