"""PushCube physics: pure functions on batched state tensors.

One control step of :class:`~rlchain.core.envs.push_cube.PushCubeEnv` is
``substeps`` substeps of ``dt = control_dt / substeps`` seconds. The cube is a
rigid body in SE(2), pose ``(x, y, yaw)`` and twist ``(vx, vy, omega)``,
uniform density, so its rotational inertia per unit mass is
``k**2 = cube_size**2 / 6`` (:func:`inertia_per_mass`). Each substep:

1. *Table friction* (:func:`apply_friction`; Coulomb, coefficient
   ``friction_coef``): the linear speed drops by ``mu * g * dt`` and the
   angular speed by ``mu * g * c / k**2 * dt`` (``c = 0.3826 * cube_size``,
   the mean distance of a square's points from its centre), each clamped at
   zero so friction stops motion and never reverses it
   (:func:`friction_decelerations`). Linear and angular friction are treated
   independently, the usual simplification of the coupled Coulomb law for a
   sliding and spinning plate.
2. *Prediction* (:func:`predict_pose`, :func:`move_pusher`): the pose
   advances with the mean of the twist before and after friction (exact for
   constant deceleration); the pusher moves by its share of the commanded
   displacement and is held on the table.
3. *Contact* (:func:`project_contact`; position-based dynamics, Mueller et
   al. 2007): the signed distance between the pusher disc and the cube's
   square is computed in the cube frame (:func:`square_contact`); a
   penetration of depth ``d`` along contact normal ``n`` at contact point
   ``r`` (relative to the cube centre) is removed by moving the cube alone
   (the pusher is kinematic, i.e. of infinite mass) by ``dx = -n d / w`` and
   ``dyaw = -(r x n) d / (k**2 w)`` with the generalised inverse mass
   ``w = 1 + (r x n)**2 / k**2`` (per unit mass). A push through a face
   centre has ``r x n = 0`` and translates the cube without turning it; an
   off-centre push turns it in the sense of the torque ``r x F``. The
   projection runs ``contact_iterations`` times.
4. *Velocity update* (:func:`contact_twist`): the contact correction divided
   by ``dt`` is added to the twist, so a pushed cube carries the pusher's
   velocity and slides to rest by friction once released.

With a kinematic pusher and Coulomb friction the motion does not depend on the
cube's mass, only on the ratio of its inertia to its mass, so no mass appears.
The pusher may move at most ``pusher_radius`` per substep, which keeps its
centre outside the cube and the contact normal well defined.

Every tensor argument is float32 of one shape ``[N]`` (one entry per env);
units are metres, radians, seconds, m/s and rad/s. The functions return new
tensors and never modify their arguments.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "GRAVITY",
    "apply_friction",
    "contact_twist",
    "friction_decelerations",
    "inertia_per_mass",
    "move_pusher",
    "predict_pose",
    "project_contact",
    "square_contact",
]

GRAVITY = 9.81  # m/s^2
# Mean distance from the centre of a unit square's points: (sqrt(2) + asinh(1)) / 6.
_SQUARE_MEAN_RADIUS = (math.sqrt(2.0) + math.asinh(1.0)) / 6.0

Tensors3 = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def inertia_per_mass(cube_size: float) -> float:
    """``k**2``, the rotational inertia per unit mass of a uniform square of side ``cube_size`` (m), m^2."""
    return cube_size**2 / 6.0


def friction_decelerations(friction_coef: float, cube_size: float, dt: float) -> tuple[float, float]:
    """Speed lost to table friction in one substep of ``dt`` s: ``(linear m/s, angular rad/s)``.

    Args:
        friction_coef: Coulomb coefficient ``mu`` between cube and table.
        cube_size: side of the cube's square footprint, m.
        dt: substep duration, s.
    """
    linear = friction_coef * GRAVITY * dt
    angular = friction_coef * GRAVITY * _SQUARE_MEAN_RADIUS * cube_size / inertia_per_mass(cube_size) * dt
    return linear, angular


def apply_friction(
    vx: torch.Tensor, vy: torch.Tensor, omega: torch.Tensor, lin_decel: float, ang_decel: float
) -> Tensors3:
    """Step 1: the twist ``(vx, vy, omega)`` ``[N]`` after one substep of Coulomb friction.

    The linear speed drops by ``lin_decel`` (m/s) along the direction of
    motion and ``|omega|`` by ``ang_decel`` (rad/s), each stopping at zero.
    """
    speed = torch.hypot(vx, vy)
    keep = (speed - lin_decel).clamp_min(0) / speed.clamp_min(1e-9)
    return vx * keep, vy * keep, torch.copysign((omega.abs() - ang_decel).clamp_min(0), omega)


def predict_pose(pose: Tensors3, twist_before: Tensors3, twist_after: Tensors3, dt: float) -> Tensors3:
    """Step 2: ``pose`` ``(x, y, yaw)`` ``[N]`` advanced ``dt`` s with the mean of two twists.

    The mean of the twist before and after friction (trapezoidal rule), so a
    cube sliding under constant friction travels exactly ``v**2 / (2 mu g)``.
    """
    (x, y, yaw), (vx0, vy0, omega0), (vx, vy, omega) = pose, twist_before, twist_after
    h = 0.5 * dt
    return x + (vx + vx0) * h, y + (vy + vy0) * h, yaw + (omega + omega0) * h


def move_pusher(
    px: torch.Tensor, py: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor, limit: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2: the pusher position ``[N]`` moved by ``(dx, dy)`` m and held in the table ``[-limit, limit]^2``."""
    return (px + dx).clamp(-limit, limit), (py + dy).clamp(-limit, limit)


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


def project_contact(
    pose: Tensors3,
    px: torch.Tensor,
    py: torch.Tensor,
    half: float,
    pusher_radius: float,
    k2: float,
    iterations: int,
) -> Tensors3:
    """Step 3: the cube pose ``(x, y, yaw)`` ``[N]`` moved out of the pusher disc (PBD projection).

    Args:
        pose: predicted cube pose, m and rad.
        px, py: pusher centre ``[N]``, m (kinematic: it does not move).
        half: half side of the cube, m.
        pusher_radius: radius of the pusher disc, m.
        k2: the cube's inertia per unit mass (:func:`inertia_per_mass`), m^2.
        iterations: projections to run.
    """
    cx, cy, yaw = pose
    for _ in range(iterations):
        c, s = torch.cos(yaw), torch.sin(yaw)
        rx, ry = px - cx, py - cy
        signed, nx, ny, r_cross_n = square_contact(c * rx + s * ry, c * ry - s * rx, half)
        depth = (pusher_radius - signed).clamp_min(0)
        corr = depth / (1.0 + r_cross_n * r_cross_n / k2)
        cx = cx - (c * nx - s * ny) * corr
        cy = cy - (s * nx + c * ny) * corr
        yaw = yaw - r_cross_n * corr / k2
    return cx, cy, yaw


def contact_twist(twist: Tensors3, pose: Tensors3, predicted: Tensors3, dt: float) -> Tensors3:
    """Step 4: ``twist`` ``(vx, vy, omega)`` ``[N]`` plus the contact correction ``pose - predicted`` over ``dt``.

    A free cube (``pose == predicted``) keeps its post-friction twist exactly.
    """
    (vx, vy, omega), (cx, cy, yaw), (cx0, cy0, yaw0) = twist, pose, predicted
    inv_dt = 1.0 / dt
    return vx + (cx - cx0) * inv_dt, vy + (cy - cy0) * inv_dt, omega + (yaw - yaw0) * inv_dt
