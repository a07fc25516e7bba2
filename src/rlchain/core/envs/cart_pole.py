"""CartPole, batched in torch: the classic cart-pole of Barto, Sutton and Anderson (1983).

The dynamics, constants, initial-state distribution, termination bounds,
reward and 500-step limit are those of gymnasium's ``CartPole-v1``
(``gymnasium.envs.classic_control.cartpole``, explicit Euler integration):
a pole of half-length 0.5 m and mass 0.1 kg on a 1 kg cart, a force of
+-10 N every 0.02 s, gravity 9.8 m/s^2; the episode terminates when the cart
leaves +-2.4 m or the pole leans beyond +-12 degrees, and is truncated after
500 steps. Every step, including the terminating one, earns reward 1.

Observation ``[x (m), x_dot (m/s), theta (rad), theta_dot (rad/s)]``, float32;
with ``hide_velocities`` only ``[x (m), theta (rad)]`` (sb3-contrib's
``CartPoleNoVel-v1``: a task that needs memory, the velocities inferred from
successive observations).
Actions:

* ``action_mode="discrete"``: ``Discrete(2)``, 0 pushes left and 1 right, as in
  gymnasium;
* ``action_mode="continuous"``: ``Box(-1, 1, (1,))``, the force is
  ``clip(a, -1, 1) * force_mag`` newtons.

``info["success"]`` marks episodes that reach the step limit (the pole stayed
up for all 500 steps).

Rendering (``render_mode="rgb_array"``): :meth:`CartPoleEnv.render` draws
gymnasium's side view in its colours, ``RENDER_HEIGHT x RENDER_WIDTH``
pixels: the track from -2.4 m to 2.4 m across the whole width, the cart
(0.4 m x 0.24 m, black), the pole (1 m, tilted by ``theta``, clockwise for a
positive angle as in gymnasium) and its pivot. It is drawn with torch ops on
the env's device (:mod:`rlchain.core.envs.rendering`) at gymnasium's 50 frames per
second, one per step.

Registered with gymnasium by ``import rlchain`` as ``rlchain/CartPole-v1``:
``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")`` returns a
batched :class:`CartPoleEnv`, ``gymnasium.make`` a single numpy
:class:`CartPoleGymEnv` built on it (so both take the same keyword arguments,
``action_mode`` included, and follow the same float32 equations; gymnasium's
own ``CartPole-v1`` remains its float64 numpy reference).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import rlchain.core.envs.rendering as rendering
from rlchain.core.envs.base import SingleGymEnv, TorchVecEnv, VecEnvConfig
from rlchain.core.envs.rng import CounterRng
from rlchain.settings import setting
from rlchain.utils import resolve_device

__all__ = [
    "INVALID_DISCRETE_ACTION",
    "RENDER_HEIGHT",
    "RENDER_WIDTH",
    "CartPoleConfig",
    "CartPoleEnv",
    "CartPoleGymEnv",
]

#: The error of a discrete :class:`CartPoleEnv` step on an action outside {0, 1}.
INVALID_DISCRETE_ACTION = "action contains values other than 0 and 1: expected 0 (push left) or 1 (push right)"

#: The values of ``action_mode``.
ACTION_MODES = ("discrete", "continuous")


@dataclass
class CartPoleConfig(VecEnvConfig):
    """Every setting of :class:`CartPoleEnv` with its default and range (SI units); the Hydra schema.

    ``num_envs``, ``device`` and ``seed`` as :class:`~rlchain.core.envs.base.VecEnvConfig`.
    """

    _target_: str = "rlchain.core.envs.cart_pole.CartPoleEnv"
    action_mode: str = setting("discrete", choices=ACTION_MODES)
    """'discrete' (Discrete(2), as gymnasium) or 'continuous' (Box(-1, 1, (1,)) x force_mag)."""
    max_episode_steps: int = setting(500, gt=0)
    """Time limit in steps (CartPole-v1: 500)."""
    force_mag: float = setting(10.0, gt=0)
    """Force of a full push, N."""
    hide_velocities: bool = False
    """Observe [x, theta] only (sb3-contrib's CartPoleNoVel-v1): a policy needs memory to infer the velocities."""


GRAVITY = 9.8  # m/s^2
MASS_CART = 1.0  # kg
MASS_POLE = 0.1  # kg
TOTAL_MASS = MASS_CART + MASS_POLE
HALF_LENGTH = 0.5  # m, half the pole's length
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
TAU = 0.02  # s between state updates
THETA_THRESHOLD = 12 * 2 * math.pi / 360  # rad
X_THRESHOLD = 2.4  # m
INIT_HALF_RANGE = 0.05  # initial states uniform in [-0.05, 0.05]

#: Height and width of :meth:`CartPoleEnv.render`'s frames, pixels (even, as H.264 video needs).
RENDER_HEIGHT, RENDER_WIDTH = 256, 384
# The drawing, in metres: gymnasium's pixel sizes at its scale of 600 px / 4.8 m.
_SCALE = RENDER_WIDTH / (2 * X_THRESHOLD)  # px/m: the frame spans x in [-2.4, 2.4] m
_CART_W, _CART_H = 0.4, 0.24  # m; the cart's centre is at y = 0
_POLE_W, _POLE_LEN = 0.08, 2 * HALF_LENGTH  # m
_AXLE_Y = _CART_H / 4  # m, the pivot above the cart's centre
_TRACK_Y, _TRACK_PX = -_CART_H / 2, 2  # the track's top edge (under the cart), m, and its thickness, px
_FLOOR = 0.8  # m of the view below the cart's centre (a quarter of the height, as gymnasium)
# The labels of a frame (later ones are drawn over earlier ones) and their RGB colours (gymnasium's).
_BACKGROUND, _TRACK, _CART, _POLE, _AXLE = range(5)
_COLOURS = ((255, 255, 255), (0, 0, 0), (0, 0, 0), (202, 152, 101), (129, 132, 203))


class CartPoleEnv(TorchVecEnv):
    """``num_envs`` CartPole-v1 systems stepped as one batch on one device.

    Args:
        settings: fields of :class:`CartPoleConfig` (``self.cfg``): ``num_envs``,
            ``device``, ``seed``, ``render_mode``, ``action_mode`` (see the module docstring),
            ``max_episode_steps``, ``force_mag``.

    Shapes: observations float32 ``[N, 4]`` (``[N, 2]`` with ``hide_velocities``); actions int64 ``[N]`` in {0, 1}
    (discrete) or float32 ``[N, 1]`` (continuous); rewards float32 ``[N]``;
    terminated/truncated/success bool ``[N]``; frames of :meth:`render`
    (``render_mode="rgb_array"``) uint8 ``[K, 256, 384, 3]`` on ``device``.

    Raises:
        ValueError: a setting out of its range (an unknown ``action_mode``,
            a non-positive count or force; see :class:`CartPoleConfig`),
            naming it; a CUDA device on a machine without one; ``reset`` on a
            ``group_size`` that does not divide ``num_envs``; ``step`` on an
            action of the wrong shape, a discrete action outside {0, 1} or a
            non-finite continuous one. The shape is checked at once, the
            values at once eager on the CPU, else on the device and raised by
            :meth:`~rlchain.core.envs.base.TorchVecEnv.check_actions`, which the
            collector and evaluation call once per rollout (meanwhile an
            invalid discrete action pushes left).
    """

    spreads_episode_starts = True
    compiles_step = True
    #: The one column of ``info["rewards"]``: 1 every step.
    reward_terms = ("alive",)
    #: The columns of ``info["metrics"]``: the absolute pole angle (rad) and cart position (m).
    metric_names = ("abs_theta", "abs_x")
    _STATE = ("x", "x_dot", "theta", "theta_dot", "elapsed_steps")
    metadata: dict[str, Any] = {**TorchVecEnv.metadata, "render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(self, **settings: Any) -> None:
        self.cfg = cfg = CartPoleConfig(**settings)
        super().__init__(cfg.num_envs, resolve_device(cfg.device))
        self.max_episode_steps = cfg.max_episode_steps
        self.render_mode = cfg.render_mode
        self._canvas: tuple[torch.Tensor, ...] | None = None
        high = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)
        if cfg.hide_velocities:
            high, self.observation_names = high[[0, 2]], ("x", "theta")
        action_space = (
            gym.spaces.Discrete(2) if cfg.action_mode == "discrete" else gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        )
        self._set_spaces(gym.spaces.Box(-high, high, dtype=np.float32), action_space)
        n, dev = self.num_envs, self.device
        self._rng = CounterRng(cfg.seed, dev)
        if cfg.action_mode == "discrete":
            self._invalid_action_message = INVALID_DISCRETE_ACTION
        zeros = lambda: torch.zeros(n, device=dev, dtype=torch.float32)  # noqa: E731
        self.x, self.x_dot, self.theta, self.theta_dot = zeros(), zeros(), zeros(), zeros()
        self.elapsed_steps = torch.zeros(n, device=dev, dtype=torch.int32)
        self._sample_and_set(torch.ones(n, dtype=torch.bool, device=dev), group_size=1)

    @property
    def seed(self) -> int:
        """The seed the env was built with (``cfg.seed``; ``reset(seed=...)`` reseeds without changing it)."""
        return self.cfg.seed

    # ------------------------------------------------------------------ reset
    def _sample_and_set(self, mask: torch.Tensor, group_size: int) -> None:
        """Give the envs where ``mask`` (bool ``[N]``) fresh initial states, shared within groups."""
        u = (self._rng.uniform(4, self.num_envs // group_size) * 2 - 1) * INIT_HALF_RANGE
        if group_size > 1:
            u = u.repeat_interleave(group_size, dim=1)
        for i, name in enumerate(("x", "x_dot", "theta", "theta_dot")):
            state = getattr(self, name)
            state.copy_(torch.where(mask, u[i], state))
        self.elapsed_steps.masked_fill_(mask, 0)

    #: The features of an observation, in order (m, m/s, rad, rad/s).
    observation_names = ("x", "x_dot", "theta", "theta_dot")

    def _observe(self) -> torch.Tensor:
        if self.cfg.hide_velocities:
            return torch.stack((self.x, self.theta), dim=-1)
        return torch.stack((self.x, self.x_dot, self.theta, self.theta_dot), dim=-1)

    # ------------------------------------------------------------------- step
    def _force(self, action: torch.Tensor) -> torch.Tensor:
        """Force on the cart, float32 ``[N]``, N, from a checked action."""
        n, force_mag = self.num_envs, self.cfg.force_mag
        if not isinstance(action, torch.Tensor):
            action = torch.as_tensor(np.asarray(action), device=self.device)
        if self.cfg.action_mode == "discrete":
            if action.shape == (n, 1):
                action = action[:, 0]
            if tuple(action.shape) != (n,):
                raise ValueError(f"action has shape {tuple(action.shape)}: expected ({n},) = (num_envs,) of 0 or 1")
            action = action.to(self.device)
            self._flag_invalid_action(~((action == 0) | (action == 1)))
            return torch.where(action == 1, force_mag, -force_mag).float()
        if tuple(action.shape) != (n, 1):
            raise ValueError(f"action has shape {tuple(action.shape)}: expected ({n}, 1) = (num_envs, 1)")
        action = action.to(device=self.device, dtype=torch.float32)[:, 0]
        self._flag_invalid_action(~torch.isfinite(action))
        return action.clamp(-1.0, 1.0) * force_mag

    @torch.no_grad()
    def step(self, action: torch.Tensor):
        """Advance every env by one 0.02 s step (gymnasium's CartPole-v1 equations).

        Args:
            action: int64 ``[N]`` (discrete) or float32 ``[N, 1]`` (continuous).

        Returns:
            ``(obs [N, 4], reward [N], terminated [N], truncated [N], info)``
            as described in :class:`rlchain.core.envs.base.VecEnv`; ``info["rewards"]``
            is float32 ``[N, 1]``, the term ``alive`` (the reward), ``info["metrics"]`` float32
            ``[N, 2]``: the absolute pole angle ``abs_theta`` (rad) and cart position ``abs_x`` (m).

        Raises:
            ValueError: see the class docstring.
        """
        force = self._force(action)
        costheta, sintheta = torch.cos(self.theta), torch.sin(self.theta)
        temp = (force + POLE_MASS_LENGTH * self.theta_dot.square() * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * costheta.square() / TOTAL_MASS)
        )
        xacc = temp - POLE_MASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        # Written in place: the state tensors keep their addresses (a captured CUDA graph reads them).
        self.x.add_(TAU * self.x_dot)
        self.x_dot.add_(TAU * xacc)
        self.theta.add_(TAU * self.theta_dot)
        self.theta_dot.add_(TAU * thetaacc)
        self.elapsed_steps.add_(1)

        terminated = (self.x.abs() > X_THRESHOLD) | (self.theta.abs() > THETA_THRESHOLD)
        truncated = (self.elapsed_steps >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        reward = torch.ones(self.num_envs, device=self.device)
        final_obs = self._observe()
        info = {
            "final_obs": final_obs,
            "rewards": reward.unsqueeze(-1),
            "metrics": torch.stack((self.theta, self.x), dim=-1).abs(),
            "success": truncated,
        }
        self._sample_and_set(done, group_size=1)
        return self._observe(), reward, terminated, truncated, info

    # ---------------------------------------------------------------- render
    def _render_canvas(self) -> tuple[torch.Tensor, ...]:
        """``(xs [W], ys [H], background [H, W], colours [5, 3])``, built on first use; ``xs``/``ys`` in m."""
        if self._canvas is None:
            top = RENDER_HEIGHT / _SCALE - _FLOOR
            xs, ys = rendering.pixel_centres(
                RENDER_HEIGHT, RENDER_WIDTH, (-X_THRESHOLD, X_THRESHOLD), (-_FLOOR, top), self.device
            )
            track = (ys <= _TRACK_Y) & (ys > _TRACK_Y - _TRACK_PX / _SCALE)
            background = torch.where(track, _TRACK, _BACKGROUND).to(torch.uint8)[:, None].repeat(1, RENDER_WIDTH)
            self._canvas = (xs, ys, background, rendering.palette(_COLOURS, self.device))
        return self._canvas

    def render(self, env_ids: Sequence[int] | None = None) -> torch.Tensor:
        """Side views of the envs ``env_ids`` (every env when None) in their current state (see the module docstring).

        The frame spans x in ``[-2.4, 2.4]`` m (the cart's limits) at 80
        pixels per metre; a cart beyond them is drawn in part or not at all.
        Vectorised torch ops on ``device`` (no host sync).

        Args:
            env_ids: env indices in ``[0, num_envs)``, ``K`` of them; None: every env.

        Returns:
            uint8 RGB ``[K, RENDER_HEIGHT, RENDER_WIDTH, 3]`` on ``device``.

        Raises:
            RuntimeError: the env was built with ``render_mode=None``.
            IndexError: an env id outside ``[0, num_envs)``.
        """
        rows = self._render_rows(env_ids)
        xs, ys, background, colours = self._render_canvas()
        x, theta = self.x[rows], self.theta[rows]
        labels = background.expand(x.shape[0], -1, -1).clone()
        on_cart = ((xs[None, :] - x[:, None]).abs() <= _CART_W / 2)[:, None, :]  # [K, 1, W]
        labels.masked_fill_(on_cart & (ys.abs() <= _CART_H / 2)[None, :, None], _CART)
        # The pole in its own frame: "along" from the pivot to the tip, "across" its width.
        across, along = rendering.box_frame(xs, ys, x, torch.full_like(x, _AXLE_Y), -theta)
        pole = (across.abs() <= _POLE_W / 2) & (along >= -_POLE_W / 2) & (along <= _POLE_LEN - _POLE_W / 2)
        labels.masked_fill_(pole, _POLE)
        labels.masked_fill_(rendering.disc(xs, ys, x, torch.full_like(x, _AXLE_Y), _POLE_W / 2), _AXLE)
        return rendering.colour(labels, colours)

    def close(self, **kwargs: Any) -> None:
        """Release nothing: the env holds only tensors."""


class CartPoleGymEnv(SingleGymEnv):
    """A single rlchain CartPole as a plain numpy gymnasium env (``gymnasium.make("rlchain/CartPole-v1")``).

    A one-env :class:`CartPoleEnv` on the CPU behind
    :class:`~rlchain.core.envs.base.SingleGymEnv`. Observations float32 ``(4,)``;
    actions an int in {0, 1} (discrete, the default) or float32 ``(1,)``
    (``action_mode="continuous"``). Keyword arguments are those of
    :class:`CartPoleConfig` except ``num_envs``.

    Like gymnasium's own CartPole it never truncates by itself: the time limit
    is gymnasium's ``TimeLimit`` wrapper, which ``gymnasium.make`` adds from
    the registered spec (500 steps, or ``make(..., max_episode_steps=...)``).
    Given ``max_episode_steps`` directly, the wrapped env truncates there too.

    ``render_mode="rgb_array"`` (``gymnasium.make(..., render_mode=...)``):
    ``render()`` returns a uint8 ``(256, 384, 3)`` frame.

    Raises:
        ValueError: as :class:`CartPoleEnv` (on the CPU, so at once).
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": CartPoleEnv.metadata["render_fps"]}

    def __init__(self, max_episode_steps: int | None = None, **kwargs: Any) -> None:
        kwargs.pop("num_envs", None)
        kwargs.setdefault("device", "cpu")
        # No limit of its own: 2**31 - 1 steps is beyond any episode and fits the int32 step counter.
        limit = 2**31 - 1 if max_episode_steps is None else max_episode_steps
        super().__init__(CartPoleEnv(num_envs=1, max_episode_steps=limit, **kwargs))
        # Success is reaching the time limit, which gymnasium's TimeLimit enforces, not this env.
        self.reports_success = max_episode_steps is not None
