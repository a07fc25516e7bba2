"""Regression tests of six silent errors (each failed on 014b5f8); they move to their topic modules."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlchain.algorithms import GRPO, PPO
from rlchain.algorithms.base import Algorithm, AlgorithmConfig
from rlchain.envs import GymVecEnv
from rlchain.policies import ActorCritic, ActorOnly
from rlchain.trainer import Trainer

from conftest import rows
from toy_env import LineEnv


# 1. GRPO's charts count only the episodes that started at the rollout's reset.
def test_grpo_charts_count_each_envs_first_episode_whatever_its_length(tmp_path):
    torch.manual_seed(0)
    env = LineEnv(num_envs=32, max_episode_steps=5, seed=1)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(env, policy, GRPO(policy, group_size=4, batch_size=64), iterations=1, rollout_steps=12,
                      stats_min_episodes=1, output_dir=str(tmp_path), progress=False)  # fmt: skip
    trainer.train()
    data = trainer.collector.buffer.data
    done, length, ret = data["done"], data["episode_length"], data["episode_return"]
    first = done & (done.cumsum(0) == 1)
    assert bool(first.any(0).all()), "every env ends its first episode within the rollout"
    assert int(done.sum()) > int(first.sum()), "some env ends a second, shorter episode: the case at stake"
    (row,) = rows(tmp_path)
    assert row["charts/episodic_length"] == pytest.approx(length[first].double().mean().item())
    assert row["charts/episodic_return"] == pytest.approx(ret[first].double().mean().item())
    assert row["charts/success_rate"] == pytest.approx(data["success"][first].double().mean().item())


# 2. After a resume, best.pt, best_objective and best_objective_step describe one policy of the run's history.
class ScoredByEvaluation(LineEnv):
    """No success signal; every step of the k-th reset's episodes pays k, so evaluation k scores k * limit."""

    reports_success = False
    resets = 0

    def reset(self, **kwargs):
        self.resets += 1
        return super().reset(**kwargs)

    def step(self, action):
        self.t = self.t + 1
        truncated = self.t >= self.max_episode_steps
        final_obs = self._obs()
        self._fresh(truncated, 1)
        never = torch.zeros_like(truncated)
        info = {"final_obs": final_obs, "success": never, "rewards": {}, "metrics": {}}
        return self._obs(), torch.full((self.num_envs,), float(self.resets)), never, truncated, info


class FailingPPO(PPO):
    """PPO whose update raises at its ``fail_at``-th call."""

    def __init__(self, policy, fail_at: int | None = None, **kwargs):
        super().__init__(policy, **kwargs)
        self.calls, self.fail_at = 0, fail_at

    def update(self, rollout):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the update crashed")
        return super().update(rollout)


def test_a_resume_never_keeps_a_best_checkpoint_of_the_branch_it_discards(tmp_path):
    def make(fail_at=None, resume_from=None):
        env = ScoredByEvaluation(num_envs=4, max_episode_steps=3)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(env, policy, FailingPPO(policy, fail_at=fail_at, batch_size=8),
                       eval_env=ScoredByEvaluation(num_envs=4, max_episode_steps=3), iterations=6, rollout_steps=3,
                       eval_freq=1, save_freq=4, num_eval_envs=4, num_eval_episodes=4, objective="eval/avg_reward",
                       output_dir=str(tmp_path), progress=False, resume_from=resume_from)  # fmt: skip

    with pytest.raises(RuntimeError, match="the update crashed"):
        make(fail_at=6).train()  # evaluations 1-5 each a new best; latest.pt written at iteration 4
    summary = make(resume_from="auto").train()  # a fresh eval env scores 1, 2: below the best so far
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    assert best["global_step"] == summary.best_objective_step
    assert best["best_objective"] == summary.best_objective
    (row,) = [r for r in rows(tmp_path) if r["global_step"] == summary.best_objective_step]
    assert row["eval/avg_reward"] == summary.best_objective


# 3. A resume applies the config's learning rate under the constant and linear schedules.
@pytest.mark.parametrize("schedule, resumed_lr", [("constant", 1e-5), ("adaptive", None)])
def test_a_resume_takes_the_configs_learning_rate_unless_the_schedule_adapts_it(tmp_path, capsys, schedule, resumed_lr):
    def make(out, lr, iterations, resume_from=None):
        env = LineEnv(num_envs=8)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        extra = {"target_kl": 1e-9} if schedule == "adaptive" else {}  # adaptive: the rate moves every update
        algorithm = PPO(policy, learning_rate=lr, lr_schedule=schedule, batch_size=16, **extra)
        return Trainer(env, policy, algorithm, iterations=iterations, rollout_steps=4, output_dir=str(out),
                       progress=False, resume_from=resume_from)  # fmt: skip

    first = make(tmp_path / "a", 1e-3, iterations=1)
    first.train()
    saved = first.algorithm.current_lr
    capsys.readouterr()
    resumed = make(tmp_path / "b", 1e-5, iterations=2, resume_from=str(tmp_path / "a" / "checkpoints" / "latest.pt"))
    expected = saved if resumed_lr is None else resumed_lr
    assert resumed.algorithm.current_lr == pytest.approx(expected)
    err = capsys.readouterr().err
    assert ("replaces the checkpoint's" in err) == (resumed_lr is not None), err
    resumed.train()
    assert rows(tmp_path / "b")[-1]["charts/learning_rate"] == pytest.approx(
        expected if resumed_lr is not None else expected / 1.5)


# 4. stop_at_target_kl tests the KL of the epoch's last minibatch (CleanRL), not the epoch's mean.
def test_the_kl_stop_reads_the_epochs_last_minibatch():
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))
    algorithm = Algorithm(policy, AlgorithmConfig(batch_size=4, n_epochs=3))
    data = torch.zeros(16, 2)
    from tensordict import TensorDict

    batch = TensorDict({"obs": data}, batch_size=[16])
    kls = iter([0.0, 0.005, 0.01, 0.02] * 3)  # epoch mean 0.00875, last minibatch 0.02

    def minibatch_loss(mb):
        loss = policy.actor(mb["obs"]).square().mean()
        return {"loss": loss, "approx_kl": torch.tensor(next(kls))}

    _, epochs = algorithm._optimise(batch, minibatch_loss, stop_kl=0.015)
    assert epochs == 1


# 5. env=gym's seed generator travels with checkpoints: a resumed GRPO run does not reuse its first start seeds.
def test_a_resumed_gym_run_continues_its_reset_seeds(tmp_path):
    def make(out, iterations, resume_from=None):
        torch.manual_seed(0)
        env = GymVecEnv("CartPole-v1", num_envs=4, seed=0, max_episode_steps=10)
        policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(env, policy, GRPO(policy, group_size=2, batch_size=20), iterations=iterations, rollout_steps=10,
                       output_dir=str(out), progress=False, resume_from=resume_from)  # fmt: skip

    straight = make(tmp_path / "a", 3)
    straight.train()
    make(tmp_path / "b", 2).train()
    resumed = make(tmp_path / "c", 3, resume_from=str(tmp_path / "b" / "checkpoints" / "latest.pt"))
    resumed.train()
    assert torch.equal(resumed.collector.buffer.data["obs"][0], straight.collector.buffer.data["obs"][0])


# 6. algorithm.target_kl is refused unless a setting reads it.
@pytest.mark.parametrize("algorithm, settings, match", [
    (PPO, {}, r"^target_kl=0.01 is not allowed with lr_schedule='constant', stop_at_target_kl=False: "),
    (GRPO, {}, r"^target_kl=0.01 is not allowed with lr_schedule='constant': "),
    (GRPO, {"lr_schedule": "linear", "total_iterations": 5}, r"^target_kl=0.01 is not allowed with lr_schedule='linear': "),
])  # fmt: skip
def test_a_target_kl_that_no_setting_reads_is_refused(algorithm, settings, match):
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))
    with pytest.raises(ValueError, match=match):
        algorithm(policy, target_kl=0.01, **settings)
    algorithm(policy, target_kl=0.01, lr_schedule="adaptive")
    if algorithm is PPO:
        PPO(policy, target_kl=0.01, stop_at_target_kl=True)
