"""Toy VecEnvs whose observations come as named groups (a TensorDict), as robot tasks' do.

* :class:`GroupedLineEnv`: :class:`~tests.helpers.toy_env.LineEnv` with groups ``actor`` (what the policy sees)
  and ``critic`` (more: the time left and the distance), returned in another key order than the space's.
* :class:`HiddenSignEnv`: every step pays a sign drawn when the episode starts, which only the ``critic`` group
  shows: a critic that sees it can learn the value exactly, one that sees only the ``actor`` group cannot.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from rlchain.core.envs.base import VecEnv, check_group_size
from tests.helpers.toy_env import LineEnv


def _box(n: int) -> gym.spaces.Box:
    return gym.spaces.Box(-np.inf, np.inf, (n,), np.float32)


class GroupedLineEnv(LineEnv):
    """LineEnv observed as ``actor`` = [position, time/limit] and ``critic`` = [position, time/limit, |position|]."""

    def __init__(self, num_envs: int = 8, device: str = "cpu", seed: int = 0, max_episode_steps: int = 5, **kwargs):
        super().__init__(num_envs, device, seed, max_episode_steps, **kwargs)
        self._set_spaces(gym.spaces.Dict({"actor": _box(2), "critic": _box(3)}), self.single_action_space)

    def _obs(self) -> TensorDict:
        flat = super()._obs()
        critic = torch.cat((flat, self.pos.abs()[:, None]), -1)
        # critic first: the env's key order need not be the space's
        return TensorDict({"critic": critic, "actor": flat}, batch_size=[self.num_envs])


class HiddenSignEnv(VecEnv):
    """Reward ``sign`` every step, ``sign`` in {-1, +1} drawn at each episode's start and shown to the critic alone.

    ``actor`` = [time/limit]; ``critic`` = [time/limit, sign]. Episodes are truncated after ``max_episode_steps``;
    the action (Box [-1, 1]) changes nothing. The value of a state is ``sign`` times the discounted steps left.
    """

    def __init__(self, num_envs: int = 64, device: str = "cpu", seed: int = 0, max_episode_steps: int = 8, **_: Any):
        super().__init__(num_envs, torch.device(device))
        self.max_episode_steps = max_episode_steps
        self._set_spaces(
            gym.spaces.Dict({"actor": _box(1), "critic": _box(2)}), gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        )
        self.gen = torch.Generator().manual_seed(seed)
        self.t = torch.zeros(num_envs)
        self.sign = torch.ones(num_envs)
        self._draw(torch.ones(num_envs, dtype=torch.bool), 1)

    def _draw(self, mask: torch.Tensor, group_size: int) -> None:
        sign = (torch.randint(0, 2, (self.num_envs // group_size,), generator=self.gen) * 2 - 1).float()
        self.sign = torch.where(mask, sign.repeat_interleave(group_size), self.sign)
        self.t = torch.where(mask, 0.0, self.t)

    def _obs(self) -> TensorDict:
        time = (self.t / self.max_episode_steps)[:, None]
        return TensorDict(
            {"actor": time, "critic": torch.cat((time, self.sign[:, None]), -1)}, batch_size=[self.num_envs]
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self.gen.manual_seed(seed)
        g = check_group_size(options["group_size"], self.num_envs) if options and "group_size" in options else 1
        self._draw(torch.ones(self.num_envs, dtype=torch.bool), g)
        return self._obs(), {}

    def step(self, action: torch.Tensor):
        reward = self.sign.clone()
        self.t = self.t + 1
        truncated = self.t >= self.max_episode_steps
        terminated = torch.zeros_like(truncated)
        final_obs = self._obs()
        self._draw(truncated, 1)
        info = {"final_obs": final_obs, "success": terminated, "rewards": {"sign": reward}, "metrics": {}}
        return self._obs(), reward, terminated, truncated, info
