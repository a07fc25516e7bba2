"""GAE (Schulman et al. 2016) and PPO (Schulman et al. 2017): advantages, the loss, the update."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlchain.core.algorithms import PPO
from rlchain.core.algorithms.functional import (
    compute_gae,
)
from rlchain.core.algorithms.ppo import ppo_loss
from rlchain.core.collector import SyncCollector
from rlchain.core.policies import ActorCritic
from tests.helpers.references import reference_gae
from tests.helpers.toy_env import LineEnv


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
    assert out["loss"].item() == pytest.approx(out["policy_loss"].item() + 0.5 * out["value_loss"].item() - 0.01 * 2.0)


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
