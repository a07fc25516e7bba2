"""ManiSkill3's tasks as an rlchain :class:`~rlchain.core.envs.base.VecEnv` (``env=maniskill``), on the CPU.

``rlchain-train env=maniskill env.id=PushCube-v1`` builds any registered ManiSkill3 task (``PushCube-v1``: a
Panda arm pushes a cube to a goal; ``PickCube-v1``, ``StackCube-v1``, ...) with state observations, its
``env.control_mode`` (None: the task's default) and ``env.reward_mode`` (``normalized_dense`` by default, as
ManiSkill's PPO baseline trains). ManiSkill is an optional extra: ``pip install "rlchain[maniskill]"``.

On the CPU ManiSkill simulates one env per process: ``num_envs`` worker processes (gymnasium's
``AsyncVectorEnv``, started with ``spawn``: SAPIEN's Vulkan state cannot be forked), each a one-env task behind
ManiSkill's ``CPUGymWrapper``, are stepped together. Everything else is :class:`GymVecEnv`'s, whose subclass
this is: same-step auto-reset with the final observation, ``info["success"]`` from the ended episode's own
``final_info``, GRPO's group starts (the ``G`` envs of a group reset with one seed, so from one state),
seeding without torch's global RNG, rendering (``env.render_mode=rgb_array``: SAPIEN's camera frames).
ManiSkill's GPU simulation (every env in one process on CUDA) is not wired in yet: a CUDA device is refused.

SAPIEN needs a Vulkan device even for state observations. On a machine without a GPU that is Mesa's CPU driver
(lavapipe) from Mesa 24.3 on (Debian 12: ``mesa-vulkan-drivers`` from bookworm-backports; the repository's
``.ci/vulkan`` installs it); without one, building the env is one line that says what to install.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlchain.core.envs.gym_adapter import GymEnvConfig, GymVecEnv
from rlchain.settings import SettingError, setting

__all__ = ["MANISKILL_EXTRA", "VULKAN_HINT", "ManiSkillEnv", "ManiSkillEnvConfig", "SeededResets"]

#: What to install for env=maniskill.
MANISKILL_EXTRA = 'pip install "rlchain[maniskill]"'
#: What a machine without a Vulkan device needs.
VULKAN_HINT = (
    "install a Vulkan driver: a GPU's, or Mesa's CPU driver lavapipe 24.3 or later "
    "(Debian 12: apt install -t bookworm-backports mesa-vulkan-drivers)"
)


@dataclass
class ManiSkillEnvConfig(GymEnvConfig):
    """Settings of :class:`ManiSkillEnv`: :class:`GymEnvConfig`'s, with ManiSkill's defaults, and ManiSkill's own.

    ``env.kwargs`` go to every task's constructor as they are (e.g. ``robot_uids``).
    """

    _target_: str = "rlchain.core.envs.maniskill_adapter.ManiSkillEnv"
    id: str = "PushCube-v1"
    num_envs: int = 8
    success_key: str | None = "success"
    vectorization: str = "async"
    control_mode: str | None = None
    """The arm's controller, e.g. pd_joint_delta_pos or pd_ee_delta_pos; None: the task's default."""
    reward_mode: str = setting("normalized_dense", choices=("normalized_dense", "dense", "sparse"))
    """ManiSkill's reward: normalized_dense (dense, scaled to [0, 1] per step), dense, or sparse (success)."""


class ManiSkillEnv(GymVecEnv):
    """``num_envs`` ManiSkill3 tasks, one per worker process, as a :class:`GymVecEnv` (see the module docstring).

    Args:
        settings: fields of :class:`ManiSkillEnvConfig` (``self.cfg``).

    Shapes: observations float32 ``[N, obs_dim]`` (``PushCube-v1``: 35); actions float32 ``[N, act_dim]``;
    rewards float32 ``[N]``; terminated/truncated/success bool ``[N]``; frames uint8 ``[K, H, W, 3]`` on the CPU.

    Raises:
        SettingError: mani-skill not installed (naming the extra), no Vulkan device (what to install), a CUDA
            device, an unknown task id (close matches), ``env.kwargs`` that set what a setting sets, a setting out
            of its range; each naming its setting.
    """

    config_class = ManiSkillEnvConfig

    def _check_installed(self) -> None:
        cfg = self.cfg
        missing = SettingError(
            "env.id", cfg.id, f" needs mani-skill, an optional extra that is not installed: {MANISKILL_EXTRA}"
        )
        if importlib.util.find_spec("mani_skill") is None:
            raise missing
        if self.device.type != "cpu":
            raise SettingError(
                "env.device",
                str(self.device),
                " is not allowed: env=maniskill runs ManiSkill's CPU simulation (one env per worker process); "
                "its GPU simulation is not wired in yet: expected cpu",
            )
        clash = sorted(
            set(cfg.kwargs)
            & {"obs_mode", "control_mode", "reward_mode", "sim_backend", "num_envs", "max_episode_steps"}
        )
        if clash:
            raise SettingError(
                "env.kwargs",
                dict(cfg.kwargs),
                f" is not allowed: {', '.join(clash)} {'is' if len(clash) == 1 else 'are'} set by env=maniskill "
                "(env.control_mode, env.reward_mode, env.max_episode_steps; state observations; the CPU simulation)",
            )
        try:
            import mani_skill.envs  # noqa: F401  (registers ManiSkill's task ids with gymnasium)
            import sapien
        except ImportError as err:
            if err.name == "mani_skill":  # mani-skill itself; an error inside an installed one keeps its traceback
                raise missing from None
            raise

        try:
            sapien.render.RenderSystem()
        except RuntimeError as err:
            raise SettingError(
                "env.id", cfg.id, f": ManiSkill's simulator SAPIEN found no Vulkan device ({err}); {VULKAN_HINT}"
            ) from None

    def _env_kwargs(self) -> dict[str, Any]:
        kwargs = {"obs_mode": "state", "reward_mode": self.cfg.reward_mode, "sim_backend": "cpu"}
        if self.cfg.control_mode is not None:
            kwargs["control_mode"] = self.cfg.control_mode
        if self.cfg.max_episode_steps is not None:  # ManiSkill's own time limit (its spec's wrapper) takes it
            kwargs["max_episode_steps"] = self.cfg.max_episode_steps
        return {**kwargs, **self.cfg.kwargs}

    def _wrappers(self) -> list[Any]:
        from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

        return [CPUGymWrapper, SeededResets]

    def _vector_kwargs(self) -> dict[str, Any]:
        return {"context": "spawn"} if self.cfg.vectorization == "async" else {}


class SeededResets(gym.Wrapper):
    """Gives every reset of a task a seed, drawn from a generator that each seeded reset restarts.

    ManiSkill draws the seed of an unseeded reset (gymnasium's auto-reset) from a generator that a seeded reset
    does not restart, so ``reset(seed=s)`` and the same actions replayed other episodes after the first one.
    Here the first episode gets ``s`` and the later ones seeds drawn from ``numpy.random.default_rng(s)``.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._seeds = np.random.default_rng()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            self._seeds = np.random.default_rng(seed)
        else:
            seed = int(self._seeds.integers(2**31 - 1))
        return self.env.reset(seed=seed, options=options)
