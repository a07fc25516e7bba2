"""PushCube: a batched, torch-native planar pushing task.

A kinematic disc (the robot's end-effector, radius ``pusher_radius``) pushes a
cube (square footprint of side ``cube_size``) across a table of half-extent
``table_half_extent`` towards a goal. Semantics follow EmbodiChain's
PushCubeRL: 0.1 m cube, randomised goal, success when the cube's xy distance
to the goal is below ``success_threshold``. All state is torch tensors of
leading dimension ``num_envs`` on ``device``; nothing leaves the device.

Physics (one control step = ``substeps`` substeps of ``control_dt / substeps``
seconds). The cube is a rigid body in SE(2), pose ``(x, y, yaw)`` and twist
``(vx, vy, omega)``, uniform density, so its rotational inertia per unit mass
is ``cube_size**2 / 6``. Each substep:

1. *Table friction* (Coulomb, coefficient ``friction_coef``): the linear speed
   drops by ``mu * g * dt`` and the angular speed by ``mu * g * c / k**2 * dt``
   (``c = 0.3826 * cube_size``, the mean distance of a square's points from
   its centre; ``k**2`` the inertia per unit mass), each clamped at zero so
   friction stops motion and never reverses it. Linear and angular friction
   are treated independently, the usual simplification of the coupled
   Coulomb law for a sliding and spinning plate.
2. *Prediction*: the pose advances with the mean of the twist before and
   after friction (exact for constant deceleration); the pusher moves by
   its share of the commanded displacement and is held on the table.
3. *Contact* (position-based dynamics, Mueller et al. 2007): the signed
   distance between the pusher disc and the cube's square is computed in the
   cube frame; a penetration of depth ``d`` along contact normal ``n`` at
   contact point ``r`` (relative to the cube centre) is removed by moving the
   cube alone (the pusher is kinematic, i.e. of infinite mass) by
   ``dx = -n d / w`` and ``dyaw = -(r x n) d / (k**2 w)`` with the
   generalised inverse mass ``w = 1 + (r x n)**2 / k**2`` (per unit mass).
   A push through a face centre has ``r x n = 0`` and translates the cube
   without turning it; an off-centre push turns it in the sense of the torque
   ``r x F``. The projection runs ``contact_iterations`` times.
4. *Velocity update*: the contact correction divided by ``dt`` is added to
   the twist, so a pushed cube carries the pusher's velocity and slides to
   rest by friction once released.

With a kinematic pusher and Coulomb friction the motion does not depend on the
cube's mass, only on the ratio of its inertia to its mass, so no mass field is
exposed. The pusher may move at most ``pusher_radius`` per substep
(``action_scale / substeps <= pusher_radius``), which keeps its centre outside
the cube and the contact normal well defined.

Episode end. ``terminated`` on success (cube within ``success_threshold`` of
the goal) or failure (cube centre beyond the table edge); ``truncated`` after
``episode_length`` control steps. Finished envs reset within the same step
(see :mod:`rlchain.envs.base`).

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

Reward (EmbodiChain's terms and weights), each weighted term reported in
``info["rewards"]``. The two shaping terms are potential-based (Ng, Harada &
Russell 1999): with EmbodiChain's term as the potential ``Phi`` they pay
``weight * shaping_scale * (Phi(s_{t+1}) - Phi(s_t))``, i.e. progress, so
hovering pays nothing and the success bonus is the only way to gain once the
cube is close. (Paid as a level every step, a positive shaping term would make
hovering just outside the success radius worth more than the success bonus that
ends the episode.) ``shaping_scale`` converts EmbodiChain's per-step weights
into potential weights: a level reward ``w * Phi`` held for ``H`` steps is worth
``w * H * Phi``; the default ``H = 30`` steps.

* ``reach``: potential ``1 - tanh(|pusher - p_behind| / reach_scale)``,
  ``p_behind`` the point behind the cube on the goal line at distance
  ``cube_size / 2 + pusher_radius`` from the cube centre; weight ``reach_weight``;
* ``place``: potential ``exp(-|cube - goal|**2 / (2 place_sigma**2))``; weight
  ``place_weight``;
* ``smoothness``: ``-smoothness_weight * |a_t - a_{t-1}|**2`` (clipped actions);
* ``success``: ``success_weight`` on the step the goal is reached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlchain.envs.base import SingleGymEnv, TorchVecEnv
from rlchain.utils import check_non_negative, check_positive, resolve_device

__all__ = ["PushCubeConfig", "PushCubeEnv", "PushCubeGymEnv"]

GRAVITY = 9.81  # m/s^2
# Mean distance from the centre of a unit square's points: (sqrt(2) + asinh(1)) / 6.
_SQUARE_MEAN_RADIUS = (math.sqrt(2.0) + math.asinh(1.0)) / 6.0
OBS_DIM = 15


@dataclass
class PushCubeConfig:
    """Every setting of :class:`PushCubeEnv` with its default (SI units).

    This dataclass is the single home of the defaults: the env's constructor
    reads them from here and the Hydra schema is this dataclass.
    """

    _target_: str = "rlchain.envs.push_cube.PushCubeEnv"
    num_envs: int = 512
    """Parallel envs simulated as one batch."""
    device: str = "cpu"
    """Torch device of the simulation: 'cpu', 'cuda', 'cuda:N' or 'auto'."""
    seed: int = 0
    """Seed of the env's own torch.Generator."""
    table_half_extent: float = 0.6
    """The table is [-h, h]^2 metres; a cube centre beyond it has fallen off."""
    cube_size: float = 0.1
    """Side of the cube's square footprint, m."""
    pusher_radius: float = 0.02
    """Radius of the pusher disc, m."""
    cube_spawn_half_extent: float = 0.2
    """Cubes spawn uniformly in [-h, h]^2 m with uniform random yaw."""
    goal_spawn_half_extent: float = 0.3
    """Goals spawn uniformly in [-h, h]^2 m ..."""
    min_goal_distance: float = 0.15
    """... at least this far from the cube, m."""
    pusher_spawn_half_extent: float = 0.3
    """The pusher spawns uniformly in [-h, h]^2 m, clear of the cube."""
    success_threshold: float = 0.1
    """Success when the cube centre is this close to the goal, m."""
    episode_length: int = 100
    """Time limit in control steps."""
    action_scale: float = 0.05
    """Commanded pusher displacement per control step for an action of 1, m."""
    control_dt: float = 0.1
    """Duration of one control step, s."""
    substeps: int = 4
    """Physics substeps per control step."""
    contact_iterations: int = 1
    """Contact projections per substep (1 keeps penetration below 1 mm at the defaults)."""
    friction_coef: float = 0.5
    """Coulomb friction coefficient between cube and table."""
    reach_weight: float = 0.03
    """Weight of the reach-behind-the-cube term."""
    reach_scale: float = 0.1
    """Distance scale of the reach term's tanh, m."""
    place_weight: float = 0.8
    """Weight of the cube-to-goal exp shaping term."""
    shaping_scale: float = 30.0
    """Multiplies both potential-based terms: a horizon in steps (see the module docstring)."""
    place_sigma: float = 0.12
    """Width of the cube-to-goal Gaussian shaping, m."""
    smoothness_weight: float = 0.0
    """Weight of the action-change penalty; off by default. EmbodiChain's 0.01 also penalises exploration noise,
    which traps critic-free GRPO in a policy that barely moves on some seeds (benchmarks/README.md)."""
    success_weight: float = 10.0
    """Bonus on the step the goal is reached."""


_D = PushCubeConfig()


def square_contact(
    lx: torch.Tensor, ly: torch.Tensor, half: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Closest-feature query between points and an axis-aligned square.

    Args:
        lx, ly: point coordinates in the square's frame (float, any equal shapes), m.
        half: half side of the square, centred at the origin, m.

    Returns:
        ``(signed_distance, nx, ny, r_cross_n)`` shaped like ``lx``: the signed
        distance from the point to the square's boundary (negative inside, m),
        the unit outward normal at the closest boundary point ``q`` (square
        frame) and the 2-D cross product ``q x n`` (m), the lever arm of a
        force along ``n`` applied at ``q``.
    """
    a, b = lx.abs(), ly.abs()  # work in the first quadrant, restore signs after
    ex, ey = (a - half).clamp_min(0), (b - half).clamp_min(0)
    dist = torch.hypot(ex, ey)
    inside = dist <= 0
    face_x = a > b  # inside: the nearest face is the one of the larger coordinate
    inv = 1.0 / dist.clamp_min(1e-12)
    nxa = torch.where(inside, face_x.float(), ex * inv)
    nya = torch.where(inside, (~face_x).float(), ey * inv)
    qxa = torch.where(inside & face_x, half, a.clamp_max(half))
    qya = torch.where(inside & ~face_x, half, b.clamp_max(half))
    signed = torch.where(inside, torch.maximum(a, b) - half, dist)
    r_cross_n = (qxa * nya - qya * nxa) * torch.sign(lx * ly)  # reflect back out of quadrant I
    return signed, torch.copysign(nxa, lx), torch.copysign(nya, ly), r_cross_n


class PushCubeEnv(TorchVecEnv):
    """Batched planar pushing task; see the module docstring for the model.

    Args:
        num_envs: parallel envs ``N`` (> 0).
        device: ``'cpu'``, ``'cuda'``, ``'cuda:N'`` or ``'auto'``.
        seed: seed of the env's own ``torch.Generator``; the same seed gives
            bit-identical trajectories for the same actions.
        Other arguments: see :class:`PushCubeConfig` (SI units).

    Shapes: observations float32 ``[N, 15]``, actions float32 ``[N, 2]``,
    rewards float32 ``[N]``, terminated/truncated/success bool ``[N]``.

    Raises:
        ValueError: a non-positive size, count, duration or weight scale; a
            spawn region that does not fit on the table; a per-substep pusher
            travel above ``pusher_radius``; a CUDA device on a machine without
            one. ``step`` raises on an action of the wrong shape or with
            non-finite entries, ``reset`` on a ``group_size`` that does not
            divide ``num_envs``.
    """

    def __init__(
        self,
        num_envs: int = _D.num_envs,
        device: str | torch.device = _D.device,
        seed: int = _D.seed,
        table_half_extent: float = _D.table_half_extent,
        cube_size: float = _D.cube_size,
        pusher_radius: float = _D.pusher_radius,
        cube_spawn_half_extent: float = _D.cube_spawn_half_extent,
        goal_spawn_half_extent: float = _D.goal_spawn_half_extent,
        min_goal_distance: float = _D.min_goal_distance,
        pusher_spawn_half_extent: float = _D.pusher_spawn_half_extent,
        success_threshold: float = _D.success_threshold,
        episode_length: int = _D.episode_length,
        action_scale: float = _D.action_scale,
        control_dt: float = _D.control_dt,
        substeps: int = _D.substeps,
        contact_iterations: int = _D.contact_iterations,
        friction_coef: float = _D.friction_coef,
        reach_weight: float = _D.reach_weight,
        reach_scale: float = _D.reach_scale,
        place_weight: float = _D.place_weight,
        shaping_scale: float = _D.shaping_scale,
        place_sigma: float = _D.place_sigma,
        smoothness_weight: float = _D.smoothness_weight,
        success_weight: float = _D.success_weight,
    ) -> None:
        for name, value in [
            ("table_half_extent", table_half_extent),
            ("cube_size", cube_size),
            ("pusher_radius", pusher_radius),
            ("cube_spawn_half_extent", cube_spawn_half_extent),
            ("goal_spawn_half_extent", goal_spawn_half_extent),
            ("pusher_spawn_half_extent", pusher_spawn_half_extent),
            ("success_threshold", success_threshold),
            ("action_scale", action_scale),
            ("control_dt", control_dt),
            ("reach_scale", reach_scale),
            ("place_sigma", place_sigma),
        ]:
            check_positive(name, value)
        for name, value in [("episode_length", episode_length), ("substeps", substeps), ("contact_iterations", contact_iterations)]:
            check_positive(name, value, integer=True)
        for name, value in [
            ("min_goal_distance", min_goal_distance),
            ("friction_coef", friction_coef),
            ("reach_weight", reach_weight),
            ("place_weight", place_weight),
            ("smoothness_weight", smoothness_weight),
            ("success_weight", success_weight),
            ("shaping_scale", shaping_scale),
        ]:
            check_non_negative(name, value)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed={seed!r} is not allowed: expected an integer")
        for name, value in [
            ("cube_spawn_half_extent", cube_spawn_half_extent),
            ("goal_spawn_half_extent", goal_spawn_half_extent),
            ("pusher_spawn_half_extent", pusher_spawn_half_extent),
        ]:
            if value >= table_half_extent:
                raise ValueError(
                    f"{name}={value} is not allowed: spawn regions must lie inside the table "
                    f"(< table_half_extent={table_half_extent})"
                )
        if action_scale / substeps > pusher_radius:
            raise ValueError(
                f"action_scale={action_scale} with substeps={substeps} moves the pusher "
                f"{action_scale / substeps:.4g} m per substep: expected at most pusher_radius={pusher_radius} m "
                "(raise substeps or lower action_scale)"
            )
        super().__init__(num_envs, resolve_device(device))
        self.seed = seed
        self.table_half_extent = float(table_half_extent)
        self.cube_size = float(cube_size)
        self.pusher_radius = float(pusher_radius)
        self.cube_spawn_half_extent = float(cube_spawn_half_extent)
        self.goal_spawn_half_extent = float(goal_spawn_half_extent)
        self.min_goal_distance = float(min_goal_distance)
        self.pusher_spawn_half_extent = float(pusher_spawn_half_extent)
        self.success_threshold = float(success_threshold)
        self.max_episode_steps = self.episode_length = int(episode_length)
        self.action_scale = float(action_scale)
        self.control_dt = float(control_dt)
        self.substeps = int(substeps)
        self.contact_iterations = int(contact_iterations)
        self.friction_coef = float(friction_coef)
        self.reward_weights = {
            "reach": float(reach_weight),
            "place": float(place_weight),
            "smoothness": float(smoothness_weight),
            "success": float(success_weight),
        }
        self.shaping_scale = float(shaping_scale)
        self.reach_scale = float(reach_scale)
        self.place_sigma = float(place_sigma)

        self._half = self.cube_size / 2
        # Pusher spawns clear of the cube's circumscribed circle plus 1 cm.
        self._pusher_clearance = self._half * math.sqrt(2.0) + self.pusher_radius + 0.01
        self._inertia_per_mass = self.cube_size**2 / 6.0  # k^2, m^2
        self._dt = self.control_dt / self.substeps
        self._lin_decel = self.friction_coef * GRAVITY * self._dt  # m/s lost per substep
        self._ang_decel = (
            self.friction_coef * GRAVITY * _SQUARE_MEAN_RADIUS * self.cube_size / self._inertia_per_mass * self._dt
        )  # rad/s lost per substep

        self._set_spaces(
            gym.spaces.Box(-np.inf, np.inf, shape=(OBS_DIM,), dtype=np.float32),
            gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
        )
        n, dev = self.num_envs, self.device
        self._generator = torch.Generator(device=dev)
        self._generator.manual_seed(int(seed))
        # State, one contiguous float32 [N] tensor per coordinate (metres,
        # radians, m/s, rad/s): elementwise ops on contiguous vectors are
        # several times faster than on strided columns of an [N, k] tensor.
        zeros = lambda: torch.zeros(n, device=dev, dtype=torch.float32)  # noqa: E731
        self.pusher_x, self.pusher_y = zeros(), zeros()
        self.cube_x, self.cube_y, self.cube_yaw = zeros(), zeros(), zeros()
        self.cube_vx, self.cube_vy, self.cube_omega = zeros(), zeros(), zeros()
        self.goal_x, self.goal_y = zeros(), zeros()
        self.prev_action = torch.zeros(n, 2, device=dev, dtype=torch.float32)
        self.elapsed_steps = torch.zeros(n, device=dev, dtype=torch.int32)
        self._sample_and_set(torch.ones(n, dtype=torch.bool, device=dev), group_size=1)
        self._reach_potential, self._place_potential, _ = self._potentials()

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

    def _after_set_state(self) -> None:
        self._reach_potential, self._place_potential, _ = self._potentials()

    _STATE = (
        "pusher_x", "pusher_y", "cube_x", "cube_y", "cube_yaw", "cube_vx", "cube_vy",
        "cube_omega", "goal_x", "goal_y", "prev_action", "elapsed_steps",
    )  # fmt: skip

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
        kg, kp = 6, 4  # goal and pusher candidates; the odds above assume these
        # One draw, laid out as rows so every slice below is contiguous.
        u = torch.rand(3 + 2 * kg + 2 * kp, n, generator=self._generator, device=self.device) * 2 - 1
        cube_x = u[0] * self.cube_spawn_half_extent
        cube_y = u[1] * self.cube_spawn_half_extent
        yaw = u[2] * math.pi
        far_x = torch.where(cube_x > 0, -1.0, 1.0)
        far_y = torch.where(cube_y > 0, -1.0, 1.0)

        gx = u[3 : 3 + kg] * self.goal_spawn_half_extent
        gy = u[3 + kg : 3 + 2 * kg] * self.goal_spawn_half_extent
        ok = torch.hypot(gx - cube_x, gy - cube_y) >= self.min_goal_distance
        goal_x, goal_y = self._first_valid(gx, gy, ok, far_x, far_y, self.goal_spawn_half_extent)

        off = 3 + 2 * kg
        px = u[off : off + kp] * self.pusher_spawn_half_extent
        py = u[off + kp :] * self.pusher_spawn_half_extent
        ok = torch.hypot(px - cube_x, py - cube_y) >= self._pusher_clearance
        pusher_x, pusher_y = self._first_valid(px, py, ok, far_x, far_y, self.pusher_spawn_half_extent)
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
        fresh = self._sample_states(self.num_envs // group_size)
        if group_size > 1:
            fresh = tuple(t.repeat_interleave(group_size) for t in fresh)
        names = ("pusher_x", "pusher_y", "cube_x", "cube_y", "cube_yaw", "goal_x", "goal_y")
        for name, value in zip(names, fresh):
            setattr(self, name, torch.where(mask, value, getattr(self, name)))
        for name in ("cube_vx", "cube_vy", "cube_omega"):
            setattr(self, name, getattr(self, name).masked_fill(mask, 0.0))
        self.prev_action = self.prev_action.masked_fill(mask[:, None], 0.0)
        self.elapsed_steps = self.elapsed_steps.masked_fill(mask, 0)

    # ------------------------------------------------------------------- step
    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        if not isinstance(action, torch.Tensor):
            action = torch.as_tensor(action, dtype=torch.float32, device=self.device)
        if tuple(action.shape) != (self.num_envs, 2):
            raise ValueError(f"action has shape {tuple(action.shape)}: expected ({self.num_envs}, 2) = (num_envs, 2)")
        action = action.to(device=self.device, dtype=torch.float32)
        self._check_finite(action)
        return action.clamp(-1.0, 1.0)

    def _substep(self, dx: torch.Tensor, dy: torch.Tensor) -> None:
        """One physics substep of ``control_dt / substeps`` s; see the module docstring."""
        dt = self._dt
        # 1. Coulomb friction against the table, never reversing the motion.
        speed = torch.hypot(self.cube_vx, self.cube_vy)
        keep = (speed - self._lin_decel).clamp_min(0) / speed.clamp_min(1e-9)
        vx, vy = self.cube_vx * keep, self.cube_vy * keep
        omega = torch.copysign((self.cube_omega.abs() - self._ang_decel).clamp_min(0), self.cube_omega)
        # 2. Prediction with the mean twist over the substep (trapezoidal), so a
        #    cube sliding under constant friction travels exactly v^2 / (2 mu g).
        x0, y0, yaw0 = self.cube_x, self.cube_y, self.cube_yaw
        h = 0.5 * dt
        cx0, cy0 = x0 + (vx + self.cube_vx) * h, y0 + (vy + self.cube_vy) * h
        yaw_pred = yaw0 + (omega + self.cube_omega) * h
        cx, cy, yaw = cx0, cy0, yaw_pred
        lim = self.table_half_extent
        px = (self.pusher_x + dx).clamp(-lim, lim)
        py = (self.pusher_y + dy).clamp(-lim, lim)
        # 3. Contact projection against the kinematic pusher (PBD).
        k2 = self._inertia_per_mass
        for _ in range(self.contact_iterations):
            c, s = torch.cos(yaw), torch.sin(yaw)
            rx, ry = px - cx, py - cy
            signed, nx, ny, r_cross_n = square_contact(c * rx + s * ry, c * ry - s * rx, self._half)
            depth = (self.pusher_radius - signed).clamp_min(0)
            corr = depth / (1.0 + r_cross_n * r_cross_n / k2)
            cx = cx - (c * nx - s * ny) * corr
            cy = cy - (s * nx + c * ny) * corr
            yaw = yaw - r_cross_n * corr / k2
        # 4. The contact correction changes the twist by correction / dt
        #    (a free cube keeps its post-friction twist exactly).
        inv_dt = 1.0 / dt
        self.cube_vx = vx + (cx - cx0) * inv_dt
        self.cube_vy = vy + (cy - cy0) * inv_dt
        self.cube_omega = omega + (yaw - yaw_pred) * inv_dt
        self.cube_x, self.cube_y, self.cube_yaw = cx, cy, yaw
        self.pusher_x, self.pusher_y = px, py

    def _potentials(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(reach, place, distance_to_goal)`` of the current state, each ``[N]``."""
        tgx, tgy = self.goal_x - self.cube_x, self.goal_y - self.cube_y
        distance = torch.hypot(tgx, tgy)
        back = (self._half + self.pusher_radius) / distance.clamp_min(1e-6)
        reach_dist = torch.hypot(self.pusher_x - (self.cube_x - tgx * back), self.pusher_y - (self.cube_y - tgy * back))
        reach = 1.0 - torch.tanh(reach_dist / self.reach_scale)
        place = torch.exp(distance.square() * (-0.5 / self.place_sigma**2))
        return reach, place, distance

    def _observe(self) -> torch.Tensor:
        return torch.stack(
            (
                self.pusher_x, self.pusher_y, self.cube_x, self.cube_y,
                torch.cos(self.cube_yaw), torch.sin(self.cube_yaw),
                self.cube_vx, self.cube_vy, self.cube_omega, self.goal_x, self.goal_y,
                self.cube_x - self.pusher_x, self.cube_y - self.pusher_y,
                self.goal_x - self.cube_x, self.goal_y - self.cube_y,
            ),
            dim=-1,
        )  # fmt: skip

    @torch.no_grad()
    def step(self, action: torch.Tensor):
        """Advance every env by one control step of ``control_dt`` seconds.

        Args:
            action: float ``[N, 2]`` commanded pusher displacement in units of
                ``action_scale`` metres; clipped to ``[-1, 1]``.

        Returns:
            ``(obs [N,15], reward [N], terminated [N], truncated [N], info)``
            as described in :class:`rlchain.envs.base.VecEnv`; ``info["metrics"]``
            holds ``distance_to_goal`` (m) and ``cube_off_table`` (0/1).

        Raises:
            ValueError: wrong shape or non-finite entries.
        """
        action = self._check_action(action)
        scale = self.action_scale / self.substeps
        dx, dy = action[:, 0] * scale, action[:, 1] * scale
        for _ in range(self.substeps):
            self._substep(dx, dy)
        self.elapsed_steps = self.elapsed_steps + 1

        reach, place, distance = self._potentials()
        success = distance < self.success_threshold
        lim = self.table_half_extent
        off_table = (self.cube_x.abs() > lim) | (self.cube_y.abs() > lim)
        w = self.reward_weights
        rewards = {
            "reach": w["reach"] * self.shaping_scale * (reach - self._reach_potential),
            "place": w["place"] * self.shaping_scale * (place - self._place_potential),
            "smoothness": -w["smoothness"] * (action - self.prev_action).square().sum(dim=-1),
            "success": w["success"] * success.float(),
        }
        reward = rewards["reach"] + rewards["place"] + rewards["smoothness"] + rewards["success"]

        terminated = success | off_table
        truncated = (self.elapsed_steps >= self.episode_length) & ~terminated
        done = terminated | truncated
        final_obs = self._observe()
        self.prev_action = action
        self._sample_and_set(done, group_size=1)
        self._reach_potential, self._place_potential, _ = self._potentials()
        info = {
            "final_obs": final_obs,
            "rewards": rewards,
            "metrics": {"distance_to_goal": distance, "cube_off_table": off_table.float()},
            "success": success,
        }
        return self._observe(), reward, terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        """Release nothing: the env holds only tensors."""


class PushCubeGymEnv(SingleGymEnv):
    """A single PushCube as a plain numpy gymnasium env (``gymnasium.make("rlchain/PushCube-v0")``).

    A one-env :class:`PushCubeEnv` on the CPU behind :class:`~rlchain.envs.base.SingleGymEnv`.
    Observations float32 ``(15,)``, actions float32 ``(2,)``. Keyword
    arguments are those of :class:`PushCubeConfig`.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("num_envs", None)
        kwargs.setdefault("device", "cpu")
        super().__init__(PushCubeEnv(num_envs=1, **kwargs))


def scripted_action(obs: torch.Tensor, env: PushCubeEnv) -> torch.Tensor:
    """A hand-written pushing controller, a baseline and a solvability check.

    Goes around the cube to a staging point behind it on the cube->goal line,
    then pushes through the cube's centre towards the goal, re-aiming every
    step. Reads only the observation (layout in the module docstring).

    Args:
        obs: float32 ``[N, 15]`` observations of ``env``.
        env: the env, for its geometry and ``action_scale``.

    Returns:
        float32 ``[N, 2]`` actions in ``[-1, 1]``.
    """
    pusher, cube, goal = obs[:, 0:2], obs[:, 2:4], obs[:, 9:11]
    to_goal = goal - cube
    u = to_goal / to_goal.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    perp = torch.stack((-u[:, 1], u[:, 0]), dim=-1)
    rel = pusher - cube
    along, lateral = (rel * u).sum(-1), (rel * perp).sum(-1)
    circum = env.cube_size / 2 * math.sqrt(2.0) + env.pusher_radius
    staging = cube - u * (circum + 0.01)

    # Pushing: behind the cube and close to the goal line.
    pushing = (along < -env.cube_size / 2) & (lateral.abs() < 0.3 * env.cube_size)
    aim = (cube - pusher) / rel.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    push_dir = aim + u
    push = push_dir / push_dir.norm(dim=-1, keepdim=True).clamp_min(1e-6) * env.action_scale

    # Repositioning: straight to the staging point unless the cube is in the
    # way, else along an orbit around the cube towards the staging side.
    ang_p = torch.atan2(rel[:, 1], rel[:, 0])
    ang_s = torch.atan2(-u[:, 1], -u[:, 0])
    diff = torch.remainder(ang_s - ang_p + math.pi, 2 * math.pi) - math.pi
    blocked = diff.abs() > 0.6
    ang_w = ang_p + diff.clamp(-0.7, 0.7)
    radius = torch.maximum(rel.norm(dim=-1), torch.full_like(along, circum + 0.02)).clamp_max(circum + 0.05)
    orbit = cube + radius[:, None] * torch.stack((torch.cos(ang_w), torch.sin(ang_w)), dim=-1)
    target = torch.where(blocked[:, None], orbit, staging)
    move = target - pusher

    delta = torch.where(pushing[:, None], push, move)
    return (delta / env.action_scale).clamp(-1.0, 1.0)
