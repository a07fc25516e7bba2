"""ManiSkill3's tasks as an rlchain :class:`~rlchain.core.envs.base.VecEnv` (``env=maniskill``), on the CPU.

``rlchain-train env=maniskill env.id=PushCube-v1`` builds any registered ManiSkill3 task (``PushCube-v1``: a
Panda arm pushes a cube to a goal; ``PickCube-v1``, ``StackCube-v1``, ...) with its ``env.control_mode`` (None:
the task's default) and ``env.reward_mode`` (``normalized_dense`` by default, as ManiSkill's PPO baseline
trains). ManiSkill is an optional extra: ``pip install "rlchain[maniskill]"``.

Observations (``env.obs_mode``): ``state``, one float32 vector; or the task's cameras, ``rgb``, ``depth`` or
``rgbd``, as observation groups (:mod:`rlchain.core.observations`), joined by ManiSkill's
``FlattenRGBDObservationWrapper``: ``state`` (float32 ``[D]``, the robot's and the task's state), ``rgb`` (uint8
``[H, W, 3 * cameras]``) and ``depth`` (millimetres as float32 ``[H, W, cameras]``), for the policy's CNN
encoder; e.g. ``policy.actor_obs=[rgb,state]`` ``policy.critic_obs=[state]``.

Two simulations, chosen by ``env.device``:

* ``cpu``: ManiSkill's CPU simulation holds one env per process, so ``num_envs`` worker processes (gymnasium's
  ``AsyncVectorEnv``, started with ``spawn``: SAPIEN's Vulkan state cannot be forked), each a one-env task behind
  ManiSkill's ``CPUGymWrapper``, are stepped together (:class:`ManiSkillEnv`, a :class:`GymVecEnv`): GRPO's
  group starts reset the ``G`` envs of a group with one seed, so from one state.
* ``cuda``: ManiSkill's GPU simulation, every env batched in one process on the device, behind its own
  ``ManiSkillVectorEnv`` (:class:`ManiSkillBatchedEnv`; ``ManiSkillEnv(device="cuda")`` builds one): GRPO's
  group starts reset the other envs of a group to its first env's simulator state (ManiSkill's
  ``get_state_dict`` and ``reset_to_env_states``); ManiSkill's episode resets draw from torch's default generator, which holds the env's
  own stream (:class:`~rlchain.core.envs.base.TorchRngStream`) while it does.

Either way: same-step auto-reset with the final observation, ``info["success"]`` from the ended episode's own
``final_info``, seeding that leaves torch's global RNG alone, rendering (``env.render_mode=rgb_array``:
SAPIEN's camera frames).

SAPIEN needs a Vulkan device even for state observations. On a machine without a GPU that is Mesa's CPU driver
(lavapipe) from Mesa 24.3 on (Debian 12: ``mesa-vulkan-drivers`` from bookworm-backports; the repository's
``.ci/vulkan``, which ``make test`` runs, installs it); without one, building the env is one line that says what
to install (:func:`vulkan_error` is that check).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlchain.core.envs.base import TorchRngStream, VecEnv, reset_group_size
from rlchain.core.envs.gym_adapter import GymEnvConfig, GymVecEnv, float32_observation_space, resolve_spec
from rlchain.settings import SettingError, setting
from rlchain.utils import indexed_device, resolve_device

__all__ = [
    "MANISKILL_EXTRA",
    "VULKAN_HINT",
    "ManiSkillBatchedEnv",
    "ManiSkillEnv",
    "ManiSkillEnvConfig",
    "SeededResets",
    "SuccessOnce",
    "vulkan_error",
]

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
    ignore_terminations: bool = False
    """Run every episode to its time limit (ManiSkill's own option, as its PPO baseline trains): the task's
    success or failure no longer ends it. With a dense reward and a small gamma an episode that ends on success
    earns less than one that stays near the goal, which a policy learns to prefer. Success keeps its meaning:
    info["success"] is then whether the episode has succeeded at any step so far (ManiSkill's success_once), what
    an episode ended by its first success reports."""
    obs_mode: str = setting("state", choices=("state", "rgb", "depth", "rgbd"))
    """state: one vector; rgb, depth, rgbd: the groups state, and rgb and/or depth of the task's cameras."""

    def check(self) -> None:
        """Refuse ``obs_groups``: ``obs_mode`` decides whether there are groups."""
        super().check()
        if self.obs_groups:
            raise SettingError(
                "obs_groups",
                True,
                " is not allowed with env=maniskill: obs_mode decides (rgb, depth and rgbd give the groups "
                "state, rgb, depth); expected false",
            )


def _maniskill_kwargs(cfg: ManiSkillEnvConfig, device: torch.device) -> dict[str, Any]:
    """The keyword arguments of ManiSkill's ``gym.make`` for ``cfg``: its simulation and renderer on ``device``
    (``cpu``, or ``cuda:N`` with its index)."""
    where = f"cuda:{device.index}" if device.type == "cuda" else "cpu"
    kwargs = {
        "obs_mode": cfg.obs_mode,
        "reward_mode": cfg.reward_mode,
        "sim_backend": f"physx_{where}",
        "render_backend": f"sapien_{where}",
    }
    if cfg.control_mode is not None:
        kwargs["control_mode"] = cfg.control_mode
    if cfg.max_episode_steps is not None:  # ManiSkill's own time limit (its spec's wrapper) takes it
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    return {**kwargs, **cfg.kwargs}


def _cameras(obs_mode: str) -> Any:
    """ManiSkill's wrapper that joins the cameras of ``obs_mode`` into the groups state, rgb and depth; None for
    ``state``."""
    if obs_mode == "state":
        return None
    from mani_skill.utils.wrappers.flatten import FlattenRGBDObservationWrapper

    return partial(FlattenRGBDObservationWrapper, rgb=obs_mode != "depth", depth=obs_mode != "rgb", state=True)


def _check_maniskill(cfg: ManiSkillEnvConfig) -> None:
    """Refuse, in one line naming the setting, what ManiSkill cannot build here: mani-skill not installed (the
    extra), ``env.kwargs`` that set what a setting sets, no Vulkan device (what to install)."""
    missing = SettingError(
        "env.id", cfg.id, f" needs mani-skill, an optional extra that is not installed: {MANISKILL_EXTRA}"
    )
    if importlib.util.find_spec("mani_skill") is None:
        raise missing
    settings = ("obs_mode", "control_mode", "reward_mode", "max_episode_steps", "render_mode", "num_envs")
    clash = sorted(set(cfg.kwargs) & {*settings, "sim_backend", "render_backend"})
    if clash:
        raise SettingError(
            "env.kwargs",
            dict(cfg.kwargs),
            f" is not allowed: {', '.join(clash)} {'is' if len(clash) == 1 else 'are'} set by env=maniskill "
            "(env.control_mode, env.reward_mode, env.obs_mode, env.max_episode_steps, env.render_mode, "
            "env.num_envs; the simulation follows env.device)",
        )
    try:
        import mani_skill.envs  # noqa: F401  (registers ManiSkill's task ids with gymnasium)
    except ImportError as err:
        if err.name == "mani_skill":  # mani-skill itself; an error inside an installed one keeps its traceback
            raise missing from None
        raise

    err = vulkan_error()
    if err is not None:
        raise SettingError(
            "env.id", cfg.id, f": ManiSkill's simulator SAPIEN found no Vulkan device ({err}); {VULKAN_HINT}"
        )


def vulkan_error() -> str | None:
    """Why SAPIEN (ManiSkill's simulator) finds no Vulkan device on this machine, or None where it finds one.

    SAPIEN needs the device even for state observations. The check builds SAPIEN's render system once (cheap
    beside importing SAPIEN, which a ManiSkill env imports anyway), in this process.

    Returns:
        SAPIEN's own message (e.g. ``failed to find a rendering device``), or None.

    Raises:
        ImportError: mani-skill (which brings SAPIEN) is not installed.
    """
    import sapien

    try:
        sapien.render.RenderSystem()
    except RuntimeError as err:
        return str(err)
    return None


class ManiSkillEnv(GymVecEnv):
    """``num_envs`` ManiSkill3 tasks, one per worker process, as a :class:`GymVecEnv` (see the module docstring);
    with a CUDA ``device``, ``ManiSkillEnv(...)`` builds a :class:`ManiSkillBatchedEnv` instead.

    Args:
        settings: fields of :class:`ManiSkillEnvConfig` (``self.cfg``).

    Shapes: observations float32 ``[N, obs_dim]`` (``PushCube-v1``: 35), or with cameras a TensorDict of the
    groups (``PushCube-v1``, ``obs_mode=rgb``: ``state`` ``[N, 25]``, ``rgb`` uint8 ``[N, 128, 128, 3]``);
    actions float32 ``[N, act_dim]``; rewards float32 ``[N]``; terminated/truncated/success bool ``[N]``; frames
    uint8 ``[K, H, W, 3]`` on the CPU.

    Raises:
        SettingError: mani-skill not installed (naming the extra), no Vulkan device (what to install), an unknown
            task id (close matches), ``env.kwargs`` that set what a setting sets, a setting out of its range, a
            CUDA device given to this class itself; each naming its setting.
    """

    config_class = ManiSkillEnvConfig

    def __new__(cls, *args: Any, **settings: Any) -> Any:
        """A :class:`ManiSkillBatchedEnv` for a CUDA ``device`` (ManiSkill's GPU simulation), else this class."""
        if cls is ManiSkillEnv and resolve_device(settings.get("device", "cpu"), "env.device").type == "cuda":
            return ManiSkillBatchedEnv(**settings)
        return super().__new__(cls)

    def _check_installed(self) -> None:
        if self.device.type != "cpu":
            raise SettingError(
                "env.device",
                str(self.device),
                " is not allowed: ManiSkillEnv runs ManiSkill's CPU simulation (one env per worker process); "
                "ManiSkill's GPU simulation is ManiSkillBatchedEnv's (ManiSkillEnv(device='cuda') builds one)",
            )
        _check_maniskill(self.cfg)

    def _env_kwargs(self) -> dict[str, Any]:
        return _maniskill_kwargs(self.cfg, self.device)

    def _wrappers(self) -> list[Any]:
        from mani_skill.utils.wrappers.gymnasium import CPUGymWrapper

        cameras = _cameras(self.cfg.obs_mode)
        wrappers = [] if cameras is None else [cameras]
        wrappers += [partial(CPUGymWrapper, ignore_terminations=self.cfg.ignore_terminations), SeededResets]
        return wrappers + [SuccessOnce] if self.cfg.ignore_terminations else wrappers

    def _obs_groups(self) -> bool:
        return self.cfg.obs_mode != "state"

    def _vector_kwargs(self) -> dict[str, Any]:
        return {"context": "spawn"} if self.cfg.vectorization == "async" else {}


class SuccessOnce(gym.Wrapper):
    """``info["success"]`` becomes whether the episode has succeeded at any step so far (ManiSkill's
    ``success_once``): with ``ignore_terminations`` an episode goes on after its success, and reports what an
    episode ended by it would have."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._once = False

    def reset(self, **kwargs: Any) -> Any:
        self._once = False
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if "success" in info:
            self._once = self._once or bool(info["success"])
            info["success"] = np.bool_(self._once)
        return obs, reward, terminated, truncated, info


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


def _stream_seed(seed: int) -> int:
    """The seed of the env's torch stream for the run seed ``seed``: ManiSkill seeds torch with ``seed`` itself
    for a seeded reset's draws, and a stream seeded alike would repeat them in the next episodes."""
    return int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])


class ManiSkillBatchedEnv(VecEnv):
    """Every env of a ManiSkill3 task batched in one process, behind ManiSkill's ``ManiSkillVectorEnv``: its GPU
    simulation on a CUDA device (see the module docstring); on the CPU, where ManiSkill's simulation holds one
    env per process, a single env.

    ``ManiSkillEnv(device="cuda")`` (``env=maniskill device=cuda``) builds one.

    Args:
        settings: fields of :class:`ManiSkillEnvConfig` (``self.cfg``; ``vectorization`` is not read).

    Shapes: observations float32 ``[N, obs_dim]`` (``PushCube-v1``: 35), or with cameras a TensorDict of the
    groups (:class:`ManiSkillEnv`'s); actions float32 ``[N, act_dim]`` (the controllers clip them to
    ``[-1, 1]``); rewards float32 ``[N]``; terminated/truncated/success bool ``[N]``; frames uint8
    ``[K, H, W, 3]`` on ``device``. ManiSkill's auto-reset asks the device once a step whether an episode ended.

    Raises:
        SettingError: what :class:`ManiSkillEnv` refuses (but a CUDA device); ``num_envs`` other than 1 on the CPU.
    """

    def __init__(self, **settings: Any) -> None:
        self.cfg = cfg = ManiSkillEnvConfig(**settings)
        super().__init__(cfg.num_envs, indexed_device(resolve_device(cfg.device, "env.device")))
        if self.device.type == "cpu" and cfg.num_envs != 1:
            raise SettingError(
                "env.num_envs",
                cfg.num_envs,
                " is not allowed: ManiSkill's CPU simulation holds one env per process, so on the CPU "
                "ManiSkillBatchedEnv is one env (ManiSkillEnv steps num_envs processes); expected 1",
            )
        _check_maniskill(cfg)
        spec = resolve_spec(cfg.id)
        self.max_episode_steps = int(cfg.max_episode_steps or spec.max_episode_steps)
        self.render_mode = cfg.render_mode
        self.reports_success = cfg.success_key is not None
        self._rng = TorchRngStream(self.device, _stream_seed(cfg.seed))
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

        kwargs = {**_maniskill_kwargs(cfg, self.device), "num_envs": cfg.num_envs, "render_mode": cfg.render_mode}
        with self._rng.active():
            env = gym.make(spec, **kwargs)
            cameras = _cameras(cfg.obs_mode)
            if cameras is not None:
                env = cameras(env)
            self.envs = ManiSkillVectorEnv(
                env, ignore_terminations=cfg.ignore_terminations, record_metrics=cfg.ignore_terminations
            )
        self.metadata = {
            **type(self).metadata,
            "render_modes": ["rgb_array"],
            "render_fps": int(getattr(self.envs.base_env, "control_freq", 0) or 30),
        }
        obs_space = self.envs.single_observation_space
        self._groups = tuple(obs_space.spaces) if isinstance(obs_space, gym.spaces.Dict) else None
        self._set_spaces(float32_observation_space(obs_space, self._groups), self.envs.single_action_space)
        self._no_success = torch.zeros(cfg.num_envs, dtype=torch.bool, device=self.device)
        self.reset(seed=cfg.seed)

    def _observe(self, obs: Any) -> Any:
        """ManiSkill's batched observation as rlchain's: the float32 tensor, or a TensorDict of the groups (uint8
        images kept, depth as float32)."""
        if self._groups is None:
            return obs.float()
        from tensordict import TensorDict  # imported where used: see rlchain.commands.config

        groups = {g: obs[g] if obs[g].dtype == torch.uint8 else obs[g].float() for g in self._groups}
        return TensorDict(groups, batch_size=[self.num_envs], device=self.device)

    def _success(self, info: dict[str, Any]) -> torch.Tensor:
        """The step's success flag; with ``ignore_terminations`` the episode's ``success_once`` (ManiSkill's
        metric, recorded by its vector env)."""
        key = self.cfg.success_key
        if key is None or key not in info:
            return self._no_success
        if self.cfg.ignore_terminations and key == "success":
            return info["episode"]["success_once"].bool()
        return info[key].bool()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset every env.

        Args:
            seed: restarts the env's RNG stream and ManiSkill's episode seeds from it; None goes on with both.
            options: ``{"group_size": G}``: each block of ``G`` consecutive envs starts from the simulator state
                its first env was reset to.

        Returns:
            ``(obs, info)``: ``obs`` as :meth:`step` returns it; ``info`` is empty.

        Raises:
            SettingError: ``group_size`` not a positive int dividing ``num_envs``.
        """
        group_size = reset_group_size(options, self.num_envs)
        if seed is not None:
            self._rng.seed(_stream_seed(seed))
        with self._rng.active():
            obs, _ = self.envs.reset(seed=seed)
            if group_size > 1:
                obs = self._copy_group_starts(group_size)
        return self._observe(obs), {}

    def _copy_group_starts(self, group_size: int) -> Any:
        """Reset every env but the first of each block to the simulator state of that first env (ManiSkill's
        ``reset_to_env_states``: the state, then the controllers, then the observation); return the observation.

        Raises:
            ValueError: a task whose start is not all in the simulator state (a goal kept in a plain tensor, a
                different object per env), so that the envs of a block would not start alike.
        """
        from tensordict import TensorDict

        state = TensorDict(self.envs.base_env.get_state_dict(), batch_size=[self.num_envs])
        ids = torch.arange(self.num_envs, device=self.device)
        followers = ids[ids % group_size != 0]
        leaders = followers - followers % group_size
        starts = {"env_states": state[leaders].to_dict()}
        obs, _ = self.envs.reset(options={"env_idx": followers, "reset_to_env_states": starts})
        vector = obs["state"] if self._groups is not None else obs
        if not bool((vector[followers] == vector[leaders]).all()):  # once per reset, not per step
            raise ValueError(
                f"env.id={self.cfg.id!r} keeps part of an episode's start outside ManiSkill's simulator state, so "
                "the envs of a group do not start alike: GRPO's group starts (algorithm.group_size > 1) need a task "
                "whose start get_state_dict holds whole"
            )
        return obs

    def step(self, action: torch.Tensor):
        """Step every env once (same-step auto-reset).

        Args:
            action: float32 ``[N, act_dim]``.

        Returns:
            ``(obs, reward, terminated, truncated, info)`` as described in :class:`VecEnv`; ``info["success"]``
            of an env whose episode ended is its ended episode's last step's.

        Raises:
            ValueError: an action of the wrong shape.
        """
        shape = (self.num_envs, *self.single_action_space.shape)
        if tuple(action.shape) != shape:
            raise ValueError(f"action has shape {tuple(action.shape)}: expected {shape} = (num_envs, action dim)")
        with self._rng.active():
            obs, reward, terminated, truncated, info = self.envs.step(action)
        final_obs = obs
        if "final_info" in info:  # some episode ended (ManiSkill's auto-reset asked the device)
            info, final_obs = info["final_info"], info["final_observation"]  # the step's, before the reset
        success = self._success(info)
        out = {"final_obs": self._observe(final_obs), "rewards": {}, "metrics": {}, "success": success}
        return self._observe(obs), reward.float(), terminated.bool(), truncated.bool(), out

    def render(self, env_ids: Sequence[int] | None = None) -> torch.Tensor:
        """Frames of the envs ``env_ids`` (every env when None): SAPIEN's render camera.

        Returns:
            uint8 RGB ``[K, H, W, 3]`` on ``device``.

        Raises:
            RuntimeError: the env was built with ``render_mode=None``.
            IndexError: an env id outside ``[0, num_envs)``.
        """
        ids = self._render_ids(env_ids)
        frames = self.envs.render()
        if frames is None:
            raise RuntimeError(f"env.id={self.cfg.id!r} has no render camera: ManiSkill drew no frame")
        frames = frames[..., :3].to(self.device, torch.uint8)
        return frames if ids is None else frames[torch.as_tensor(ids, dtype=torch.long, device=self.device)]

    def state_dict(self) -> dict[str, Any]:
        """The env's random state: its torch stream and ManiSkill's per-env numpy episode generators (which draw,
        e.g., the robot's start noise). ManiSkill's episodes in progress are not saved: a resume resets every env."""
        states = [rng.get_state() for rng in self.envs.base_env._batched_episode_rng.rngs]
        episode_rngs = {
            "keys": torch.from_numpy(np.stack([s[1] for s in states]).astype(np.int64)),
            "pos": torch.tensor([s[2] for s in states], dtype=torch.int64),
            "has_gauss": torch.tensor([s[3] for s in states], dtype=torch.int64),
            "cached_gaussian": torch.tensor([s[4] for s in states], dtype=torch.float64),
        }
        return {"rng": self._rng.state.clone(), "episode_rngs": episode_rngs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output: later episode resets draw what the saved run's would have.

        Raises:
            ValueError: a state that is not a ManiSkillBatchedEnv's, or one of another number of envs.
        """
        if set(state) != {"rng", "episode_rngs"}:
            raise ValueError(f"env state {sorted(state)} is not a ManiSkillBatchedEnv's: expected rng, episode_rngs")
        saved = state["episode_rngs"]
        if tuple(saved["keys"].shape) != (self.num_envs, 624):
            raise ValueError(
                f"env state episode_rngs holds {tuple(saved['keys'].shape)} generator keys: expected "
                f"({self.num_envs}, 624), one per env of this ManiSkillBatchedEnv"
            )
        self._rng.load(state["rng"], "ManiSkillBatchedEnv")
        rngs = self.envs.base_env._batched_episode_rng.rngs
        for i, rng in enumerate(rngs):
            keys = saved["keys"][i].numpy().astype(np.uint32)
            rng.set_state(
                ("MT19937", keys, int(saved["pos"][i]), int(saved["has_gauss"][i]), float(saved["cached_gaussian"][i]))
            )

    def close(self, **kwargs: Any) -> None:
        """Close ManiSkill's env."""
        self.envs.close()
