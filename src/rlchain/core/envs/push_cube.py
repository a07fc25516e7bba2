"""PushCube: a batched, torch-native planar pushing task.

A kinematic disc (the robot's end-effector, radius ``pusher_radius``) pushes a
cube (square footprint of side ``cube_size``) across a table of half-extent
``table_half_extent`` towards a goal. Semantics follow EmbodiChain's
PushCubeRL: 0.1 m cube, randomised goal, success when the cube's xy distance
to the goal is below ``success_threshold``. All state is torch tensors of
leading dimension ``num_envs`` on ``device``; nothing leaves the device.

Physics: a kinematic pusher and a rigid cube sliding on the table with
Coulomb friction, ``substeps`` substeps per control step of ``control_dt``
seconds, contacts resolved by position-based dynamics; the model and its
equations are in :mod:`rlchain.core.envs.push_cube_physics`. The pusher may move at
most ``pusher_radius`` per substep (``action_scale / substeps <=
pusher_radius``), which keeps its centre outside the cube.

Episode end. ``terminated`` on success (cube within ``success_threshold`` of
the goal) or failure (cube centre beyond the table edge); ``truncated`` after
``max_episode_steps`` control steps. Finished envs reset within the same step
(see :mod:`rlchain.core.envs.base`).

Observation (float32, 15 values, metres, radians, m/s, rad/s):

===========  =====================================
index        meaning
===========  =====================================
0:2          pusher position (x, y)
2:4          cube position (x, y)
4:6          cube yaw as (cos, sin)
6:8          cube linear velocity (vx, vy)
8            cube angular velocity (omega)
9:11         goal position (x, y)
11:13        pusher -> cube vector (cube - pusher)
13:15        cube -> goal vector (goal - cube)
===========  =====================================

Action: ``Box(-1, 1, (2,))``, the commanded pusher displacement; clipped to
``[-1, 1]`` and scaled by ``action_scale`` metres.

Reward (EmbodiChain's terms and weights), each weighted term a column of
``info["rewards"]`` (``[N, 4]``, named by ``PushCubeEnv.reward_terms``). The two shaping terms pay progress: with EmbodiChain's
term as a potential ``Phi`` they pay ``weight * shaping_scale * (Phi(s_{t+1})
- Phi(s_t))``, so hovering pays nothing and the success bonus is the only
reward left once the cube is close. (Paid as a level every step, a positive
shaping term would make hovering just outside the success radius worth more
than the success bonus that ends the episode.) ``shaping_scale`` converts
EmbodiChain's per-step weights into potential weights: a level reward
``w * Phi`` held for ``H`` steps is worth ``w * H * Phi``; the default ``H = 30``
steps.

This is not the potential-based shaping of Ng, Harada & Russell (1999), which
pays ``gamma * Phi(s_{t+1}) - Phi(s_t)`` and takes ``Phi = 0`` at the end of an
episode, and so leaves the optimal policy unchanged. Against it, these terms
add ``weight * shaping_scale * (1 - gamma) * Phi(s_{t+1})`` at every step and
``weight * shaping_scale * Phi`` of the state an episode ends in: both are
larger where the potential is higher (the pusher behind the cube, the cube at
the goal), so they can change which policy is optimal, in the direction of
the task. With the defaults and ``gamma = 0.99`` the per-step part is at most
0.009 (reach) and 0.24 (place), against a success bonus of 10.

* ``reach``: potential ``1 - tanh(|pusher - p_behind| / reach_scale)``,
  ``p_behind`` the point behind the cube on the goal line at distance
  ``cube_size / 2 + pusher_radius`` from the cube centre; weight ``reach_weight``;
* ``place``: potential ``exp(-|cube - goal|**2 / (2 place_sigma**2))``; weight
  ``place_weight``;
* ``smoothness``: ``-smoothness_weight * |a_t - a_{t-1}|**2`` (clipped actions);
* ``success``: ``success_weight`` on the step the goal is reached.

Rendering (``render_mode="rgb_array"``): :meth:`PushCubeEnv.render` draws a
top-down view, ``RENDER_SIZE x RENDER_SIZE`` pixels, x to the right and y up:
the table (light, filling the frame but for a dark border of
``RENDER_MARGIN`` pixels), the success region (a translucent green disc of
radius ``success_threshold`` with a darker outline) around the goal (a dark
green dot), the cube (red, its face on its own +x axis dark red, so its yaw
shows in full, not only modulo 90 degrees) and the pusher (a blue disc of
``pusher_radius``). It is drawn with torch ops on the env's device
(:mod:`rlchain.core.envs.rendering`); one frame per control step, so
``metadata["render_fps"]`` is ``1 / control_dt``.

A hand-written controller that solves the task (a baseline, and the check
that it is solvable) is :func:`rlchain.core.envs.push_cube_controller.scripted_action`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import rlchain.core.envs.push_cube_physics as physics
import rlchain.core.envs.rendering as rendering
from rlchain.core.envs.base import SingleGymEnv, TorchVecEnv, VecEnvConfig
from rlchain.core.envs.rng import CounterRng
from rlchain.settings import SettingError, refuse_renamed, setting
from rlchain.utils import resolve_device

__all__ = ["RENDER_SIZE", "PushCubeConfig", "PushCubeEnv", "PushCubeGymEnv"]

OBS_DIM = 15
#: The features of the group 'state' of obs_mode=pixels_state: pusher_x, pusher_y, goal_x, goal_y.
_PIXELS_STATE = [0, 1, 9, 10]

#: Height and width of :meth:`PushCubeEnv.render`'s frames, pixels (even, as H.264 video needs).
RENDER_SIZE = 256
#: The dark border around the table in a frame, pixels on each side.
RENDER_MARGIN = 8

# The labels of a frame (later ones are drawn over earlier ones) and their RGB colours.
_OUTSIDE, _TABLE, _OUTSIDE_IN_REGION, _TABLE_IN_REGION, _RING, _CUBE, _CUBE_FACE, _GOAL, _PUSHER = range(9)
_OUTSIDE_RGB, _TABLE_RGB, _REGION_RGB = (38, 40, 46), (226, 218, 200), (60, 170, 90)
_COLOURS = (
    _OUTSIDE_RGB,
    _TABLE_RGB,
    rendering.blend(_OUTSIDE_RGB, _REGION_RGB, 0.35),
    rendering.blend(_TABLE_RGB, _REGION_RGB, 0.35),
    (40, 130, 65),
    (205, 70, 55),
    (110, 25, 20),
    (15, 90, 40),
    (45, 85, 200),
)
# Outline of the success region and radius of the goal dot, pixels; width of the cube's marked face, of cube_size.
_RING_PX, _GOAL_PX, _FACE_FRACTION = 1.5, 2.5, 0.2

#: The state the physics moves, the rows of one ``[8, N]`` block in this order (m, rad, m/s, rad/s).
_PHYSICS_STATE = ("pusher_x", "pusher_y", "cube_x", "cube_y", "cube_yaw", "cube_vx", "cube_vy", "cube_omega")

#: The spawn regions, each of which must lie inside the table.
_SPAWN_REGIONS = ("cube_spawn_half_extent", "goal_spawn_half_extent", "pusher_spawn_half_extent")


@dataclass
class PushCubeConfig(VecEnvConfig):
    """Every setting of :class:`PushCubeEnv` with its default and range (SI units); the Hydra schema.

    ``num_envs``, ``device`` and ``seed`` as :class:`~rlchain.core.envs.base.VecEnvConfig`.
    """

    _target_: str = "rlchain.core.envs.push_cube.PushCubeEnv"
    num_envs: int = 512
    table_half_extent: float = setting(0.6, gt=0)
    """The table is [-h, h]^2 metres; a cube centre beyond it has fallen off."""
    cube_size: float = setting(0.1, gt=0)
    """Side of the cube's square footprint, m."""
    pusher_radius: float = setting(0.02, gt=0)
    """Radius of the pusher disc, m."""
    cube_spawn_half_extent: float = setting(0.2, gt=0)
    """Cubes spawn uniformly in [-h, h]^2 m with uniform random yaw (h < table_half_extent)."""
    goal_spawn_half_extent: float = setting(0.3, gt=0)
    """Goals spawn uniformly in [-h, h]^2 m (h < table_half_extent) ..."""
    min_goal_distance: float = setting(0.15, ge=0)
    """... at least this far from the cube, m."""
    pusher_spawn_half_extent: float = setting(0.3, gt=0)
    """The pusher spawns uniformly in [-h, h]^2 m (h < table_half_extent), clear of the cube."""
    success_threshold: float = setting(0.1, gt=0)
    """Success when the cube centre is this close to the goal, m."""
    max_episode_steps: int = setting(100, gt=0)
    """Time limit in control steps (gymnasium's name; earlier releases called it episode_length)."""
    action_scale: float = setting(0.05, gt=0)
    """Commanded pusher displacement per control step for an action of 1, m (at most substeps * pusher_radius)."""
    control_dt: float = setting(0.1, gt=0)
    """Duration of one control step, s."""
    substeps: int = setting(4, gt=0)
    """Physics substeps per control step."""
    contact_iterations: int = setting(1, gt=0)
    """Contact projections per substep (1 keeps penetration below 1 mm at the defaults)."""
    friction_coef: float = setting(0.5, ge=0)
    """Coulomb friction coefficient between cube and table."""
    reach_weight: float = setting(0.03, ge=0)
    """Weight of the reach-behind-the-cube term."""
    reach_scale: float = setting(0.1, gt=0)
    """Distance scale of the reach term's tanh, m."""
    place_weight: float = setting(0.8, ge=0)
    """Weight of the cube-to-goal exp shaping term."""
    shaping_scale: float = setting(30.0, ge=0)
    """Multiplies both progress terms: a horizon in steps (see the module docstring)."""
    place_sigma: float = setting(0.12, gt=0)
    """Width of the cube-to-goal Gaussian shaping, m."""
    smoothness_weight: float = setting(0.0, ge=0)
    """Weight of the action-change penalty; off by default. EmbodiChain's 0.01 also penalises exploration noise,
    which traps critic-free GRPO in a policy that barely moves on some seeds (benchmarks/README.md)."""
    success_weight: float = setting(10.0, ge=0)
    """Bonus on the step the goal is reached."""
    obs_noise_std: float = setting(0.0, ge=0)
    """Std of Gaussian noise on every feature the actor observes (m, m/s, rad/s; the yaw's cosine and sine): a noisy
    sensor, drawn anew each step (the envs of a group reset share their first draw). 0: the exact state."""
    privileged_critic: bool = False
    """Observe as two groups: 'actor' (the features with obs_noise_std's noise) and 'critic' (the exact features):
    the privileged state a simulator gives the critic of a robot policy, and not the robot. With pixels, the group
    'critic' joins the pixel groups."""
    obs_mode: str = setting("state", choices=("state", "pixels", "pixels_state"))
    """What the actor observes: 'state' (the 15 features); 'pixels', the group 'image' (a top-down camera, uint8
    [image_size, image_size, 3], drawn as render's frames); 'pixels_state', 'image' and the group 'state' (the
    pusher's and the goal's positions, m, with obs_noise_std's noise: what the robot knows without a camera, its
    own position and its goal, as ManiSkill's rgb observations give the agent's state and the goal beside the
    camera); the cube is seen only on the image."""
    image_size: int = setting(64, ge=16)
    """Height and width of the camera image of the pixel modes, pixels."""

    def check(self) -> None:
        """Every spawn region lies inside the table, and the pusher moves at most ``pusher_radius`` per substep;
        observation noise needs a vector to act on (not ``obs_mode=pixels``)."""
        if self.obs_mode == "pixels" and self.obs_noise_std > 0:
            raise SettingError(
                "obs_noise_std",
                self.obs_noise_std,
                " is not allowed with obs_mode='pixels': the noise acts on observed features, and the image has none; "
                "expected 0, or obs_mode 'state' or 'pixels_state'",
            )
        for name in _SPAWN_REGIONS:
            value = getattr(self, name)
            if value >= self.table_half_extent:
                raise SettingError(
                    name,
                    value,
                    f" is not allowed with table_half_extent={self.table_half_extent}: "
                    "expected a number < table_half_extent (spawn regions lie inside the table)",
                )
        if self.action_scale / self.substeps > self.pusher_radius:
            raise SettingError(
                "action_scale",
                self.action_scale,
                f" is not allowed with substeps={self.substeps}, pusher_radius={self.pusher_radius}: expected "
                f"action_scale / substeps <= pusher_radius (it moves the pusher {self.action_scale / self.substeps:.4g} "
                "m per substep; raise substeps or lower action_scale)",
            )


class PushCubeEnv(TorchVecEnv):
    """Batched planar pushing task; see the module docstring for the model.

    Args:
        settings: fields of :class:`PushCubeConfig` (``self.cfg``), e.g.
            ``num_envs``, ``device``, ``seed``, ``render_mode``.

    Shapes: observations float32 ``[N, 15]``, actions float32 ``[N, 2]``,
    rewards float32 ``[N]``, terminated/truncated/success bool ``[N]``;
    frames of :meth:`render` uint8 ``[K, 256, 256, 3]`` on ``device``.

    Raises:
        ValueError: a setting out of its range (a non-positive size, count,
            duration or scale, a negative weight), a spawn region that does
            not fit on the table, a per-substep pusher travel above
            ``pusher_radius`` (see :class:`PushCubeConfig`), naming it; a CUDA
            device on a machine without one. ``step`` raises on an action of
            the wrong shape or with non-finite entries, ``reset`` on a
            ``group_size`` that does not divide ``num_envs``.
    """

    metadata: dict[str, Any] = {**TorchVecEnv.metadata, "render_modes": ["rgb_array"], "render_fps": 10.0}
    spreads_episode_starts = True
    compiles_step = True
    #: The columns of ``info["rewards"]``: the weighted terms of the module docstring.
    reward_terms = ("reach", "place", "smoothness", "success")
    #: The columns of ``info["metrics"]``: the cube's distance to the goal (m), and 1 where it left the table.
    metric_names = ("distance_to_goal", "cube_off_table")

    def __init__(self, **settings: Any) -> None:
        refuse_renamed(settings)
        self.cfg = cfg = PushCubeConfig(**settings)
        super().__init__(cfg.num_envs, resolve_device(cfg.device))
        self.max_episode_steps = cfg.max_episode_steps
        self.render_mode = cfg.render_mode
        # One frame per control step; control_dt is a setting, so the metadata is the instance's own.
        self.metadata = {**type(self).metadata, "render_modes": ["rgb_array"], "render_fps": 1.0 / cfg.control_dt}
        self._canvases: dict[int, tuple[Any, ...]] = {}  # by frame size: see _render_canvas
        self._half = cfg.cube_size / 2
        # Pusher spawns clear of the cube's circumscribed circle plus 1 cm.
        self._pusher_clearance = self._half * math.sqrt(2.0) + cfg.pusher_radius + 0.01
        self._inertia_per_mass = physics.inertia_per_mass(cfg.cube_size)  # k^2, m^2
        self._dt = cfg.control_dt / cfg.substeps
        # m/s and rad/s lost per substep
        self._lin_decel, self._ang_decel = physics.friction_decelerations(cfg.friction_coef, cfg.cube_size, self._dt)

        box = gym.spaces.Box(-np.inf, np.inf, shape=(OBS_DIM,), dtype=np.float32)
        names = type(self).observation_names
        if cfg.obs_mode != "state":
            groups = {"image": gym.spaces.Box(0, 255, (cfg.image_size, cfg.image_size, 3), np.uint8)}
            self.observation_names = {"image": ("top_down_rgb",)}
            if cfg.obs_mode == "pixels_state":
                groups["state"] = gym.spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
                self.observation_names["state"] = (*names[:2], *names[9:11])
            if cfg.privileged_critic:
                groups["critic"], self.observation_names["critic"] = box, names
            space: gym.Space = gym.spaces.Dict(groups)
        elif cfg.privileged_critic:
            self.observation_names = {"actor": names, "critic": names}
            space = gym.spaces.Dict({"actor": box, "critic": box})
        else:
            space = box
        self._set_spaces(space, gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32))
        self._noise_group = 1  # the group size of the last reset, for the noise of its observation
        n, dev = self.num_envs, self.device
        self._rng = CounterRng(cfg.seed, dev)
        # State, one contiguous float32 [N] row per coordinate (metres, radians, m/s, rad/s): elementwise ops on
        # contiguous vectors are several times faster than on strided columns of an [N, k] tensor. What the
        # physics moves is one [8, N] block (its rows named below), written by one copy_ per step: a foreach copy
        # of eight tensors there was a kernel that inductor's Triton backend could not generate (torch 2.11).
        self._physics_state = torch.zeros(len(_PHYSICS_STATE), n, device=dev, dtype=torch.float32)
        for name, row in zip(_PHYSICS_STATE, self._physics_state):
            setattr(self, name, row)
        self.goal_x = torch.zeros(n, device=dev, dtype=torch.float32)
        self.goal_y = torch.zeros(n, device=dev, dtype=torch.float32)
        self.prev_action = torch.zeros(n, 2, device=dev, dtype=torch.float32)
        self.elapsed_steps = torch.zeros(n, device=dev, dtype=torch.int32)
        if cfg.obs_mode != "state":
            self._render_canvas(cfg.image_size)  # built here, not inside a compiled step
        self._sample_and_set(torch.ones(n, dtype=torch.bool, device=dev), group_size=1)

    @property
    def seed(self) -> int:
        """The seed the env was built with (``cfg.seed``; ``reset(seed=...)`` reseeds without changing it)."""
        return self.cfg.seed

    # ----------------------------------------------------------- state views
    @property
    def pusher_pos(self) -> torch.Tensor:
        """Pusher position, float32 ``[N, 2]``, m (a copy)."""
        return torch.stack((self.pusher_x, self.pusher_y), dim=-1)

    @property
    def cube_pos(self) -> torch.Tensor:
        """Cube centre, float32 ``[N, 2]``, m (a copy)."""
        return torch.stack((self.cube_x, self.cube_y), dim=-1)

    @property
    def goal_pos(self) -> torch.Tensor:
        """Goal position, float32 ``[N, 2]``, m (a copy)."""
        return torch.stack((self.goal_x, self.goal_y), dim=-1)

    _STATE = (*_PHYSICS_STATE, "goal_x", "goal_y", "prev_action", "elapsed_steps")

    # ------------------------------------------------------------------ reset
    def _sample_states(self, n: int) -> tuple[torch.Tensor, ...]:
        """Draw ``n`` initial states as ``(pusher_x, pusher_y, cube_x, cube_y, yaw, goal_x, goal_y)``, each ``[n]``.

        Goal and pusher are rejection-sampled from a fixed number of candidates
        (6 and 4; the first acceptable one is kept), so the generator's stream
        does not depend on the outcome and no host sync is needed. If every
        candidate is rejected the table corner of the spawn region farthest
        from the cube is used, which always satisfies the constraint. At the
        default sizes that happens with probability below 6e-5 for the goal
        (a candidate is within ``min_goal_distance`` of the cube with
        probability at most 0.2) and below 7e-5 for the pusher (at most 0.09).
        """
        cfg = self.cfg
        kg, kp = 6, 4  # goal and pusher candidates; the odds above assume these
        # One draw, laid out as rows so every slice below is contiguous.
        u = self._rng.uniform(3 + 2 * kg + 2 * kp, n) * 2 - 1
        cube_x = u[0] * cfg.cube_spawn_half_extent
        cube_y = u[1] * cfg.cube_spawn_half_extent
        yaw = u[2] * math.pi
        far_x = torch.where(cube_x > 0, -1.0, 1.0)
        far_y = torch.where(cube_y > 0, -1.0, 1.0)

        gx = u[3 : 3 + kg] * cfg.goal_spawn_half_extent
        gy = u[3 + kg : 3 + 2 * kg] * cfg.goal_spawn_half_extent
        ok = torch.hypot(gx - cube_x, gy - cube_y) >= cfg.min_goal_distance
        goal_x, goal_y = self._first_valid(gx, gy, ok, far_x, far_y, cfg.goal_spawn_half_extent)

        off = 3 + 2 * kg
        px = u[off : off + kp] * cfg.pusher_spawn_half_extent
        py = u[off + kp :] * cfg.pusher_spawn_half_extent
        ok = torch.hypot(px - cube_x, py - cube_y) >= self._pusher_clearance
        pusher_x, pusher_y = self._first_valid(px, py, ok, far_x, far_y, cfg.pusher_spawn_half_extent)
        return pusher_x, pusher_y, cube_x, cube_y, yaw, goal_x, goal_y

    @staticmethod
    def _first_valid(cx, cy, ok, far_x, far_y, half):
        """Per column of the ``[k, n]`` candidates, the first with ``ok`` set, else the far corner."""
        x, y = far_x * half, far_y * half
        for j in range(ok.shape[0] - 1, -1, -1):  # a where-cascade: far cheaper than argmax over rows
            x = torch.where(ok[j], cx[j], x)
            y = torch.where(ok[j], cy[j], y)
        return x, y

    def _sample_and_set(self, mask: torch.Tensor, group_size: int) -> None:
        """Give the envs where ``mask`` (bool ``[N]``) is set fresh initial states."""
        self._noise_group = group_size
        fresh = self._sample_states(self.num_envs // group_size)
        if group_size > 1:
            fresh = tuple(t.repeat_interleave(group_size) for t in fresh)
        names = ("pusher_x", "pusher_y", "cube_x", "cube_y", "cube_yaw", "goal_x", "goal_y")
        for name, value in zip(names, fresh):
            state = getattr(self, name)
            state.copy_(torch.where(mask, value, state))
        for name in ("cube_vx", "cube_vy", "cube_omega"):
            getattr(self, name).masked_fill_(mask, 0.0)
        self.prev_action.masked_fill_(mask[:, None], 0.0)
        self.elapsed_steps.masked_fill_(mask, 0)

    # ------------------------------------------------------------------- step
    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        if not isinstance(action, torch.Tensor):
            action = torch.as_tensor(action, dtype=torch.float32, device=self.device)
        if tuple(action.shape) != (self.num_envs, 2):
            raise ValueError(f"action has shape {tuple(action.shape)}: expected ({self.num_envs}, 2) = (num_envs, 2)")
        action = action.to(device=self.device, dtype=torch.float32)
        self._flag_invalid_action(~torch.isfinite(action).all(-1))
        return action.clamp(-1.0, 1.0)

    def _substep(self, pose: tuple, twist0: tuple, pusher: tuple, dx: torch.Tensor, dy: torch.Tensor) -> tuple:
        """One physics substep of ``control_dt / substeps`` s (see :mod:`rlchain.core.envs.push_cube_physics`):
        ``(pose, twist, pusher)`` after it, from the cube's pose ``(x, y, yaw)`` and twist ``(vx, vy, omega)`` and
        the pusher's position ``(x, y)`` before it, each ``[N]``."""
        cfg, dt = self.cfg, self._dt
        twist = physics.apply_friction(*twist0, self._lin_decel, self._ang_decel)
        predicted = physics.predict_pose(pose, twist0, twist, dt)
        px, py = physics.move_pusher(*pusher, dx, dy, cfg.table_half_extent)
        pose = physics.project_contact(
            predicted, px, py, self._half, cfg.pusher_radius, self._inertia_per_mass, cfg.contact_iterations
        )
        return pose, physics.contact_twist(twist, pose, predicted, dt), (px, py)

    def _potentials(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(reach, place, distance_to_goal)`` of the current state, each ``[N]``."""
        cfg = self.cfg
        tgx, tgy = self.goal_x - self.cube_x, self.goal_y - self.cube_y
        distance = torch.hypot(tgx, tgy)
        back = (self._half + cfg.pusher_radius) / distance.clamp_min(1e-6)
        reach_dist = torch.hypot(self.pusher_x - (self.cube_x - tgx * back), self.pusher_y - (self.cube_y - tgy * back))
        reach = 1.0 - torch.tanh(reach_dist / cfg.reach_scale)
        place = torch.exp(distance.square() * (-0.5 / cfg.place_sigma**2))
        return reach, place, distance

    #: The features of :meth:`_observe`, in order (m, m/s, rad/s; the yaw as its cosine and sine).
    observation_names = (
        "pusher_x",
        "pusher_y",
        "cube_x",
        "cube_y",
        "cube_yaw_cos",
        "cube_yaw_sin",
        "cube_vx",
        "cube_vy",
        "cube_omega",
        "goal_x",
        "goal_y",
        "cube_minus_pusher_x",
        "cube_minus_pusher_y",
        "goal_minus_cube_x",
        "goal_minus_cube_y",
    )

    def _observe(self) -> Any:
        """The observation (see :attr:`PushCubeConfig.obs_mode`): the features, noisy with ``obs_noise_std``; with
        ``privileged_critic`` a TensorDict of the groups ``actor`` (noisy) and ``critic`` (exact); with pixels a
        TensorDict of ``image`` (and ``state``, noisy; and ``critic``, exact)."""
        from tensordict import TensorDict  # imported where used: see rlchain.commands.config

        cfg = self.cfg
        exact = self._features()
        if cfg.obs_mode != "state":
            groups = {"image": self._draw(slice(None), cfg.image_size)}
            if cfg.obs_mode == "pixels_state":
                groups["state"] = self._noisy(exact[:, _PIXELS_STATE])
            if cfg.privileged_critic:
                groups["critic"] = exact
            return TensorDict(groups, batch_size=[self.num_envs])
        actor = self._noisy(exact)
        if not cfg.privileged_critic:
            return actor
        return TensorDict({"actor": actor, "critic": exact}, batch_size=[self.num_envs])

    def _noisy(self, features: torch.Tensor) -> torch.Tensor:
        """``features`` ``[N, k]`` with ``obs_noise_std``'s Gaussian noise (one draw per block of the last reset's
        group size)."""
        if self.cfg.obs_noise_std <= 0:
            return features
        g, self._noise_group = self._noise_group, 1
        n, k = features.shape
        noise = self._rng.normal(n // g, k, env_axis=0).repeat_interleave(g, 0)
        return features + self.cfg.obs_noise_std * noise

    def _features(self) -> torch.Tensor:
        """The exact state as the features of :attr:`observation_names`, ``[N, 15]``."""
        return torch.stack(
            (
                self.pusher_x,
                self.pusher_y,
                self.cube_x,
                self.cube_y,
                torch.cos(self.cube_yaw),
                torch.sin(self.cube_yaw),
                self.cube_vx,
                self.cube_vy,
                self.cube_omega,
                self.goal_x,
                self.goal_y,
                self.cube_x - self.pusher_x,
                self.cube_y - self.pusher_y,
                self.goal_x - self.cube_x,
                self.goal_y - self.cube_y,
            ),
            dim=-1,
        )

    @torch.no_grad()
    def step(self, action: torch.Tensor):
        """Advance every env by one control step of ``control_dt`` seconds.

        Args:
            action: float ``[N, 2]`` commanded pusher displacement in units of
                ``action_scale`` metres; clipped to ``[-1, 1]``.

        Returns:
            ``(obs [N,15], reward [N], terminated [N], truncated [N], info)``
            as described in :class:`rlchain.core.envs.base.VecEnv`; ``info["rewards"]`` is float32 ``[N, 4]``,
            the weighted terms of ``reward_terms`` (see the module docstring), and ``info["metrics"]`` float32
            ``[N, 2]``: ``distance_to_goal`` (m) and ``cube_off_table`` (0/1), as ``metric_names`` names them.

        Raises:
            ValueError: wrong shape or non-finite entries.
        """
        cfg = self.cfg
        action = self._check_action(action)
        scale = cfg.action_scale / cfg.substeps
        dx, dy = action[:, 0] * scale, action[:, 1] * scale
        # The potentials of the state the step starts from, computed here rather than kept from the last step: the
        # same code computes them in every step, so a resumed run (compiled or eager) pays what the run it resumes
        # would have paid, to the bit.
        reach_before, place_before, _ = self._potentials()
        pose = (self.cube_x, self.cube_y, self.cube_yaw)
        twist = (self.cube_vx, self.cube_vy, self.cube_omega)
        pusher = (self.pusher_x, self.pusher_y)
        for _ in range(cfg.substeps):
            pose, twist, pusher = self._substep(pose, twist, pusher, dx, dy)
        # Written in place, in the order of _PHYSICS_STATE: the block keeps its address (a CUDA graph reads it).
        self._physics_state.copy_(torch.stack((*pusher, *pose, *twist)))
        self.elapsed_steps.add_(1)

        reach, place, distance = self._potentials()
        success = distance < cfg.success_threshold
        lim = cfg.table_half_extent
        off_table = (self.cube_x.abs() > lim) | (self.cube_y.abs() > lim)
        terms = (  # in the order of reward_terms
            cfg.reach_weight * cfg.shaping_scale * (reach - reach_before),
            cfg.place_weight * cfg.shaping_scale * (place - place_before),
            -cfg.smoothness_weight * (action - self.prev_action).square().sum(dim=-1),
            cfg.success_weight * success.float(),
        )
        reward = terms[0] + terms[1] + terms[2] + terms[3]

        terminated = success | off_table
        truncated = (self.elapsed_steps >= cfg.max_episode_steps) & ~terminated
        done = terminated | truncated
        final_obs = self._observe()
        self.prev_action.copy_(action)
        self._sample_and_set(done, group_size=1)
        info = {
            "final_obs": final_obs,
            "rewards": torch.stack(terms, dim=-1),
            "metrics": torch.stack((distance, off_table.float()), dim=-1),
            "success": success,
        }
        return self._observe(), reward, terminated, truncated, info

    # ---------------------------------------------------------------- render
    def _render_canvas(self, size: int) -> tuple[Any, ...]:
        """``(xs [W], ys [H], table [H, W], table_in_region [H, W], colours [9, 3], pixel)`` of ``size x size``
        frames, built on first use.

        ``xs``/``ys`` are the pixel centres, m; the two label maps are the background without and with the success
        region's tint; ``pixel`` is a pixel's width, m. The border is ``RENDER_MARGIN`` pixels of a
        ``RENDER_SIZE`` frame, scaled to ``size``.
        """
        if size not in self._canvases:
            dev, margin = self.device, RENDER_MARGIN * size / RENDER_SIZE
            view = self.cfg.table_half_extent * size / (size - 2 * margin)  # half the width shown, m
            xs, ys = rendering.pixel_centres(size, size, (-view, view), (-view, view), dev)
            on_table = (xs.abs() <= self.cfg.table_half_extent)[None, :] & (ys.abs() <= self.cfg.table_half_extent)[
                :, None
            ]
            table = torch.where(on_table, _TABLE, _OUTSIDE).to(torch.uint8)
            colours = rendering.palette(_COLOURS, dev)
            self._canvases[size] = (xs, ys, table, table + (_TABLE_IN_REGION - _TABLE), colours, 2 * view / size)
        return self._canvases[size]

    def render(self, env_ids: Sequence[int] | None = None) -> torch.Tensor:
        """Top-down frames of the envs ``env_ids`` (every env when None) in their current state.

        What is drawn is in the module docstring: table, success region and
        goal, the cube with its +x face marked, the pusher. The table
        ``[-table_half_extent, table_half_extent]^2`` fills the frame but for
        a border of ``RENDER_MARGIN`` pixels; x runs to the right, y up.
        Vectorised torch ops on ``device`` (no host sync), a few elementwise
        ops over ``K * 256 * 256`` pixels.

        Args:
            env_ids: env indices in ``[0, num_envs)``, ``K`` of them; None: every env.

        Returns:
            uint8 RGB ``[K, RENDER_SIZE, RENDER_SIZE, 3]`` on ``device``.

        Raises:
            RuntimeError: the env was built with ``render_mode=None``.
            IndexError: an env id outside ``[0, num_envs)``.
        """
        return self._draw(self._render_rows(env_ids), RENDER_SIZE)

    def _draw(self, rows: slice | torch.Tensor, size: int) -> torch.Tensor:
        """uint8 RGB frames ``[K, size, size, 3]`` of the envs ``rows`` (the pixel modes' camera and :meth:`render`)."""
        xs, ys, table, tinted, colours, pixel = self._render_canvas(size)
        cfg = self.cfg
        goal_d2 = rendering.squared_distance(xs, ys, self.goal_x[rows], self.goal_y[rows])
        region = goal_d2 <= cfg.success_threshold**2
        labels = torch.where(region, tinted, table)
        labels.masked_fill_(region & (goal_d2 >= max(cfg.success_threshold - _RING_PX * pixel, 0.0) ** 2), _RING)
        u, v = rendering.box_frame(xs, ys, self.cube_x[rows], self.cube_y[rows], self.cube_yaw[rows])
        cube = (u.abs() <= self._half) & (v.abs() <= self._half)
        labels.masked_fill_(cube, _CUBE)
        labels.masked_fill_(cube & (u >= self._half * (1 - 2 * _FACE_FRACTION)), _CUBE_FACE)
        labels.masked_fill_(goal_d2 <= (_GOAL_PX * pixel) ** 2, _GOAL)
        # At least one pixel's radius, so that the pusher shows in a small camera image.
        radius = max(cfg.pusher_radius, 0.75 * pixel)
        labels.masked_fill_(rendering.disc(xs, ys, self.pusher_x[rows], self.pusher_y[rows], radius), _PUSHER)
        return rendering.colour(labels, colours)

    def close(self, **kwargs: Any) -> None:
        """Release nothing: the env holds only tensors."""


class PushCubeGymEnv(SingleGymEnv):
    """A single PushCube as a plain numpy gymnasium env (``gymnasium.make("rlchain/PushCube-v0")``).

    A one-env :class:`PushCubeEnv` on the CPU behind :class:`~rlchain.core.envs.base.SingleGymEnv`.
    Observations float32 ``(15,)``, actions float32 ``(2,)``. Keyword
    arguments are those of :class:`PushCubeConfig` except ``num_envs``, ``render_mode`` included
    (``gymnasium.make(..., render_mode="rgb_array")``: ``render()`` returns
    a uint8 ``(256, 256, 3)`` frame).

    Like gymnasium's own envs it never truncates by itself: the time limit is
    gymnasium's ``TimeLimit`` wrapper, which ``gymnasium.make`` adds from the
    registered spec (100 steps, ``max_episode_steps``' default, or
    ``make(..., max_episode_steps=...)``), so that one limit holds. Given
    ``max_episode_steps`` directly, the wrapped env truncates there too.

    Raises:
        ValueError: as :class:`PushCubeEnv` (on the CPU, so at once).
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": PushCubeEnv.metadata["render_fps"]}

    def __init__(self, max_episode_steps: int | None = None, **kwargs: Any) -> None:
        kwargs.pop("num_envs", None)
        kwargs.setdefault("device", "cpu")
        # No limit of its own: 2**31 - 1 steps is beyond any episode and fits the int32 step counter.
        limit = 2**31 - 1 if max_episode_steps is None else max_episode_steps
        super().__init__(PushCubeEnv(num_envs=1, max_episode_steps=limit, **kwargs))
