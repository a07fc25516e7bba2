"""A minimal env of your own: a point on a line walks to the origin, batched in torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlchain.core.envs import VecEnv, VecEnvConfig, check_group_size
from rlchain.settings import setting
from rlchain.utils import resolve_device


@dataclass
class LineEnvConfig(VecEnvConfig):
    """Settings of :class:`LineEnv` (``num_envs``, ``device``, ``seed``, ``render_mode`` come with VecEnvConfig)."""

    _target_: str = "my_rl.line_env.LineEnv"
    max_episode_steps: int = setting(20, gt=0)
    """Time limit in steps."""
    speed: float = setting(0.1, gt=0)
    """How far an action of 1 moves the point."""


class LineEnv(VecEnv):
    """obs ``[position]``; an action in [-1, 1] moves the point by ``speed * action``.

    An episode succeeds (and terminates) within 0.05 of the origin; every other step costs 0.01.
    """

    def __init__(self, **settings: Any) -> None:
        self.cfg = cfg = LineEnvConfig(**settings)  # checks every value against its type and range
        super().__init__(cfg.num_envs, resolve_device(cfg.device))
        self.max_episode_steps = cfg.max_episode_steps
        box = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._set_spaces(box, box)  # single_observation_space, single_action_space and their batches
        self.generator = torch.Generator(self.device).manual_seed(cfg.seed)
        self.pos = torch.zeros(self.num_envs, device=self.device)
        self.t = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)

    def _start(self, mask: torch.Tensor, group_size: int = 1) -> None:
        """New episodes where ``mask``: one random start per block of ``group_size`` envs."""
        start = torch.rand(self.num_envs // group_size, generator=self.generator, device=self.device) * 2 - 1
        self.pos = torch.where(mask, start.repeat_interleave(group_size), self.pos)
        self.t = torch.where(mask, 0, self.t)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self.generator.manual_seed(seed)
        group_size = 1
        if options and "group_size" in options:  # GRPO: every block of group_size envs starts from one state
            group_size = check_group_size(options["group_size"], self.num_envs)
        self._start(torch.ones(self.num_envs, dtype=torch.bool, device=self.device), group_size)
        return self.pos[:, None].clone(), {}

    def step(self, action: torch.Tensor):
        self.pos = (self.pos + self.cfg.speed * action[:, 0].clamp(-1, 1)).clamp(-1, 1)
        self.t += 1
        success = self.pos.abs() < 0.05
        terminated = success
        truncated = (self.t >= self.max_episode_steps) & ~success
        reward = torch.where(success, 1.0, -0.01)
        final_obs = self.pos[:, None].clone()  # what the episodes that end here ended on
        self._start(terminated | truncated)  # same-step auto-reset
        info = {
            "final_obs": final_obs,
            "rewards": {"goal": reward},  # the weighted terms; they sum to the reward
            "metrics": {"distance": final_obs[:, 0].abs()},
            "success": success,
        }
        return self.pos[:, None].clone(), reward, terminated, truncated, info
