"""A tiny torch-native VecEnv for tests: a point on a line walks to the origin.

Written as a user would write their own env: it follows the VecEnv contract
(same-step auto-reset, ``final_obs``, group reset) with nothing but torch.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlchain.core.envs.base import VecEnv, check_group_size


class LineEnv(VecEnv):
    """obs = [position, time/limit]; action in [-1, 1] moves the point by 0.1 * action.

    Terminates (success) within 0.05 of the origin; truncates after
    ``max_episode_steps``. Reward: 1 on success, else -0.01.
    """

    resumes_episodes = True  # state_dict holds the whole state

    def __init__(
        self, num_envs: int = 8, device: str = "cpu", seed: int = 0, max_episode_steps: int = 5, discrete: bool = False
    ):
        super().__init__(num_envs, torch.device(device))
        self.max_episode_steps = max_episode_steps
        action_space = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.discrete = discrete
        self._set_spaces(gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), action_space)
        self.gen = torch.Generator().manual_seed(seed)
        self.pos = torch.zeros(num_envs)
        self.t = torch.zeros(num_envs)
        self._fresh(torch.ones(num_envs, dtype=torch.bool), 1)

    def _fresh(self, mask: torch.Tensor, group_size: int) -> None:
        new = (torch.rand(self.num_envs // group_size, generator=self.gen) * 2 - 1).repeat_interleave(group_size)
        self.pos = torch.where(mask, new, self.pos)
        self.t = torch.where(mask, 0.0, self.t)

    def _obs(self) -> torch.Tensor:
        return torch.stack((self.pos, self.t / self.max_episode_steps), -1)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self.gen.manual_seed(seed)
        g = check_group_size(options["group_size"], self.num_envs) if options and "group_size" in options else 1
        self._fresh(torch.ones(self.num_envs, dtype=torch.bool), g)
        return self._obs(), {}

    def step(self, action: torch.Tensor):
        move = (action.float() - 1.0) if self.discrete else action[:, 0].clamp(-1, 1)
        self.pos = self.pos + 0.1 * move
        self.t = self.t + 1
        success = self.pos.abs() < 0.05
        reward = torch.where(success, 1.0, -0.01)
        terminated = success
        truncated = (self.t >= self.max_episode_steps) & ~terminated
        final_obs = self._obs()
        self._fresh(terminated | truncated, 1)
        info = {
            "final_obs": final_obs,
            "success": success,
            "rewards": {"progress": reward},
            "metrics": {"distance": self.pos.abs()},
        }
        return self._obs(), reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self.pos.clone(), "t": self.t.clone(), "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pos, self.t = state["pos"].clone(), state["t"].clone()
        self.gen.set_state(state["gen"])


class ScoredByEvaluation(LineEnv):
    """No success signal; every step of the k-th reset's episodes pays k, so evaluation k scores k * limit.

    Each evaluation resets its env once, so an objective on ``eval/avg_reward`` grows with every evaluation
    (until a resumed run's fresh eval env starts counting again).
    """

    reports_success = False
    resets = 0

    def reset(self, **kwargs):
        self.resets += 1
        return super().reset(**kwargs)

    def step(self, action):
        self.t = self.t + 1
        truncated = self.t >= self.max_episode_steps
        final_obs = self._obs()
        self._fresh(truncated, 1)
        never = torch.zeros_like(truncated)
        info = {"final_obs": final_obs, "success": never, "rewards": {}, "metrics": {}}
        return self._obs(), torch.full((self.num_envs,), float(self.resets)), never, truncated, info
