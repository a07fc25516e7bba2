"""GRPO (Shao et al. 2024): group-relative advantages, the reference policy, group sizes."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlchain.core.algorithms import GRPO, PPO
from rlchain.core.algorithms.functional import (
    discounted_returns,
    first_done_mask,
    group_relative_advantages,
)
from rlchain.core.collector import SyncCollector
from rlchain.core.envs import CartPoleEnv, PushCubeEnv
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.run.trainer import Trainer
from tests.helpers.recurrent import recurrent, step_by_step
from tests.helpers.references import reference_group_advantages
from tests.helpers.runs import run_cli
from tests.helpers.toy_env import LineEnv


def test_grpo_advantages_by_hand_with_masks_and_groups():
    # T=3, N=4, two groups of 2.
    reward = torch.tensor([[1.0, 0.0, 2.0, 2.0], [1.0, 3.0, 0.0, 1.0], [1.0, 1.0, 4.0, 0.0]])
    done = torch.tensor([[False, False, False, True], [False, True, False, False], [True, False, False, False]])
    gamma = 0.5
    returns = discounted_returns(reward, done, gamma)
    # env0: R2=1, R1=1+.5*1=1.5, R0=1+.5*1.5=1.75; env1: R2=1, R1=3 (done), R0=0+.5*3=1.5
    # env2: R2=4, R1=0+2=2, R0=2+1=3; env3: R2=0, R1=1, R0=2 (done at 0)
    torch.testing.assert_close(
        returns, torch.tensor([[1.75, 1.5, 3.0, 2.0], [1.5, 3.0, 2.0, 1.0], [1.0, 1.0, 4.0, 0.0]])
    )
    mask = first_done_mask(done)
    torch.testing.assert_close(
        mask, torch.tensor([[True, True, True, True], [True, True, True, False], [True, False, True, False]])
    )
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
    returns = discounted_returns(
        torch.ones(100, 8 * group_size), torch.zeros(100, 8 * group_size, dtype=torch.bool), 0.99
    )
    mask = torch.ones_like(returns, dtype=torch.bool)
    for norm in ("std", "none", "rollout_std"):
        assert torch.equal(group_relative_advantages(returns, mask, group_size, norm=norm), torch.zeros_like(returns))


@pytest.mark.parametrize("norm", ["std", "none", "rollout_std"])
def test_group_advantages_match_a_reference_loop(norm):
    gen = torch.Generator().manual_seed(0)
    reward = torch.randint(0, 3, (12, 16), generator=gen).float()  # ties inside groups happen
    done = torch.rand(12, 16, generator=gen) < 0.15
    returns, mask = discounted_returns(reward, done, 0.9), first_done_mask(done)
    adv = group_relative_advantages(returns, mask, 4, eps=1e-8, norm=norm)
    torch.testing.assert_close(
        adv.double(), reference_group_advantages(returns, mask, 4, 1e-8, norm), atol=1e-5, rtol=1e-5
    )


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


@pytest.mark.parametrize("rnn_type", ["gru", "lstm", None])
def test_the_reference_kl_reads_the_reference_stepped_from_its_own_state(rnn_type):
    """The reference KL against a plain step-by-step replay of the reference from its own zero state.

    A recurrent reference used to be evaluated per minibatch from the state the trained policy stored at
    collection: from another network's state at the start of every sequence but each env's first, so with
    ``seq_len < rollout_steps`` its log-probabilities erred by about 0.1 from the second sequence on, and the
    reported KL was about two thirds too high here.
    One epoch of one minibatch of every sample: the reported KL is the one before the step, the trained policy's
    log-probabilities there are those of collection.
    """
    env = CartPoleEnv(num_envs=8, seed=0, hide_velocities=True, max_episode_steps=20)
    if rnn_type is None:
        torch.manual_seed(0)
        policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[16])
    else:
        policy = recurrent(env, rnn_type, cls=ActorOnly)
    with torch.no_grad():  # actions that the state moves (the head's initial gain is 0.01)
        policy.actor[-1].weight.mul_(100.0)
    seq_len = 5 if rnn_type else None
    grpo = GRPO(policy, batch_size=160, n_epochs=1, group_size=4, kl_coef=0.1, seq_len=seq_len)
    with torch.no_grad():  # the trained policy moves away from its reference
        for p in policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    data = SyncCollector(env, policy, 20, reset_options=grpo.reset_options).collect().data
    ref = grpo.ref_policy
    if rnn_type is None:
        with torch.no_grad():
            expected = torch.stack([ref.evaluate_actions(data[t])["sample_log_prob"] for t in range(20)])
    else:
        assert all((v[0] == 0).all() for v in data["hidden"].values())  # every rollout starts from a reset
        own = data.clone().set("hidden", ref.initial_state(8).expand(20, 8).clone())  # zeros: a reset's state
        expected = step_by_step(ref, own)[0]
        with torch.no_grad():  # the trained policy's states are not the reference's
            stored = torch.cat([ref.evaluate_actions(data[c : c + 5])["sample_log_prob"] for c in range(0, 20, 5)])
        assert (stored - expected).abs().max() > 0.05
    mask = first_done_mask(data["done"]).double()
    q = expected.double() - data["sample_log_prob"].double()
    kl = float(((q.exp() - q - 1) * mask).sum() / mask.sum())
    assert 0 < mask.mean() < 1 and kl > 5e-4
    assert grpo.update(data)["approx_ref_kl"] == pytest.approx(kl, rel=1e-4)
    torch.testing.assert_close(grpo.reference_log_prob(data), expected)  # every step's, masked ones included


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


@pytest.mark.slow
def test_grpo_rejects_rollouts_shorter_than_an_episode_naming_both(tmp_path):
    # GRPO resets every env when a rollout starts: a 100-step rollout on
    # 500-step episodes only ever sees failed episodes end (success 0 while
    # evaluation returns 500). It is refused before any step, naming both values.
    proc = run_cli(["algorithm=grpo", "env=cart_pole", "trainer.rollout_steps=100", "device=cpu"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "trainer.rollout_steps=100" in line and "max_episode_steps=500" in line and "rollout_steps >= 500" in line
    assert not (tmp_path / "outputs").exists()  # refused before its first step: no run directory is left
    # a rollout of a whole episode is accepted, and PPO (no reset per rollout) is not concerned
    env = CartPoleEnv(num_envs=8, max_episode_steps=20)
    for algorithm, rollout_steps in ((GRPO, 20), (PPO, 5)):
        policy = ActorCritic(env.single_observation_space, env.single_action_space)
        Trainer(
            env, policy, algorithm(policy), rollout_steps=rollout_steps, output_dir=str(tmp_path / algorithm.__name__)
        )
