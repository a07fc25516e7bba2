"""env=gym: any gymnasium id behind the VecEnv contract."""

from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

import tests.helpers.gym_toy_envs  # noqa: F401  (registers the toy gymnasium ids)
from rlchain.core.envs import GymVecEnv, check_vec_env
from rlchain.core.envs.gym_adapter import flatten_batch
from tests.helpers.runs import TINY, run_cli


def raw_vec(env_id: str, num_envs: int, seed: int):
    raw = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    obs, _ = raw.reset(seed=[seed + i for i in range(num_envs)])
    return raw, obs


def test_box_env_matches_gymnasium_clips_actions_and_keeps_final_obs():
    env = GymVecEnv("Pendulum-v1", num_envs=3, seed=5)
    raw, raw_obs = raw_vec("Pendulum-v1", 3, seed=5)
    assert env.single_action_space == raw.single_action_space and env.max_episode_steps == 200
    obs, _ = env.reset(seed=5)
    np.testing.assert_allclose(obs.numpy(), raw_obs, atol=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(200):
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


def test_obs_groups_keeps_a_dict_observations_keys_as_groups_each_flattened():
    from rlchain.core.collector import SyncCollector
    from rlchain.core.policies import ActorCritic

    env = GymVecEnv("rlchain_test/DictObs-v0", num_envs=4, obs_groups=True)
    space = env.single_observation_space
    assert isinstance(space, gym.spaces.Dict) and {k: v.shape for k, v in space.spaces.items()} == {
        "mode": (3,),
        "position": (4,),
        "target": (2,),
    }
    check_vec_env(env)
    obs, _ = env.reset(seed=0)
    assert obs["mode"].sum(-1).tolist() == [1.0] * 4  # the Discrete part is one-hot, in its own group
    for _ in range(3):
        obs, _, terminated, _, info = env.step(torch.ones(4, 1))
    assert terminated.all() and info["final_obs"]["position"].unique().tolist() == [3.0]  # the final observation
    assert obs["position"].unique().tolist() == [0.0]
    policy = ActorCritic(space, env.single_action_space, hidden_sizes=[8], actor_obs=["target"])
    data = SyncCollector(env, policy, rollout_steps=4).collect().data
    assert set(data["obs"].keys()) == {"mode", "position", "target"} and policy.critic_groups == ["target"]
    with pytest.raises(ValueError, match=r"env.obs_groups=True needs a Dict observation space: Pendulum-v1's is Box"):
        GymVecEnv("Pendulum-v1", num_envs=2, obs_groups=True)


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
    for _ in range(3):
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
        (
            {"id": "CartPol-v1"},
            None,
            "env.id='CartPol-v1' is not a registered gymnasium id; close matches: CartPole-v1",
        ),
        (
            {"id": "rlchain_test/MultiDiscrete-v0"},
            None,
            "the action space MultiDiscrete([2 3]) (MultiDiscrete) is not supported",
        ),
        ({"id": "CartPole-v1", "vectorization": "threads"}, None, "vectorization='threads' is not allowed"),
        ({"id": "Blackjack-v1"}, None, "env.id='Blackjack-v1' has no time limit: set env.max_episode_steps"),
        ({"id": "HalfCheetah-v5"}, "mujoco", 'needs MuJoCo, which is not installed: pip install "rlchain[mujoco]"'),
        ({"id": "LunarLander-v3"}, "Box2D", "env.id='LunarLander-v3' needs a package that is not installed"),
    ],
)
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
)
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


def test_a_gymnasium_env_knows_whether_it_reports_success_from_its_construction(capsys):
    # success_key names the info flag; reports_success never changes while the env runs
    plain = GymVecEnv("Pendulum-v1", num_envs=2)
    assert plain.reports_success is False
    check_vec_env(plain)
    flagged = GymVecEnv("rlchain_test/DictObs-v0", num_envs=2, success_key="is_success")  # flag on the third step
    assert flagged.reports_success is True
    for _ in range(3):
        _, _, _, _, info = flagged.step(torch.ones(2, 1))
    assert info["success"].tolist() == [True, True] and flagged.reports_success is True
    capsys.readouterr()
    unread = GymVecEnv("rlchain_test/DictObs-v0", num_envs=2)  # the same flag, no success_key: one notice
    for _ in range(6):
        _, _, _, _, info = unread.step(torch.ones(2, 1))
    assert unread.reports_success is False and not info["success"].any()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "rlchain: env.id=rlchain_test/DictObs-v0 reports info['is_success'], which env.success_key=None "
        "leaves unread: set env.success_key=is_success to log a success rate"
    )


class ImageObsEnv(gym.Env):
    """An env observing a Box of ``shape`` and ``dtype`` (CarRacing-v3: uint8 (96, 96, 3)), alone or as the
    ``pixels`` part of a Dict beside a vector ``state`` (``in_dict``)."""

    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, shape=(96, 96, 3), dtype="uint8", in_dict=False):
        high = 255 if dtype == "uint8" else 1.0
        image = gym.spaces.Box(0, high, tuple(shape), np.dtype(dtype))
        state = gym.spaces.Box(-1, 1, (3,), np.float32)
        self.observation_space = gym.spaces.Dict({"pixels": image, "state": state}) if in_dict else image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


gym.register("rlchain_test/ImageObs-v0", entry_point=ImageObsEnv, max_episode_steps=10)


@pytest.mark.parametrize(
    "kwargs, shape, dtype",
    [
        ({}, (96, 96, 3), torch.uint8),  # CarRacing-v3's
        ({"shape": [84, 84]}, (84, 84, 1), torch.uint8),  # a grey image gains a channel
        ({"shape": [3, 64, 64], "dtype": "float32"}, (3, 64, 64), torch.float32),  # e.g. depth, channels first
    ],
)
def test_an_image_observation_is_kept_whole_for_the_cnn(kwargs, shape, dtype):
    # Before: refused (and before that, flattened into 27,648 MLP inputs for CarRacing-v3).
    from rlchain.core.policies import ActorCritic
    from rlchain.envs import check_vec_env

    env = GymVecEnv("rlchain_test/ImageObs-v0", num_envs=2, kwargs=kwargs)
    assert env.single_observation_space.shape == shape
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, *shape) and obs.dtype == dtype
    raw = np.asarray(env.envs.reset(seed=[0, 1])[0]).reshape(2, *shape)  # the gymnasium env's own, unflattened
    assert np.array_equal(env.reset(seed=0)[0].numpy(), raw)
    check_vec_env(env)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, cnn_kernel_sizes=[8, 4, 3])
    assert list(policy.actor_encoders) == ["obs"] and policy.obs_normalizer is None


def test_an_image_in_a_dict_is_a_group_of_its_own_with_obs_groups():
    env = GymVecEnv("rlchain_test/ImageObs-v0", num_envs=2, kwargs={"in_dict": True}, obs_groups=True)
    obs, _ = env.reset(seed=0)
    assert obs["pixels"].shape == (2, 96, 96, 3) and obs["pixels"].dtype == torch.uint8
    assert obs["state"].shape == (2, 3) and obs["state"].dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs, part, why",
    [
        (
            {"in_dict": True},
            "the part ['pixels'] of its observation space Box(0, 255, (96, 96, 3), uint8)",
            "kept whole only as an observation group; expected env.obs_groups=true",
        ),
        (
            {"shape": [2, 8, 8, 3]},
            "its observation space Box(0, 255, (2, 8, 8, 3), uint8)",
            "the CNN encoder takes images of 2 or 3 dimensions",
        ),
    ],
)
def test_an_image_the_policy_cannot_take_whole_is_refused_in_one_line(kwargs, part, why):
    with pytest.raises(ValueError) as info:
        GymVecEnv("rlchain_test/ImageObs-v0", num_envs=2, kwargs=kwargs)
    message = str(info.value)
    assert message.startswith(f"env.id='rlchain_test/ImageObs-v0': {part} is an image, and ") and "\n" not in message
    assert why in message


@pytest.mark.parametrize(
    "kwargs", [{"shape": [4]}, {"shape": [2, 2], "dtype": "float32"}, {"shape": [5], "in_dict": True}]
)
def test_vector_observations_of_any_dtype_are_no_images(kwargs):
    env = GymVecEnv("rlchain_test/ImageObs-v0", num_envs=2, kwargs=kwargs)
    assert env.single_observation_space.shape == (gym.spaces.flatdim(env.gym_observation_space),)
