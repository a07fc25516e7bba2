"""env=maniskill: ManiSkill3's tasks on the CPU (one env per worker process) against the VecEnv contract, GRPO's
group starts, training, evaluation and export, and the one-line errors. Skipped, with the reason, on a machine
without mani-skill or without a Vulkan device (:mod:`tests.helpers.maniskill`; ``make test`` installs Mesa's CPU
driver first where it can)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.helpers.maniskill import skip_without_maniskill

skip_without_maniskill()

from rlchain.core.envs import ManiSkillEnv, check_vec_env  # noqa: E402
from rlchain.core.envs.maniskill_adapter import ManiSkillBatchedEnv, SuccessOnce  # noqa: E402
from rlchain.settings import SettingError  # noqa: E402
from tests.helpers.runs import TINY, run_cli  # noqa: E402


@pytest.fixture(scope="module")
def push_cube():
    env = ManiSkillEnv(num_envs=4, max_episode_steps=10)
    yield env
    env.close()


def test_push_cube_passes_the_contract(push_cube):
    assert push_cube.single_observation_space.shape == (35,) and push_cube.max_episode_steps == 10
    assert push_cube.reports_success
    check_vec_env(push_cube)


def test_group_resets_start_each_group_from_one_state_and_groups_from_different_ones(push_cube):
    obs, _ = push_cube.reset(seed=3, options={"group_size": 2})
    assert torch.equal(obs[0], obs[1]) and torch.equal(obs[2], obs[3]) and not torch.equal(obs[0], obs[2])


def test_a_seeded_reset_replays_the_later_episodes_too(push_cube):
    # ManiSkill draws an unseeded reset's seed from a generator that reset(seed=...) does not restart: before
    # SeededResets the second episode of a replay differed.
    def episodes():
        out = [push_cube.reset(seed=5)[0]]
        for t in range(15):
            out.append(push_cube.step(torch.full((4, 8), 0.05 * (t % 3)))[0])
        return torch.stack(out)

    assert torch.equal(episodes(), episodes())


def test_ignore_terminations_runs_episodes_to_the_time_limit():
    # PushCube-v1 ends an episode on success; with ignore_terminations only the time limit ends one.
    for env in (
        ManiSkillEnv(num_envs=1, max_episode_steps=6, ignore_terminations=True),
        ManiSkillBatchedEnv(num_envs=1, max_episode_steps=6, ignore_terminations=True),
    ):
        try:
            env.reset(seed=0)
            ends = [env.step(torch.zeros(1, 8))[2:4] for _ in range(6)]
            assert not any(bool(terminated) for terminated, _ in ends)
            assert [bool(truncated) for _, truncated in ends] == [False] * 5 + [True]
        finally:
            env.close()


class _SucceedsAtItsThirdStep(gym.Env):
    """A task whose success flag is up at its third step only."""

    observation_space = gym.spaces.Box(-1, 1, (1,))
    action_space = gym.spaces.Box(-1, 1, (1,))

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 0.0, False, self.t == 5, {"success": np.bool_(self.t == 3)}


def test_with_ignore_terminations_success_is_whether_the_episode_succeeded_at_any_step():
    env = SuccessOnce(_SucceedsAtItsThirdStep())
    for _ in range(2):  # and a reset starts it afresh
        env.reset()
        assert [bool(env.step(np.zeros(1))[4]["success"]) for _ in range(5)] == [False, False, True, True, True]


def test_the_batched_env_passes_the_contract_replays_and_leaves_torchs_rng_alone():
    # ManiSkill's GPU simulation's path, on the CPU: one env batched in this process (ManiSkill's CPU
    # simulation holds one). Its unseeded episode resets draw with torch.rand: from the env's own stream.
    outer = torch.get_rng_state()
    env = ManiSkillBatchedEnv(num_envs=1, max_episode_steps=10, render_mode="rgb_array")
    try:
        assert env.single_observation_space.shape == (35,) and env.reports_success
        check_vec_env(env)
        assert env.render().shape[0] == 1 and env.render().dtype == torch.uint8

        def episodes():
            out = [env.reset(seed=5)[0]]
            for t in range(25):
                out.append(env.step(torch.full((1, 8), 0.05 * (t % 3)))[0])
            return torch.stack(out)

        first = episodes()
        assert torch.equal(first, episodes())
        assert not torch.equal(first[11], first[22])  # the later episodes (unseeded resets) start elsewhere
        assert torch.equal(torch.get_rng_state(), outer)

        # A resume resets every env (ManiSkill's episodes cannot be saved): from the saved random state, the new
        # episodes start where the saved run's would have: the cube (torch's stream) and the arm's start noise
        # (ManiSkill's numpy generators) alike.
        env.reset(seed=5)
        [env.step(torch.zeros(1, 8)) for _ in range(3)]
        saved = env.state_dict()
        expected, _ = env.reset()
        env.reset(seed=7)
        [env.step(torch.zeros(1, 8)) for _ in range(13)]
        env.load_state_dict(saved)
        assert torch.equal(env.reset()[0], expected)
    finally:
        env.close()


def test_cameras_are_observation_groups_and_the_batched_env_one_env_on_the_cpu():
    small = {"sensor_configs": {"width": 32, "height": 24}}  # ManiSkill's camera settings (its default: 128x128)
    env = ManiSkillBatchedEnv(num_envs=1, max_episode_steps=3, obs_mode="rgbd", kwargs=small)
    try:
        spaces = env.single_observation_space
        assert spaces["rgb"].shape == (24, 32, 3) and spaces["rgb"].dtype == np.uint8
        assert spaces["depth"].shape == (24, 32, 1) and spaces["depth"].dtype == np.float32
        assert spaces["state"].shape == (25,)
        obs, _ = env.reset(seed=0)
        assert obs["rgb"].dtype == torch.uint8 and obs["rgb"].float().std() > 0 and obs["depth"].max() > 100  # mm
        check_vec_env(env)
    finally:
        env.close()
    with pytest.raises(SettingError, match=r"^env.num_envs=2 is not allowed: ManiSkill's CPU simulation holds one"):
        ManiSkillBatchedEnv(num_envs=2)


@pytest.mark.cuda
def test_on_cuda_env_maniskill_is_the_gpu_simulation_with_group_starts_from_one_state():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env = ManiSkillEnv(num_envs=8, max_episode_steps=10, device="cuda")
    try:
        assert isinstance(env, ManiSkillBatchedEnv) and env.device.type == "cuda"
        check_vec_env(env)
        obs, _ = env.reset(seed=3, options={"group_size": 4})
        assert obs.device.type == "cuda"
        assert torch.equal(obs[0], obs[3]) and torch.equal(obs[4], obs[7]) and not torch.equal(obs[0], obs[4])
        obs, _ = env.reset(seed=3)
        assert not torch.equal(obs[0], obs[1])
    finally:
        env.close()


def test_a_camera_actor_trains_evaluates_and_exports(tmp_path):
    run = tmp_path / "run"
    camera = ["env.obs_mode=rgb", "+env.kwargs.sensor_configs={width:32,height:24}"]
    small_cnn = ["policy.cnn_channels=[4]", "policy.cnn_kernel_sizes=[4]", "policy.cnn_strides=[4]"]
    groups = ["policy.actor_obs=[rgb,state]", "policy.critic_obs=[state]", *small_cnn]
    in_process = ["env.num_envs=1", "env.vectorization=sync", "trainer.num_eval_envs=1"]  # no worker to start
    args = ["env=maniskill", *camera, *groups, *in_process, "env.max_episode_steps=8", *TINY]
    proc = run_cli([*args, f"hydra.run.dir={run}"], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # rlchain-eval and rlchain-export in this process (the commands' own subprocesses are tested elsewhere)
    from rlchain.commands import eval as eval_command
    from rlchain.commands import export as export_command

    assert eval_command.main([str(run), "num_episodes=2"]) == 0
    assert export_command.main([str(run), "format=torchscript"]) == 0
    files = {"rlchain.json": ""}
    torch.jit.load(str(run / "checkpoints" / "best.torchscript.pt"), _extra_files=files)
    metadata = json.loads(files["rlchain.json"])
    assert metadata["env_id"] == "PushCube-v1" and metadata["env"].endswith("ManiSkillEnv")
    rgb = {i["name"]: i for i in metadata["inputs"]}["rgb"]
    assert rgb["dtype"] == "uint8" and rgb["shape"] == ["B", 24, 32, 3] and rgb["layout"] == "HWC"


def test_bad_input_is_one_line(monkeypatch):
    with pytest.raises(SettingError, match=r"^env.id='PushCub-v1' .*PushCube-v1"):
        ManiSkillEnv(id="PushCub-v1", num_envs=1)
    with pytest.raises(SettingError, match=r"^env.kwargs=.* is not allowed: reward_mode is set by env=maniskill"):
        ManiSkillEnv(num_envs=1, kwargs={"reward_mode": "sparse"})
    with pytest.raises(SettingError, match=r"^obs_groups=True is not allowed with env=maniskill: obs_mode"):
        ManiSkillEnv(num_envs=1, obs_groups=True)
    with pytest.raises(SettingError, match=r"^obs_mode='pointcloud' is not allowed: expected one of"):
        ManiSkillEnv(num_envs=1, obs_mode="pointcloud")
    with pytest.raises(SettingError, match=r"^env.device='cuda' is not allowed: ManiSkillEnv runs ManiSkill's CPU"):
        _refuse_cuda()
    # sys.modules[name] = None is Python's own way to make `import name` fail, as on a machine without mani-skill.
    for name in [m for m in sys.modules if m == "mani_skill" or m.startswith("mani_skill.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(SettingError) as info:
        ManiSkillEnv(num_envs=1)
    assert str(info.value) == (
        "env.id='PushCube-v1' needs mani-skill, an optional extra that is not installed: "
        'pip install "rlchain[maniskill]"'
    )


def _refuse_cuda() -> None:
    """The process env's refusal of a CUDA device (ManiSkillEnv(device="cuda") builds the batched env instead),
    where torch has no CUDA device to resolve 'cuda' to."""
    env = object.__new__(ManiSkillEnv)
    env.cfg = ManiSkillEnv.config_class(num_envs=1)
    env.device = torch.device("cuda")
    env._check_installed()


def test_a_machine_without_vulkan_is_told_what_to_install(tmp_path):
    env = {
        **os.environ,
        "VK_ICD_FILENAMES": str(tmp_path / "none.json"),
        "VK_DRIVER_FILES": str(tmp_path / "none.json"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "rlchain.commands.train", "env=maniskill", *TINY, f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 1
    (line,) = [x for x in proc.stderr.splitlines() if "Vulkan" in x]
    assert "SAPIEN found no Vulkan device" in line and "bookworm-backports mesa-vulkan-drivers" in line
