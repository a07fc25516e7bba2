"""rlchain/CartPole-v1: the batched torch CartPole against gymnasium's CartPole-v1."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import tests.helpers.gym_toy_envs  # noqa: F401  (registers the toy gymnasium ids)
from rlchain.core.envs import CartPoleEnv, GymVecEnv

STATE = ("x", "x_dot", "theta", "theta_dot")


INVALID_DISCRETE_ACTION = "action contains values other than 0 and 1: expected 0 (push left) or 1 (push right)"


def set_cart_pole(env: CartPoleEnv, states: np.ndarray) -> None:
    env.set_state({name: torch.as_tensor(states[:, i], dtype=torch.float32) for i, name in enumerate(STATE)})


def test_cart_pole_steps_like_gymnasium_cart_pole_v1():
    """Identical states and actions: the same next states to 1e-5 and the same terminations."""
    reference = gym.make("CartPole-v1").unwrapped
    env = CartPoleEnv(num_envs=1)
    rng = np.random.default_rng(0)
    terminations = 0
    for episode in range(30):
        reference.reset(seed=episode)
        for _ in range(500):
            state = np.array(reference.state, dtype=np.float64)
            set_cart_pole(env, state[None])
            action = int(rng.integers(2))
            obs, reward, terminated, truncated, _ = reference.step(action)
            _, ours_reward, ours_terminated, _, info = env.step(torch.tensor([action]))
            np.testing.assert_allclose(info["final_obs"][0].numpy(), obs, atol=1e-5, rtol=0)
            assert bool(ours_terminated[0]) == terminated and float(ours_reward[0]) == reward
            if terminated:
                terminations += 1
                break
    assert terminations == 30  # random actions drop the pole in every episode
    # states straddling every bound give the same terminations
    states = rng.uniform([-2.5, -3, -0.23, -3], [2.5, 3, 0.23, 3], size=(2000, 4))
    actions = rng.integers(0, 2, 2000)
    batch = CartPoleEnv(num_envs=2000)
    set_cart_pole(batch, states)
    _, _, ours_terminated, _, info = batch.step(torch.as_tensor(actions))
    expected = []
    for state, action in zip(states, actions):
        reference.state, reference.steps_beyond_terminated = state.copy(), None
        expected.append(reference.step(int(action))[2])
    assert ours_terminated.numpy().tolist() == expected and 300 < sum(expected) < 1700


def test_cart_pole_constants_spaces_and_initial_states_match_gymnasium():
    reference = gym.make("CartPole-v1")
    env = CartPoleEnv(num_envs=4096)
    assert env.single_observation_space == reference.observation_space
    assert env.single_action_space == reference.action_space
    assert env.max_episode_steps == reference.spec.max_episode_steps == 500
    obs, _ = env.reset(seed=1)
    assert obs.shape == (4096, 4) and obs.dtype == torch.float32
    assert float(obs.abs().max()) <= 0.05 and float(obs.abs().max()) > 0.049  # uniform on [-0.05, 0.05]


def test_continuous_mode_scales_the_force():
    reference = gym.make("CartPole-v1").unwrapped
    env = CartPoleEnv(num_envs=4, action_mode="continuous")
    assert env.single_action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    state = np.array([0.1, -0.2, 0.03, 0.4])
    set_cart_pole(env, np.tile(state, (4, 1)))
    _, _, _, _, info = env.step(torch.tensor([[1.0], [-1.0], [0.5], [7.0]]))
    for row, (force_mag, action) in enumerate([(10.0, 1), (10.0, 0), (5.0, 1), (10.0, 1)]):  # 7 is clipped to 1
        reference.force_mag, reference.state = force_mag, state.copy()
        np.testing.assert_allclose(info["final_obs"][row].numpy(), reference.step(action)[0], atol=1e-6)


def test_cart_pole_truncates_at_the_limit_reports_success_and_resets_in_the_same_step():
    env = CartPoleEnv(num_envs=3, max_episode_steps=4)
    set_cart_pole(env, np.zeros((3, 4)))
    for t in range(4):
        obs, _, terminated, truncated, info = env.step(torch.tensor([0, 1, 0]) if t % 2 else torch.tensor([1, 0, 1]))
    assert truncated.all() and not terminated.any() and info["success"].all()
    assert not torch.equal(info["final_obs"], obs)  # the final observation is kept apart from the new episode's
    assert float(obs.abs().max()) <= 0.05 and env.elapsed_steps.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match=r"action has shape \(2,\): expected \(3,\)"):
        env.step(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="values other than 0 and 1"):
        env.step(torch.tensor([0, 1, 2]))


def test_invalid_discrete_cart_pole_actions_raise_through_the_device_agnostic_check():
    env = CartPoleEnv(num_envs=3)
    for action in (torch.tensor([0, 1, 2]), torch.tensor([0.0, 1.0, 0.5]), torch.tensor([-1, 0, 0])):
        with pytest.raises(ValueError, match=rf"^{re.escape(INVALID_DISCRETE_ACTION)}$"):
            env.step(action)
    env.check_actions()  # each was raised and cleared


def test_a_compiled_step_keeps_the_invalid_action_on_the_device_until_check_actions():
    env = CartPoleEnv(num_envs=3)
    step = torch.compile(env.step, fullgraph=True, backend="aot_eager")
    step(torch.tensor([0, 1, 1]))
    env.check_actions()
    step(torch.tensor([0, 1, 2]))  # no host read inside the step
    step(torch.tensor([1, 1, 0]))
    with pytest.raises(ValueError, match=rf"^{re.escape(INVALID_DISCRETE_ACTION)}$"):
        env.check_actions()
    env.check_actions()  # the flag was cleared


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_invalid_discrete_cart_pole_action_on_cuda_raises_at_check_actions():
    env = CartPoleEnv(num_envs=4, device="cuda")
    good = torch.ones(4, dtype=torch.int64, device="cuda")
    env.step(torch.tensor([0, 1, 2, 1], device="cuda"))  # kept on the device: no error yet
    env.step(good)
    with pytest.raises(ValueError, match=re.escape(INVALID_DISCRETE_ACTION)):
        env.check_actions()
    env.step(good)
    env.check_actions()


def balance(obs: np.ndarray) -> int:
    """A linear controller that keeps CartPole up for well over 500 steps."""
    return int(obs[2] + 0.5 * obs[3] + 0.01 * obs[0] + 0.1 * obs[1] > 0)


@pytest.mark.filterwarnings("ignore:.*Box observation space m.*:UserWarning")
def test_gymnasium_make_cart_pole_is_the_batched_env_one_at_a_time():
    env = gym.make("rlchain/CartPole-v1")
    check_env(env.unwrapped)
    assert env.spec.max_episode_steps == 500 and env.action_space == gym.spaces.Discrete(2)
    obs, _ = env.reset(seed=3)
    batched = CartPoleEnv(num_envs=1)
    set_cart_pole(batched, obs[None])
    for t in range(200):
        obs, reward, terminated, truncated, info = env.step(t % 3 % 2)  # an open-loop pattern: the pole falls
        _, _, b_terminated, _, b_info = batched.step(torch.tensor([t % 3 % 2]))
        np.testing.assert_array_equal(obs, b_info["final_obs"][0].numpy())
        assert reward == 1.0 and terminated == bool(b_terminated[0]) and not truncated
        assert info == {"abs_theta": abs(float(obs[2])), "abs_x": abs(float(obs[0])), "reward_alive": 1.0}
        if terminated:
            break
    assert terminated
    with pytest.raises(ValueError, match="other than 0 and 1"):
        gym.make("rlchain/CartPole-v1", disable_env_checker=True).unwrapped.step(2)


@pytest.mark.parametrize("limit", [3, 800])
def test_gymnasium_make_cart_pole_takes_its_time_limit_from_gymnasium(limit):
    # The single env never truncates by itself, so make's max_episode_steps holds above 500 too.
    env = gym.make("rlchain/CartPole-v1", max_episode_steps=limit)
    obs, _ = env.reset(seed=0)
    for t in range(1, limit + 1):
        obs, _, terminated, truncated, _ = env.step(balance(obs))
        assert not terminated and truncated == (t == limit)


def test_rlchain_cart_pole_keyword_arguments_reach_make_and_make_vec():
    single = gym.make("rlchain/CartPole-v1", action_mode="continuous")
    assert single.action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    single.reset(seed=0)
    single.step(np.array([0.5], np.float32))
    vec = gym.make_vec(
        "rlchain/CartPole-v1",
        num_envs=4,
        vectorization_mode="vector_entry_point",
        action_mode="continuous",
        max_episode_steps=7,
    )
    assert isinstance(vec, CartPoleEnv) and vec.num_envs == 4
    assert vec.cfg.action_mode == "continuous" and vec.max_episode_steps == 7


@pytest.mark.parametrize("make", [lambda: CartPoleEnv(num_envs=12), lambda: GymVecEnv("Pendulum-v1", num_envs=12)])
def test_group_reset_gives_each_group_one_initial_state(make):
    env = make()
    obs, _ = env.reset(options={"group_size": 4})
    groups = obs.view(3, 4, -1)
    assert torch.equal(groups, groups[:, :1].expand_as(groups))
    assert not torch.equal(groups[0, 0], groups[1, 0]) and not torch.equal(groups[1, 0], groups[2, 0])
    again, _ = env.reset(options={"group_size": 4})
    assert not torch.equal(again, obs)  # a new shared state per group at every reset
    with pytest.raises(ValueError, match="group_size=5 is not allowed with num_envs=12"):
        env.reset(options={"group_size": 5})
