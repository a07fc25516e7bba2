"""mjlab's tasks (Isaac Lab's manager API on MuJoCo Warp) as rlchain :class:`~rlchain.core.envs.base.VecEnv` s.

``rlchain-train env=mjlab env.task=Mjlab-Cartpole-Swingup env.num_envs=256`` builds the task that
``mjlab.tasks.registry`` registers under that id, as mjlab's own ``train`` does
(``ManagerBasedRlEnv(load_env_cfg(task), device)``), on the configured device (CPU or CUDA). mjlab is an
optional extra: ``pip install "rlchain[mjlab]"``.

What rlchain sees of a task:

* observations: mjlab's observation groups (``actor`` and ``critic`` in every task it ships) as rlchain
  observation groups (:mod:`rlchain.core.observations`), float32 ``[N, dim]`` each; the actor sees ``actor``
  and the critic ``critic`` by default (``policy.actor_obs`` / ``policy.critic_obs``). A camera group (the
  ``camera`` of ``Mjlab-Lift-Cube-Yam-Rgb``, float32 ``[3, H, W]`` in ``[0, 1]`` as mjlab hands it) is an
  image group, read through the policy's CNN encoder when ``policy.actor_obs`` or ``policy.critic_obs``
  names it.
* actions: float32 ``[N, action_dim]``, passed on unclipped, as mjlab's registered runners do (its
  action terms scale them).
* episodes: same-step auto-reset. The env is built with mjlab's ``auto_reset=False``, so that ``step``
  hands back the observation an episode ended on; it goes to ``info["final_obs"]`` (every group), and the
  envs that ended are then reset in the same call. ``terminated`` is mjlab's termination; ``truncated``
  its time-out (where the episode did not also terminate).
* ``info["rewards"]``: the reward manager's terms, weighted (and scaled by the step's duration where the
  task does so, as its reward is), summing to the reward; ``info["metrics"]``: the metrics manager's terms
  and each command's metrics (``<command>/<metric>``), float32 ``[N]`` each.
* ``info["success"]``, by task family: a task whose command latches an ``episode_success`` (the
  manipulation tasks, ``Mjlab-Lift-Cube-Yam*``: the object came within the command's
  ``success_threshold`` of its target since the command last drew a target, which it does every 8-12 s of a
  20 s episode); a motion-tracking task (a ``motion`` command): the episode ran to its time-out without a
  termination. Other tasks (cartpole, velocity
  tracking) report no success signal (``reports_success`` is False), as Pendulum does.

Settings of the task's env cfg (``ManagerBasedRlEnvCfg``) are changed with ``env.overrides``, a nested
mapping of its fields: ``+env.overrides.episode_length_s=10``,
``+env.overrides.observations.actor.enable_corruption=false``,
``+env.overrides.rewards.smooth_reward.weight=2``. ``env.play=true`` starts from the task's play cfg
(no observation noise, endless episodes) instead.

Randomness. mjlab draws its random events (resets, pushes, observation noise) from torch's global RNG and
seeds it (and numpy's, Python's and Warp's) when its cfg has a seed. rlchain keeps its own: the env's draws
come from a torch RNG state of its own, seeded by ``env.seed`` and swapped in around every mjlab call, so the
policy's sampling and the env's events do not share a stream, nothing reseeds torch's global RNG, and the
state is part of :meth:`MjlabEnv.state_dict` (a resumed run draws what the saved run would have drawn; the
simulator's own state cannot be saved, so a resume resets every env). A terrain generator without a seed gets
``env.seed``. MuJoCo Warp itself is not bit-deterministic on every device (mujoco_warp issue 562).

``reset(options={"group_size": G})`` gives each block of ``G`` consecutive envs one initial state: the
blocks are reset in ``G`` passes, pass ``k`` resetting env ``k`` of every block from one RNG state, so each
env of a block draws the same reset events: the same simulator state (its place in the scene, its terrain tile,
stays its own). mjlab draws observation noise for the whole batch at once, so the noisy groups of a block's envs
differ by their noise.

Rendering (``env.render_mode=rgb_array``, for ``trainer.video``): mjlab's offscreen MuJoCo renderer, one env
per frame, at the task's viewer size (320x240 for the shipped tasks). It draws through OpenGL: on a machine
without a display set ``MUJOCO_GL=egl`` (GPU or Mesa EGL) or ``MUJOCO_GL=osmesa`` before anything imports
``mujoco``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.util
import io
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlchain.core.envs.base import TorchRngStream, VecEnv, VecEnvConfig, reset_group_size
from rlchain.settings import SettingError, setting
from rlchain.utils import indexed_device, resolve_device

__all__ = ["MjlabEnv", "MjlabEnvConfig"]

#: What to install for env=mjlab.
INSTALL = 'pip install "rlchain[mjlab]"'


@dataclass
class MjlabEnvConfig(VecEnvConfig):
    """Every setting of :class:`MjlabEnv` with its default; the Hydra schema of ``env=mjlab``.

    ``num_envs``, ``device``, ``seed`` and ``render_mode`` as :class:`~rlchain.core.envs.base.VecEnvConfig`.
    """

    _target_: str = "rlchain.core.envs.mjlab_adapter.MjlabEnv"
    num_envs: int = 256
    task: str = "Mjlab-Cartpole-Balance"
    """A task id of mjlab's registry (mjlab.tasks.registry.list_tasks()), e.g. Mjlab-Cartpole-Swingup,
    Mjlab-Velocity-Flat-Unitree-Go1, Mjlab-Lift-Cube-Yam."""
    max_episode_steps: int | None = setting(None, gt=0)
    """Time limit in env steps; None keeps the task's (its cfg's episode_length_s)."""
    play: bool = False
    """Start from the task's play cfg (mjlab's play mode: no observation noise, endless episodes) instead of its
    training cfg; needs max_episode_steps (evaluation needs episodes that end)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Fields of the task's env cfg (mjlab's ManagerBasedRlEnvCfg) to change, nested as the cfg is:
    +env.overrides.episode_length_s=10, +env.overrides.observations.actor.enable_corruption=false."""


#: What Warp's native library prints to stderr when it loads on a machine without a CUDA driver: noise on the
#: CPU, where rlchain drops it (see :func:`_native_stderr_without`).
NO_CUDA_DRIVER = "Warp CUDA warning: Could not find or load the NVIDIA CUDA driver."


@contextlib.contextmanager
def _native_stderr_without(prefix: str) -> Iterator[None]:
    """Run the body with file descriptor 2 caught (a native library's prints), then write what it printed to
    stderr, less the lines that start with ``prefix``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not line.startswith(prefix)))


def _quiet_on_cpu(device: torch.device) -> contextlib.AbstractContextManager:
    """Drop Warp's no-CUDA-driver line (Warp loads its native library when mjlab builds its first env) on the CPU."""
    return _native_stderr_without(NO_CUDA_DRIVER) if device.type == "cpu" else contextlib.nullcontext()


def _import_mjlab(task: str, device: torch.device) -> tuple[Any, Any]:
    """mjlab's env class and task registry module, with its tasks registered.

    Raises:
        SettingError: ``env.task=...``: mjlab is not installed (naming the extra).
    """
    missing = SettingError("env.task", task, f" needs mjlab, an optional extra that is not installed: {INSTALL}")
    if importlib.util.find_spec("mjlab") is None:
        raise missing
    logging.getLogger("OpenGL").setLevel(logging.WARNING)  # PyOpenGL's INFO line on every import
    try:
        with _quiet_on_cpu(device):
            import mjlab.tasks  # noqa: F401  (registers mjlab's tasks)
            from mjlab.envs import ManagerBasedRlEnv
            from mjlab.tasks import registry
    except ImportError as err:
        if err.name == "mjlab":  # mjlab itself; an error inside an installed mjlab keeps its traceback
            raise missing from None
        raise
    return ManagerBasedRlEnv, registry


def _task_cfg(registry: Any, task: str, play: bool) -> Any:
    """The registered env cfg of ``task`` (a copy).

    Raises:
        SettingError: ``env.task=...``: not a registered task (naming close matches and every task).
    """
    tasks = registry.list_tasks()
    if task not in tasks:
        close = difflib.get_close_matches(task, tasks, n=3, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise SettingError("env.task", task, f" is not a registered mjlab task{hint}; the tasks: {', '.join(tasks)}")
    return registry.load_env_cfg(task, play=play)


def apply_overrides(cfg: Any, overrides: dict[str, Any], path: str = "env.overrides") -> None:
    """Set the fields of mjlab's env cfg ``cfg`` that ``overrides`` names, nested as ``cfg`` is.

    A mapping under a key that names a dataclass or a dict in ``cfg`` is applied to it; any other value
    replaces the field's (a list becomes a tuple where the field holds a tuple).

    Raises:
        SettingError: ``env.overrides.<path>``: a key that is not a field (naming the fields there).
    """
    for key, value in overrides.items():
        where = f"{path}.{key}"
        if isinstance(cfg, dict):
            names, current = list(cfg), cfg.get(key, _MISSING)
        else:
            names = [f.name for f in dataclasses.fields(cfg)]
            current = getattr(cfg, key, _MISSING) if key in names else _MISSING
        if current is _MISSING:
            raise SettingError(where, value, f" is not allowed: {key!r} is not a field there; expected one of {names}")
        if isinstance(value, dict) and (dataclasses.is_dataclass(current) or isinstance(current, dict)):
            apply_overrides(current, value, where)
            continue
        if isinstance(value, list) and isinstance(current, tuple):
            value = tuple(value)
        if isinstance(cfg, dict):
            cfg[key] = value
        else:
            setattr(cfg, key, value)


_MISSING = object()


class MjlabEnv(VecEnv):
    """A registered mjlab task behind rlchain's :class:`VecEnv` contract (see the module docstring).

    Args:
        settings: the fields of :class:`MjlabEnvConfig` (``self.cfg``): ``task``, ``num_envs``, ``device``,
            ``seed``, ``render_mode``, ``max_episode_steps``, ``play``, ``overrides``.

    Shapes: observations a TensorDict of the task's groups, float32 ``[N, dim_g]`` each; actions float32
    ``[N, action_dim]``; rewards float32 ``[N]``; terminated/truncated/success bool ``[N]``; frames of
    :meth:`render` uint8 ``[K, H, W, 3]`` on the CPU.

    Raises:
        SettingError: ``env.task``: mjlab not installed, or an unknown task; ``env.overrides.<field>``: a
            field the task's cfg does not have; a setting out of its range (see :class:`MjlabEnvConfig`).
    """

    spreads_episode_starts = True

    def __init__(self, **settings: Any) -> None:
        self.cfg = cfg = MjlabEnvConfig(**settings)
        super().__init__(cfg.num_envs, resolve_device(cfg.device))
        if cfg.play and cfg.max_episode_steps is None:
            raise SettingError(
                "env.play",
                True,
                " needs env.max_episode_steps: the play cfg's episodes are endless, and evaluation needs episodes "
                "that end",
            )
        env_class, registry = _import_mjlab(cfg.task, self.device)
        task_cfg = _task_cfg(registry, cfg.task, cfg.play)
        apply_overrides(task_cfg, cfg.overrides)
        if cfg.max_episode_steps is not None:  # mjlab's limit is ceil(episode_length_s / step_dt) steps
            task_cfg.episode_length_s = (
                (cfg.max_episode_steps - 0.5) * task_cfg.sim.mujoco.timestep * task_cfg.decimation
            )
        task_cfg.scene.num_envs = cfg.num_envs
        task_cfg.seed = None  # mjlab would reseed torch's (and numpy's) global RNG with it
        task_cfg.auto_reset = False  # step hands back the observation an episode ended on
        generator = getattr(task_cfg.scene.terrain, "terrain_generator", None)
        if generator is not None and getattr(generator, "seed", 0) is None:
            generator.seed = cfg.seed  # else mjlab's terrain draws a seed from numpy's global RNG
        self._rng = TorchRngStream(indexed_device(self.device), cfg.seed)
        build_log = io.StringIO()
        with (
            self._rng.active(),
            contextlib.redirect_stdout(build_log),
            _quiet_on_cpu(self.device),
        ):  # startup events draw
            self.env = env_class(task_cfg, device=str(indexed_device(self.device)), render_mode=cfg.render_mode)
        self.description = build_log.getvalue()
        """mjlab's description of the env it built (its managers' tables), which it prints and rlchain keeps here."""
        self.render_mode = cfg.render_mode
        self.max_episode_steps = int(self.env.max_episode_length)
        self.metadata = {
            **type(self).metadata,
            "render_modes": ["rgb_array"],
            "render_fps": float(self.env.metadata.get("render_fps") or 1.0 / self.env.step_dt),
        }
        self._groups = tuple(self.env.single_observation_space.spaces)
        self._term_of: dict[str, str] = {}
        """The groups that mjlab keeps as named terms (not concatenated: a camera's), and each one's term."""
        spaces = {}
        for group, space in self.env.single_observation_space.spaces.items():
            if hasattr(space, "spaces"):  # a group of named terms, e.g. an image
                if len(space.spaces) != 1:
                    self.env.close()
                    raise SettingError(
                        "env.task",
                        cfg.task,
                        f": its observation group {group!r} keeps {len(space.spaces)} terms apart "
                        f"({', '.join(space.spaces)}): expected one tensor per group (concatenate_terms=True)",
                    )
                ((self._term_of[group], space),) = space.spaces.items()
            spaces[group] = gym.spaces.Box(-np.inf, np.inf, tuple(int(d) for d in space.shape), np.float32)
        action_dim = int(self.env.single_action_space.shape[0])
        self._set_spaces(gym.spaces.Dict(spaces), gym.spaces.Box(-np.inf, np.inf, (action_dim,), np.float32))
        self._finite_horizon = bool(getattr(task_cfg, "is_finite_horizon", False))
        """mjlab's is_finite_horizon: its time-outs end the task (terminations, never bootstrapped)."""
        self._success_of = self._success_source()
        self.reports_success = self._success_of is not None
        self._no_success = torch.zeros(cfg.num_envs, dtype=torch.bool, device=self.device)
        rewards = self.env.reward_manager
        self._reward_scale = self.env.step_dt if getattr(rewards, "_scale_by_dt", True) else 1.0
        self._reward_names = list(rewards.active_terms)
        metrics = self.env.metrics_manager
        self._metric_names = list(getattr(metrics, "active_terms", []))

    # -- episodes ---------------------------------------------------------------------------------------------

    def _observe(self, obs: dict[str, Any]) -> Any:
        """mjlab's observation dict as a TensorDict of the groups."""
        from tensordict import TensorDict  # imported where used: see rlchain.commands.config

        groups = {g: obs[g][self._term_of[g]] if g in self._term_of else obs[g] for g in self._groups}
        return TensorDict(groups, batch_size=[self.num_envs], device=self.device)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset every env.

        Args:
            seed: restarts the env's RNG stream from it; None goes on with the stream.
            options: ``{"group_size": G}``: each block of ``G`` consecutive envs starts from one state.

        Returns:
            ``(obs, info)``: a TensorDict of the groups, float32 ``[N, dim_g]`` each; ``info`` is empty.

        Raises:
            SettingError: ``group_size`` not a positive int dividing ``num_envs``.
        """
        group_size = reset_group_size(options, self.num_envs)
        if seed is not None:
            self._rng.seed(seed)
        ids = torch.arange(self.num_envs, device=self.device)
        with self._rng.active():
            if group_size == 1:
                obs, _ = self.env.reset(env_ids=ids)
            else:
                start = self._rng.get()
                for k in range(group_size):  # env k of every block draws what env 0 of its block drew
                    self._rng.set(start)
                    obs = self._reset_envs(ids[k::group_size])
        return self._observe(obs), {}

    def spread_episode_starts(self) -> None:
        """See :meth:`VecEnv.spread_episode_starts`: mjlab's ``episode_length_buf`` from the env's own stream (what
        mjlab's ``train`` does through rsl_rl's ``init_at_random_ep_len``)."""
        steps = self.env.episode_length_buf
        with self._rng.active():
            steps.copy_(torch.randint_like(steps, high=self.max_episode_steps))

    def step(self, action: torch.Tensor):
        """Step every env once (same-step auto-reset).

        Args:
            action: float32 ``[N, action_dim]``.

        Returns:
            ``(obs, reward, terminated, truncated, info)`` as described in :class:`VecEnv`.

        Raises:
            ValueError: an action of the wrong shape, or with NaN or inf.
        """
        shape = (self.num_envs, *self.single_action_space.shape)
        if tuple(action.shape) != shape:
            raise ValueError(f"action has shape {tuple(action.shape)}: expected {shape} = (num_envs, action dim)")
        if not bool(torch.isfinite(action).all()):  # mjlab syncs on every step anyway (its resets)
            raise ValueError("action contains NaN or inf: expected finite values")
        with self._rng.active():
            obs, reward, terminated, time_outs, _ = self.env.step(action)
            done = terminated | time_outs
            info = {
                "rewards": self._reward_terms(),
                "metrics": self._metrics(),  # copies: the reset below zeroes the ended rows of mjlab's own
                "success": self._success(terminated, time_outs),
            }
            ended = done.nonzero().squeeze(-1)
            final = self._observe(obs)
            if len(ended):
                final = final.clone()  # a group's history buffer is mjlab's own, refilled by the reset
                obs = self._reset_envs(ended)
        info["final_obs"] = final
        if self._finite_horizon:  # the time limit ends the task: nothing to bootstrap (as mjlab's rsl_rl wrapper)
            return self._observe(obs), reward.float(), done.bool(), torch.zeros_like(done, dtype=torch.bool), info
        truncated = time_outs & ~terminated
        return self._observe(obs), reward.float(), terminated.bool(), truncated.bool(), info

    def _reset_envs(self, env_ids: torch.Tensor) -> dict[str, Any]:
        """mjlab's ``reset(env_ids=...)``; returns its observation dict.

        The reset advances every env's commands by a step of 0 s, and a command that sums its metrics over the
        episode (the velocity commands' tracking errors) would add this step's error once more to every env that
        did not end: their metrics are put back as they were.
        """
        commands = [term.metrics for term in self.env.command_manager._terms.values() if getattr(term, "metrics", None)]
        kept = [{name: value.clone() for name, value in metrics.items()} for metrics in commands]
        obs, _ = self.env.reset(env_ids=env_ids)
        others = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        others[env_ids] = False
        for metrics, before in zip(commands, kept):
            for name, value in before.items():
                if name in metrics and metrics[name].shape == value.shape:
                    metrics[name][others] = value[others]
        return obs

    def _reward_terms(self) -> dict[str, torch.Tensor]:
        """Each reward term as it counts in the reward (weighted, scaled by the step's duration where the
        reward is): float32 ``[N]`` each."""
        weighted = self.env.reward_manager._step_reward * self._reward_scale
        return dict(zip(self._reward_names, weighted.unbind(1)))

    def _metrics(self) -> dict[str, torch.Tensor]:
        """The metrics manager's terms of this step and each command's metrics, float32 ``[N]`` each."""
        out: dict[str, torch.Tensor] = {}
        if self._metric_names:
            out.update(zip(self._metric_names, self.env.metrics_manager._step_values.clone().unbind(1)))
        for name, term in self.env.command_manager._terms.items():
            for metric, value in getattr(term, "metrics", {}).items():
                if isinstance(value, torch.Tensor) and value.shape == (self.num_envs,):
                    out[f"{name}/{metric}"] = value.float().clone()
        return out

    def _success_source(self) -> Any:
        """Where the task's success signal comes from (see the module docstring): the command term that latches
        an ``episode_success``, ``"motion"`` for a motion-tracking task, or None."""
        terms = self.env.command_manager._terms
        latched = [term for term in terms.values() if isinstance(getattr(term, "episode_success", None), torch.Tensor)]
        return latched[0] if latched else "motion" if "motion" in terms else None

    def _success(self, terminated: torch.Tensor, time_outs: torch.Tensor) -> torch.Tensor:
        if self._success_of is None:
            return self._no_success
        if isinstance(self._success_of, str):  # "motion": the episode ran to its time-out
            return time_outs & ~terminated
        return self._success_of.episode_success > 0.5

    # -- rendering, state -------------------------------------------------------------------------------------

    def render(self, env_ids: Sequence[int] | None = None) -> torch.Tensor:
        """Frames of the envs ``env_ids`` (every env when None) in their current state, one env per frame.

        Returns:
            uint8 RGB ``[K, H, W, 3]`` on the CPU (the task's viewer size).

        Raises:
            RuntimeError: the env was built with ``render_mode=None``.
            IndexError: an env id outside ``[0, num_envs)``.
        """
        ids = self._render_ids(env_ids)
        ids = list(range(self.num_envs)) if ids is None else ids
        renderer = self.env._offline_renderer
        viewer = self.env.cfg.viewer
        frames = []
        try:
            for i in ids:
                renderer._env_ids = (i,)  # the env it frames (mjlab draws viewer.env_idx and its neighbours)
                renderer.update(self.env.sim.data)
                frames.append(np.array(renderer.render(), dtype=np.uint8))
        finally:
            renderer._env_ids = None
        if not frames:
            return torch.zeros((0, viewer.height, viewer.width, 3), dtype=torch.uint8)
        return torch.from_numpy(np.stack(frames))

    def state_dict(self) -> dict[str, Any]:
        """The env's RNG state (the simulator's own state cannot be saved: a resume resets every env)."""
        return {"rng": self._rng.state.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output: later draws are those the saved run would have made.

        Raises:
            ValueError: a state that is not an MjlabEnv's.
        """
        if set(state) != {"rng"}:
            raise ValueError(f"env state {sorted(state)} is not an MjlabEnv's: expected its rng")
        self._rng.load(state["rng"], "MjlabEnv")

    def close(self, **kwargs: Any) -> None:
        """Close mjlab's env (and its renderer)."""
        self.env.close()
