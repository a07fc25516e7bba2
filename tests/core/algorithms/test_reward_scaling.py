"""PPO's reward_norm: rewards scaled by the running std of the discounted return, against a plain reference."""

from __future__ import annotations

import math

import pytest
import torch

from rlchain.core.algorithms import PPO
from rlchain.core.algorithms.reward_scaling import RewardScaler
from rlchain.core.collector import SyncCollector
from rlchain.core.envs import PushCubeEnv
from rlchain.core.policies import ActorCritic
from rlchain.run.trainer import Trainer
from rlchain.settings import SettingError

GAMMA = 0.9


def _rollouts(seed: int = 0, count: int = 3, steps: int = 7, envs: int = 4):
    """Random rewards and episode ends; env 3 never ends its episode (its return runs across every rollout)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        reward = torch.randn(steps, envs, generator=g) * 3 + 1
        done = torch.rand(steps, envs, generator=g) < 0.25
        done[:, 3] = False
        done[-1, 0] = True  # an episode cut exactly at a rollout's end
        out.append((reward, done))
    return out


def _reference(rollouts, clip=None, eps=1e-8):
    """One env and one step at a time: R = r + gamma * R, set to 0 after an episode's last step; each rollout's
    rewards divided by the std (population, not centred on... its own mean: np.var) of every R collected so far."""
    envs = rollouts[0][0].shape[1]
    running = [0.0] * envs
    seen: list[float] = []
    scaled_rollouts = []
    for reward, done in rollouts:
        for t in range(reward.shape[0]):
            for i in range(envs):
                running[i] = float(reward[t, i]) + GAMMA * running[i]
                seen.append(running[i])
                if done[t, i]:
                    running[i] = 0.0
        mean = sum(seen) / len(seen)
        var = sum((x - mean) ** 2 for x in seen) / len(seen)
        scaled = reward.double() / math.sqrt(var + eps)
        scaled_rollouts.append(scaled.clamp(-clip, clip) if clip is not None else scaled)
    return scaled_rollouts


@pytest.mark.parametrize("clip", [None, 0.5])
def test_rewards_are_scaled_by_the_std_of_every_discounted_return_so_far(clip):
    rollouts = _rollouts()
    scaler = RewardScaler(GAMMA, clip)
    for (reward, done), expected in zip(rollouts, _reference(rollouts, clip)):
        torch.testing.assert_close(scaler(reward, done).double(), expected, rtol=1e-5, atol=1e-6)
    assert scaler.returns[0] == 0 and scaler.returns[3] != 0  # env 0 ended at the last step; env 3 runs on


def test_identical_returns_scale_by_the_floor_not_by_infinity():
    scaler = RewardScaler(GAMMA)
    reward, done = torch.zeros(5, 2), torch.ones(5, 2, dtype=torch.bool)
    assert torch.equal(scaler(reward, done), torch.zeros(5, 2))  # var 0: 0 / sqrt(eps), no NaN


def test_the_scaler_round_trips_through_the_algorithms_checkpoint_state():
    env = PushCubeEnv(num_envs=4)
    rollouts = _rollouts(envs=4)

    def ppo():
        return PPO(ActorCritic(env.single_observation_space, env.single_action_space), reward_norm=True, gamma=GAMMA)

    a = ppo()
    for reward, done in rollouts[:2]:
        a.reward_scaler(reward, done)
    b = ppo()
    b.load_state_dict(a.state_dict())
    b.load_rank_state_dict(a.rank_state_dict())
    reward, done = rollouts[2]
    assert torch.equal(a.reward_scaler(reward, done), b.reward_scaler(reward, done))


def test_reward_clip_needs_reward_norm():
    env = PushCubeEnv(num_envs=4)
    policy = ActorCritic(env.single_observation_space, env.single_action_space)
    with pytest.raises(SettingError, match=r"reward_clip=5.0 is not allowed with reward_norm=False"):
        PPO(policy, reward_clip=5.0)


def _trainer(tmp_path, iterations, resume_from=None):
    torch.manual_seed(3)
    env = PushCubeEnv(num_envs=16, seed=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[32, 32])
    algo = PPO(policy, batch_size=128, n_epochs=2, seed=3, reward_norm=True, reward_clip=10.0)
    return Trainer(
        env,
        policy,
        algo,
        iterations=iterations,
        rollout_steps=16,
        save_freq=100,
        output_dir=str(tmp_path),
        seed=3,
        progress=False,
        fresh_eval=False,
        resume_from=resume_from,
    )


def test_a_resumed_run_continues_the_return_estimate_exactly(tmp_path):
    """2 iterations, then a resume to 3, end where 3 straight iterations end: the statistics, each env's
    carried return and the policy; the logged episode returns stay in the env's units."""
    straight = _trainer(tmp_path / "a", 3)
    straight.train()
    _trainer(tmp_path / "b", 2).train()
    resumed = _trainer(tmp_path / "c", 3, resume_from=str(tmp_path / "b" / "checkpoints" / "latest.pt"))
    resumed.train()
    a, b = straight.algorithm.reward_scaler, resumed.algorithm.reward_scaler
    assert torch.equal(a.rms.var, b.rms.var) and torch.equal(a.rms.count, b.rms.count) and a.rms.count == 3 * 16 * 16
    assert torch.equal(a.returns, b.returns)
    for (name, x), y in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(x, y), name
    assert straight.last_train["losses/return_std"] == pytest.approx(a.std)


def test_the_update_leaves_the_rollouts_rewards_in_the_envs_units():
    """What the collector logs (episode returns) and keeps comes from the env's rewards: the update scales a copy."""
    torch.manual_seed(0)
    env = PushCubeEnv(num_envs=8, seed=0)
    policy = ActorCritic(env.single_observation_space, env.single_action_space)
    data = SyncCollector(env, policy, 8).collect().data
    before = data["reward"].clone()
    stats = PPO(policy, reward_norm=True, batch_size=64).update(data)
    assert torch.equal(data["reward"], before)
    assert stats["return_std"] != pytest.approx(1.0, abs=0.05)  # the rewards the update learnt from were scaled
