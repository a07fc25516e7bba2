"""Policies: distributions, the acting method, the critic, the log-std bound, observation normalisation."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlchain.core.algorithms import PPO
from rlchain.core.collector import SyncCollector
from rlchain.core.evaluation import evaluate
from rlchain.core.networks import bounded
from rlchain.core.policies import ActorCritic, ActorOnly
from tests.helpers.toy_env import LineEnv


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
            return td.update(
                {"action": torch.full((n, 1), 0.5), "sample_log_prob": torch.zeros(n), "value": torch.zeros(n)}
            )

    for policy, expected in ((Braking(*spaces, hidden_sizes=[8]), 0.0), (TensorDictOnly(), 0.5)):
        env = LineEnv(num_envs=4)
        rollout = SyncCollector(env, policy, rollout_steps=3).collect().data
        assert rollout["action"].unique().tolist() == [expected]
        seen = []
        original = policy.get_action
        policy.get_action = lambda td, deterministic=False: seen.append(deterministic) or original(td, deterministic)  # noqa: B023 - called within the iteration
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


@pytest.mark.parametrize("ortho_init", [True, False])
def test_mlp_init_is_orthogonal_or_torchs_default(ortho_init):
    # ortho_init=False keeps nn.Linear's own init (rsl_rl's networks): the same seed gives the same weights as
    # plain nn.Linear layers made in the same order; the default is orthogonal (gain sqrt 2, heads 0.01 and 1,
    # zero biases).
    obs_space, act_space = gym.spaces.Box(-1, 1, (5,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)
    torch.manual_seed(3)
    policy = ActorCritic(obs_space, act_space, hidden_sizes=[16, 8], ortho_init=ortho_init, obs_normalization=False)
    torch.manual_seed(3)
    plain = [torch.nn.Linear(i, o) for i, o in ((5, 16), (16, 8), (8, 2), (5, 16), (16, 8), (8, 1))]
    layers = [m for net in (policy.actor, policy.critic) for m in net if isinstance(m, torch.nn.Linear)]
    assert len(layers) == len(plain)
    for layer, reference in zip(layers, plain):
        assert torch.equal(layer.weight, reference.weight) == (not ortho_init)
        assert torch.equal(layer.bias, reference.bias) == (not ortho_init)
    if ortho_init:
        for layer, gain in zip(layers, (math.sqrt(2), math.sqrt(2), 0.01, math.sqrt(2), math.sqrt(2), 1.0)):
            w = layer.weight
            rows_orthonormal = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w  # gain^2 * identity
            torch.testing.assert_close(rows_orthonormal, gain**2 * torch.eye(min(w.shape)))
            assert not layer.bias.any()


def test_log_std_is_clamped():
    policy = ActorCritic(
        gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32), log_std_max=0.5
    )
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
    policy = ActorCritic(
        gym.spaces.Box(-1, 1, (2,), np.float32),
        gym.spaces.Box(-1, 1, (1,), np.float32),
        init_log_std=0.0,
        log_std_min=-1.0,
        log_std_max=1.0,
    )
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
    policy = ActorCritic(
        gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32), obs_normalization=True
    )
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
