"""Evaluation videos: the frames evaluate records, and a training run's MP4 files, TensorBoard images and errors."""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from rlchain.core.envs import CartPoleEnv, PushCubeEnv
from rlchain.core.evaluation import evaluate
from rlchain.core.policies import ActorCritic
from rlchain.run.video import encode_gif, write_mp4
from tests.helpers.runs import TINY, run_cli, summary_of


@pytest.mark.parametrize(
    "make_env",
    [
        lambda: PushCubeEnv(num_envs=4, max_episode_steps=12, render_mode="rgb_array"),
        lambda: CartPoleEnv(num_envs=4, max_episode_steps=30, render_mode="rgb_array"),
    ],
)
def test_video_holds_the_first_episode_of_each_recorded_env_one_frame_per_action(make_env):
    env = make_env()
    torch.manual_seed(0)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    result = evaluate(env, policy, num_episodes=8, seed=0, video_episodes=3)
    first = result.lengths[:3].astype(int).tolist()  # rows 0..2: the first episodes of envs 0..2
    assert result.video_lengths == first
    height, width = env.render([0]).shape[1:3]
    assert result.frames.shape == (sum(first), height, width, 3) and result.frames.dtype == np.uint8
    # each episode's first frame is its start state: what env.render shows right after the same reset
    env.reset(seed=0)
    starts = env.render([0, 1, 2]).cpu().numpy()
    offsets = np.cumsum([0, *first[:-1]])
    for j, at in enumerate(offsets):
        np.testing.assert_array_equal(result.frames[at], starts[j])
    assert result.fps == env.metadata["render_fps"]


def test_a_written_mp4_decodes_to_its_frames(tmp_path):
    env = PushCubeEnv(num_envs=2, render_mode="rgb_array")
    frames = []
    for _ in range(9):
        frames.append(env.render([0])[0].numpy())
        env.step(torch.full((2, 2), 0.5))
    frames = np.stack(frames)
    path = write_mp4(tmp_path / "v.mp4", frames, fps=10)
    decoded = iio.imread(path)
    assert decoded.shape == frames.shape
    assert np.abs(decoded.astype(int) - frames.astype(int)).mean() < 4  # H.264 is lossy; the picture is the same
    gif = iio.imread(encode_gif(frames, fps=10), extension=".gif")
    assert gif.shape[0] == 9


@pytest.mark.slow
def test_training_with_video_writes_one_mp4_per_evaluation(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(
        [
            "algorithm=ppo",
            "env=push_cube",
            *TINY,
            "env.max_episode_steps=10",
            "trainer.video=true",
            "trainer.video_episodes=2",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(run)
    videos = sorted((run / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["step_000000000128.mp4", "step_000000000256.mp4"]  # eval_freq=1, 2 iterations
    # the last video is the policy of latest.pt, evaluated as the trainer does: the same frames
    state = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    env = PushCubeEnv(num_envs=8, max_episode_steps=10, seed=1, render_mode="rgb_array")
    policy = ActorCritic(env.single_observation_space, env.single_action_space)
    policy.load_state_dict(state["policy"])
    expected = evaluate(env, policy, 8, seed=1, video_episodes=2)
    decoded = iio.imread(videos[-1])
    assert decoded.shape == expected.frames.shape == (sum(expected.video_lengths), 256, 256, 3)
    assert np.abs(decoded.astype(int) - expected.frames.astype(int)).mean() < 4
    assert summary.final["eval/avg_length"] == pytest.approx(float(expected.lengths.mean()))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0}).Reload()
    images = events.Images("eval/video")
    assert [i.step for i in images] == [128, 256] and images[-1].width == 128 and images[-1].height == 128


def test_video_on_an_env_that_cannot_render_fails_before_any_step(compose_cfg):
    from omegaconf import OmegaConf, open_dict

    from rlchain.commands.train import ConfigError, build

    cfg = compose_cfg(["env=push_cube", *TINY, "trainer.video=true"])
    with open_dict(cfg):  # a user's env, as --config-dir's env=line gives it
        cfg.env = OmegaConf.create({"_target_": "tests.helpers.toy_env.LineEnv", "num_envs": 16})
    with pytest.raises(
        ConfigError, match=r"trainer.video=True needs an env that renders: its settings have no render_mode"
    ):
        build(cfg)


def test_more_video_episodes_than_evaluation_envs_is_refused(compose_cfg):
    from rlchain.commands.train import ConfigError, build

    with pytest.raises(ConfigError, match="trainer.video_episodes=9 is not allowed with num_eval_envs=8"):
        build(compose_cfg(["env=push_cube", *TINY, "trainer.video=true", "trainer.video_episodes=9"]))
