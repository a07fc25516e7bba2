"""What every algorithm shares: learning-rate schedules, the KL stop, target_kl."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlchain.core.algorithms import GRPO, PPO
from rlchain.core.algorithms.base import Algorithm, AlgorithmConfig
from rlchain.core.algorithms.functional import compute_gae
from rlchain.core.collector import SyncCollector
from rlchain.core.envs.push_cube import PushCubeEnv
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.settings import SettingError
from tests.helpers.toy_env import LineEnv

#: A small encoder for image observations (push_cube's 16 x 16 camera).
SMALL_CNN = {"cnn_channels": [4, 8], "cnn_kernel_sizes": [4, 3], "cnn_strides": [2, 2], "cnn_features": 8}


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
        algorithm = GRPO(
            policy, learning_rate=1e-3, lr_schedule="adaptive", target_kl=1e-9, batch_size=32, n_epochs=1, group_size=4
        )
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


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_adaptive_minibatch_sets_each_steps_rate_from_that_minibatchs_kl(algo):
    # rsl_rl's rule, against a plain replay of it: before every optimiser step the rate is multiplied by 1.5 when
    # the minibatch's KL from the rollout policy is in (0, target/2), divided by 1.5 above 2 * target, clamped to
    # [1e-5, 1e-2]. A tiny target makes it fall within the update, as soon as the first step has moved the policy.
    torch.manual_seed(0)
    make = ActorCritic if algo == "ppo" else ActorOnly
    env = LineEnv(num_envs=8, max_episode_steps=4)
    policy = make(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    reset = {"group_size": 4} if algo == "grpo" else None
    rollout = SyncCollector(env, policy, 4, reset_options=reset).collect().data
    settings = dict(learning_rate=1e-3, lr_schedule="adaptive_minibatch", target_kl=1e-6, batch_size=8, n_epochs=2)
    algorithm = PPO(policy, **settings) if algo == "ppo" else GRPO(policy, group_size=4, **settings)
    kls, rates = [], []
    updater = algorithm.updater
    loss = updater.loss

    def recording_loss(batch):
        terms = loss(batch)
        kls.append(terms["approx_kl"].item())
        return terms

    step = updater.train_step

    def recording_step(batch):
        row = step(batch)
        rates.append(algorithm.current_lr)  # the rate this step took
        return row

    updater.loss, updater.train_step = recording_loss, recording_step
    stats = algorithm.update(rollout)
    assert len(kls) == len(rates) == 8 and "update_kl" not in stats
    expected, lr = [], 1e-3
    for kl in kls:
        lr = max(1e-5, lr / 1.5) if kl > 2e-6 else min(1e-2, lr * 1.5) if 0 < kl < 0.5e-6 else lr
        expected.append(lr)
    assert rates == pytest.approx(expected, rel=1e-12)
    assert kls[0] == 0.0 and rates[0] == 1e-3  # the rollout policy: a KL of 0 leaves the rate
    assert rates[-1] < rates[0] and stats["learning_rate"] == pytest.approx(rates[-1])


@pytest.mark.parametrize("schedule", ["adaptive", "adaptive_minibatch"])
def test_a_kl_of_zero_leaves_the_adaptive_rate_unchanged(schedule):
    # rsl_rl raises the rate only on 0 < KL < target/2: a KL of exactly 0 says that nothing has moved yet.
    # adaptive_minibatch: one minibatch, one epoch; its KL is read before its step, from the rollout policy itself.
    # adaptive: a loss without gradient leaves the policy as it was, so the update_kl after the update is 0.
    torch.manual_seed(0)
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    rollout = SyncCollector(env, policy, 4).collect().data
    algorithm = PPO(policy, learning_rate=1e-3, lr_schedule=schedule, target_kl=0.01, batch_size=32, n_epochs=1)
    kls = []
    if schedule == "adaptive_minibatch":
        loss = algorithm.updater.loss

        def recording_loss(batch):
            terms = loss(batch)
            kls.append(terms["approx_kl"].item())
            return terms

        algorithm.updater.loss = recording_loss
        stats = algorithm.update(rollout)
    else:
        before = [p.detach().clone() for p in policy.parameters()]

        def still_loss(batch):
            zero = sum(p.sum() for p in policy.parameters()) * 0.0
            return {"loss": zero, **dict.fromkeys(algorithm.term_names, zero.detach())}

        algorithm.updater.loss = still_loss
        stats, _ = algorithm._optimise(rollout)
        assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))
        kls.append(stats["update_kl"])
    assert kls == [0.0]
    assert algorithm.current_lr == 1e-3  # was 1.5e-3: the rate grew on a KL of 0
    if schedule == "adaptive_minibatch":
        assert stats["learning_rate"] == 1e-3


def test_adaptive_minibatch_needs_a_target_kl():
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))
    with pytest.raises(ValueError, match=r"^target_kl=None is not allowed with lr_schedule='adaptive_minibatch'"):
        PPO(policy, lr_schedule="adaptive_minibatch")


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

    algorithm.updater.loss = minibatch_loss
    _, epochs = algorithm._optimise(batch, stop_kl=0.015)
    assert epochs == 1


# 6. algorithm.target_kl is refused unless a setting reads it.
@pytest.mark.parametrize(
    "algorithm, settings, match",
    [
        (PPO, {}, r"^target_kl=0.01 is not allowed with lr_schedule='constant', stop_at_target_kl=False: "),
        (GRPO, {}, r"^target_kl=0.01 is not allowed with lr_schedule='constant': "),
        (
            GRPO,
            {"lr_schedule": "linear", "total_iterations": 5},
            r"^target_kl=0.01 is not allowed with lr_schedule='linear': ",
        ),
    ],
)
def test_a_target_kl_that_no_setting_reads_is_refused(algorithm, settings, match):
    policy = ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))
    with pytest.raises(ValueError, match=match):
        algorithm(policy, target_kl=0.01, **settings)
    algorithm(policy, target_kl=0.01, lr_schedule="adaptive")
    if algorithm is PPO:
        PPO(policy, target_kl=0.01, stop_at_target_kl=True)


@pytest.mark.parametrize("obs_mode", ["state", "pixels"])
def test_an_update_moves_every_parameter_as_torch_adam_moves_it(obs_mode):
    # One minibatch of the whole rollout, one epoch: the update is one step of Adam (torch.optim.Adam, its plain
    # form) on the PPO loss's gradients, clipped to max_grad_norm. A camera's [H, W, C] image enters the CNN as a
    # channels-last tensor, whose convolutions' weight gradients come channels-last: each must still move the
    # element it belongs to.
    torch.manual_seed(0)
    env = PushCubeEnv(num_envs=4, seed=0, obs_mode=obs_mode, image_size=16)
    policy = ActorCritic(
        env.single_observation_space, env.single_action_space, hidden_sizes=[16], obs_normalization=False, **SMALL_CNN
    )
    rollout = SyncCollector(env, policy, 8).collect().data
    settings = {"learning_rate": 1e-3, "batch_size": 32, "n_epochs": 1, "norm_adv": False, "max_grad_norm": 0.5}
    reference, start = copy.deepcopy(policy), copy.deepcopy(policy)
    PPO(policy, **settings).update(rollout)

    advantages, returns = compute_gae(
        rollout["reward"], rollout["value"], rollout["next_value"], rollout["terminated"], rollout["done"], 0.99, 0.95
    )
    data = rollout.select("obs", "action", "sample_log_prob", "value")
    data.set("advantages", advantages)
    data.set("returns", returns)
    PPO(reference, **settings)._minibatch_loss(data.reshape(-1))["loss"].backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
    torch.optim.Adam(reference.parameters(), lr=1e-3, eps=1e-5, foreach=False).step()
    for (name, mine), want, before in zip(policy.named_parameters(), reference.parameters(), start.parameters()):
        torch.testing.assert_close(mine, want, rtol=0, atol=1e-6, msg=name)
        assert not torch.equal(mine, before), name  # every parameter took its step


def _line_ppo(**settings):
    """A small PPO on the line task, its first rollout, and the rollout's collector."""
    torch.manual_seed(0)
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    collector = SyncCollector(env, policy, 4)
    return PPO(policy, batch_size=16, n_epochs=2, **settings), collector


class _NoKL(PPO):
    """An algorithm whose reported terms leave out approx_kl (a user's may: docs/examples' VPG reports none)."""

    term_names = ("policy_loss", "value_loss", "entropy")


def test_a_schedule_or_stop_that_reads_the_minibatch_kl_is_refused_where_no_kl_is_reported():
    torch.manual_seed(0)
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    with pytest.raises(SettingError, match=r"lr_schedule.*adaptive_minibatch.*approx_kl"):
        _NoKL(policy, lr_schedule="adaptive_minibatch", target_kl=0.01)
    stopping = _NoKL(policy, stop_at_target_kl=True, target_kl=0.01, batch_size=16)
    with pytest.raises(ValueError, match="approx_kl"):
        stopping.update(SyncCollector(env, policy, 4).collect().data)


def test_a_checkpoints_adam_state_is_torch_adams_a_step_count_per_parameter():
    """The update steps one count for every parameter; the checkpoint gives each parameter its own, so that a plain
    ``torch.optim.Adam`` that loads it counts each once per step."""
    algorithm, collector = _line_ppo()
    algorithm.update(collector.collect().data)
    state = algorithm.state_dict()["optimizer"]
    steps = [s["step"] for s in state["state"].values()]
    assert len({s.data_ptr() for s in steps}) == len(steps) and all(float(s) == 4 for s in steps)  # 2 epochs of 2
    plain = torch.optim.Adam(algorithm.policy.parameters())
    plain.load_state_dict(copy.deepcopy(state))
    for p in algorithm.policy.parameters():
        p.grad = torch.ones_like(p)
    plain.step()
    assert all(float(s["step"]) == 5 for s in plain.state.values())


def test_a_checkpoint_without_state_for_some_parameters_keeps_the_step_count_of_the_others():
    """A checkpoint written before Adam's state was made at once has none for a parameter that had no gradient
    yet: that parameter's moments start at 0, and the step count is the others' (not reset, which would restart
    the bias correction with the moments kept)."""
    algorithm, collector = _line_ppo()
    algorithm.update(collector.collect().data)
    state = algorithm.state_dict()
    last = max(state["optimizer"]["state"])
    del state["optimizer"]["state"][last]
    fresh, _ = _line_ppo()
    fresh.load_state_dict(state)
    updater = fresh.updater
    assert float(updater._adam_steps[0]) == 4
    assert not updater._exp_avg[-1].any() and updater._exp_avg[0].any()


def test_a_policy_with_a_frozen_parameter_keeps_the_checkpoints_parameter_group():
    """The checkpoint's parameter group holds every parameter of the policy (a frozen one without state), as
    checkpoints always have: a custom policy's older checkpoint loads."""
    algorithm, collector = _line_ppo()
    frozen = next(algorithm.policy.parameters())
    frozen.requires_grad_(False)
    algorithm, collector = PPO(algorithm.policy, batch_size=16, n_epochs=2), collector
    algorithm.update(collector.collect().data)
    state = algorithm.state_dict()["optimizer"]
    assert len(state["param_groups"][0]["params"]) == len(list(algorithm.policy.parameters()))
    assert len(state["state"]) == len(list(algorithm.policy.parameters())) - 1
    before = frozen.clone()
    again = PPO(algorithm.policy, batch_size=16, n_epochs=2)
    again.load_state_dict(algorithm.state_dict())
    again.update(collector.collect().data)
    assert torch.equal(frozen, before)
