"""RL core: advantage maths, losses, policies, collector, checkpoints, trainer."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode

from rlchain.algorithms import GRPO, PPO, NonFiniteError
from rlchain.algorithms.functional import (
    compute_gae,
    discounted_returns,
    first_done_mask,
    group_relative_advantages,
)
from rlchain.algorithms.ppo import ppo_loss
from rlchain.collector import EpisodeWindow, SyncCollector
from rlchain.envs import CartPoleEnv, GymVecEnv, PushCubeEnv
from rlchain.envs.base import NON_FINITE_ACTION
from rlchain.evaluation import evaluate
from rlchain.policies import ActorCritic, ActorOnly, bounded
from rlchain.trainer import Trainer
from rlchain.summary import RunSummary
from rlchain.train import ConfigError, build

sys.path.insert(0, str(Path(__file__).parent))
from conftest import run_cli  # noqa: E402
from toy_env import LineEnv  # noqa: E402


# --------------------------------------------------------------- GAE / GRPO
def reference_gae(reward, value, next_value, terminated, truncated, gamma, lam):
    """Plain per-env, per-step loop: bootstrap on truncation, not on termination."""
    T, N = reward.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, n]:
                delta = reward[t, n] - value[t, n]
                running = delta
            elif truncated[t, n]:
                delta = reward[t, n] + gamma * next_value[t, n] - value[t, n]
                running = delta
            else:
                delta = reward[t, n] + gamma * next_value[t, n] - value[t, n]
                running = delta + gamma * lam * running
            adv[t, n] = running
    return adv


def test_gae_matches_a_reference_loop_with_terminations_and_truncations():
    gen = torch.Generator().manual_seed(0)
    T, N = 17, 6
    reward = torch.randn(T, N, generator=gen, dtype=torch.float64)
    value = torch.randn(T, N, generator=gen, dtype=torch.float64)
    next_value = torch.randn(T, N, generator=gen, dtype=torch.float64)
    u = torch.rand(T, N, generator=gen)
    terminated, truncated = u < 0.1, (u >= 0.1) & (u < 0.2)
    assert terminated.any() and truncated.any()
    adv, ret = compute_gae(reward, value, next_value, terminated, terminated | truncated, 0.97, 0.9)
    expected = reference_gae(reward, value, next_value, terminated, truncated, 0.97, 0.9)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + value)


def test_gae_hand_computed_two_steps():
    # Step 0 continues, step 1 is truncated: bootstrap from V(final_obs) = 2.
    r = torch.tensor([[1.0], [0.5]])
    v = torch.tensor([[0.2], [0.4]])
    nv = torch.tensor([[0.4], [2.0]])
    term = torch.tensor([[False], [False]])
    done = torch.tensor([[False], [True]])
    adv, _ = compute_gae(r, v, nv, term, done, gamma=0.9, gae_lambda=0.5)
    d1 = 0.5 + 0.9 * 2.0 - 0.4
    d0 = 1.0 + 0.9 * 0.4 - 0.2
    assert adv[1, 0].item() == pytest.approx(d1)
    assert adv[0, 0].item() == pytest.approx(d0 + 0.9 * 0.5 * d1)
    # Terminated instead: no bootstrap.
    adv, _ = compute_gae(r, v, nv, done, done, gamma=0.9, gae_lambda=0.5)
    assert adv[1, 0].item() == pytest.approx(0.5 - 0.4)


def test_grpo_advantages_by_hand_with_masks_and_groups():
    # T=3, N=4, two groups of 2.
    reward = torch.tensor([[1.0, 0.0, 2.0, 2.0], [1.0, 3.0, 0.0, 1.0], [1.0, 1.0, 4.0, 0.0]])
    done = torch.tensor([[False, False, False, True], [False, True, False, False], [True, False, False, False]])
    gamma = 0.5
    returns = discounted_returns(reward, done, gamma)
    # env0: R2=1, R1=1+.5*1=1.5, R0=1+.5*1.5=1.75; env1: R2=1, R1=3 (done), R0=0+.5*3=1.5
    # env2: R2=4, R1=0+2=2, R0=2+1=3; env3: R2=0, R1=1, R0=2 (done at 0)
    torch.testing.assert_close(returns, torch.tensor([[1.75, 1.5, 3.0, 2.0], [1.5, 3.0, 2.0, 1.0], [1.0, 1.0, 4.0, 0.0]]))
    mask = first_done_mask(done)
    torch.testing.assert_close(mask, torch.tensor([[True, True, True, True], [True, True, True, False], [True, False, True, False]]))
    adv = group_relative_advantages(returns, mask, group_size=2, eps=0.0)
    # t0 group0: 1.75 vs 1.5 -> mean 1.625, std .125 -> +1, -1; group1: 3 vs 2 -> +1, -1
    # t1 group0: 1.5 vs 3 -> -1, +1; group1: only env2 alive -> 0, masked 0
    # t2 group0: only env0 -> 0; group1: only env2 -> 0
    expected = torch.tensor([[1.0, -1.0, 1.0, -1.0], [-1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)


@pytest.mark.parametrize("group_size", [3, 6, 8])
def test_identical_returns_carry_no_signal(group_size):
    # Reward 1 every step (cart_pole) gives bit-identical returns within a group; their
    # mean's rounding residue over an equally tiny std used to come out as |A| ~ 1.
    returns = discounted_returns(torch.ones(100, 8 * group_size), torch.zeros(100, 8 * group_size, dtype=torch.bool), 0.99)
    mask = torch.ones_like(returns, dtype=torch.bool)
    for norm in ("std", "none", "rollout_std"):
        assert torch.equal(group_relative_advantages(returns, mask, group_size, norm=norm), torch.zeros_like(returns))


def reference_group_advantages(returns, mask, group_size, eps, norm):
    """Plain loops over steps and groups: centre on the live members' mean, then scale."""
    T, N = returns.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for t in range(T):
        for g in range(0, N, group_size):
            live = [n for n in range(g, g + group_size) if mask[t, n]]
            values = [float(returns[t, n]) for n in live]
            if len(values) < 2 or max(values) == min(values):
                continue
            mean = sum(values) / len(values)
            std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
            for n, v in zip(live, values):
                adv[t, n] = (v - mean) / (std + eps) if norm == "std" else v - mean
    if norm == "rollout_std":
        live = adv != 0
        adv[live] /= adv[live].pow(2).mean().sqrt() + eps
    return adv


@pytest.mark.parametrize("norm", ["std", "none", "rollout_std"])
def test_group_advantages_match_a_reference_loop(norm):
    gen = torch.Generator().manual_seed(0)
    reward = torch.randint(0, 3, (12, 16), generator=gen).float()  # ties inside groups happen
    done = torch.rand(12, 16, generator=gen) < 0.15
    returns, mask = discounted_returns(reward, done, 0.9), first_done_mask(done)
    adv = group_relative_advantages(returns, mask, 4, eps=1e-8, norm=norm)
    torch.testing.assert_close(adv.double(), reference_group_advantages(returns, mask, 4, 1e-8, norm), atol=1e-5, rtol=1e-5)


def test_grpo_reference_policy_is_frozen_with_its_observation_normaliser():
    # The reference used to share the live normaliser: with kl_coef > 0 it drifted as the statistics moved.
    env = LineEnv(num_envs=8)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8], obs_normalization=True)
    policy.update_obs_normalizer(torch.randn(64, 2))
    grpo = GRPO(policy, kl_coef=0.02, group_size=4)
    batch = TensorDict({"obs": torch.randn(16, 2), "action": torch.randn(16, 1)}, batch_size=[16])
    before = grpo.ref_policy.evaluate_actions(batch)["sample_log_prob"]
    policy.update_obs_normalizer(torch.randn(64, 2) * 5 + 3)  # the live statistics move
    torch.testing.assert_close(grpo.ref_policy.evaluate_actions(batch)["sample_log_prob"], before)
    assert not torch.equal(policy.obs_normalizer.mean, grpo.ref_policy.obs_normalizer.mean)


# --------------------------------------------------------------- PPO loss
def test_ppo_loss_terms_on_a_fixed_batch():
    batch = TensorDict(
        {
            "sample_log_prob": torch.log(torch.tensor([0.5, 0.5, 0.5])),
            "value": torch.tensor([1.0, 0.0, 2.0]),
            "advantages": torch.tensor([1.0, -1.0, 2.0]),
            "returns": torch.tensor([1.5, 0.5, 1.0]),
        },
        batch_size=[3],
    )
    new = TensorDict(
        {
            "sample_log_prob": torch.log(torch.tensor([0.75, 0.25, 0.5])),  # ratios 1.5, 0.5, 1.0
            "entropy": torch.tensor([1.0, 2.0, 3.0]),
            "value": torch.tensor([1.4, 0.1, 1.5]),
        },
        batch_size=[3],
    )
    out = ppo_loss(new, batch, clip_coef=0.2, clip_vloss=True, vf_coef=0.5, ent_coef=0.01)
    # surrogate: max(-A r, -A clip(r)): [max(-1.5,-1.2), max(.5,.8), max(-2,-2)] = [-1.2, .8, -2]
    assert out["policy_loss"].item() == pytest.approx((-1.2 + 0.8 - 2.0) / 3)
    # values: unclipped sq err [.01, .16, .25]; clipped values [1.2, .1, 1.8] -> [.09, .16, .64]
    assert out["value_loss"].item() == pytest.approx(0.5 * (0.09 + 0.16 + 0.64) / 3)
    assert out["entropy"].item() == pytest.approx(2.0)
    assert out["clipfrac"].item() == pytest.approx(2 / 3)
    r = torch.tensor([1.5, 0.5, 1.0])
    assert out["approx_kl"].item() == pytest.approx(((r - 1) - r.log()).mean().item())
    assert out["loss"].item() == pytest.approx(
        out["policy_loss"].item() + 0.5 * out["value_loss"].item() - 0.01 * 2.0
    )


# --------------------------------------------------------------- policies
def test_gaussian_policy_matches_torch_distributions():
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-1, 1, (5,), np.float32)
    act_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    policy = ActorCritic(obs_space, act_space, hidden_sizes=[16], init_log_std=-0.3)
    td = TensorDict({"obs": torch.randn(7, 5)}, batch_size=[7])
    out = policy.get_action(td.clone())
    mean = policy.actor(td["obs"])
    dist = torch.distributions.Normal(mean, torch.full_like(mean, math.exp(-0.3)))
    torch.testing.assert_close(out["sample_log_prob"], dist.log_prob(out["action"]).sum(-1))
    ev = policy.evaluate_actions(out)
    torch.testing.assert_close(ev["sample_log_prob"], out["sample_log_prob"])
    torch.testing.assert_close(ev["entropy"], dist.entropy().sum(-1))
    torch.testing.assert_close(ev["value"], policy.critic(td["obs"]).squeeze(-1))
    det = policy.get_action(td.clone(), deterministic=True)
    torch.testing.assert_close(det["action"], mean)


def test_categorical_policy_matches_torch_distributions():
    torch.manual_seed(0)
    policy = ActorCritic(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(5), hidden_sizes=[8])
    td = TensorDict({"obs": torch.randn(9, 4)}, batch_size=[9])
    out = policy.get_action(td.clone())
    assert out["action"].dtype == torch.int64 and out["action"].shape == (9,)
    dist = torch.distributions.Categorical(logits=policy.actor(td["obs"]))
    torch.testing.assert_close(out["sample_log_prob"], dist.log_prob(out["action"]))
    torch.testing.assert_close(policy.evaluate_actions(out)["entropy"], dist.entropy())
    assert torch.equal(policy.get_action(td.clone(), True)["action"], dist.probs.argmax(-1))


def test_get_action_is_the_one_method_collection_and_evaluation_call():
    # A user's policy overrides get_action (or only has it, duck-typed): the
    # collector and the evaluation act through it, and nothing else.
    spaces = (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))  # LineEnv's

    class Braking(ActorCritic):  # overrides get_action only
        def get_action(self, td, deterministic=False):
            td = super().get_action(td, deterministic)
            td["action"] = torch.zeros_like(td["action"])
            return td

    class TensorDictOnly(torch.nn.Module):  # not a Policy: get_action and get_value only
        has_critic = False

        def get_action(self, td, deterministic=False):
            n = td.batch_size[0]
            return td.update({"action": torch.full((n, 1), 0.5), "sample_log_prob": torch.zeros(n), "value": torch.zeros(n)})

    for policy, expected in ((Braking(*spaces, hidden_sizes=[8]), 0.0), (TensorDictOnly(), 0.5)):
        env = LineEnv(num_envs=4)
        rollout = SyncCollector(env, policy, rollout_steps=3).collect().data
        assert rollout["action"].unique().tolist() == [expected]
        seen = []
        original = policy.get_action
        policy.get_action = lambda td, deterministic=False: seen.append(deterministic) or original(td, deterministic)
        evaluate(LineEnv(num_envs=4, max_episode_steps=3), policy, num_episodes=4, seed=0)
        assert seen and all(seen)  # evaluation acts deterministically, through get_action
    assert not hasattr(ActorCritic, "act")


def test_actor_only_has_no_critic_and_zero_value():
    policy = ActorOnly(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32))
    assert policy.critic is None
    out = policy.get_action(TensorDict({"obs": torch.randn(3, 4)}, batch_size=[3]))
    assert torch.equal(out["value"], torch.zeros(3))
    with pytest.raises(ValueError, match="has no critic"):
        PPO(policy)


def test_log_std_is_clamped():
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32), log_std_max=0.5)
    with torch.no_grad():
        policy.log_std.fill_(3.0)
    ev = policy.evaluate_actions(TensorDict({"obs": torch.zeros(1, 2), "action": torch.zeros(1, 1)}, batch_size=[1]))
    assert ev["entropy"].item() == pytest.approx(0.5 + 0.5 * math.log(2 * math.pi) + 0.5)


@pytest.mark.parametrize("start", [-3.0, 2.0])
def test_a_log_std_past_its_bound_can_come_back(start):
    # log_std bounded to [-1, 1] but carried past a bound (by an optimiser
    # step, or Adam's momentum): a loss whose optimum is inside the range
    # (log_std = 0) must bring it back; a loss that wants it further out must
    # not move it.
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32),
                         init_log_std=0.0, log_std_min=-1.0, log_std_max=1.0)  # fmt: skip
    td = TensorDict({"obs": torch.zeros(4, 2), "action": torch.zeros(4, 1)}, batch_size=[4])
    entropy_at_0 = 0.5 * math.log(2 * math.pi * math.e)  # Gaussian entropy = log_std + this
    entropy = lambda: policy.evaluate_actions(td)["entropy"].mean()  # noqa: E731
    with torch.no_grad():
        policy.log_std.fill_(start)
    optimizer = torch.optim.Adam([policy.log_std], lr=0.05)
    for _ in range(200):
        optimizer.zero_grad()
        (entropy() - entropy_at_0).square().backward()
        optimizer.step()
    assert abs(policy.log_std.item()) < 0.05
    with torch.no_grad():
        policy.log_std.fill_(start)
    policy.zero_grad()
    (entropy() * (1.0 if start < 0 else -1.0)).backward()  # falls as log_std moves further out
    assert policy.log_std.grad.item() == 0.0


def test_bounded_has_the_plain_gradient_inside_its_range():
    x = torch.tensor([-0.5, 0.0, 0.7], requires_grad=True)
    bounded(x, -1.0, 1.0).exp().sum().backward()
    torch.testing.assert_close(x.grad, x.detach().exp())


def test_obs_normalizer_tracks_mean_and_var_and_is_in_the_state_dict():
    policy = ActorCritic(gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32), obs_normalization=True)
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(1000, 3, generator=gen) * torch.tensor([1.0, 2.0, 0.5]) + torch.tensor([3.0, -1.0, 0.0])
    for chunk in data.split(100):
        policy.update_obs_normalizer(chunk)
    torch.testing.assert_close(policy.obs_normalizer.mean, data.mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy.obs_normalizer.var, data.var(0, unbiased=False), atol=1e-4, rtol=1e-4)
    state = policy.state_dict()
    assert {"obs_normalizer.mean", "obs_normalizer.var", "obs_normalizer.count"} <= set(state)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(activation="swish"), "activation='swish'"),
        (dict(hidden_sizes=[64, 0]), r"hidden_sizes\[1\]=0"),
        (dict(init_log_std=3.0), "init_log_std=3.0"),
    ],
)
def test_bad_policy_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32), **kwargs)


# --------------------------------------------------------------- collector
class SyncCounter(TorchDispatchMode):
    """Counts aten ops that read a device value on the host (a host-device sync on CUDA)."""

    SYNC_OPS = {
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.nonzero.default,
        torch.ops.aten.is_nonzero.default,
        torch.ops.aten.equal.default,
        torch.ops.aten.masked_select.default,
        torch.ops.aten.unique_consecutive.default,
    }

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.SYNC_OPS or (func.overloadpacket is torch.ops.aten.index and args[1] and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
        )):
            self.count += 1
        return func(*args, **(kwargs or {}))


def syncs_per_collect(rollout_steps: int) -> int:
    env = LineEnv(num_envs=8, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    collector = SyncCollector(env, policy, rollout_steps)
    collector.collect()  # first call resets; count a steady-state one
    with SyncCounter() as counter:
        collector.collect()
    return counter.count


def test_collector_has_no_host_sync_per_step():
    # The rollout-end statistics read a fixed number of values; the step loop none.
    assert syncs_per_collect(4) == syncs_per_collect(32)
    assert syncs_per_collect(4) > 0  # the counter does see the end-of-rollout reads


def test_collector_bootstraps_truncations_from_final_obs_only():
    torch.manual_seed(0)
    env = LineEnv(num_envs=16, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    rollout = SyncCollector(env, policy, rollout_steps=12).collect().data
    truncated, done = rollout["truncated"], rollout["done"]
    assert truncated.any() and rollout["terminated"].any()
    with torch.no_grad():
        v_final = policy.critic(rollout["final_obs"]).squeeze(-1)
    torch.testing.assert_close(rollout["next_value"], v_final)
    # Where the env reset, the stored next state is the final one, not the reset one.
    reset_obs = rollout["obs"][1:][done[:-1]]
    assert not torch.allclose(rollout["final_obs"][:-1][done[:-1]], reset_obs)
    # GAE: a truncated step's target uses next_value, a terminated one does not.
    adv, _ = compute_gae(rollout["reward"], rollout["value"], rollout["next_value"], rollout["terminated"], done, 0.9, 1.0)
    t, n = torch.nonzero(truncated)[0].tolist()
    expected = rollout["reward"][t, n] + 0.9 * v_final[t, n] - rollout["value"][t, n]
    assert adv[t, n].item() == pytest.approx(expected.item(), abs=1e-6)


def test_collector_reads_final_obs_only_on_done_rows():
    # An env that follows the contract to the letter: final_obs carries
    # meaning on done rows only (here zeros elsewhere, as a user converting
    # gymnasium's None entries would write). Running episodes must bootstrap
    # from the next observation, not from those zeros.
    class FinalObsOnDoneRowsOnly(LineEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            info["final_obs"] = torch.where((terminated | truncated)[:, None], info["final_obs"], 0.0)
            return obs, reward, terminated, truncated, info

    torch.manual_seed(0)
    env = FinalObsOnDoneRowsOnly(num_envs=16, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    collector = SyncCollector(env, policy, rollout_steps=12)
    rollout = collector.collect().data
    done = rollout["done"]
    assert done.any() and (~done).any()
    next_obs = torch.cat((rollout["obs"][1:], collector._obs[None]))  # the state each transition moved to
    s_prime = torch.where(done[..., None], rollout["final_obs"], next_obs)
    with torch.no_grad():
        expected = policy.critic(s_prime).squeeze(-1)
    torch.testing.assert_close(rollout["next_value"], expected)
    # and so GAE equals the reference loop on the true next states
    adv, _ = compute_gae(rollout["reward"], rollout["value"], rollout["next_value"], rollout["terminated"], done, 0.9, 0.8)
    ref = reference_gae(rollout["reward"], rollout["value"], expected, rollout["terminated"], rollout["truncated"], 0.9, 0.8)
    torch.testing.assert_close(adv.double(), ref, atol=1e-5, rtol=1e-5)


def test_collector_stores_each_step_and_counts_episodes_across_rollouts():
    # Step the env by hand next to the collector (same seed, same actions) and
    # keep the episode sums the plain way; episodes span rollout boundaries.
    torch.manual_seed(0)
    env, twin = LineEnv(num_envs=6, max_episode_steps=3), LineEnv(num_envs=6, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    collector = SyncCollector(env, policy, rollout_steps=5)
    window = EpisodeWindow(min_episodes=4)
    twin_obs, _ = twin.reset()
    ret, length, finished = torch.zeros(6, dtype=torch.float64), torch.zeros(6, dtype=torch.int64), []
    for _ in range(3):
        result = collector.collect()
        rollout = result.data.clone()
        window.add(result.episodes)
        from_here = len(finished)
        for t in range(5):
            assert torch.equal(rollout["obs"][t], twin_obs)
            twin_obs, reward, terminated, truncated, info = twin.step(rollout["action"][t])
            done = terminated | truncated
            ret, length = ret + reward, length + 1
            for key, value in (("reward", reward), ("terminated", terminated), ("truncated", truncated),
                               ("done", done), ("final_obs", info["final_obs"]), ("success", info["success"]),
                               ("episode_return", ret), ("episode_length", length)):  # fmt: skip
                torch.testing.assert_close(rollout[key][t], value, msg=f"{key} at step {t}")
            finished += ret[done].tolist()
            ret, length = ret.masked_fill(done, 0.0), length.masked_fill(done, 0)
        assert result.episodes.returns == pytest.approx(finished[from_here:])
        # the window: this rollout's episodes, topped up with earlier ones to at least 4
        assert window.returns == pytest.approx(finished[-max(4, len(finished) - from_here):])
    assert len(finished) > 6


def test_collector_copies_each_step_so_an_env_may_reuse_its_buffers():
    # An env that returns the same obs/reward/flag tensors every step, overwritten
    # in place (as simulators with preallocated buffers do): the rollout must hold
    # each step's values, as stepping a twin env that returns fresh tensors shows.
    class ReusesItsBuffers(LineEnv):
        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed, options=options)
            self.obs_buf = obs.clone()
            return self.obs_buf, info

        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            if not hasattr(self, "step_bufs"):
                self.step_bufs = (reward.clone(), terminated.clone(), truncated.clone())
            self.obs_buf.copy_(obs)
            for buf, value in zip(self.step_bufs, (reward, terminated, truncated)):
                buf.copy_(value)
            return self.obs_buf, *self.step_bufs, info

    torch.manual_seed(0)
    env, twin = ReusesItsBuffers(num_envs=6, max_episode_steps=3), LineEnv(num_envs=6, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    rollout = SyncCollector(env, policy, rollout_steps=7).collect().data
    twin_obs, _ = twin.reset()
    for t in range(7):
        assert torch.equal(rollout["obs"][t], twin_obs), t
        twin_obs, reward, terminated, truncated, _ = twin.step(rollout["action"][t])
        assert torch.equal(rollout["reward"][t], reward) and torch.equal(rollout["terminated"][t], terminated)
        assert torch.equal(rollout["truncated"][t], truncated), t


def test_collector_rejects_reward_terms_that_come_and_go():
    class FlakyTerms(LineEnv):
        def step(self, action):
            out = super().step(action)
            if int(self.t[0]) % 2 == 0:
                out[4]["rewards"] = {}
            return out

    env = FlakyTerms(num_envs=4, max_episode_steps=50)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    with pytest.raises(ValueError, match=r"info\['rewards'\]\['progress'\] is missing at some step"):
        SyncCollector(env, policy, rollout_steps=4).collect()


def test_collector_group_reset_and_episode_stats():
    env = LineEnv(num_envs=8, max_episode_steps=4)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    collector = SyncCollector(env, policy, rollout_steps=4, reset_options={"group_size": 4})
    for _ in range(2):  # every rollout starts from a group reset
        result = collector.collect()
        rollout = result.data
        first = rollout["obs"][0, :, 0].view(2, 4)
        assert torch.equal(first, first[:, :1].expand(2, 4)) and first[0, 0] != first[1, 0]
        assert torch.equal(rollout["episode_length"][0], torch.ones(8, dtype=torch.int64))
    window = EpisodeWindow(min_episodes=100)
    window.add(result.episodes)
    stats = window.means(success=True)
    assert 0.0 <= stats["charts/success_rate"] <= 1.0 and 1 <= stats["charts/episodic_length"] <= 4
    assert "rewards/progress" in result.term_means and "metrics/distance" in result.term_means


# --------------------------------------------------------------- algorithms
def test_grpo_rejects_bad_group_sizes_before_any_step(tmp_path):
    env = PushCubeEnv(num_envs=64)
    policy = ActorOnly(env.single_observation_space, env.single_action_space)
    with pytest.raises(ValueError, match="group_size=1 .*>= 2"):
        GRPO(policy, group_size=1)
    algo = GRPO(policy, group_size=3)
    steps_before = env.elapsed_steps.clone()
    with pytest.raises(ValueError, match="group_size=3 .*num_envs=64"):
        Trainer(env, policy, algo, output_dir=str(tmp_path))
    assert torch.equal(env.elapsed_steps, steps_before) and not any(tmp_path.iterdir())


def test_grpo_rejects_rollouts_shorter_than_an_episode_naming_both(tmp_path):
    # GRPO resets every env when a rollout starts: a 100-step rollout on
    # 500-step episodes only ever sees failed episodes end (success 0 while
    # evaluation returns 500). It is refused before any step, naming both values.
    proc = run_cli(["algorithm=grpo", "env=cart_pole", "trainer.rollout_steps=100", "device=cpu"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "trainer.rollout_steps=100" in line and "max_episode_steps=500" in line and "rollout_steps >= 500" in line
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    assert not (run_dir / "metrics.jsonl").exists()
    # a rollout of a whole episode is accepted, and PPO (no reset per rollout) is not concerned
    env = CartPoleEnv(num_envs=8, max_episode_steps=20)
    for algorithm, rollout_steps in ((GRPO, 20), (PPO, 5)):
        policy = ActorCritic(env.single_observation_space, env.single_action_space)
        Trainer(env, policy, algorithm(policy), rollout_steps=rollout_steps, output_dir=str(tmp_path / algorithm.__name__))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(clip_coef=-1.0), "clip_coef=-1.0"),
        (dict(gamma=1.5), "gamma=1.5"),
        (dict(lr_schedule="cosine"), "lr_schedule='cosine'"),
        (dict(lr_schedule="linear"), "total_iterations=None"),
        (dict(lr_schedule="adaptive"), "target_kl=None"),
        (dict(n_epochs=0), "n_epochs=0"),
    ],
)
def test_bad_ppo_hyperparameters(kwargs, match):
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))
    with pytest.raises(ValueError, match=match):
        PPO(policy, **kwargs)


def test_lr_schedules():
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))
    env = LineEnv(num_envs=8)
    rollout = SyncCollector(env, policy, 4).collect().data
    linear = PPO(policy, learning_rate=1e-3, lr_schedule="linear", total_iterations=4, batch_size=16, n_epochs=1)
    lrs = [linear.update(rollout)["learning_rate"] for _ in range(4)]
    assert lrs == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    adaptive = PPO(policy, learning_rate=1e-3, lr_schedule="adaptive", target_kl=1.0, batch_size=16, n_epochs=1)
    # The KL of one small update is far below target/2: the rate grows by 1.5 once per update.
    assert adaptive.update(rollout)["learning_rate"] == pytest.approx(1e-3 * 1.5)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_the_adaptive_rate_follows_the_kl_the_update_caused(algo):
    # One minibatch and one epoch: before its step the policy is the rollout
    # policy, so the KL it sees is 0. The update itself moves the policy by far
    # more than a target of 1e-9: the rate must fall, not grow.
    torch.manual_seed(0)
    env = LineEnv(num_envs=8)
    make = ActorCritic if algo == "ppo" else ActorOnly
    # The update ends by folding the rollout into the observation statistics;
    # update_kl is the KL of the optimiser steps, so compare without them.
    policy = make(env.single_observation_space, env.single_action_space, hidden_sizes=[8], obs_normalization=False)
    rollout = SyncCollector(env, policy, 4).collect().data
    if algo == "ppo":
        algorithm = PPO(policy, learning_rate=1e-3, lr_schedule="adaptive", target_kl=1e-9, batch_size=32, n_epochs=1)
    else:
        algorithm = GRPO(policy, learning_rate=1e-3, lr_schedule="adaptive", target_kl=1e-9, batch_size=32, n_epochs=1,
                         group_size=4)  # fmt: skip
        env = LineEnv(num_envs=8, max_episode_steps=4)  # a GRPO rollout holds a whole episode
        rollout = SyncCollector(env, policy, 4, reset_options={"group_size": 4}).collect().data
    stats = algorithm.update(rollout)
    assert stats["learning_rate"] == pytest.approx(1e-3 / 1.5)
    # update_kl is the KL from the rollout policy to the updated one over the (live) samples
    with torch.no_grad():
        new_log_prob = policy.evaluate_actions(rollout.reshape(-1))["sample_log_prob"]
    log_ratio = new_log_prob - rollout.reshape(-1)["sample_log_prob"]
    kl = (log_ratio.exp() - 1) - log_ratio
    if algo == "grpo":
        live = algorithm.advantages(rollout)[1].reshape(-1)
        kl = kl[live]
    assert stats["update_kl"] == pytest.approx(kl.mean().item(), rel=1e-2) and stats["update_kl"] > 1e-9


def test_explained_variance_of_constant_returns_is_nan():
    # gamma = 0 and a constant reward make every return 1; the old values vary.
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))
    rollout = SyncCollector(LineEnv(num_envs=8), policy, 4).collect().data.clone()
    rollout["reward"].fill_(1.0)
    rollout["value"].copy_(torch.linspace(-1, 1, 32).view(4, 8))
    stats = PPO(policy, gamma=0.0, batch_size=32, n_epochs=1).update(rollout)
    assert math.isnan(stats["explained_variance"])
    rollout["reward"].copy_(torch.arange(32.0).view(4, 8))  # varying returns: a finite value
    assert math.isfinite(PPO(policy, gamma=0.0, batch_size=32, n_epochs=1).update(rollout)["explained_variance"])


def test_ppo_stops_epochs_at_target_kl():
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))
    rollout = SyncCollector(LineEnv(num_envs=8), policy, 8).collect().data
    algo = PPO(policy, learning_rate=0.05, n_epochs=50, batch_size=16, target_kl=1e-4, stop_at_target_kl=True)
    assert algo.update(rollout)["epochs"] < 50


def test_non_finite_loss_stops_the_run_naming_the_iteration_and_keeps_the_checkpoint(tmp_path):
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(env, policy, PPO(policy, batch_size=16), iterations=3, rollout_steps=4, save_freq=1,
                      output_dir=str(tmp_path), progress=False)  # fmt: skip
    trainer.train()  # 3 good iterations, checkpoint at the end
    good = (tmp_path / "checkpoints" / "latest.pt").read_bytes()
    trainer.cfg.iterations = 5
    with torch.no_grad():
        policy.critic[0].weight.fill_(float("nan"))
    with pytest.raises(RuntimeError, match=r"non-finite loss at iteration 4 \(nan\); last good checkpoint: .*latest.pt"):
        trainer.train()
    assert (tmp_path / "checkpoints" / "latest.pt").read_bytes() == good
    summary = RunSummary.read(tmp_path)
    assert summary.status == "failed" and "iteration 4" in summary.error


class FailingPPO(PPO):
    """PPO whose update raises at its ``fail_at``-th call, as a CUDA out-of-memory error would."""

    def __init__(self, policy, fail_at: int, **kwargs):
        super().__init__(policy, **kwargs)
        self.calls, self.fail_at = 0, fail_at

    def update(self, rollout):
        self.calls += 1
        if self.calls == self.fail_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().update(rollout)


def test_any_error_during_training_is_recorded_and_reraised(tmp_path):
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(env, policy, FailingPPO(policy, fail_at=3, batch_size=16), iterations=5, rollout_steps=4,
                      output_dir=str(tmp_path), progress=False)  # fmt: skip
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        trainer.train()
    summary = RunSummary.read(tmp_path)
    assert summary.status == "failed" and summary.iteration == 2
    assert summary.error == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [32, 64]  # the two good iterations were flushed


# --------------------------------------------------------------- trainer
def make_push_cube_ppo(tmp_path, iterations, resume_from=None, seed=3):
    torch.manual_seed(seed)
    env = PushCubeEnv(num_envs=32, seed=seed)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[32, 32], obs_normalization=True)
    algo = PPO(policy, batch_size=256, n_epochs=2, seed=seed)
    return Trainer(env, policy, algo, iterations=iterations, rollout_steps=16, save_freq=100,
                   output_dir=str(tmp_path), seed=seed, progress=False, resume_from=resume_from)  # fmt: skip


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    straight = make_push_cube_ppo(tmp_path / "a", iterations=3)
    straight.train()
    first = make_push_cube_ppo(tmp_path / "b", iterations=2)
    first.train()
    ckpt = tmp_path / "b" / "checkpoints" / "latest.pt"
    resumed = make_push_cube_ppo(tmp_path / "c", iterations=3, resume_from=str(ckpt))
    assert resumed.global_step == 2 * 32 * 16 and resumed.iteration == 2
    summary = resumed.train()
    assert summary.global_step == 3 * 32 * 16
    for (name, a), b in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(straight.env.cube_x, resumed.env.cube_x)


def test_resume_on_an_env_that_cannot_save_its_state_restarts_it_fresh(tmp_path, capsys):
    # gymnasium envs cannot save their state: after a resume the env starts
    # afresh, so the policy must act on the env's own observation and no
    # episode may be carried over from the checkpoint.
    def make(out, iterations, resume_from=None):
        env = GymVecEnv("Pendulum-v1", num_envs=4, seed=0)  # 200-step episodes: in progress at every checkpoint
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(env, policy, PPO(policy, batch_size=16), iterations=iterations, rollout_steps=8,
                       output_dir=str(out), progress=False, resume_from=resume_from)  # fmt: skip

    make(tmp_path / "a", iterations=2).train()
    capsys.readouterr()
    resumed = make(tmp_path / "b", iterations=3, resume_from=str(tmp_path / "a" / "checkpoints" / "latest.pt"))
    twin = GymVecEnv("Pendulum-v1", num_envs=4, seed=0)
    twin.reset()  # the saved run's one reset, at its first rollout
    fresh_obs, _ = twin.reset()  # the restarted env's reset draws the next seeds of the saved generator
    rollout = resumed.collector.collect().data
    assert torch.equal(rollout["obs"][0], fresh_obs)
    assert torch.equal(rollout["episode_length"], torch.arange(1, 9)[:, None].expand(8, 4))
    assert resumed.global_step == 2 * 8 * 4 and resumed.iteration == 2
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1 and "resumed from" in notice[0] and "GymVecEnv cannot restore its state" in notice[0]
    assert "every env reset" in notice[0]


class ScoredByEvaluation(LineEnv):
    """No success signal; every step of the k-th reset's episodes pays k, so evaluation k scores k * limit."""

    reports_success = False

    def reset(self, **kwargs):
        self.resets = getattr(self, "resets", 0) + 1
        return super().reset(**kwargs)

    def step(self, action):
        self.t = self.t + 1
        truncated = self.t >= self.max_episode_steps
        final_obs = self._obs()
        self._fresh(truncated, 1)
        never = torch.zeros_like(truncated)
        info = {"final_obs": final_obs, "success": never, "rewards": {}, "metrics": {}}
        return self._obs(), torch.full((self.num_envs,), float(self.resets)), never, truncated, info


@pytest.mark.parametrize("direction, best_eval", [("maximize", 4), ("minimize", 1)])
def test_best_checkpoint_follows_the_objective_and_its_direction(tmp_path, direction, best_eval):
    env = ScoredByEvaluation(num_envs=4, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(env, policy, PPO(policy, batch_size=8), eval_env=ScoredByEvaluation(num_envs=4, max_episode_steps=3),
                      iterations=4, rollout_steps=3, eval_freq=1, num_eval_envs=4, num_eval_episodes=4,
                      objective="eval/avg_reward", output_dir=str(tmp_path), progress=False,
                      **({} if direction == "maximize" else {"objective_direction": direction}))  # maximize: the default
    summary = trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/avg_reward"] for r in rows] == [3.0, 6.0, 9.0, 12.0]
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    assert best["global_step"] == 12 * best_eval and best["best_objective"] == 3.0 * best_eval
    assert summary.best_objective == 3.0 * best_eval and summary.best_objective_step == 12 * best_eval
    assert summary.objective_direction == direction


def test_a_task_without_success_logs_and_shows_no_success_rate(tmp_path, capsys):
    env = ScoredByEvaluation(num_envs=4, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    summary = Trainer(env, policy, PPO(policy, batch_size=8), eval_env=ScoredByEvaluation(num_envs=4, max_episode_steps=3),
                      iterations=2, rollout_steps=3, eval_freq=1, num_eval_envs=4, num_eval_episodes=4,
                      objective="eval/avg_reward", output_dir=str(tmp_path), progress=True).train()  # fmt: skip
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter ")]
    assert len(lines) == 2 and all("success" not in line and "eval return" in line for line in lines)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(not any("success" in key for key in row) for row in rows)
    assert "charts/episodic_return" in rows[-1] and "eval/avg_reward" in rows[-1]
    assert summary.best_eval_success_rate is None and "eval/success_rate" not in summary.final


def test_trainer_writes_the_run_directory(tmp_path):
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(env, policy, PPO(policy, batch_size=16), eval_env=lambda num_envs, seed: LineEnv(num_envs, seed=seed),
                      iterations=4, rollout_steps=4, eval_freq=2, save_freq=2, num_eval_envs=4, num_eval_episodes=6,
                      output_dir=str(tmp_path), progress=False, run_config={"algorithm": {"name": "ppo"}})  # fmt: skip
    summary = trainer.train()
    assert summary == RunSummary.read(tmp_path)
    assert summary.status == "completed" and summary.global_step == 4 * 8 * 4
    assert summary.objective == summary.final["eval/success_rate"]
    assert summary.final["eval/episodes"] == 8.0  # 6 rounded up to whole rounds of 4 envs
    assert set(summary.checkpoints) == {"latest", "best"}
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [32, 64, 96, 128]
    assert "eval/success_rate" in rows[1] and "eval/success_rate" not in rows[0]
    for key in ("charts/SPS", "losses/policy_loss", "losses/explained_variance", "losses/clipfrac", "charts/learning_rate", "rewards/progress", "metrics/distance"):
        assert key in rows[-1], key
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    state = torch.load(tmp_path / "checkpoints" / "latest.pt", weights_only=True)
    assert state["global_step"] == 128 and state["config"] == {"algorithm": {"name": "ppo"}}
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_wandb_mirrors_rows_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    Trainer(env, policy, PPO(policy, batch_size=16), iterations=2, rollout_steps=4, output_dir=str(tmp_path),
            progress=False, use_wandb=True, wandb_project="rlchain-test").train()  # fmt: skip
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_use_wandb_without_the_extra_names_it_before_any_step(compose_cfg, monkeypatch):
    # sys.modules[name] = None is Python's own way to make `import name` fail, as on a machine without wandb.
    monkeypatch.setitem(sys.modules, "wandb", None)
    cfg = compose_cfg(["trainer.use_wandb=true", "env.num_envs=8", "device=cpu"])
    with pytest.raises(ConfigError, match=r'^Invalid config: trainer.use_wandb=True needs wandb, an optional extra: '
                                          r'pip install "rlchain\[wandb\]"$'):  # fmt: skip
        build(cfg)
    assert not (Path(cfg.trainer.output_dir) / "metrics.jsonl").exists()


CTRL_C_SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
from toy_env import LineEnv
from rlchain.policies import ActorCritic
from rlchain.algorithms import PPO
from rlchain.trainer import Trainer
from rlchain.summary import RunSummary
env = LineEnv(num_envs=64)
policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[256, 256])
t = Trainer(env, policy, PPO(policy, batch_size=64, n_epochs=4), iterations=100000, rollout_steps=64,
            save_freq=100000, output_dir={out!r}, progress=True)
print(t.train().status, flush=True)
"""


def test_ctrl_c_saves_a_checkpoint_flushes_logs_and_exits_cleanly(tmp_path):
    script = CTRL_C_SCRIPT.format(tests=str(Path(__file__).parent), out=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == "interrupted"
    assert "stopping after this iteration" in err
    summary = RunSummary.read(tmp_path)
    assert summary.status == "interrupted"
    rows = metrics.read_text().splitlines()
    assert json.loads(rows[-1])["global_step"] == summary.global_step
    assert torch.load(tmp_path / "checkpoints" / "latest.pt", weights_only=True)["global_step"] == summary.global_step


# --------------------------------------------------------------- learning
def train_push_cube(tmp_path, policy_cls, make_algorithm, iterations: int, rollout_steps: int) -> tuple[float, float]:
    """Eval success rate before and after a short, seeded PushCube run."""
    from rlchain.trainer import evaluate

    torch.manual_seed(0)
    env = PushCubeEnv(num_envs=512, seed=0)
    policy = policy_cls(env.single_observation_space, env.single_action_space)
    trainer = Trainer(env, policy, make_algorithm(policy), eval_env=PushCubeEnv, iterations=iterations,
                      rollout_steps=rollout_steps, eval_freq=iterations, output_dir=str(tmp_path), progress=False)  # fmt: skip
    before = evaluate(trainer.eval_env, policy, 256, seed=1)["success_rate"]
    return before, trainer.train().final["eval/success_rate"]


@pytest.mark.slow
def test_ppo_learns_push_cube(tmp_path):
    before, after = train_push_cube(
        tmp_path, ActorCritic, lambda p: PPO(p, learning_rate=1e-3, batch_size=2048, n_epochs=5, ent_coef=0.01),
        iterations=40, rollout_steps=32,
    )  # fmt: skip
    assert before < 0.1
    assert after >= 0.3


@pytest.mark.slow
def test_grpo_with_its_defaults_learns_push_cube_in_a_million_steps(tmp_path):
    # The main job's settings (GRPO's and PushCube's defaults), 20 rollouts: 1.02M env steps. Seeds 0-3
    # reached 0.76-0.90 here; with EmbodiChain's smoothness penalty (0.01) they reached 0.01-0.38.
    before, after = train_push_cube(tmp_path, ActorOnly, GRPO, iterations=20, rollout_steps=100)
    assert before < 0.1
    assert after >= 0.4


# ------------------------------------------------------- non-finite training
class InfiniteGradientPPO(PPO):
    """PPO plus a term that is 0 but has an infinite gradient (d sqrt(x) / dx at 0)."""

    def update(self, rollout):
        weight = self.policy.actor[0].weight
        original = ppo_loss

        def loss_with_a_kink(*args, **kwargs):
            terms = original(*args, **kwargs)
            terms["loss"] = terms["loss"] + torch.sqrt(weight[0, 0] - weight[0, 0].detach())
            return terms

        import rlchain.algorithms.ppo as ppo_module

        ppo_module.ppo_loss = loss_with_a_kink
        try:
            return super().update(rollout)
        finally:
            ppo_module.ppo_loss = original


def non_finite_run(tmp_path, make_algorithm, policy_cls=ActorCritic, **trainer_kwargs):
    torch.manual_seed(0)
    env = PushCubeEnv(num_envs=64, seed=0, episode_length=16)
    policy = policy_cls(env.single_observation_space, env.single_action_space, hidden_sizes=[32])
    trainer = Trainer(env, policy, make_algorithm(policy), iterations=4, rollout_steps=16, save_freq=1,
                      output_dir=str(tmp_path), progress=False, **trainer_kwargs)  # fmt: skip
    with pytest.raises(RuntimeError) as info:
        trainer.train()
    summary = RunSummary.read(tmp_path)
    assert summary.status == "failed" and summary.error == str(info.value)
    assert "Traceback" in summary.traceback and "NonFiniteError" in summary.traceback
    for path in (tmp_path / "checkpoints").glob("*.pt"):
        state = torch.load(path, weights_only=True)
        assert all(torch.isfinite(v).all() for v in state["policy"].values() if v.is_floating_point()), path
    return str(info.value)


def test_a_non_finite_gradient_norm_stops_the_run(tmp_path):
    message = non_finite_run(tmp_path, lambda policy: InfiniteGradientPPO(policy, batch_size=256))
    assert message == "non-finite grad_norm at iteration 1 (inf); last good checkpoint: none written yet"


def test_grpo_with_a_huge_learning_rate_stops_at_its_non_finite_kl(tmp_path):
    # The case: GRPO at learning_rate=1e8 completed with approx_kl = inf in every row.
    message = non_finite_run(tmp_path, lambda policy: GRPO(policy, learning_rate=1e8, batch_size=512, group_size=8),
                             policy_cls=ActorOnly)  # fmt: skip
    assert message.startswith("non-finite approx_kl at iteration 1 (inf); last good checkpoint: none written yet")


def test_a_non_finite_parameter_stops_the_run(tmp_path):
    # A parameter outside the loss's path (here one a user's policy holds) goes NaN:
    # loss and gradient norm stay finite, so only the parameter check can see it.
    def make(policy):
        policy.temperature = torch.nn.Parameter(torch.tensor([float("nan")]))
        return PPO(policy, batch_size=512)

    message = non_finite_run(tmp_path, make)
    assert message == "non-finite parameter temperature at iteration 1 (nan); last good checkpoint: none written yet"


def test_no_checkpoint_is_written_from_a_non_finite_policy(tmp_path):
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(env, policy, PPO(policy, batch_size=16), iterations=1, rollout_steps=4,
                      output_dir=str(tmp_path), progress=False)  # fmt: skip
    trainer.train()
    good = (tmp_path / "checkpoints" / "latest.pt").read_bytes()
    policy.obs_normalizer.mean.fill_(float("nan"))  # as NaN observations would leave it
    with pytest.raises(NonFiniteError, match=r"policy obs_normalizer.mean is nan"):
        trainer.save()
    assert (tmp_path / "checkpoints" / "latest.pt").read_bytes() == good
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


class NaNObservations(LineEnv):
    """Its observations turn NaN after two steps (a diverged simulation); it rejects
    non-finite actions, as the built-in envs and env=gym do."""

    def _obs(self):
        obs = super()._obs()
        return torch.where(self.t[:, None] >= 2, float("nan"), obs)

    def step(self, action):
        if not bool(torch.isfinite(action).all()):
            raise ValueError(NON_FINITE_ACTION)
        return super().step(action)


def test_nan_observations_are_reported_as_observations(tmp_path):
    env = NaNObservations(num_envs=4, max_episode_steps=50)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8], obs_normalization=False)
    with pytest.raises(ValueError, match=r"^observation contains NaN or inf: NaNObservations returned a non-finite obs"):
        SyncCollector(env, policy, rollout_steps=8).collect()
