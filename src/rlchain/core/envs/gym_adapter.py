"""Any registered gymnasium environment as an rlchain :class:`~rlchain.core.envs.base.VecEnv`.

``rlchain-train env=gym env.id=Pendulum-v1 env.num_envs=16`` builds
``gymnasium.make_vec(id, num_envs, vectorization_mode=sync|async)`` with
same-step auto-reset and converts, in :meth:`GymVecEnv.step` only, numpy
arrays to torch tensors on the configured device and actions back.

Spaces:

* actions: ``Box`` (1-D; actions are clipped to its bounds) or ``Discrete``
  (the policy's ``0..n-1`` are shifted by the space's ``start``);
* observations: ``Box``, ``Discrete``, ``MultiBinary`` and ``Dict``/``Tuple``
  of them, flattened to one float32 vector exactly as
  ``gymnasium.spaces.flatten`` does: a Box is raveled (C order), a Discrete
  becomes a one-hot of length ``n``, a Dict is the concatenation of its
  sub-spaces in the Dict's key order (gymnasium sorts the keys of a plain
  dict), a Tuple in its order. With ``obs_groups=true`` a Dict observation
  keeps its keys as observation groups (:mod:`rlchain.core.observations`),
  each flattened so, for a policy whose actor and critic see different keys.
  Images (a uint8 Box of 2 or 3 dims, any Box of 3) are kept as they are, for
  the policy's CNN encoder: the whole observation (CarRacing-v3's uint8
  ``(96, 96, 3)``), or a group with ``obs_groups=true``; a grey ``[H, W]``
  image gains a channel, ``[H, W, 1]``. An image inside a flattened Dict or
  Tuple, or a Box of 4 or more dims, is refused.

Third-party ids: ``env.imports=[gymnasium_robotics]`` imports the packages
that register an id before it is looked up, and an id of gymnasium's form
``module:Name-v0`` imports its module first, as ``gymnasium.make`` does.

``info["success"]`` is the env's success flag, named by the ``success_key``
setting (gymnasium-robotics: ``is_success``; Meta-World: ``success``), of the
step, read from ``final_info`` for envs whose episode ended there. Without
``success_key`` the env reports no success (``reports_success`` is False from
its construction on); one that shows ``is_success`` or ``success`` in its
info then gets a one-line notice naming the setting.
``reset(options={"group_size": G})`` seeds the ``G`` envs of each group with
one seed, so they start from one state (GRPO, Shao et al. 2024). The
generator that draws the seeds of later resets is part of the env's
:meth:`~GymVecEnv.state_dict`, so a resumed run goes on drawing new ones
(gymnasium's own env state cannot be saved: a resume resets every env).

Rendering: ``env.render_mode=rgb_array`` is passed to ``gymnasium.make_vec``,
which builds every sub-env with it; :meth:`GymVecEnv.render` returns their
frames as one uint8 CPU tensor ``[K, H, W, 3]``, and ``metadata["render_fps"]``
is the gymnasium env's (30 where it declares none). An id whose env does not
list ``rgb_array`` in its ``metadata["render_modes"]`` is refused at
construction. What drawing needs depends on the env:

* MuJoCo envs (``HalfCheetah-v5``, ...) render through OpenGL. On a machine
  without a display set ``MUJOCO_GL=egl`` (GPU or Mesa EGL) or
  ``MUJOCO_GL=osmesa`` (Mesa's software OSMesa, where it is installed) in the
  environment before anything imports ``mujoco``, e.g. ``MUJOCO_GL=egl
  rlchain-train env=gym env.id=HalfCheetah-v5 ...``;
* gymnasium's classic-control envs (``CartPole-v1``, ``Pendulum-v1``, ...)
  draw with pygame: ``pip install "gymnasium[classic-control]"``; without it
  their ``render`` fails with gymnasium's DependencyNotInstalled;
* rlchain's own ids (``rlchain/PushCube-v0``, ``rlchain/CartPole-v1``) draw
  with torch and need nothing more.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import concatenate, create_empty_array

from rlchain.console import notice
from rlchain.core.envs.base import VecEnv, VecEnvConfig, reset_group_size
from rlchain.settings import SettingError, setting
from rlchain.utils import resolve_device

__all__ = ["GymEnvConfig", "GymVecEnv", "flatten_batch"]

_OBS_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary, gym.spaces.Dict, gym.spaces.Tuple)


#: The values of ``vectorization``.
VECTORIZATIONS = ("sync", "async")


@dataclass
class GymEnvConfig(VecEnvConfig):
    """Every setting of :class:`GymVecEnv` with its default and range; the Hydra schema of ``env=gym``.

    ``num_envs``, ``device`` and ``seed`` (env i is seeded with seed + i at construction) as
    :class:`~rlchain.core.envs.base.VecEnvConfig`.
    """

    _target_: str = "rlchain.core.envs.gym_adapter.GymVecEnv"
    num_envs: int = 16
    id: str = "CartPole-v1"
    """A registered gymnasium id, e.g. Pendulum-v1, HalfCheetah-v5, or your own; gymnasium's form module:Id
    imports the module that registers it first (gymnasium_robotics:FetchPush-v4)."""
    imports: list[str] = field(default_factory=list)
    """Modules imported before id is looked up: the packages that register it with gymnasium, e.g.
    [gymnasium_robotics] for FetchPush-v4, [metaworld] for Meta-World's ids, [my_package] for my_package/MyEnv-v0.
    rlchain-eval and rlchain-export import them only for a module allowed with --allow-target."""
    success_key: str | None = None
    """The info key of the task's success flag (gymnasium-robotics: is_success; Meta-World: success);
    None: the task has no success signal, and no success rate is logged."""
    vectorization: str = setting("sync", choices=VECTORIZATIONS)
    """'sync' (one process) or 'async' (one subprocess per env)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the env's constructor."""
    max_episode_steps: int | None = setting(None, gt=0)
    """Time limit in steps; None keeps the id's registered limit."""
    obs_groups: bool = False
    """Keep a Dict observation's keys as observation groups (each flattened to a float32 vector: the actor and the
    critic may see different ones, policy.actor_obs and policy.critic_obs) instead of one flattened vector."""


def flatten_batch(space: gym.Space, x: Any) -> np.ndarray:
    """Flatten a batch of observations of ``space`` to a new float32 ``[N, flatdim(space)]`` array.

    Row ``i`` equals ``gymnasium.spaces.flatten(space, x_i)`` (see the module
    docstring for the layout). The result never shares memory with ``x``.

    Raises:
        ValueError: a space type other than those in the module docstring.
    """
    if isinstance(space, gym.spaces.Box):
        x = np.asarray(x)
        return np.array(x.reshape(x.shape[0], -1), dtype=np.float32)
    if isinstance(space, gym.spaces.Discrete):
        x = np.asarray(x).reshape(-1) - int(space.start)
        out = np.zeros((x.shape[0], int(space.n)), dtype=np.float32)
        out[np.arange(x.shape[0]), x] = 1.0
        return out
    if isinstance(space, gym.spaces.MultiBinary):
        x = np.asarray(x)
        return x.reshape(x.shape[0], -1).astype(np.float32)
    if isinstance(space, gym.spaces.Dict):
        return np.concatenate([flatten_batch(sub, x[key]) for key, sub in space.spaces.items()], axis=1)
    if isinstance(space, gym.spaces.Tuple):
        return np.concatenate([flatten_batch(sub, part) for sub, part in zip(space.spaces, x)], axis=1)
    raise ValueError(_unsupported("observation", space))


def float32_observation_space(space: gym.Space, groups: Sequence[str] | None) -> gym.Space:
    """The space of the flattened observation: one float32 Box (an image's own, :func:`_image_space`), or a Dict of
    one per group."""

    def flat(sub: gym.Space) -> gym.spaces.Box:
        if _is_image(sub):
            return _image_space(sub)
        box = gym.spaces.flatten_space(sub)
        return gym.spaces.Box(box.low.astype(np.float32), box.high.astype(np.float32), box.shape, np.float32)

    return gym.spaces.Dict({g: flat(space.spaces[g]) for g in groups}) if groups is not None else flat(space)


def _to_device(x: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(x).to(device, non_blocking=True)


def _unsupported(kind: str, space: gym.Space) -> str:
    allowed = "a 1-D Box or a Discrete" if kind == "action" else "Box, Discrete, MultiBinary, or a Dict/Tuple of them"
    return f"the {kind} space {space} ({type(space).__name__}) is not supported by env=gym: expected {allowed}"


def _check_obs_space(space: gym.Space) -> None:
    if not isinstance(space, _OBS_SPACES):
        raise ValueError(_unsupported("observation", space))
    subspaces = space.spaces.values() if isinstance(space, gym.spaces.Dict) else getattr(space, "spaces", ())
    for sub in subspaces:
        _check_obs_space(sub)


def import_registrations(env_id: str, imports: Sequence[str] = ()) -> str:
    """Import the modules that register ``env_id`` with gymnasium; the id without its module.

    Each module of ``imports`` (``env.imports``) is imported in order, then the
    module of an id of gymnasium's form ``module:Name-v0`` (as ``gymnasium.make``
    does with it), which then returns ``Name-v0``.

    Raises:
        SettingError: ``env.imports=...`` or ``env.id=...``: a module whose import fails, naming it and its error.
    """
    module, colon, name = env_id.partition(":")
    for each in imports:
        _import_module(each, "env.imports", list(imports), name if colon else env_id)
    if not colon:
        return env_id
    _import_module(module, "env.id", env_id, name)
    return name


def _import_module(module: str, key: str, value: Any, env_id: str) -> None:
    """Import ``module``, named by setting ``key`` (whose value is ``value``) to register ``env_id``.

    Raises:
        SettingError: ``<key>=<value>``: the import failed (any error the module raised), naming the module.
    """
    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - whatever a package raises while it imports: one line naming the setting
        reason = " ".join(f"{type(err).__name__}: {err}".split())
        raise SettingError(
            key,
            value,
            f": module {module!r} cannot be imported ({reason}): expected an installed "
            f"module that registers {env_id} with gymnasium",
        ) from None


def _is_image(space: gym.Space) -> bool:
    """A Box of dtype uint8 with 2 or 3 dims, or any Box with 3 or more dims."""
    if not isinstance(space, gym.spaces.Box):
        return False
    dims = len(space.shape)
    return dims >= 3 or (space.dtype == np.uint8 and dims == 2)


def _image_space(box: gym.spaces.Box) -> gym.spaces.Box:
    """The space rlchain gives an image of ``box``: its own (uint8 stays uint8, another dtype becomes float32), a
    grey ``[H, W]`` image with a channel axis, ``[H, W, 1]``."""
    shape = (*box.shape, 1) if len(box.shape) == 2 else tuple(box.shape)
    dtype = np.uint8 if box.dtype == np.uint8 else np.float32
    return gym.spaces.Box(box.low.reshape(shape).astype(dtype), box.high.reshape(shape).astype(dtype), shape, dtype)


def _image_batch(box: gym.spaces.Box, x: Any) -> np.ndarray:
    """A batch of images of ``box`` as a new ``[N, *shape]`` array of :func:`_image_space`'s dtype and shape."""
    x = np.asarray(x)
    space = _image_space(box)
    return np.array(x.reshape(x.shape[0], *space.shape), dtype=space.dtype)


def _images_in(space: gym.Space, path: str = "") -> list[tuple[str, gym.spaces.Box]]:
    """Every image in ``space`` as ``(path, Box)`` (``path`` "" for ``space`` itself, e.g. ``['pixels']`` in a
    Dict, ``[1]`` in a Tuple), in order: see :func:`_is_image`."""
    if isinstance(space, gym.spaces.Box):
        return [(path, space)] if _is_image(space) else []
    parts = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(getattr(space, "spaces", ()))
    return [found for key, sub in parts for found in _images_in(sub, f"{path}[{key!r}]")]


def resolve_spec(env_id: str, imports: Sequence[str] = ()) -> gym.envs.registration.EnvSpec:
    """The registered spec of ``env_id``, once the modules that register it are imported.

    ``imports`` and an id ``module:Name-v0`` name the modules that register the
    id (see :func:`import_registrations`).
    An id whose version gymnasium retired (``Pendulum-v0``) fails with
    gymnasium's own message, which names the current version. So does an id
    gymnasium still registers only to say where its env went (see
    :func:`_placeholder_error`: the MuJoCo v2/v3 envs such as ``Ant-v2``, which
    need mujoco-py, and the Gym v21/v26 compatibility envs): the message quotes
    gymnasium and names the id's current version (``Ant-v5``) from the registry,
    where it has one, instead of failing later on a missing time limit.

    Raises:
        SettingError: ``env.id=...``: an unknown id (naming close matches, or gymnasium's hint for
            a retired version, or how to import the package that registers it); an id
            gymnasium no longer provides (see above); a MuJoCo env while ``mujoco``
            is not installed (naming the extra to install). ``env.imports=...`` or
            ``env.id=...``: a module that cannot be imported.
    """
    name = import_registrations(env_id, imports)
    try:
        spec = gym.spec(name)
    except gym.error.Error as err:
        if isinstance(err, (gym.error.DeprecatedEnv, gym.error.VersionNotFound)):
            hint = f": gymnasium {gym.__version__} says: {err}"
        else:
            close = difflib.get_close_matches(name, list(gym.registry), n=5, cutoff=0.5)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            hint += f"; if a package registers it, import it with env.imports=[<package>] or env.id=<package>:{name}"
        raise SettingError("env.id", env_id, f" is not a registered gymnasium id{hint}") from err
    reason = _placeholder_error(spec)
    if reason is not None:
        message = (
            f" is not provided by gymnasium {gym.__version__} itself, which keeps the id only "
            f"to say: {reason.rstrip('. ')}"
        )
        if "mujoco_py" in spec.entry_point.__name__:
            message += f"; {env_id} runs only on mujoco-py, with older gymnasium releases"
        current = gym.envs.registration.find_highest_version(spec.namespace, spec.name)
        if spec.version is not None and current is not None and current > spec.version:
            current_id = gym.envs.registration.get_env_id(spec.namespace, spec.name, current)
            message += f"; its current version is {current_id}: set env.id={current_id}"
            if _needs_missing_mujoco(gym.spec(current_id)):
                message += ' (needs MuJoCo: pip install "rlchain[mujoco]")'
        raise SettingError("env.id", env_id, message)
    if _needs_missing_mujoco(spec):
        raise SettingError("env.id", env_id, ' needs MuJoCo, which is not installed: pip install "rlchain[mujoco]"')
    return spec


def _placeholder_error(spec: gym.envs.registration.EnvSpec) -> str | None:
    """gymnasium's message when ``spec`` only stands for an env gymnasium no longer provides, else None.

    gymnasium registers its own envs by module path (``"gymnasium.envs...:Env"``);
    for the envs it moved out (gymnasium 1.x: the MuJoCo v2/v3 envs, to
    gymnasium-robotics; the Gym v21/v26 compatibility envs, to shimmy) it keeps
    the ids with a function of its own as entry point that raises an error
    saying where they went. Such a function is called here, as
    ``gymnasium.make`` would, for that message; one that builds an env instead
    is a real entry point (the env is closed again), and one that raises
    another error raises it here, as it would in ``gymnasium.make``.
    """
    entry = spec.entry_point
    if not inspect.isfunction(entry) or entry.__module__.partition(".")[0] != "gymnasium":
        return None
    try:
        env = entry(**spec.kwargs)
    except (ImportError, gym.error.Error) as err:  # gymnasium's placeholders raise ImportError
        return str(err) or type(err).__name__
    close = getattr(env, "close", None)
    if callable(close):
        close()
    return None


def _check_renders(spec: gym.envs.registration.EnvSpec, render_mode: str) -> None:
    """Refuse ``render_mode`` before the env is built when its entry point's ``metadata`` does not list it.

    The class-level ``metadata`` is what ``gymnasium.make`` reads too; an
    entry point without one (a factory function) is checked on the built
    env instead.

    Raises:
        SettingError: ``env.render_mode=...``: a mode that the env's ``render_modes`` do not list.
    """
    entry = spec.entry_point
    try:
        creator = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    except (ImportError, AttributeError):
        return  # gymnasium.make_vec fails on it with its own message
    metadata = getattr(creator, "metadata", None)
    if not isinstance(metadata, dict):
        return
    modes = list(metadata.get("render_modes") or [])
    if render_mode not in modes:
        raise SettingError(
            "env.render_mode", render_mode, f" is not allowed with env.id={spec.id}: it renders only {modes}"
        )


def _needs_missing_mujoco(spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether ``spec``'s entry point is one of gymnasium's MuJoCo envs while ``mujoco`` is not installed."""
    entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__module__", "")
    return "mujoco" in entry and importlib.util.find_spec("mujoco") is None


class GymVecEnv(VecEnv):
    """A gymnasium vector env behind rlchain's torch :class:`VecEnv` contract.

    Args:
        id: the gymnasium id, which may come first, positionally
            (``GymVecEnv("Pendulum-v1", num_envs=4)``), or by keyword.
        settings: the other fields of :class:`GymEnvConfig` (``self.cfg``):
            ``num_envs``, ``device``, ``seed`` (env ``i`` is seeded with
            ``seed + i`` at construction), ``imports`` (modules that register
            the id; see :func:`import_registrations`), ``success_key``,
            ``vectorization``, ``kwargs`` (of the env's constructor),
            ``max_episode_steps`` (None keeps the registered limit).

    Shapes: observations float32 ``[N, flatdim]``; actions float32
    ``[N, act_dim]`` (Box) or int64 ``[N]`` (Discrete); rewards float32 ``[N]``;
    terminated/truncated/success bool ``[N]``; frames of :meth:`render`
    (``render_mode="rgb_array"``) uint8 ``[K, H, W, 3]`` on the CPU.

    Raises:
        ValueError: see :func:`resolve_spec`; an unsupported action or
            observation space (image observations included: a uint8 Box of 2
            or 3 dims, any Box of 3 or more, also inside a Dict or Tuple); an env without a time limit and no
            ``max_episode_steps``; ``render_mode="rgb_array"`` for an env
            that does not list it in its ``metadata["render_modes"]``, or
            given in ``kwargs`` as well; a setting out of its range (see
            :class:`GymEnvConfig`), naming it.
    """

    def __init__(self, id: str | None = None, /, **settings: Any) -> None:
        if id is not None:
            if "id" in settings:
                raise TypeError(f"GymVecEnv got the id twice: {id!r} and id={settings['id']!r}")
            settings["id"] = id
        self.cfg = cfg = type(self).config_class(**settings)
        super().__init__(cfg.num_envs, resolve_device(cfg.device))
        self._check_installed()
        spec = resolve_spec(cfg.id, cfg.imports)
        if cfg.max_episode_steps is not None:
            spec = dataclasses.replace(spec, max_episode_steps=cfg.max_episode_steps)
        if spec.max_episode_steps is None:
            raise SettingError(
                "env.id", cfg.id, " has no time limit: set env.max_episode_steps (evaluation needs episodes that end)"
            )
        self.max_episode_steps = int(spec.max_episode_steps)
        self.render_mode = cfg.render_mode
        kwargs = self._env_kwargs()
        if cfg.render_mode is not None:
            if "render_mode" in kwargs:
                raise SettingError(
                    "env.kwargs",
                    cfg.kwargs,
                    " is not allowed with env.render_mode set: give render_mode once, as env.render_mode",
                )
            _check_renders(spec, cfg.render_mode)
            kwargs["render_mode"] = cfg.render_mode  # gymnasium builds every sub-env with it
        try:
            self.envs = gym.make_vec(
                spec,
                num_envs=cfg.num_envs,
                vectorization_mode=cfg.vectorization,
                # copy=False: flatten_batch copies every observation once, so
                # gymnasium's own defensive deepcopy would be a second copy.
                vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP, "copy": False, **self._vector_kwargs()},
                wrappers=self._wrappers(),
                **kwargs,
            )
        except gym.error.DependencyNotInstalled as err:
            raise SettingError("env.id", cfg.id, f" needs a package that is not installed: {err}") from err
        modes = list(self.envs.metadata.get("render_modes") or [])
        self.metadata = {
            **type(self).metadata,
            "render_modes": ["rgb_array"] if "rgb_array" in modes else [],
            "render_fps": self.envs.metadata.get("render_fps") or 30,
        }
        if cfg.render_mode is not None and cfg.render_mode not in modes:  # where the entry point could not tell
            self.envs.close()
            raise SettingError(
                "env.render_mode", cfg.render_mode, f" is not allowed with env.id={cfg.id}: it renders only {modes}"
            )
        try:
            self._setup_spaces(self.envs.single_observation_space, self.envs.single_action_space)
        except ValueError:
            self.envs.close()
            raise
        self._rng = np.random.default_rng(cfg.seed)
        # numpy -> torch for every array of a step. Each array passed is a fresh
        # one, so on the CPU the tensor simply shares its memory.
        self._to_torch: Callable[[np.ndarray], torch.Tensor] = (
            torch.from_numpy if self.device.type == "cpu" else partial(_to_device, device=self.device)
        )
        self._no_success = torch.zeros(cfg.num_envs, dtype=torch.bool, device=self.device)
        self.reports_success = cfg.success_key is not None
        self._unread_flag_noticed = False
        self.envs.reset(seed=[cfg.seed + i for i in range(cfg.num_envs)])

    @property
    def seed(self) -> int:
        """The base seed the envs were built with (``cfg.seed``)."""
        return self.cfg.seed

    @property
    def action_start(self) -> int:
        """What the gymnasium env's actions add to the policy's (its ``Discrete(n, start)``'s start; 0 for a Box)."""
        return getattr(self, "_action_start", 0)

    def _setup_spaces(self, obs_space: gym.Space, action_space: gym.Space) -> None:
        _check_obs_space(obs_space)
        self._check_images(obs_space)
        if isinstance(action_space, gym.spaces.Discrete):
            self._discrete, self._action_start = True, int(action_space.start)
            policy_action_space: gym.Space = gym.spaces.Discrete(int(action_space.n))
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self._discrete = False
            low, high = action_space.low.astype(np.float32), action_space.high.astype(np.float32)
            # Scalar bounds when every dimension shares them (most Boxes):
            # numpy clips against two scalars faster than against two arrays.
            uniform = low.size > 0 and low.min() == low.max() and high.min() == high.max()
            self._clip_bounds = (float(low[0]), float(high[0])) if uniform else (low, high)
            # None: the clipped float32 array is already of the Box's dtype.
            self._action_dtype = None if action_space.dtype == np.float32 else action_space.dtype
            self._action_shape = (self.num_envs, action_space.shape[0])
            self._zero_action = np.zeros(self.num_envs * action_space.shape[0], dtype=np.float32)
            policy_action_space = action_space
        else:
            raise ValueError(_unsupported("action", action_space))
        self.gym_observation_space = obs_space
        if self._obs_groups() and not isinstance(obs_space, gym.spaces.Dict):
            raise SettingError(
                "env.obs_groups",
                True,
                f" needs a Dict observation space: {self.cfg.id}'s is {obs_space}; expected false",
            )
        self._groups = tuple(obs_space.spaces) if self._obs_groups() else None
        """The observation groups (the Dict's keys), or None: one flattened vector."""
        # The flattening of one batch, chosen once: each group's on its own; a batch of 1-D Box
        # observations is [N, dim] already and needs only the float32 copy.
        self._flatten: Callable[[Any], Any]
        if self._groups is not None:
            parts = {
                g: partial(_image_batch if _is_image(sub) else flatten_batch, sub)
                for g, sub in ((g, obs_space.spaces[g]) for g in self._groups)
            }
            self._flatten = lambda x: {g: flatten(x[g]) for g, flatten in parts.items()}
        elif _is_image(obs_space):
            self._flatten = partial(_image_batch, obs_space)
        elif isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1:
            self._flatten = partial(np.array, dtype=np.float32)
        else:
            self._flatten = partial(flatten_batch, obs_space)
        self._set_spaces(float32_observation_space(obs_space, self._groups), policy_action_space)

    #: The settings' schema (a subclass for a family of ids, e.g. :class:`~rlchain.core.envs.ManiSkillEnv`).
    config_class: type[GymEnvConfig] = GymEnvConfig

    def _obs_groups(self) -> bool:
        """Whether a Dict observation's keys are kept as observation groups: ``env.obs_groups``."""
        return self.cfg.obs_groups

    def _check_installed(self) -> None:
        """Raise :class:`SettingError` when what the id needs beyond its package is missing (nothing here)."""

    def _env_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of every sub-env's constructor: ``env.kwargs``."""
        return dict(self.cfg.kwargs)

    def _wrappers(self) -> list[Callable[[gym.Env], gym.Env]] | None:
        """Wrappers around every sub-env, innermost first (none here)."""
        return None

    def _vector_kwargs(self) -> dict[str, Any]:
        """Extra arguments of gymnasium's vector env (none here)."""
        return {}

    def _check_images(self, obs_space: gym.Space) -> None:
        """Refuse, naming ``env.id``, an image the policy cannot take as one: one of 4 or more dims, or one inside an
        observation that is flattened (a Dict without ``obs_groups``, a Tuple, a Dict inside a group)."""
        for where, box in _images_in(obs_space):
            part = f"the part {where} of its observation space" if where else "its observation space"
            group = isinstance(obs_space, gym.spaces.Dict) and where.count("[") == 1  # a key of the Dict itself
            if len(box.shape) > 3:
                why = "the CNN encoder takes images of 2 or 3 dimensions ([H, W], [H, W, C] or [C, H, W])"
            elif not where or (group and self._obs_groups()):
                continue
            elif group:
                why = "an image is kept whole only as an observation group; expected env.obs_groups=true"
            else:
                why = "an image is kept whole only as the observation or as a group of a Dict observation"
            raise SettingError("env.id", self.cfg.id, f": {part} {box} is an image, and {why}")

    def _observe(self, flat: Any) -> Any:
        """A flattened batch as torch: a tensor, or a TensorDict of the groups."""
        if self._groups is None:
            return self._to_torch(flat)
        from tensordict import TensorDict  # imported where used: see rlchain.commands.config

        return TensorDict({g: self._to_torch(flat[g]) for g in self._groups}, batch_size=[self.num_envs])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset every env.

        Args:
            seed: env ``i`` gets ``seed + i`` (or ``seed + i // G`` in groups);
                None draws a fresh base seed from the env's own generator.
            options: ``{"group_size": G}`` seeds each block of ``G`` consecutive
                envs identically, so they start from one state.

        Returns:
            ``(obs [N, flatdim] float32, info)`` (gymnasium's reset info).

        Raises:
            ValueError: ``group_size`` not a positive int dividing ``num_envs``.
        """
        group_size = reset_group_size(options, self.num_envs)
        base = int(seed) if seed is not None else int(self._rng.integers(0, 2**31 - self.num_envs))
        seeds = [base + i // group_size for i in range(self.num_envs)]
        obs, info = self.envs.reset(seed=seeds)
        return self._observe(self._flatten(obs)), info

    def _action_to_numpy(self, action: torch.Tensor) -> np.ndarray:
        n = self.num_envs
        if isinstance(action, torch.Tensor):
            try:
                a = action.numpy()  # a CPU tensor outside autograd: no copy
            except (RuntimeError, TypeError):  # on an accelerator, or requiring grad
                a = action.detach().cpu().numpy()
        else:
            a = np.asarray(action)
        if self._discrete:
            a = a.reshape(-1) if a.shape == (n, 1) else a
            if a.shape != (n,):
                raise ValueError(f"action has shape {a.shape}: expected ({n},) = (num_envs,)")
            return a.astype(np.int64) + self._action_start
        if a.shape != self._action_shape:
            raise ValueError(f"action has shape {a.shape}: expected {self._action_shape} = (num_envs, action dim)")
        # One BLAS call: a . 0 is 0 when every entry is finite and NaN when one
        # is NaN or inf (inf * 0 = NaN); unlike a sum it cannot overflow.
        if not math.isfinite(np.vdot(a, self._zero_action)):
            raise ValueError("action contains NaN or inf: expected finite values (they are clipped to the Box bounds)")
        clipped = a.clip(*self._clip_bounds)
        return clipped if self._action_dtype is None else clipped.astype(self._action_dtype)

    def step(self, action: torch.Tensor):
        """Step every env once (same-step auto-reset).

        Args:
            action: float32 ``[N, act_dim]`` (Box; clipped to its bounds) or
                int64 ``[N]`` (Discrete).

        Returns:
            ``(obs, reward, terminated, truncated, info)`` as described in
            :class:`rlchain.core.envs.base.VecEnv`; ``info["final_obs"]`` holds the
            last observation of every episode that ended in this step.

        Raises:
            ValueError: an action of the wrong shape or with non-finite entries.
        """
        obs, reward, terminated, truncated, info = self.envs.step(self._action_to_numpy(action))
        flat = self._flatten(obs)
        obs_t = self._observe(flat)
        final_t = obs_t  # no episode ended: the final observations are the observations
        success = self._success(info, None)
        if "final_obs" in info:  # gymnasium adds it exactly when an episode ended
            done = np.logical_or(terminated, truncated)
            ended = np.flatnonzero(done)
            # gymnasium keeps one final observation per env (None where none
            # ended): batch those that ended, then flatten them all at once.
            space = self.gym_observation_space
            final_batch = concatenate(space, info["final_obs"][ended], create_empty_array(space, len(ended)))
            ended_flat = self._flatten(final_batch)
            if self._groups is None:
                final = flat.copy()
                final[ended] = ended_flat
            else:
                final = {g: flat[g].copy() for g in self._groups}
                for g in self._groups:
                    final[g][ended] = ended_flat[g]
            final_t = self._observe(final)
            success = self._success(info.get("final_info", {}), success, rows=done)
        out = {
            "final_obs": final_t,
            "rewards": {},
            "metrics": {},
            "success": self._no_success if success is None else self._to_torch(success),
        }
        # gymnasium's sync and async vector envs return fresh float64 rewards
        # and fresh bool terminated/truncated arrays.
        return (
            obs_t,
            self._to_torch(reward.astype(np.float32)),
            self._to_torch(terminated),
            self._to_torch(truncated),
            out,
        )

    def _success(
        self,
        info: dict[str, Any],
        success: np.ndarray | None,
        rows: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """``success`` (all False when None) with the rows (of ``rows``) that report
        the ``success_key`` flag in ``info`` overwritten; ``success`` itself
        when ``info`` has no such flag."""
        key = self.cfg.success_key
        if key is None:
            if not self._unread_flag_noticed and ("is_success" in info or "success" in info):
                self._unread_flag_noticed = True
                flag = "is_success" if "is_success" in info else "success"
                notice(
                    f"env.id={self.cfg.id} reports info[{flag!r}], which env.success_key=None leaves unread: "
                    f"set env.success_key={flag} to log a success rate"
                )
            return success
        if key not in info:
            return success
        present = np.asarray(info.get(f"_{key}", np.ones(self.num_envs, dtype=bool)), dtype=bool)
        if rows is not None:
            present = present & rows
        base = np.zeros(self.num_envs, dtype=bool) if success is None else success
        return np.where(present, np.asarray(info[key], dtype=bool), base)

    def render(self, env_ids: Sequence[int] | None = None) -> torch.Tensor:
        """Frames of the sub-envs ``env_ids`` (every env when None) in their current state.

        A sync vector env renders only the sub-envs asked for; an async one
        renders all of them in their subprocesses (gymnasium has no call to
        one of them) and the frames asked for are kept.

        Args:
            env_ids: env indices in ``[0, num_envs)``, ``K`` of them; None: every env.

        Returns:
            uint8 RGB ``[K, H, W, 3]`` on the CPU (the gymnasium env's frame size).

        Raises:
            RuntimeError: the env was built with ``render_mode=None``, or a
                sub-env returned something other than an ``[H, W, 3]`` frame.
            IndexError: an env id outside ``[0, num_envs)``.
        """
        ids = self._render_ids(env_ids)
        ids = list(range(self.num_envs)) if ids is None else ids
        if isinstance(self.envs, gym.vector.SyncVectorEnv):
            frames = [self.envs.envs[i].render() for i in ids]
        else:
            every = self.envs.call("render")
            frames = [every[i] for i in ids]
        if not frames:  # the frame size of no frames: that of sub-env 0
            return self.render([0])[:0]
        for i, frame in zip(ids, frames):
            shape = getattr(frame, "shape", None)
            if shape is None or len(shape) != 3 or shape[2] != 3:
                raise RuntimeError(
                    f"env.id={self.cfg.id}: sub-env {i}'s render() returned "
                    f"{type(frame).__name__} of shape {shape}: expected an [H, W, 3] array"
                )
        return torch.from_numpy(np.stack(frames).astype(np.uint8, copy=False))

    def state_dict(self) -> dict[str, Any]:
        """The generator of the reset seeds (gymnasium's own env state cannot be saved)."""
        return {"seed_generator": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output: later resets draw the seeds the saved run would have drawn.

        Raises:
            ValueError: a state that is not this env's (no ``seed_generator``, or one of another generator).
        """
        try:
            self._rng.bit_generator.state = state["seed_generator"]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"env state {sorted(state)} is not a GymVecEnv's: expected its seed_generator ({err})"
            ) from err

    def close(self, **kwargs: Any) -> None:
        """Close the underlying gymnasium vector env (and its subprocesses)."""
        self.envs.close()
