"""The batched environment contract every rlchain task follows.

A :class:`VecEnv` simulates ``num_envs`` copies of one task at once on one
torch ``device``; every tensor it takes or returns has leading dimension
``num_envs`` and lives on that device, so env, policy and rollout storage
share memory with no copies.

Same-step auto-reset (gymnasium's ``AutoresetMode.SAME_STEP``): an env whose
episode ends inside :meth:`VecEnv.step` is reset in that same call; the
returned observation is the first one of its new episode and the observation
it ended on is in ``info["final_obs"]``, so time-limit truncations can be
bootstrapped (Pardo et al. 2018, "Time Limits in Reinforcement Learning").

Rendering is headless and batched: an env built with
``render_mode="rgb_array"`` draws the current state of any of its envs with
:meth:`VecEnv.render` as uint8 RGB frames ``[K, H, W, 3]``; the built-in
tasks draw with torch ops on their own device (no display, no OpenGL).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rlchain.core.envs.rng import CounterRng
from rlchain.settings import SettingError, Settings, setting
from rlchain.utils import MAX_SEED

__all__ = [
    "NON_FINITE_ACTION",
    "RENDER_MODES",
    "SingleGymEnv",
    "TorchRngStream",
    "TorchVecEnv",
    "VecEnv",
    "VecEnvConfig",
    "check_group_size",
    "info_terms",
    "reset_group_size",
]

#: The error of a torch-native task's ``step`` on an action with NaN or inf.
NON_FINITE_ACTION = "action contains NaN or inf: expected finite values (they are clipped to [-1, 1])"

#: The values of ``render_mode`` (:class:`VecEnvConfig`); gymnasium's name for the one rendering mode.
RENDER_MODES = (None, "rgb_array")


def check_group_size(group_size: Any, num_envs: int, names: tuple[str, str] = ("group_size", "num_envs")) -> int:
    """The rule of a GRPO group size: a positive int that divides ``num_envs``; returns it.

    GRPO checks its ``group_size`` against its env with it once, before any
    step; an env checks the ``group_size`` its ``reset`` is given with it.
    ``names`` are how the message names the two values (``algorithm.group_size``
    and ``env.num_envs`` when the algorithm checks its env).

    Raises:
        SettingError: unless ``group_size`` is a positive int dividing ``num_envs``.
    """
    group_name, envs_name = names
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise SettingError(group_name, group_size, " is not allowed: expected an integer > 0")
    if num_envs % group_size != 0:
        raise SettingError(
            group_name,
            group_size,
            f" is not allowed with {envs_name}={num_envs}: num_envs must be a multiple of group_size",
        )
    return group_size


def reset_group_size(options: dict[str, Any] | None, num_envs: int) -> int:
    """The group size a ``reset``'s ``options`` ask for (``{"group_size": G}``), checked by
    :func:`check_group_size`; 1 when they ask for none.

    Raises:
        SettingError: a ``group_size`` that is not a positive int dividing ``num_envs``.
    """
    if options and options.get("group_size") is not None:
        return check_group_size(options["group_size"], num_envs)
    return 1


@dataclass
class VecEnvConfig(Settings):
    """The settings every built-in env has; each env's schema extends it (and may change a default)."""

    num_envs: int = setting(64, gt=0)
    """Parallel envs simulated as one batch."""
    device: str = "cpu"
    """Torch device of observations, rewards and flags: 'cpu', 'cuda', 'cuda:N' or 'auto'."""
    seed: int = setting(0, ge=0, le=MAX_SEED)
    """Seed of the env's random stream (initial states): the same seed and actions give the same episodes."""
    render_mode: str | None = setting(None, choices=RENDER_MODES)
    """'rgb_array': render() returns frames (trainer.video sets it on the evaluation env); None: the env does not render."""


#: The ``info`` groups of per-term outputs, and the env attribute that declares each one's names.
_TERM_ATTRIBUTES = {"rewards": "reward_terms", "metrics": "metric_names"}


def info_terms(env: Any, info: dict[str, Any], group: str) -> tuple[tuple[str, ...], torch.Tensor]:
    """The reward terms (``group="rewards"``) or task metrics (``group="metrics"``) of one step's ``info``, in
    either form of the :class:`VecEnv` contract, as names and one tensor.

    An env that declares the group's names (``env.reward_terms`` or ``env.metric_names`` a tuple) gives them and
    ``info[group]`` as it is: a float32 ``[N, K]`` tensor, not copied. Otherwise ``info[group]`` is a dict of
    ``[N]`` tensors: its keys in order, and its values stacked along the last dimension as float32 (a new
    ``[N, K]`` tensor; ``[N, 0]`` for an empty dict). The shapes are not checked here; ``check_vec_env`` does.

    Args:
        env: the env that returned ``info`` (``N = env.num_envs``).
        info: the ``info`` of one ``step``.
        group: ``"rewards"`` or ``"metrics"``.

    Returns:
        ``(names, values)``: ``K`` names and float32 ``[N, K]`` whose column ``k`` is ``names[k]``.

    Raises:
        ValueError: a ``group`` other than ``"rewards"`` or ``"metrics"``.
        KeyError: ``info`` has no ``group``.
    """
    attribute = _TERM_ATTRIBUTES.get(group)
    if attribute is None:
        raise ValueError(f"group={group!r} is not allowed: expected 'rewards' or 'metrics'")
    names = getattr(env, attribute, None)
    terms = info[group]
    if names is not None:
        return names, terms
    if not terms:
        return (), torch.zeros((env.num_envs, 0), device=env.device)
    return tuple(terms), torch.stack([value.float() for value in terms.values()], dim=-1)


class VecEnv(gym.vector.VectorEnv):
    """Abstract batched torch environment (a gymnasium ``VectorEnv``).

    Attributes:
        num_envs: number of parallel envs ``N``.
        device: torch device of every tensor in and out.
        single_observation_space / single_action_space: gymnasium spaces of one env.
        observation_space / action_space: the batched spaces.
        max_episode_steps: time limit in control steps (episodes are truncated there).

    ``reset(seed=None, options=None) -> (obs, info)``: ``obs`` is ``[N, *obs_shape]``.
    ``options={"group_size": G}`` gives identical initial states to every block
    of ``G`` consecutive envs (GRPO, Shao et al. 2024) and different ones across
    blocks.

    ``step(action) -> (obs, reward, terminated, truncated, info)`` with
    ``obs`` float32 ``[N, *obs_shape]``, ``reward`` float32 ``[N]``,
    ``terminated``/``truncated`` bool ``[N]``; ``info`` holds ``final_obs``
    float32 ``[N, *obs_shape]``, ``rewards`` (the weighted reward terms,
    summing to ``reward``), ``metrics`` (the task metrics) and ``success``
    (bool ``[N]``). Actions are float32 ``[N, *act_shape]`` (Box) or int64
    ``[N]`` (Discrete).

    Reward terms and metrics come in one of two forms, the same every step:

    * declared: ``reward_terms`` (``metric_names``) is a tuple of ``K``
      distinct names, set once (a class attribute, or in ``__init__``), and
      ``info["rewards"]`` (``info["metrics"]``) is a float32 tensor
      ``[N, K]`` whose column ``k`` is the term named ``reward_terms[k]``.
      This is the form of the built-in tasks, and the one a step compiled
      with ``torch.compile(fullgraph=True)`` or captured as a CUDA graph
      needs: no dict built per step, a fixed shape;
    * dict: ``reward_terms`` (``metric_names``) is None, and
      ``info["rewards"]`` (``info["metrics"]``) is a dict of float32 ``[N]``
      tensors, the same names every step (adapters and eager envs).

    :func:`info_terms` reads either form as ``(names, [N, K] tensor)``; every
    consumer in rlchain goes through it.

    Only the done rows (``terminated | truncated``) of ``final_obs`` carry
    meaning: there it is the observation the episode ended on, before the
    reset. Elsewhere its content is unspecified (gymnasium leaves those
    entries ``None``); the state a running episode moved to is the returned
    ``obs``, and that is what the collector bootstraps from.

    ``reports_success`` declares whether ``info["success"]`` is a task
    success signal. An env without one (a locomotion task, Pendulum) sets it
    False, still returns an all-False ``info["success"]``, and rlchain then
    neither logs nor shows a success rate for it. An env knows it from its
    construction on; it never changes while the env runs.

    Checkpoints save what :meth:`state_dict` returns and a resume hands it to
    :meth:`load_state_dict`. ``resumes_episodes`` declares whether that
    restores every env exactly, so that a resumed run goes on with the
    episodes in progress (bit-identical on the CPU); otherwise a resume resets
    every env first (the episodes in progress at the checkpoint are dropped).

    Rendering. ``render_mode`` (gymnasium's attribute; the ``render_mode``
    setting of :class:`VecEnvConfig`) is ``"rgb_array"`` for an env built to
    render, else None. ``render(env_ids=None)`` then returns the frames of the
    envs ``env_ids`` (every env when None) in their current state, as uint8
    RGB ``[K, H, W, 3]`` (``K = len(env_ids)``; the built-in tasks draw
    even H and W, which H.264 video needs) on ``device`` (on the CPU for
    :class:`~rlchain.core.envs.gym_adapter.GymVecEnv`). An env that renders lists
    ``"rgb_array"`` in ``metadata["render_modes"]`` and its frame rate, one
    frame per ``step``, in ``metadata["render_fps"]``. An env that does not
    render inherits the ``render`` here, which raises ``NotImplementedError``.

    :func:`rlchain.core.envs.check_vec_env` checks an env against every rule here.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
    #: ``"rgb_array"`` when :meth:`render` draws frames, None when the env was built not to render.
    render_mode: str | None = None
    #: The name of each observation feature, in order (``obs_dim`` of them), or None when the env does not name
    #: them; ``rlchain-export`` writes them into an exported policy's metadata.
    observation_names: tuple[str, ...] | None = None
    #: What the env adds to the policy's Discrete action (the policy's category ``i`` is the env's action
    #: ``i + action_start``: a gymnasium ``Discrete(n, start)``); 0 for a Box. ``rlchain-export`` bakes it in.
    action_start: int = 0
    #: The names of the columns of ``info["rewards"]`` (a float32 ``[N, K]`` tensor), in order, or None when
    #: ``info["rewards"]`` is a dict of ``[N]`` tensors (see the class docstring).
    reward_terms: tuple[str, ...] | None = None
    #: The names of the columns of ``info["metrics"]`` (a float32 ``[N, K]`` tensor), in order, or None when
    #: ``info["metrics"]`` is a dict of ``[N]`` tensors (see the class docstring).
    metric_names: tuple[str, ...] | None = None
    #: The env's settings (its :class:`VecEnvConfig` subclass), or None for an env without a schema;
    #: ``rlchain-export`` records ``cfg._target_`` (and ``cfg.id`` or ``cfg.task``, where there is one) in its metadata.
    cfg: VecEnvConfig | None = None

    #: Whether ``info["success"]`` is a task success signal (see the class docstring).
    reports_success: bool = True
    #: Whether :meth:`load_state_dict` restores the episodes in progress exactly (see the class docstring).
    resumes_episodes: bool = False
    #: Whether :meth:`spread_episode_starts` is implemented (``trainer.spread_episode_starts`` needs it).
    spreads_episode_starts: bool = False
    #: Whether :meth:`step` compiles with ``torch.compile(fullgraph=True)``: torch ops only, state written in place,
    #: no host read and no Python branch on a tensor's value, reward terms and metrics declared
    #: (``reward_terms``, ``metric_names``). The collector then compiles (and on CUDA captures) its whole step.
    compiles_step: bool = False
    num_envs: int
    device: torch.device
    max_episode_steps: int

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.num_envs = num_envs
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        """The env's state for a checkpoint (tensors and plain data); ``{}`` when there is none to save."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (see ``resumes_episodes`` for what a resume expects of it).

        Raises:
            ValueError: (in an env that has state) a state of another env: an unknown key, a wrong shape.
        """

    def check_actions(self) -> None:
        """Raise for an invalid action taken since the last call; a no-op for an env that checks each action in
        its ``step`` (this base implementation).

        A torch-native task keeps its check on the device so that its ``step`` compiles whole
        (:class:`TorchVecEnv`); the collector and evaluation call this once per rollout.

        Raises:
            ValueError: (an env that defers its check) the env's message for the invalid action.
        """

    def spread_episode_starts(self) -> None:
        """Move every env to a random step of its episode, uniform in ``[0, max_episode_steps)``, drawn from the
        env's own random stream; the state is unchanged, only the step its time limit counts from.

        After a reset, every episode would otherwise reach its time limit at the same step, and the rollouts of
        a long episode would see only its early steps and then only its late ones. ``trainer.spread_episode_starts``
        calls it once after the first reset of training (rsl_rl's ``init_at_random_ep_len``); evaluation never.

        Raises:
            NotImplementedError: the env cannot move its episodes' step counts (this base implementation).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot spread its episode starts")

    def render(self, env_ids: Sequence[int] | None = None) -> torch.Tensor:
        """Frames of the envs ``env_ids`` (every env when None) in their current state.

        Args:
            env_ids: env indices in ``[0, num_envs)``, ``K`` of them (repeats allowed).

        Returns:
            uint8 RGB ``[K, H, W, 3]``, on ``device`` for a torch-native env
            (on the CPU for :class:`~rlchain.core.envs.gym_adapter.GymVecEnv`).

        Raises:
            NotImplementedError: the env does not render (this base implementation).
            RuntimeError: (an env that renders) ``render_mode`` is not ``"rgb_array"``.
            IndexError: (an env that renders) an env id outside ``[0, num_envs)``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not render")

    def _render_ids(self, env_ids: Sequence[int] | None) -> list[int] | None:
        """The checks of every :meth:`render`: ``render_mode`` is set and each id is in range.

        Returns:
            ``env_ids`` as a list of ints (a tensor or array of them is read
            once on the host), or None for every env.

        Raises:
            RuntimeError: ``render_mode`` is not ``"rgb_array"``.
            IndexError: an id that is not an integer in ``[0, num_envs)``.
        """
        if self.render_mode != "rgb_array":
            raise RuntimeError(
                f"{type(self).__name__}.render() needs render_mode='rgb_array' "
                f"(env.render_mode={self.render_mode!r}): build the env with render_mode='rgb_array'"
            )
        if env_ids is None:
            return None
        ids = env_ids.tolist() if isinstance(env_ids, (torch.Tensor, np.ndarray)) else list(env_ids)
        bad = [
            i for i in ids if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.num_envs
        ]
        if bad:
            raise IndexError(
                f"env_ids has {bad[:5]}: expected integers in [0, {self.num_envs}) (num_envs={self.num_envs})"
            )
        return [int(i) for i in ids]

    def _set_spaces(self, single_observation_space: gym.Space, single_action_space: gym.Space) -> None:
        self.single_observation_space = single_observation_space
        self.single_action_space = single_action_space
        self.observation_space = gym.vector.utils.batch_space(single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(single_action_space, self.num_envs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # pragma: no cover - abstract
        """Reset every env; returns ``(obs, info)``, ``obs`` float32 ``[N, *obs_shape]``.

        ``seed`` reseeds the env's random stream; ``options={"group_size": G}``
        gives each block of ``G`` consecutive envs one initial state.

        Raises:
            ValueError: a ``group_size`` that is not a positive int dividing ``num_envs``.
        """
        raise NotImplementedError

    def step(self, action: torch.Tensor):  # pragma: no cover - abstract
        """Step every env once; returns ``(obs, reward, terminated, truncated, info)`` (see the class docstring).

        ``action``: float32 ``[N, *act_shape]`` (Box) or int64 ``[N]`` (Discrete).
        Finished envs reset in this call (same-step auto-reset).

        Raises:
            ValueError: an action of the wrong shape or with values the action space refuses.
        """
        raise NotImplementedError


class TorchVecEnv(VecEnv):
    """A :class:`VecEnv` whose whole state is named torch tensors and one :class:`~rlchain.core.envs.rng.CounterRng`.

    Subclasses list their state tensors (attribute names) in ``_STATE``, write them in place only, and draw
    from ``self._rng``; this class gives them exact save and restore (:meth:`state_dict`,
    :meth:`load_state_dict`), used by checkpoints so a resumed run continues bit-identically, and an
    invalid-action check that stays on the device (:meth:`_flag_invalid_action`, :meth:`check_actions`). Written
    so, a task's ``step`` compiles whole (``torch.compile(env.step, fullgraph=True)``) and replays as one CUDA
    graph: no host read, no ``torch.Generator``, no tensor whose address changes between steps.
    """

    resumes_episodes = True
    _STATE: tuple[str, ...] = ()
    _rng: CounterRng
    #: The error of :meth:`check_actions` (one kind of invalid action per env).
    _invalid_action_message: str = NON_FINITE_ACTION

    def __init__(self, num_envs: int, device: torch.device) -> None:
        super().__init__(num_envs, device)
        self._invalid_action = torch.zeros((), dtype=torch.bool, device=device)

    def get_state(self) -> dict[str, torch.Tensor]:
        """Every state tensor by name (references, not copies)."""
        return {name: getattr(self, name) for name in self._STATE}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        """Overwrite state tensors by name (as returned by :meth:`get_state`), in place.

        Raises:
            ValueError: an unknown name or a tensor of the wrong shape.
        """
        for name, value in state.items():
            if name not in self._STATE:
                raise ValueError(f"state key {name!r} is unknown: expected one of {', '.join(self._STATE)}")
            current = getattr(self, name)
            value = torch.as_tensor(value, device=self.device, dtype=current.dtype)
            if value.shape != current.shape:
                raise ValueError(f"state[{name!r}] has shape {tuple(value.shape)}: expected {tuple(current.shape)}")
            current.copy_(value)
        self._after_set_state()

    def _after_set_state(self) -> None:
        """Recompute anything derived from the state (a hook for subclasses)."""

    def spread_episode_starts(self) -> None:
        """See :meth:`VecEnv.spread_episode_starts`: for a task that counts its steps in ``elapsed_steps`` (a state
        tensor ``[N]``; it then sets ``spreads_episode_starts``), random counts from its stream.

        Raises:
            NotImplementedError: the task keeps no ``elapsed_steps``.
        """
        if "elapsed_steps" not in self._STATE:
            super().spread_episode_starts()
        self.elapsed_steps.copy_(self._rng.integers(self.max_episode_steps, self.num_envs))

    def split_into_members(self, seeds: Sequence[int]) -> None:
        """Make this task of ``N`` envs ``P = len(seeds)`` member tasks of ``N / P`` envs each, in order, member
        ``p`` seeded ``seeds[p]`` (a population, :mod:`rlchain.population`): from here on member ``p``'s envs
        see the episodes a task of ``N / P`` envs built with seed ``seeds[p]`` sees (each member draws from its
        own stream: :class:`~rlchain.core.envs.rng.CounterRng`, at the draw the task's stream stands at) and flags
        its own invalid actions (:meth:`take_invalid_members`). Call it before the first ``reset``.

        Raises:
            ValueError: ``N`` not a multiple of ``P``.
        """
        if not seeds or self.num_envs % len(seeds):
            raise ValueError(f"num_envs={self.num_envs} does not split into {len(seeds)} members of equal size")
        counter = self._rng.state.view(-1, 2)[0, 1]  # the draws made so far (a task may draw when it is built)
        self._rng = CounterRng(list(seeds), self.device)
        self._rng.state[:, 1] = counter
        # Each member's own invalid-action flag (take_invalid_members): one member's fault stops it alone.
        self._invalid_action = torch.zeros(len(seeds), dtype=torch.bool, device=self.device)

    def _render_rows(self, env_ids: Sequence[int] | None) -> slice | torch.Tensor:
        """The rows of the state tensors that :meth:`render` draws (checked by :meth:`VecEnv._render_ids`).

        A slice for every env or a run of consecutive ids (no index tensor to
        copy to the device), else an int64 index tensor on ``device``.
        """
        ids = self._render_ids(env_ids)
        if ids is None:
            return slice(None)
        if not ids or ids == list(range(ids[0], ids[0] + len(ids))):
            start = ids[0] if ids else 0
            return slice(start, start + len(ids))
        return torch.tensor(ids, dtype=torch.int64, device=self.device)

    def _sample_and_set(self, mask: torch.Tensor, group_size: int) -> None:  # pragma: no cover - abstract
        """Give the envs where ``mask`` (bool ``[N]``) fresh initial states, one per block of ``group_size``."""
        raise NotImplementedError

    def _observe(self) -> torch.Tensor:  # pragma: no cover - abstract
        """The observation of every env, ``[N, *obs_shape]``."""
        raise NotImplementedError

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset every env.

        Args:
            seed: restarts the env's random stream from this seed when given.
            options: ``{"group_size": G}`` makes each block of ``G`` consecutive
                envs start from one shared state (GRPO); blocks differ.

        Returns:
            ``(obs [N, *obs_shape] float32, info)``; ``info`` is empty.

        Raises:
            SettingError: ``group_size`` not a positive int dividing ``num_envs``.
        """
        group_size = reset_group_size(options, self.num_envs)
        if seed is not None:
            self._rng.seed(seed)
        self._sample_and_set(torch.ones(self.num_envs, dtype=torch.bool, device=self.device), group_size)
        self._after_set_state()
        return self._observe(), {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """State tensors (copies) and the random stream's state (``rng``): everything to continue exactly."""
        return {**{k: v.clone() for k, v in self.get_state().items()}, "rng": self._rng.state_dict()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict` output.

        A checkpoint of rlchain 0.1.0 holds a ``torch.Generator``'s state (``generator``) instead of ``rng``: its
        episodes in progress are restored, and the random stream goes on from where this env's stands.

        Raises:
            ValueError: an unknown key, a tensor of the wrong shape, an ``rng`` that is not a stream's state.
        """
        state = dict(state)
        if "rng" in state:
            self._rng.load_state_dict(state.pop("rng"))
        else:
            state.pop("generator", None)
        self.set_state(state)

    def _flag_invalid_action(self, bad: torch.Tensor) -> None:
        """Record ``bad`` (a bool tensor on the env's device: ``[N]``, which envs' actions of this step were invalid,
        or 0-d, whether any was) for :meth:`check_actions`, on the device. Eager on the CPU, where a read costs no
        synchronisation, the check follows at once; compiled, or on CUDA, it waits for the caller's
        :meth:`check_actions` (the collector and evaluation call it once per rollout). In a task split into members
        (:meth:`split_into_members`) each member's flag is its own (a 0-d ``bad`` flags every member), and it is
        read by :meth:`take_invalid_members`, not raised."""
        if self._invalid_action.dim():  # a member's own flag: any of its envs
            members = self._invalid_action.shape[0]
            self._invalid_action.logical_or_(bad.expand(self.num_envs).view(members, -1).any(1))
            return
        self._invalid_action.logical_or_(bad.any())
        if self.device.type == "cpu" and not torch.compiler.is_compiling():
            self.check_actions()

    def check_actions(self) -> None:
        """Raise for an invalid action taken since the last call (one host read; the flag is then cleared). In a
        task split into members, nothing: the population reads each member's flag (:meth:`take_invalid_members`).

        Raises:
            ValueError: the env's one-line message (NaN or inf in a Box action, a Discrete action out of range).
        """
        if self.is_split:
            return
        if bool(self._invalid_action):
            self._invalid_action.zero_()
            raise ValueError(self._invalid_action_message)

    @property
    def is_split(self) -> bool:
        """Whether the task is split into members (:meth:`split_into_members`)."""
        return bool(self._invalid_action.dim())

    def take_invalid_members(self) -> tuple[list[int], str]:
        """In a task split into members: the members whose actions were invalid since the last call (one host
        read; the flags are then cleared), and the env's message for such an action. A member's envs step on with
        what its actions make of its own state; no other member's envs see them.

        Raises:
            RuntimeError: a task not split into members.
        """
        if not self.is_split:
            raise RuntimeError(f"{type(self).__name__} is not split into members: its check is check_actions()")
        members = self._invalid_action.nonzero().flatten().tolist()
        self._invalid_action.zero_()
        return members, self._invalid_action_message


class SingleGymEnv(gym.Env):
    """One env of a batched :class:`VecEnv` as a plain numpy gymnasium env (what ``gymnasium.make`` returns).

    Subclasses build their batched env with ``num_envs=1`` (on the CPU) and
    pass it here. Observations are numpy ``single_observation_space`` arrays;
    actions a Discrete's int or a Box's array. Episodes end as gymnasium
    expects: the observation returned on an episode's last step is its final
    one, and the caller resets. ``info`` holds ``success`` (where
    ``reports_success``, by default the batched env's), every task metric,
    and every reward term as ``reward_<term>``, all as Python scalars.

    Rendering follows the batched env: built with ``render_mode="rgb_array"``
    (gymnasium's ``make(..., render_mode=...)`` passes it on),
    :meth:`render` returns its frame as a numpy uint8 ``[H, W, 3]``;
    ``metadata`` holds the batched env's ``render_modes`` and ``render_fps``.
    A subclass lists ``"rgb_array"`` in its class-level ``metadata``, which
    ``gymnasium.make`` reads before building the env.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env: VecEnv) -> None:
        self._env = env
        self.reports_success = env.reports_success
        self.observation_space = env.single_observation_space
        self.action_space = env.single_action_space
        self.render_mode = env.render_mode
        self.metadata = {"render_modes": list(env.metadata.get("render_modes", []))}
        if "render_fps" in env.metadata:
            self.metadata["render_fps"] = env.metadata["render_fps"]

    def render(self) -> np.ndarray | None:
        """The env's frame in its current state: numpy uint8 RGB ``[H, W, 3]``.

        None (with gymnasium's warning) when ``render_mode`` is None, as gymnasium's own envs do.
        """
        if self.render_mode is None:
            gym.logger.warn(
                f"{type(self).__name__}.render() was called with render_mode=None: build the env with "
                "gymnasium.make(..., render_mode='rgb_array') to get frames"
            )
            return None
        # One intra-op thread: a single frame gains nothing from more, and a
        # gymnasium AsyncVectorEnv worker is a forked process, in which the
        # first parallel region of torch's OpenMP hangs once the parent has
        # run one.
        threads = torch.get_num_threads()
        if threads > 1:
            torch.set_num_threads(1)
        try:
            return self._env.render([0])[0].cpu().numpy()
        finally:
            if threads > 1:
                torch.set_num_threads(threads)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        # The batched env is reseeded from gymnasium's np_random on every
        # reset, so reset(seed=s) followed by plain resets is reproducible.
        obs, _ = self._env.reset(seed=int(self.np_random.integers(2**31 - 1)))
        return _first_row(obs), {}

    def step(self, action: Any):
        if isinstance(self.action_space, gym.spaces.Discrete):
            act = torch.as_tensor(np.asarray(action).reshape(1))  # no cast: 0.5 must fail the env's own check
        else:
            act = torch.as_tensor(np.asarray(action, dtype=np.float32).reshape(1, *self.action_space.shape))
        obs, reward, terminated, truncated, info = self._env.step(act)
        done = bool(terminated[0] | truncated[0])
        last = _first_row(info["final_obs"] if done else obs)  # final_obs means something on done rows only
        out = {"success": bool(info["success"][0])} if self.reports_success else {}
        for group, prefix in (("metrics", ""), ("rewards", "reward_")):
            names, values = info_terms(self._env, info, group)
            out.update({prefix + name: value for name, value in zip(names, values[0].tolist())})
        return last, float(reward[0]), bool(terminated[0]), bool(truncated[0]), out


def _first_row(obs: Any) -> Any:
    """Env 0's observation as numpy: an array, or a dict of one per group."""
    if isinstance(obs, torch.Tensor):
        return obs[0].cpu().numpy()
    return {key: obs[key][0].cpu().numpy() for key in obs.keys()}


class TorchRngStream:
    """Torch RNG states of an env's own, swapped in for torch's global ones inside :meth:`active`.

    For a simulator that draws with ``torch.rand`` and friends on torch's default generators (mjlab, ManiSkill's
    episode resets): inside :meth:`active` those generators hold this state (the CPU's, and on CUDA the
    device's too; mjlab draws a few things on the CPU's even on CUDA), and the global states they held are put
    back afterwards, so the env and the policy's sampling do not share a stream. ``state`` is a uint8 tensor:
    the CPU state, then on CUDA the device's.
    """

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device = device  # with its index: the generator the simulator draws from
        self.state = self._seeded(seed)

    def get(self) -> torch.Tensor:
        """The generators' current states, as ``state`` holds them."""
        states = [torch.get_rng_state()]
        if self.device.type == "cuda":
            states.append(torch.cuda.get_rng_state(self.device))
        return torch.cat(states)

    def set(self, state: torch.Tensor) -> None:
        """Put ``state`` (as :meth:`get` returns it) on the generators."""
        cpu_size = torch.get_rng_state().numel()
        torch.set_rng_state(state[:cpu_size])
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state[cpu_size:], self.device)

    def _seeded(self, seed: int) -> torch.Tensor:
        states = []
        for device in ["cpu"] + ([self.device] if self.device.type == "cuda" else []):
            generator = torch.Generator(device)
            generator.manual_seed(int(seed))
            states.append(generator.get_state())
        return torch.cat(states)

    def seed(self, seed: int) -> None:
        """Restart the stream from ``seed``."""
        self.state = self._seeded(seed)

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the body with this state on the default generators; keep where the body left it."""
        outer = self.get()
        self.set(self.state)
        try:
            yield
        finally:
            self.state = self.get()
            self.set(outer)

    def load(self, state: Any, env: str) -> None:
        """Take ``state`` (a uint8 tensor, as ``self.state`` is) saved by an env of kind ``env``, e.g. ``"MjlabEnv"``.

        Raises:
            ValueError: not a tensor, or one of another size (a checkpoint saved on another kind of device).
        """
        if not isinstance(state, torch.Tensor):
            raise ValueError(f"env state rng is a {type(state).__name__}: expected the RNG state of an {env}")
        rng = state.cpu().to(torch.uint8)
        if rng.numel() != self.state.numel():
            raise ValueError(
                f"env state rng has {rng.numel()} bytes: expected {self.state.numel()}, the RNG state of an "
                f"{env} on {self.device.type} (a checkpoint saved on another kind of device)"
            )
        self.state = rng
