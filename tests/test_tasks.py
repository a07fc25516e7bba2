"""The torch cart_pole against gymnasium's CartPole-v1, the env=gym adapter, and the task presets."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import gym_toy_envs  # noqa: F401  (registers rlchain_test/* ids)
from rlchain.envs import CartPoleEnv, GymVecEnv, TorchVecEnv
from rlchain.envs.gym_adapter import flatten_batch
from rlchain.train import build
from rlchain.summary import RunSummary

from conftest import TINY, run_cli

STATE = ("x", "x_dot", "theta", "theta_dot")
INVALID_DISCRETE_ACTION = "action contains values other than 0 and 1: expected 0 (push left) or 1 (push right)"


def set_cart_pole(env: CartPoleEnv, states: np.ndarray) -> None:
    env.set_state({name: torch.as_tensor(states[:, i], dtype=torch.float32) for i, name in enumerate(STATE)})


# -------------------------------------------------------------- cart_pole
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


def test_invalid_discrete_cart_pole_actions_raise_through_the_device_agnostic_check(monkeypatch):
    env = CartPoleEnv(num_envs=3)
    for action in (torch.tensor([0, 1, 2]), torch.tensor([0.0, 1.0, 0.5]), torch.tensor([-1, 0, 0])):
        with pytest.raises(ValueError, match=rf"^{re.escape(INVALID_DISCRETE_ACTION)}$"):
            env.step(action)
    # The check used to be CPU-only: on CUDA an invalid action pushed left, silently. It now goes
    # through TorchVecEnv._check_flag, which raises at once on the CPU and without a host sync on CUDA.
    seen = []
    monkeypatch.setattr(TorchVecEnv, "_check_flag", lambda self, bad, message: seen.append((bool(bad), message)))
    env.step(torch.tensor([0, 1, 2]))
    env.step(torch.tensor([1, 0, 1]))
    assert seen == [(True, INVALID_DISCRETE_ACTION), (False, INVALID_DISCRETE_ACTION)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_invalid_discrete_cart_pole_action_raises_on_cuda_a_step_later():
    env = CartPoleEnv(num_envs=4, device="cuda")
    env.step(torch.tensor([0, 1, 2, 1], device="cuda"))  # checked without a host sync: no error yet
    torch.cuda.synchronize()  # the check's flag has reached the host
    with pytest.raises(ValueError, match=re.escape(INVALID_DISCRETE_ACTION)):
        env.step(torch.tensor([0, 1, 1, 1], device="cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_bad_action_taken_while_a_check_is_in_flight_is_still_caught_on_cuda():
    env = CartPoleEnv(num_envs=4, device="cuda")
    good = torch.ones(4, dtype=torch.int64, device="cuda")
    env.step(good)  # its check is in flight
    env.step(torch.tensor([0, 1, 2, 1], device="cuda"))  # may find that check unfinished: kept on the device
    with pytest.raises(ValueError, match=re.escape(INVALID_DISCRETE_ACTION)):
        for _ in range(3):
            torch.cuda.synchronize()
            env.step(good)


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
    vec = gym.make_vec("rlchain/CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point",
                       action_mode="continuous", max_episode_steps=7)  # fmt: skip
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


# ----------------------------------------------------------- env=gym
def raw_vec(env_id: str, num_envs: int, seed: int):
    raw = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})  # fmt: skip
    obs, _ = raw.reset(seed=[seed + i for i in range(num_envs)])
    return raw, obs


def test_box_env_matches_gymnasium_clips_actions_and_keeps_final_obs():
    env = GymVecEnv("Pendulum-v1", num_envs=3, seed=5)
    raw, raw_obs = raw_vec("Pendulum-v1", 3, seed=5)
    assert env.single_action_space == raw.single_action_space and env.max_episode_steps == 200
    obs, _ = env.reset(seed=5)
    np.testing.assert_allclose(obs.numpy(), raw_obs, atol=1e-6)
    rng = np.random.default_rng(0)
    for t in range(200):
        action = rng.uniform(-4, 4, (3, 1)).astype(np.float32)  # half of them outside [-2, 2]
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(action))
        raw_obs, raw_reward, _, raw_truncated, raw_info = raw.step(np.clip(action, -2, 2))
        np.testing.assert_allclose(obs.numpy(), raw_obs, atol=1e-6)
        np.testing.assert_allclose(reward.numpy(), raw_reward, rtol=1e-6)
        assert reward.dtype == torch.float32 and truncated.dtype == torch.bool
    assert truncated.all() and not terminated.any()  # the 200-step limit
    np.testing.assert_allclose(info["final_obs"].numpy(), np.stack(raw_info["final_obs"]), atol=1e-6)
    assert not np.allclose(info["final_obs"].numpy(), obs.numpy())
    with pytest.raises(ValueError, match="NaN or inf"):
        env.step(torch.full((3, 1), float("nan")))


def test_box_actions_are_clipped_in_the_box_dtype_and_only_non_finite_ones_are_rejected():
    env = GymVecEnv("rlchain_test/EchoAction-v0", num_envs=3)
    # Entries near the largest float32 or float64 would overflow a sum of
    # them: finite all the same, so clipped, and without numpy warnings.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        obs, *_ = env.step(torch.tensor([[3e38, 3e38], [0.5, -0.25], [-2.0, 7.0]]))
        assert obs.tolist() == [[1.0, 1.0], [0.5, -0.25], [-1.0, 1.0]]
        assert env.envs.envs[0].unwrapped.action_dtype == np.float64
        obs, *_ = env.step(torch.tensor([[1e308, 1e308], [-1e308, -1e308], [0.0, 0.0]], dtype=torch.float64))
        assert obs.tolist() == [[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0]]
    for bad in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(ValueError, match="action contains NaN or inf"):
            env.step(torch.tensor([[0.0, 0.0], [0.0, bad], [0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"action has shape \(3, 1\): expected \(3, 2\)"):
        env.step(torch.zeros(3, 1))
    # Bounds that differ per dimension clip each dimension to its own.
    env = GymVecEnv("rlchain_test/EchoAction-v0", num_envs=2, kwargs={"low": [-1.0, 0.0], "high": [1.0, 0.5]})
    obs, *_ = env.step(torch.tensor([[-2.0, -2.0], [2.0, 0.25]]))
    assert obs.tolist() == [[-1.0, 0.0], [1.0, 0.25]]


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_returned_tensors_are_not_overwritten_by_later_steps(vectorization):
    # The collector keeps a rollout's tensors until it stores them; gymnasium
    # reuses its observation buffer, so the adapter must hand out copies.
    env = GymVecEnv("Pendulum-v1", num_envs=2, vectorization=vectorization)
    first = env.step(torch.zeros(2, 1))
    kept = [first[0].clone(), first[1].clone(), first[4]["final_obs"].clone()]
    for _ in range(3):
        env.step(torch.full((2, 1), 2.0))
    assert torch.equal(first[0], kept[0]) and torch.equal(first[1], kept[1])
    assert torch.equal(first[4]["final_obs"], kept[2])
    env.close()


def test_discrete_env_matches_gymnasium_in_sync_and_async_modes():
    raw, raw_obs = raw_vec("CartPole-v1", 4, seed=0)
    envs = [GymVecEnv("CartPole-v1", num_envs=4), GymVecEnv("CartPole-v1", num_envs=4, vectorization="async")]
    assert envs[0].single_action_space == gym.spaces.Discrete(2)
    rng = np.random.default_rng(1)
    dones = partial_dones = 0
    for _ in range(60):
        action = rng.integers(0, 2, 4)
        raw_obs, _, raw_term, _, raw_info = raw.step(action)
        # rows whose episode ended hold gymnasium's final observation, the others the observation
        raw_final = np.stack([raw_info["final_obs"][i] if done else raw_obs[i] for i, done in enumerate(raw_term)])
        for env in envs:
            obs, _, terminated, _, info = env.step(torch.as_tensor(action))
            np.testing.assert_allclose(obs.numpy(), raw_obs, atol=1e-6)
            np.testing.assert_allclose(info["final_obs"].numpy(), raw_final, atol=1e-6)
            assert terminated.numpy().tolist() == raw_term.tolist()
        dones += int(raw_term.sum())
        partial_dones += int(0 < raw_term.sum() < 4)
    assert dones > 0 and partial_dones > 0
    for env in envs:
        env.close()


def test_dict_observations_flatten_in_key_order_and_success_flags_are_reported():
    env = GymVecEnv("rlchain_test/DictObs-v0", num_envs=4, success_key="is_success")
    space = env.gym_observation_space
    assert list(space.spaces) == ["mode", "position", "target"]  # gymnasium sorts a plain dict's keys
    assert env.single_observation_space.shape == (3 + 4 + 2,)
    raw = {key: np.stack([space[key].sample() for _ in range(4)]) for key in space.spaces}
    flat = flatten_batch(space, raw)
    for i in range(4):
        row = gym.spaces.flatten(space, {key: value[i] for key, value in raw.items()})
        np.testing.assert_array_equal(flat[i], row.astype(np.float32))
    assert flat[:, :3].sum(axis=1).tolist() == [1.0] * 4  # the Discrete part is one-hot
    signs = torch.tensor([[1.0], [-1.0], [1.0], [-1.0]])
    for t in range(3):
        obs, _, terminated, _, info = env.step(signs)
    assert terminated.all() and info["success"].tolist() == [True, False, True, False]
    assert info["final_obs"][:, 3:7].unique().tolist() == [3.0]  # the final position (t = 3), not the reset one
    assert obs[:, 3:7].unique().tolist() == [0.0]
    # Tuple(Discrete(32), Discrete(11), Discrete(2)); Blackjack has no registered time limit
    tuple_env = GymVecEnv("Blackjack-v1", num_envs=2, max_episode_steps=10)
    assert tuple_env.single_observation_space.shape == (45,)


@pytest.mark.parametrize(
    "kwargs, missing, message",
    [
        ({"id": "CartPol-v1"}, None, "env.id='CartPol-v1' is not a registered gymnasium id; close matches: CartPole-v1"),
        ({"id": "rlchain_test/MultiDiscrete-v0"}, None,
         "the action space MultiDiscrete([2 3]) (MultiDiscrete) is not supported"),
        ({"id": "CartPole-v1", "vectorization": "threads"}, None, "vectorization='threads' is not allowed"),
        ({"id": "Blackjack-v1"}, None, "env.id='Blackjack-v1' has no time limit: set env.max_episode_steps"),
        ({"id": "HalfCheetah-v5"}, "mujoco", 'needs MuJoCo, which is not installed: pip install "rlchain[mujoco]"'),
        ({"id": "LunarLander-v3"}, "Box2D", "env.id='LunarLander-v3' needs a package that is not installed"),
    ],
)  # fmt: skip
def test_bad_gym_envs_give_clear_errors(monkeypatch, kwargs, missing, message):
    if missing is not None:
        # None in sys.modules makes a module unimportable (and find_spec answer None),
        # as on a machine without it, whether or not it is installed here.
        monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(ValueError) as info:
        GymVecEnv(num_envs=2, **kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "env_id, says, current",
    [
        ("Ant-v2", ["moved to the gymnasium-robotics project", "Ant-v2 runs only on mujoco-py"], "Ant-v5"),
        ("Humanoid-v3", ["moved to the gymnasium-robotics project", "runs only on mujoco-py"], "Humanoid-v5"),
        ("GymV21Environment-v0", ['pip install "shimmy[gym-v21]"'], None),
    ],
)  # fmt: skip
def test_an_id_gymnasium_keeps_only_to_say_where_its_env_went_says_so(env_id, says, current):
    # gymnasium 1.x registers these ids with an entry point that only raises: the
    # error says so in gymnasium's words, before the (absent) time limit is looked at
    with pytest.raises(ValueError) as info:
        GymVecEnv(env_id, num_envs=2)
    message = str(info.value)
    assert message.startswith(f"env.id={env_id!r} is not provided by gymnasium {gym.__version__} itself")
    assert all(part in message for part in says) and "time limit" not in message
    if current is None:
        assert "current version" not in message
    else:
        assert message.endswith(f"its current version is {current}: set env.id={current}") or (
            f"its current version is {current}: set env.id={current} (needs MuJoCo" in message
        )


def test_a_removed_mujoco_env_names_the_extra_its_current_version_needs(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco", None)  # as on a machine without MuJoCo
    with pytest.raises(ValueError) as info:
        GymVecEnv("Ant-v2", num_envs=2)
    assert str(info.value).endswith('set env.id=Ant-v5 (needs MuJoCo: pip install "rlchain[mujoco]")')


@pytest.mark.parametrize("env_id, current", [("Pendulum-v0", "Pendulum-v1"), ("LunarLander-v2", "LunarLander-v3")])
def test_a_retired_gymnasium_version_names_the_current_one(env_id, current):
    with pytest.raises(ValueError) as info:
        GymVecEnv(env_id, num_envs=2)
    assert str(info.value).startswith(f"env.id={env_id!r} is not a registered gymnasium id: gymnasium")
    assert f"Please use `{current}` instead" in str(info.value)  # gymnasium's own hint


def test_a_removed_mujoco_env_on_the_command_line_is_one_line_naming_its_current_version(tmp_path):
    proc = run_cli(["env=gym", "env.id=Ant-v2", *TINY], tmp_path)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "env.id='Ant-v2' is not provided by gymnasium" in lines[0] and "set env.id=Ant-v5" in lines[0]
    assert "mujoco-py" in lines[0] and "time limit" not in lines[0]


def test_env_kwargs_and_time_limit_reach_the_gymnasium_env():
    env = GymVecEnv("Pendulum-v1", num_envs=2, kwargs={"g": 3.0}, max_episode_steps=7)
    assert env.max_episode_steps == 7 and env.envs.envs[0].unwrapped.g == 3.0
    for _ in range(7):
        _, _, _, truncated, _ = env.step(torch.zeros(2, 1))
    assert truncated.all()


# -------------------------------------------------------------- presets
# `make test` installs the mujoco extra, so CI runs the HalfCheetah preset; a
# machine without it skips that one preset.
PRESETS = ["cart_pole_ppo", "cart_pole_grpo", "gym_cart_pole_ppo", "gym_pendulum_ppo",
           pytest.param("gym_half_cheetah_ppo", marks=pytest.mark.skipif(
               importlib.util.find_spec("mujoco") is None, reason='needs pip install "rlchain[mujoco]"'))]  # fmt: skip


@pytest.mark.parametrize("preset", PRESETS)
def test_task_presets_train_with_a_tiny_budget(compose_cfg, preset):
    # 8-step episodes: a GRPO rollout must hold a whole one
    tiny = ["trainer.iterations=2", "trainer.rollout_steps=8", "env.max_episode_steps=8", "trainer.eval_freq=1", "trainer.num_eval_envs=2",
            "trainer.num_eval_episodes=2", "trainer.progress=false", "device=cpu"]  # fmt: skip
    cfg = compose_cfg([f"experiment={preset}", *tiny])
    summary = build(cfg).train()
    assert summary.status == "completed" and summary.global_step == 2 * 8 * cfg.env.num_envs
    assert summary.objective_name == "eval/avg_reward" and summary.objective == summary.final["eval/avg_reward"]


def test_a_task_without_success_shows_and_logs_none(tmp_path):
    # Pendulum has no success signal: no "success 0.00" in the progress lines,
    # the final line or the logs; the objective (eval/avg_reward) instead.
    proc = run_cli(["experiment=gym_pendulum_ppo", "trainer.iterations=2", "trainer.rollout_steps=8",
                    "trainer.eval_freq=1", "trainer.num_eval_envs=2", "trainer.num_eval_episodes=2",
                    "device=cpu"], tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout.replace(str(tmp_path), "<tmp>")  # the test name is in the path
    assert "success" not in shown and "eval/avg_reward" in shown.splitlines()[-1]
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and not [key for row in rows for key in row if "success" in key]
    summary = RunSummary.read(run_dir)
    assert summary.best_eval_success_rate is None and summary.best_objective is not None


@pytest.mark.parametrize("overrides", [["env=cart_pole"], ["env=cart_pole", "algorithm=grpo", "env.max_episode_steps=8"],
                                       ["env=gym", "env.id=Pendulum-v1", "env.num_envs=4"]])  # fmt: skip
def test_task_options_work_with_the_defaults(compose_cfg, overrides):
    cfg = compose_cfg([*overrides, *TINY, "trainer.num_eval_envs=2", "trainer.num_eval_episodes=2"])
    trainer = build(cfg)
    assert trainer.train().status == "completed"
