"""A hand-written PushCube controller: a baseline and the check that the task is solvable."""

from __future__ import annotations

import math

import torch

from rlchain.core.envs.push_cube import PushCubeEnv

__all__ = ["scripted_action"]


def scripted_action(obs: torch.Tensor, env: PushCubeEnv) -> torch.Tensor:
    """Actions of a pushing controller that solves most PushCube episodes.

    Goes around the cube to a staging point behind it on the cube->goal line,
    then pushes through the cube's centre towards the goal, re-aiming every
    step. Reads only the observation (layout in :mod:`rlchain.core.envs.push_cube`).

    Args:
        obs: float32 ``[N, 15]`` observations of ``env``.
        env: the env, for its geometry and ``action_scale`` (``env.cfg``).

    Returns:
        float32 ``[N, 2]`` actions in ``[-1, 1]``.
    """
    cfg = env.cfg
    pusher, cube, goal = obs[:, 0:2], obs[:, 2:4], obs[:, 9:11]
    to_goal = goal - cube
    u = to_goal / to_goal.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    perp = torch.stack((-u[:, 1], u[:, 0]), dim=-1)
    rel = pusher - cube
    along, lateral = (rel * u).sum(-1), (rel * perp).sum(-1)
    circum = cfg.cube_size / 2 * math.sqrt(2.0) + cfg.pusher_radius
    staging = cube - u * (circum + 0.01)

    # Pushing: behind the cube and close to the goal line.
    pushing = (along < -cfg.cube_size / 2) & (lateral.abs() < 0.3 * cfg.cube_size)
    aim = (cube - pusher) / rel.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    push_dir = aim + u
    push = push_dir / push_dir.norm(dim=-1, keepdim=True).clamp_min(1e-6) * cfg.action_scale

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
    return (delta / cfg.action_scale).clamp(-1.0, 1.0)
