"""Observation groups end to end in the core: storage, bootstrapping of every group, a normaliser per group, the
actor's and the critic's groups, the contract checker, evaluation, and a critic that learns from its privileged
group what the actor cannot see."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlchain.core import observations
from rlchain.core.algorithms import PPO
from rlchain.core.collector import SyncCollector
from rlchain.core.envs import VecEnvContractError, check_vec_env
from rlchain.core.evaluation import evaluate
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.settings import SettingError
from tests.helpers.grouped_env import GroupedLineEnv, HiddenSignEnv
from tests.helpers.toy_env import LineEnv


def _policy(env, **settings):
    torch.manual_seed(0)
    return ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[16], **settings)


@pytest.mark.parametrize("critic_obs", [["actor", "critic"], ["critic"]])
def test_the_rollout_stores_every_group_in_the_spaces_order_each_step(critic_obs):
    env = GroupedLineEnv(num_envs=4, max_episode_steps=3)
    twin = GroupedLineEnv(num_envs=4, max_episode_steps=3)  # the same episodes, stepped by hand
    policy = _policy(env, critic_obs=critic_obs)
    data = SyncCollector(env, policy, rollout_steps=7).collect().data
    assert list(data["obs"].keys()) == ["actor", "critic"] and data["obs"]["critic"].shape == (7, 4, 3)
    # final_obs is for the critic's bootstrap values: it keeps the critic's groups only, in the space's order
    assert list(data["final_obs"].keys()) == ["actor", "critic"][2 - len(critic_obs) :]
    obs, _ = twin.reset()
    for t in range(7):
        for group in ("actor", "critic"):
            assert torch.equal(data["obs"][group][t], obs[group]), (t, group)
        obs, _, _, _, info = twin.step(data["action"][t])
        done = data["done"][t]
        for group in data["final_obs"].keys():
            assert torch.equal(data["final_obs"][group][t][done], info["final_obs"][group][done]), (t, group)


def test_a_done_row_bootstraps_from_the_critics_groups_of_its_final_observation():
    env = GroupedLineEnv(num_envs=4, max_episode_steps=3)
    policy = _policy(env)
    data = SyncCollector(env, policy, rollout_steps=7).collect().data
    done = data["done"]
    assert done.any() and (~done).any()
    final = data["final_obs"][done]
    expected = policy.critic(policy.obs_normalizer["critic"].normalize(final["critic"])).squeeze(-1)
    torch.testing.assert_close(data["next_value"][done], expected)
    # the running rows: the next step's value, which the critic took from that step's critic group
    running = ~done[:-1]
    torch.testing.assert_close(data["next_value"][:-1][running], data["value"][1:][running])


def test_each_group_has_its_own_normaliser_fed_by_the_update():
    env = GroupedLineEnv(num_envs=8, max_episode_steps=4)
    policy = _policy(env)
    data = SyncCollector(env, policy, rollout_steps=6).collect().data
    PPO(policy, batch_size=16, n_epochs=1).update(data)
    for group, dim in (("actor", 2), ("critic", 3)):
        x = data["obs"][group].reshape(-1, dim)
        normaliser = policy.obs_normalizer[group]
        torch.testing.assert_close(normaliser.mean, x.mean(0))
        torch.testing.assert_close(normaliser.var, x.var(0, unbiased=False))
    assert set(dict(policy.state_dict())) >= {"obs_normalizer.actor.mean", "obs_normalizer.critic.var"}


@pytest.mark.parametrize(
    "settings, actor, critic",
    [
        ({}, ["actor"], ["critic"]),
        ({"critic_obs": ["actor", "critic"]}, ["actor"], ["actor", "critic"]),
        ({"actor_obs": ["critic"], "critic_obs": ["critic"]}, ["critic"], ["critic"]),
    ],
)
def test_the_groups_each_network_sees_and_their_input_widths(settings, actor, critic):
    env = GroupedLineEnv(num_envs=4)
    policy = _policy(env, **settings)
    width = {"actor": 2, "critic": 3}
    assert policy.actor_groups == actor and policy.critic_groups == critic
    assert policy.actor[0].in_features == sum(width[g] for g in actor)
    assert policy.critic[0].in_features == sum(width[g] for g in critic)


def test_the_default_groups_of_other_names():
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    act = gym.spaces.Box(-1, 1, (1,), np.float32)
    isaac = ActorCritic(gym.spaces.Dict({"policy": box, "critic": box}), act)
    goal = ActorCritic(gym.spaces.Dict({"desired_goal": box, "observation": box}), act)
    flat = ActorCritic(box, act)
    assert (isaac.actor_groups, isaac.critic_groups) == (["policy"], ["critic"])
    assert goal.actor_groups == goal.critic_groups == ["desired_goal", "observation"]
    assert flat.actor_groups == flat.critic_groups == ["obs"] and not flat.grouped
    assert set(dict(flat.state_dict())) >= {"obs_normalizer.mean"}  # a flat observation's checkpoint keys as before


@pytest.mark.parametrize(
    "space, settings, message",
    [
        (
            {"actor": (2,), "critic": (3,)},
            {"critic_obs": ["privileged"]},
            "critic_obs=['privileged'] is not allowed: the env has no group 'privileged'; "
            "its observation groups are ['actor', 'critic']",
        ),
        (
            {"actor": (2,), "critic": (3,)},
            {"actor_obs": []},
            "actor_obs=[] is not allowed: expected distinct groups, at least one",
        ),
        (
            {"actor": (8, 8, 3), "critic": (3,)},
            {},
            "cnn_kernel_sizes=[8, 4, 3] is not allowed with cnn_strides=[4, 2, 1]: the image group 'actor' (8, 8, 3) "
            "is smaller than the convolutions' receptive field",
        ),
        (
            {"actor": (2,), "camera": (2, 32, 32, 3)},
            {"critic_obs": ["camera"]},
            "critic_obs='camera' is not allowed: the image group 'camera' has shape (2, 32, 32, 3), and the CNN "
            "encoder takes images of 3 dimensions",
        ),
        (
            {"actor": (512, 512, 3)},
            {"cnn_strides": [1, 1, 1]},
            "cnn_strides=[1, 1, 1] is not allowed: the image group 'actor' (512, 512, 3) is too large for the encoder",
        ),
    ],
)
def test_a_group_the_env_lacks_or_an_image_the_encoder_cannot_take_is_one_line(space, settings, message):
    groups = {
        name: gym.spaces.Box(0, 255, shape, np.uint8) if len(shape) >= 3 else gym.spaces.Box(-1, 1, shape, np.float32)
        for name, shape in space.items()
    }
    with pytest.raises(SettingError) as caught:
        ActorCritic(gym.spaces.Dict(groups), gym.spaces.Box(-1, 1, (1,), np.float32), **settings)
    assert str(caught.value).startswith(message), str(caught.value)


def test_an_actor_without_a_critic_keeps_normalisers_of_its_own_groups_only():
    env = GroupedLineEnv(num_envs=4)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    assert list(policy.obs_normalizer) == ["actor"] and policy.critic is None
    obs, _ = env.reset(seed=0)
    assert torch.equal(policy.get_value(TensorDict({"obs": obs}, batch_size=[4]))["value"], torch.zeros(4))


def test_the_checker_accepts_groups_and_names_a_missing_one():
    check_vec_env(GroupedLineEnv(num_envs=8))
    check_vec_env(HiddenSignEnv(num_envs=8))

    class Missing(GroupedLineEnv):
        def _obs(self):
            return super()._obs().exclude("critic")

    with pytest.raises(VecEnvContractError, match=r"rule 'reset': reset\(\) obs is a TensorDict with the groups "):
        check_vec_env(Missing(num_envs=8))


def test_evaluation_and_the_deterministic_action_take_groups():
    env = GroupedLineEnv(num_envs=4, max_episode_steps=3)
    policy = _policy(env)
    result = evaluate(env, policy, num_episodes=8, seed=1)
    assert result.episodes == 8
    obs, _ = env.reset(seed=2)
    td = policy.get_action(TensorDict({"obs": obs}, batch_size=[4]), deterministic=True)
    torch.testing.assert_close(policy.deterministic_action({"actor": obs["actor"]}), td["action"])


def test_the_collectors_state_holds_every_group_and_round_trips():
    env = GroupedLineEnv(num_envs=4)
    collector = SyncCollector(env, _policy(env), rollout_steps=3)
    collector.collect()
    state = collector.state_dict()
    assert set(state["obs"]) == {"actor", "critic"} and all(isinstance(v, torch.Tensor) for v in state["obs"].values())
    other = SyncCollector(env, _policy(env), rollout_steps=3)
    other.load_state_dict(state)
    assert all(
        torch.equal(a, b)
        for a, b in zip(observations.leaves(other.stepper.obs), observations.leaves(collector.stepper.obs))
    )


def _value_fit(critic_obs: list[str]) -> tuple[float, float]:
    """The value loss and explained variance (means of the last 5 updates) after a short PPO training on
    :class:`HiddenSignEnv` with the critic seeing ``critic_obs`` (unclipped value loss, gamma 0.9)."""
    torch.manual_seed(0)
    env = HiddenSignEnv(num_envs=64, max_episode_steps=8)
    policy = ActorCritic(
        env.single_observation_space, env.single_action_space, hidden_sizes=[32], critic_obs=critic_obs
    )
    algorithm = PPO(policy, batch_size=256, n_epochs=4, learning_rate=3e-3, gamma=0.9, clip_vloss=False, seed=0)
    collector = SyncCollector(env, policy, rollout_steps=16)
    stats = [algorithm.update(collector.collect().data) for _ in range(20)]
    return tuple(float(np.mean([s[key] for s in stats[-5:]])) for key in ("value_loss", "explained_variance"))


@pytest.mark.slow
def test_a_critic_that_sees_the_privileged_group_learns_what_the_actor_cannot_see():
    (privileged, privileged_ev), (blind, blind_ev) = _value_fit(["critic"]), _value_fit(["actor"])
    # The sign decides the return's sign: with it the critic fits the value (explained variance near 1),
    # without it it can only predict the mean over both signs (near 0).
    assert privileged < 0.01 * blind and privileged_ev > 0.99 and blind_ev < 0.1, (privileged, blind)


def test_a_flat_observation_env_is_the_one_group_case():
    env = LineEnv(num_envs=4)
    data = SyncCollector(env, _policy(env), rollout_steps=3).collect().data
    assert isinstance(data["obs"], torch.Tensor) and data["obs"].shape == (3, 4, 2)


@pytest.mark.slow
def test_groups_that_hold_the_same_features_train_exactly_as_one_flat_observation():
    """PushCube as actor and critic groups of the same exact features: the same updates, bit for bit, as PushCube's
    one flat observation (the groups' storage, normalisers and inputs add nothing and lose nothing)."""
    from rlchain.core.envs import PushCubeEnv

    def train(**env_settings) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        env = PushCubeEnv(num_envs=64, seed=0, **env_settings)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[32])
        algorithm = PPO(policy, batch_size=512, n_epochs=2, seed=0)
        collector = SyncCollector(env, policy, rollout_steps=16)
        for _ in range(3):
            algorithm.update(collector.collect().data)
        return dict(policy.state_dict())

    flat, grouped = train(), train(privileged_critic=True)
    for name, value in flat.items():
        if name.startswith("obs_normalizer."):
            stat = name.removeprefix("obs_normalizer.")
            assert torch.equal(grouped[f"obs_normalizer.actor.{stat}"], value), name
            assert torch.equal(grouped[f"obs_normalizer.critic.{stat}"], value), name
        else:
            assert torch.equal(grouped[name], value), name


def test_an_actor_without_a_critic_stores_no_final_observation():
    # final_obs is for the critic's bootstrap values: GRPO's actor-only policy needs none of it.
    env = GroupedLineEnv(num_envs=4, max_episode_steps=3)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    data = SyncCollector(env, policy, rollout_steps=5).collect().data
    assert list(data["final_obs"].keys()) == [] and data["done"].any() and not data["next_value"].any()
