"""Headless rendering: frames of the torch-native tasks, the gymnasium wrappers and env=gym."""

from __future__ import annotations

import importlib.util
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import tests.helpers.gym_toy_envs  # noqa: F401  (registers the toy gymnasium ids)
from rlchain.core.envs import CartPoleEnv, GymVecEnv, PushCubeEnv, VecEnv, VecEnvContractError, check_vec_env
from rlchain.core.envs.base import RENDER_MODES
from rlchain.core.envs.cart_pole import RENDER_HEIGHT, RENDER_WIDTH
from rlchain.core.envs.push_cube import RENDER_MARGIN, RENDER_SIZE
from rlchain.settings import SettingError
from tests.helpers.runs import python_with_egl

# gymnasium's checker warns about the unbounded Box of PushCube and about a wrapped env.
GYM_CHECKER_WARNINGS = [
    pytest.mark.filterwarnings("ignore:.*Box observation space m.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*is different from the unwrapped version.*:UserWarning"),
]


def place(env: PushCubeEnv, **state: float) -> None:
    """Set every env to one state given by keyword (the rest at rest, pusher and goal out of the way)."""
    n = env.num_envs
    full = dict(cube_x=0.0, cube_y=0.0, cube_yaw=0.0, pusher_x=-0.45, pusher_y=0.45, goal_x=0.35, goal_y=-0.35)
    full.update(state)
    env.set_state({k: torch.full((n,), float(v)) for k, v in full.items()})


def pixel(env: PushCubeEnv, x: float, y: float) -> tuple[int, int]:
    """``(row, col)`` of the pixel whose square holds the world point ``(x, y)``: table plus margin, y up."""
    view = env.cfg.table_half_extent * RENDER_SIZE / (RENDER_SIZE - 2 * RENDER_MARGIN)
    return int((view - y) / (2 * view) * RENDER_SIZE), int((x + view) / (2 * view) * RENDER_SIZE)


def at(frame: torch.Tensor, env: PushCubeEnv, x: float, y: float) -> tuple[int, ...]:
    """The RGB colour of ``frame`` ([H, W, 3]) at the world point ``(x, y)``."""
    return tuple(frame[pixel(env, x, y)].tolist())


# ------------------------------------------------------------------ shapes
@pytest.mark.parametrize("num_envs", [1, 3, 6])
def test_push_cube_frames_are_uint8_rgb_on_the_device_and_rows_of_the_full_render(num_envs):
    env = PushCubeEnv(num_envs=num_envs, render_mode="rgb_array")
    frames = env.render()
    assert frames.shape == (num_envs, RENDER_SIZE, RENDER_SIZE, 3) and frames.dtype == torch.uint8
    assert frames.device == env.device and RENDER_SIZE % 2 == 0
    for ids in ([0], list(range(num_envs)), [num_envs - 1, 0], [0, 0], list(range(num_envs))[1:]):
        assert torch.equal(env.render(ids), frames[ids])
    assert torch.equal(env.render(torch.tensor([num_envs - 1])), frames[-1:])
    assert env.render([]).shape == (0, RENDER_SIZE, RENDER_SIZE, 3)
    assert env.render_mode == "rgb_array" and env.metadata["render_modes"] == ["rgb_array"]


@pytest.mark.parametrize("num_envs", [1, 4])
def test_cart_pole_frames_are_uint8_rgb_on_the_device_and_rows_of_the_full_render(num_envs):
    env = CartPoleEnv(num_envs=num_envs, render_mode="rgb_array")
    frames = env.render()
    assert frames.shape == (num_envs, RENDER_HEIGHT, RENDER_WIDTH, 3) and frames.dtype == torch.uint8
    assert frames.device == env.device and RENDER_HEIGHT % 2 == 0 and RENDER_WIDTH % 2 == 0
    for ids in ([num_envs - 1], [num_envs - 1, 0, num_envs - 1]):
        assert torch.equal(env.render(ids), frames[ids])
    assert env.metadata["render_fps"] == 50 and env.metadata["render_modes"] == ["rgb_array"]


def test_render_fps_is_one_frame_per_control_step_and_per_instance():
    assert PushCubeEnv(num_envs=1, control_dt=0.05).metadata["render_fps"] == pytest.approx(20.0)
    assert PushCubeEnv(num_envs=1).metadata["render_fps"] == pytest.approx(10.0)
    assert PushCubeEnv.metadata["render_fps"] == pytest.approx(10.0)  # the class's own is left alone


# ------------------------------------------------------------ what is drawn
def test_push_cube_frame_shows_table_cube_goal_and_pusher_where_they_are():
    env = PushCubeEnv(num_envs=2, render_mode="rgb_array")
    place(env, cube_x=0.3, cube_y=0.2)
    frame = env.render([1])[0]
    table, outside = at(frame, env, -0.5, -0.5), tuple(frame[1, 1].tolist())
    assert sum(table) > 500 and sum(outside) < 200  # a light table in a dark border
    cube = at(frame, env, 0.3, 0.2)
    pusher = at(frame, env, -0.45, 0.45)
    goal, region, past_region = at(frame, env, 0.35, -0.35), at(frame, env, 0.29, -0.35), at(frame, env, 0.2, -0.35)
    assert len({table, cube, pusher, goal, region}) == 5 and past_region == table
    # Moved by set_state, the cube leaves table where it was and shows where it is.
    place(env, cube_x=-0.2, cube_y=-0.1)
    moved = env.render()
    for frame in moved:
        assert at(frame, env, 0.3, 0.2) == table and at(frame, env, -0.2, -0.1) == cube


def test_push_cube_frame_shows_the_cube_yaw_in_full():
    env = PushCubeEnv(num_envs=1, render_mode="rgb_array")
    edge = 0.045  # inside the 0.1 m cube, by its face
    place(env, cube_yaw=0.0)
    frame0 = env.render()[0]
    body = at(frame0, env, 0.0, 0.0)
    # The +x face is marked, the others are not.
    assert at(frame0, env, edge, 0.0) != body
    assert at(frame0, env, -edge, 0.0) == at(frame0, env, 0.0, edge) == at(frame0, env, 0.0, -edge) == body
    place(env, cube_yaw=math.pi / 2)  # the marked face turns to +y: a square's outline alone would not change
    frame90 = env.render()[0]
    assert at(frame90, env, 0.0, edge) != body and at(frame90, env, edge, 0.0) == body
    assert not torch.equal(frame90, frame0)
    place(env, cube_yaw=math.pi / 4)  # a corner of the unturned cube is now table
    frame45 = env.render()[0]
    assert at(frame45, env, -0.045, -0.045) == at(frame45, env, -0.5, -0.5) != at(frame0, env, -0.045, -0.045)
    assert not torch.equal(frame45, frame0)


def test_cart_pole_frame_follows_the_cart_and_the_pole_angle():
    env = CartPoleEnv(num_envs=2, render_mode="rgb_array")
    env.set_state({"x": torch.tensor([0.0, 1.0]), "theta": torch.tensor([0.0, 0.3])})
    upright, moved = env.render()

    def colour(frame, x, y):  # frame x in [-2.4, 2.4] m at 80 px/m, the cart's centre 0.8 m above the bottom
        return tuple(frame[int(RENDER_HEIGHT - (y + 0.8) * 80), int((x + 2.4) * 80)].tolist())

    white = colour(upright, -2.0, 1.5)
    assert white == (255, 255, 255)
    assert colour(upright, 0.0, -0.05) == (0, 0, 0) and colour(moved, 0.0, -0.05) == white  # the cart
    assert colour(moved, 1.0, -0.05) == (0, 0, 0)
    pole = colour(upright, 0.0, 0.8)
    assert pole not in (white, (0, 0, 0))
    assert colour(moved, 1.0, 0.8) == white  # the leaning pole has left the vertical ...
    assert colour(moved, 1.0 + 0.7 * math.sin(0.3), 0.06 + 0.7 * math.cos(0.3)) == pole  # ... to the right


# ------------------------------------------------------------------ errors
def test_render_without_render_mode_and_out_of_range_ids_are_clear_errors():
    for env in (PushCubeEnv(num_envs=2), CartPoleEnv(num_envs=2)):
        assert env.render_mode is None
        with pytest.raises(
            RuntimeError,
            match=rf"{type(env).__name__}\.render\(\) needs render_mode='rgb_array' "
            r"\(env\.render_mode=None\)",
        ):
            env.render()
    env = PushCubeEnv(num_envs=2, render_mode="rgb_array")
    for bad in ([2], [-1], [0.5]):
        with pytest.raises(IndexError, match=r"expected integers in \[0, 2\)"):
            env.render(bad)
    with pytest.raises(SettingError, match="render_mode='human' is not allowed: expected one of None, 'rgb_array'"):
        PushCubeEnv(num_envs=2, render_mode="human")
    assert RENDER_MODES == (None, "rgb_array")


def test_a_vec_env_that_does_not_render_says_so():
    class Silent(VecEnv):
        pass

    with pytest.raises(NotImplementedError, match="Silent does not render"):
        Silent(2, torch.device("cpu")).render()


def test_check_vec_env_checks_render_when_rendering():
    check_vec_env(PushCubeEnv(num_envs=4, max_episode_steps=5, render_mode="rgb_array"))

    class FloatFrames(PushCubeEnv):
        def render(self, env_ids=None):
            return super().render(env_ids).float()

    with pytest.raises(VecEnvContractError, match="rule 'render'.*dtype torch.float32: expected torch.uint8"):
        check_vec_env(FloatFrames(num_envs=4, max_episode_steps=5, render_mode="rgb_array"))


# --------------------------------------------------------------- gymnasium
@pytest.mark.parametrize(
    "env_id, shape, fps", [("rlchain/PushCube-v0", (256, 256, 3), 10.0), ("rlchain/CartPole-v1", (256, 384, 3), 50)]
)
@GYM_CHECKER_WARNINGS[0]
@GYM_CHECKER_WARNINGS[1]
def test_gymnasium_make_with_render_mode_passes_the_env_checker_render_check_included(env_id, shape, fps):
    env = gym.make(env_id, render_mode="rgb_array")
    assert env.render_mode == "rgb_array" and env.metadata == {"render_modes": ["rgb_array"], "render_fps": fps}
    check_env(env.unwrapped, skip_render_check=False)
    check_env(env, skip_render_check=False)
    env.reset(seed=0)
    frame = env.render()
    assert isinstance(frame, np.ndarray) and frame.shape == shape and frame.dtype == np.uint8
    plain = gym.make(env_id)
    plain.reset(seed=0)
    with pytest.warns(UserWarning, match="render_mode=None"):
        assert plain.render_mode is None and plain.render() is None  # as gymnasium's own envs
    batched = gym.make_vec(env_id, num_envs=3, vectorization_mode="vector_entry_point", render_mode="rgb_array")
    assert batched.render_mode == "rgb_array" and batched.render().shape == (3, *shape)


def test_gym_vec_env_renders_the_sub_envs_asked_for():
    env = GymVecEnv("rlchain/PushCube-v0", num_envs=3, max_episode_steps=100, render_mode="rgb_array")
    frames = env.render()
    assert frames.shape == (3, 256, 256, 3) and frames.dtype == torch.uint8 and frames.device.type == "cpu"
    assert torch.equal(env.render([2, 0]), frames[[2, 0]]) and env.render([]).shape == (0, 256, 256, 3)
    assert not torch.equal(frames[0], frames[1])  # seeded apart
    assert env.metadata["render_fps"] == 10.0 and env.metadata["render_modes"] == ["rgb_array"]
    env.step(torch.ones(3, 2))
    assert not torch.equal(env.render([0]), frames[:1])  # the pusher moved
    env.close()


def test_gym_vec_env_renders_in_async_workers():
    # The parent has run torch's parallel regions (the frames above): the forked workers still draw.
    torch.zeros(1 << 20).add_(1)
    env = GymVecEnv(
        "rlchain/PushCube-v0", num_envs=2, max_episode_steps=100, render_mode="rgb_array", vectorization="async"
    )
    try:
        frames = env.render()
        assert frames.shape == (2, 256, 256, 3) and torch.equal(env.render([1]), frames[1:])
    finally:
        env.close()


def test_gym_vec_env_refuses_render_modes_the_env_lacks():
    with pytest.raises(
        SettingError,
        match=r"env.render_mode='rgb_array' is not allowed with "
        r"env.id=rlchain_test/EchoAction-v0: it renders only \[\]",
    ):
        GymVecEnv("rlchain_test/EchoAction-v0", num_envs=2, render_mode="rgb_array")
    with pytest.raises(SettingError, match="give render_mode once"):
        GymVecEnv(
            "rlchain/PushCube-v0",
            num_envs=2,
            max_episode_steps=100,
            render_mode="rgb_array",
            kwargs={"render_mode": "rgb_array"},
        )
    with pytest.raises(RuntimeError, match=r"GymVecEnv\.render\(\) needs render_mode='rgb_array'"):
        GymVecEnv("rlchain/PushCube-v0", num_envs=2, max_episode_steps=100).render()


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs mujoco")
def test_gym_vec_env_renders_mujoco_headless_with_egl():
    code = """
        import torch
        from rlchain.core.envs import GymVecEnv
        env = GymVecEnv("HalfCheetah-v5", num_envs=2, render_mode="rgb_array")
        frames = env.render()
        assert frames.shape == (2, 480, 480, 3) and frames.dtype == torch.uint8, frames.shape
        assert torch.equal(env.render([1]), frames[1:]) and env.metadata["render_fps"] == 20
        assert frames.float().std() > 1  # a picture, not a blank
        print("ok")
    """
    proc = python_with_egl(code, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr


# -------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_frames_drawn_on_cuda_stay_there_and_match_the_cpu():
    for make in (PushCubeEnv, CartPoleEnv):
        cpu = make(num_envs=8, seed=3, render_mode="rgb_array")
        gpu = make(num_envs=8, seed=3, render_mode="rgb_array", device="cuda")
        gpu.set_state({k: v.cuda() for k, v in cpu.get_state().items()})
        frames = gpu.render([7, 0, 1])
        assert frames.device.type == "cuda" and frames.dtype == torch.uint8
        # sin/cos may differ in the last bit between devices: a pixel on a shape's edge may flip.
        differ = (frames.cpu() != cpu.render([7, 0, 1])).any(-1).float().mean()
        assert differ < 1e-3, f"{make.__name__}: {differ:.2%} of the pixels differ"
