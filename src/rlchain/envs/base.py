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
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from gymnasium.vector import AutoresetMode

from rlchain.utils import check_positive

__all__ = ["VecEnv", "check_group_size"]


def check_group_size(group_size: Any, num_envs: int) -> int:
    """Validate a GRPO group size against ``num_envs`` and return it.

    Raises:
        ValueError: unless ``group_size`` is a positive int dividing ``num_envs``.
    """
    check_positive("group_size", group_size, integer=True)
    if num_envs % group_size != 0:
        raise ValueError(
            f"group_size={group_size} is not allowed with num_envs={num_envs}: "
            "num_envs must be a multiple of group_size"
        )
    return group_size


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
    ``reward`` float32 ``[N]``, ``terminated``/``truncated`` bool ``[N]``;
    ``info`` holds ``final_obs`` ``[N, *obs_shape]`` (meaningful where
    ``terminated | truncated``), ``rewards`` (dict of weighted terms, float32
    ``[N]`` each, summing to ``reward``), ``metrics`` (dict of float32 ``[N]``)
    and ``success`` (bool ``[N]``).
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    num_envs: int
    device: torch.device
    max_episode_steps: int

    def __init__(self, num_envs: int, device: torch.device) -> None:
        check_positive("num_envs", num_envs, integer=True)
        self.num_envs = num_envs
        self.device = device

    def _set_spaces(self, single_observation_space: gym.Space, single_action_space: gym.Space) -> None:
        self.single_observation_space = single_observation_space
        self.single_action_space = single_action_space
        self.observation_space = gym.vector.utils.batch_space(single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(single_action_space, self.num_envs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # pragma: no cover - abstract
        raise NotImplementedError

    def step(self, action: torch.Tensor):  # pragma: no cover - abstract
        raise NotImplementedError
