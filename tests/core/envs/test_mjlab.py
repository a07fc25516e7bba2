"""env=mjlab: mjlab's registered tasks as rlchain envs, on the CPU (MuJoCo Warp's CPU kernels)."""

from __future__ import annotations

import json
import sys

import imageio.v3 as iio
import numpy as np
import pytest
import torch

pytest.importorskip("mjlab")

from rlchain.commands.train import ConfigError, build  # noqa: E402
from rlchain.core.envs import MjlabEnv, check_vec_env  # noqa: E402
from rlchain.settings import SettingError  # noqa: E402
from tests.helpers.runs import TINY, python_with_egl, rows, run_cli, run_dir  # noqa: E402

BALANCE = "Mjlab-Cartpole-Balance"
#: Episodes of 10 steps (0.5 s at the cartpole's 20 Hz): time-outs within a test.
SHORT = {"episode_length_s": 0.5}


def balance(**settings) -> MjlabEnv:
    return MjlabEnv(**{"task": BALANCE, "num_envs": 8, "seed": 0, **settings})


def test_a_task_passes_the_contract_with_its_groups_terms_and_time_outs():
    env = balance(overrides=SHORT)
    assert env.max_episode_steps == 10 and not env.reports_success
    assert set(env.single_observation_space.spaces) == {"actor", "critic"}
    assert env.single_observation_space["critic"].shape == (5,) and env.single_action_space.shape == (1,)
    check_vec_env(env)
    env.reset(seed=3)
    for step in range(1, 11):
        obs, reward, terminated, truncated, info = env.step(torch.zeros(8, 1))
        assert torch.allclose(sum(info["rewards"].values()), reward)
        assert set(info["rewards"]) == {"smooth_reward"} and not terminated.any()
        assert bool(truncated.all()) == (step == 10)  # mjlab's time-out is a truncation


def test_final_obs_is_the_observation_the_episode_ended_on_in_every_group():
    # The same seed and actions in an env whose episodes run on: its observation at step 10 is what the
    # 10-step env's episodes ended on (observation noise included: both draw from one stream until the reset).
    short, long = balance(overrides=SHORT), balance()
    short.reset(seed=1), long.reset(seed=1)
    actions = torch.linspace(-1, 1, 8).unsqueeze(1)
    for _ in range(10):
        after_reset, _, _, truncated, info = short.step(actions)
        running, *_ = long.step(actions)
    assert truncated.all()
    for group in ("actor", "critic"):
        assert torch.equal(info["final_obs"][group], running[group])
        assert not torch.allclose(after_reset[group], running[group])  # the returned one is the new episode's


def test_a_manipulation_task_reports_success_and_the_metrics_its_episodes_ended_with():
    # The metrics of a step are copies: the reset of the envs that ended zeroed mjlab's own (they read 0).
    def lift(**settings) -> MjlabEnv:
        return MjlabEnv(task="Mjlab-Lift-Cube-Yam", num_envs=2, seed=0, **settings)

    short, long = lift(max_episode_steps=3), lift()
    assert short.reports_success and set(short.single_observation_space.spaces) == {"actor", "critic"}
    short.reset(), long.reset()
    action = torch.zeros(2, *short.single_action_space.shape)
    for _ in range(3):
        *_, truncated, info = short.step(action)
        *_, running = long.step(action)
    assert truncated.all() and info["success"].dtype == torch.bool
    error = next(name for name in info["metrics"] if name.endswith("/position_error"))
    assert torch.equal(info["metrics"][error], running["metrics"][error]) and (info["metrics"][error] > 0).all()


def test_a_reset_leaves_the_summed_command_metrics_of_the_envs_that_go_on_alone():
    # mjlab's reset advances every env's commands; the velocity command's tracking errors are sums over the
    # episode, so every env that went on counted the step twice.
    env = MjlabEnv(task="Mjlab-Velocity-Flat-Unitree-Go1", num_envs=2, seed=0)
    env.reset()
    for _ in range(3):
        env.step(torch.zeros(2, *env.single_action_space.shape))
    metrics = env.env.command_manager._terms["twist"].metrics
    before = {name: value.clone() for name, value in metrics.items()}
    with env._rng.active():
        env._reset_envs(torch.tensor([0]))
    assert all(torch.equal(metrics[name][1], before[name][1]) for name in before) and before["error_vel_xy"][1] > 0


def test_the_env_draws_from_its_own_stream_and_leaves_torchs_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = balance(seed=5), balance(seed=5), balance(seed=6)
    first = [env.reset()[0]["actor"] for env in (a, b, c)]
    assert torch.equal(torch.get_rng_state(), before)  # mjlab seeds torch's global RNG with its cfg's seed
    assert torch.equal(first[0], first[1]) and not torch.equal(first[0], first[2])
    steps = [env.step(torch.full((8, 1), 0.3))[0]["actor"] for env in (a, b)]
    assert torch.equal(steps[0], steps[1]) and torch.equal(torch.get_rng_state(), before)


def test_a_resumed_env_draws_what_the_saved_one_would_have():
    env, other = balance(seed=0), balance(seed=9)
    env.reset()
    state = env.state_dict()
    other.load_state_dict(state)
    assert torch.equal(env.reset()[0]["critic"], other.reset()[0]["critic"])
    with pytest.raises(ValueError, match="is not an MjlabEnv's"):
        other.load_state_dict({"seed_generator": 0})


def test_spread_episode_starts_moves_each_envs_time_limit_from_its_own_stream():
    before = torch.get_rng_state()
    steps = []
    for _ in range(2):
        env = balance(overrides=SHORT)
        env.reset(seed=4)
        env.spread_episode_starts()
        ends = torch.stack([env.step(torch.zeros(8, 1))[3] for _ in range(10)]).float().argmax(0)
        steps.append(ends.tolist())
    assert steps[0] == steps[1] and len(set(steps[0])) > 2  # seeded, and spread over the 10 steps
    assert torch.equal(torch.get_rng_state(), before)


def test_group_resets_give_each_block_one_start_and_blocks_different_ones():
    env = balance()
    obs, _ = env.reset(seed=2, options={"group_size": 4})
    critic = obs["critic"]
    assert torch.equal(critic[:4], critic[0].expand(4, -1)) and torch.equal(critic[4:], critic[4].expand(4, -1))
    assert not torch.equal(critic[0], critic[4])
    qpos = env.env.sim.data.qpos  # the simulator's state, not only what the critic observes
    assert torch.equal(qpos[:4], qpos[0].expand(4, -1)) and not torch.equal(qpos[0], qpos[4])
    with pytest.raises(SettingError, match="num_envs must be a multiple of group_size"):
        env.reset(options={"group_size": 3})


def test_overrides_reach_the_tasks_cfg_and_a_misspelt_one_names_the_fields():
    quiet = {"observations": {"actor": {"enable_corruption": False}}}
    env = balance(overrides={"episode_length_s": 1.0, **quiet})
    assert env.max_episode_steps == 20 and env.env.cfg.observations["actor"].enable_corruption is False
    assert balance(max_episode_steps=7).max_episode_steps == 7
    with pytest.raises(SettingError) as info:
        balance(overrides={"observations": {"actor": {"enable_coruption": False}}})
    message = str(info.value)
    assert message.startswith("env.overrides.observations.actor.enable_coruption=False is not allowed: ")
    assert "'enable_corruption'" in message and "\n" not in message


def test_a_finite_horizon_tasks_time_outs_are_terminations():
    env = balance(overrides={**SHORT, "is_finite_horizon": True})
    env.reset()
    for _ in range(10):
        _, _, terminated, truncated, _ = env.step(torch.zeros(8, 1))
    assert terminated.all() and not truncated.any()  # nothing to bootstrap, as mjlab's rsl_rl wrapper has it


def test_a_state_of_another_device_and_endless_play_episodes_are_refused():
    env = balance()
    with pytest.raises(
        ValueError, match=r"^env state rng has 16 bytes: expected \d+, the RNG state of an MjlabEnv on cpu"
    ):
        env.load_state_dict({"rng": torch.zeros(16, dtype=torch.uint8)})
    with pytest.raises(SettingError, match=r"^env.play=True needs env.max_episode_steps: the play cfg's episodes"):
        balance(play=True)
    assert balance(play=True, max_episode_steps=5).max_episode_steps == 5


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_env_draws_from_its_own_streams_on_both_devices():
    cpu, cuda = torch.get_rng_state(), torch.cuda.get_rng_state()
    a, b = balance(device="cuda", seed=3), balance(device="cuda", seed=3)
    obs = [env.reset()[0]["actor"] for env in (a, b)]
    steps = [env.step(torch.full((8, 1), 0.3, device="cuda"))[0]["actor"] for env in (a, b)]
    assert torch.equal(obs[0], obs[1]) and torch.equal(steps[0], steps[1])
    assert torch.equal(torch.get_rng_state(), cpu) and torch.equal(torch.cuda.get_rng_state(), cuda)


def test_an_unknown_task_names_close_matches_and_a_missing_mjlab_the_extra(monkeypatch):
    with pytest.raises(
        SettingError,
        match=r"^env.task='Mjlab-Cartpole-Balanse' is not a registered mjlab task; "
        r"close matches: Mjlab-Cartpole-Balance",
    ):
        balance(task="Mjlab-Cartpole-Balanse")
    # sys.modules[name] = None is Python's own way to make `import name` fail, as on a machine without mjlab.
    for name in [m for m in sys.modules if m == "mjlab" or m.startswith("mjlab.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(SettingError) as info:
        balance()
    assert str(info.value) == (
        "env.task='Mjlab-Cartpole-Balance' needs mjlab, an optional extra that is not installed: "
        'pip install "rlchain[mjlab]"'
    )


MJLAB_TINY = ["env=mjlab", *TINY, "+env.overrides.episode_length_s=0.4"]  # 8 steps: a tiny rollout's


def test_a_camera_is_an_image_group_that_the_cnn_reads(compose_cfg):
    depth = MjlabEnv(task="Mjlab-Lift-Cube-Yam-Depth", num_envs=2, seed=0)
    assert depth.single_observation_space["camera"].shape == (1, 32, 32)
    assert depth.reset(seed=0)[0]["camera"].std() > 0  # a drawn depth map, not a blank one
    small_cnn = ["policy.cnn_channels=[4]", "policy.cnn_kernel_sizes=[4]", "policy.cnn_strides=[4]"]
    groups = ["policy.actor_obs=[actor,camera]", "policy.critic_obs=[critic]"]
    cfg = compose_cfg([*MJLAB_TINY, "env.task=Mjlab-Lift-Cube-Yam-Rgb", "env.num_envs=2", *groups, *small_cnn])
    trainer = build(cfg)
    camera = trainer.env.single_observation_space["camera"]
    assert camera.shape == (3, 32, 32) and camera.dtype == np.float32
    assert set(trainer.policy.actor_encoders) == {"camera"} and not trainer.policy.critic_encoders
    obs, _ = trainer.env.reset(seed=0)
    assert obs["camera"].std() > 0
    assert trainer.train().status == "completed"


def test_grpo_trains_on_a_task_from_shared_group_starts(compose_cfg):
    cfg = compose_cfg([*MJLAB_TINY, "algorithm=grpo", "algorithm.group_size=4"])
    summary = build(cfg).train()
    assert summary.status == "completed" and summary.global_step == 2 * 8 * 16


def test_a_run_on_a_task_resumes(compose_cfg, tmp_path):
    spread = [*MJLAB_TINY, "trainer.spread_episode_starts=true"]
    build(compose_cfg(spread)).train()
    summary = build(compose_cfg([*spread, "trainer.iterations=3", "trainer.resume_from=auto"])).train()
    assert summary.status == "completed" and summary.iteration == 3 and summary.global_step == 3 * 8 * 16
    assert [row["charts/iteration"] for row in rows(tmp_path)] == [1, 2, 3]  # two from the checkpoint, one here


@pytest.mark.slow
def test_a_run_on_a_task_trains_with_videos_and_is_evaluated_and_exported_without_allowing_anything(tmp_path):
    # headless videos: Mesa's EGL (MUJOCO_GL=egl)
    train = run_cli([*MJLAB_TINY, "trainer.video=true"], tmp_path, timeout=600, MUJOCO_GL="egl")
    assert train.returncode == 0, train.stderr
    assert "Warp CUDA warning" not in train.stderr  # Warp's no-driver line is dropped on the CPU
    run = run_dir(tmp_path)
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    (video,) = sorted((run / "videos").glob("*.mp4"))[-1:]
    assert iio.imread(video).shape[1:] == (240, 320, 3)  # every frame: the task's viewer size
    # rlchain-eval and rlchain-export in this process (the commands' own subprocesses are tested elsewhere)
    from rlchain.commands import eval as eval_command
    from rlchain.commands import export as export_command

    assert eval_command.main([str(run), "num_episodes=4"]) == 0
    assert export_command.main([str(run), "format=torchscript"]) == 0
    files = {"rlchain.json": ""}
    torch.jit.load(str(run / "checkpoints" / "best.torchscript.pt"), _extra_files=files)
    metadata = json.loads(files["rlchain.json"])
    assert [entry["name"] for entry in metadata["inputs"]] == ["actor"], metadata["inputs"]
    assert metadata["env_id"] == "Mjlab-Cartpole-Balance"


def test_frames_are_drawn_headless_one_env_each():
    code = """
        import torch
        from rlchain.core.envs import MjlabEnv
        env = MjlabEnv(task="Mjlab-Cartpole-Swingup", num_envs=3, render_mode="rgb_array")
        env.reset(seed=0)
        for _ in range(5):
            env.step(torch.tensor([[1.0], [-1.0], [0.0]]))
        frames = env.render()
        assert frames.shape == (3, 240, 320, 3) and frames.dtype == torch.uint8, frames.shape
        assert torch.equal(env.render([2, 1]), frames[[2, 1]]) and env.metadata["render_fps"] == 20
        assert frames.float().std() > 1 and not torch.equal(frames[0], frames[1])  # pictures of two states
        print("ok")
    """
    proc = python_with_egl(code, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr


def test_a_bad_task_in_the_config_is_one_line(compose_cfg):
    with pytest.raises(ConfigError) as info:
        build(compose_cfg(["env=mjlab", "env.task=Mjlab-Velocity-Flat-Unitree-Go2", *TINY]))
    line = str(info.value)
    assert line.startswith("Invalid config: env.task='Mjlab-Velocity-Flat-Unitree-Go2' is not a registered mjlab task")
    assert "Mjlab-Velocity-Flat-Unitree-Go1" in line.split("; the tasks: ")[0] and "\n" not in line  # a close match
