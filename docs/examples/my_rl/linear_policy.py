"""A minimal policy of your own: a linear Gaussian actor and a linear critic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from tensordict import TensorDict
from torch import nn

from rlchain.core.policies import Policy
from rlchain.settings import Settings, setting


@dataclass
class LinearPolicyConfig(Settings):
    """Settings of :class:`LinearPolicy`."""

    _target_: str = "my_rl.linear_policy.LinearPolicy"
    init_log_std: float = setting(-0.5, le=2)
    """Initial log standard deviation of the Gaussian."""


class LinearPolicy(Policy):
    """Box observations and actions: ``action ~ Normal(W obs + b, exp(log_std))``, ``value = w obs + c``."""

    def __init__(self, observation_space: gym.spaces.Box, action_space: gym.spaces.Box, **settings: Any) -> None:
        super().__init__()
        self.cfg = LinearPolicyConfig(**settings)
        self.observation_space, self.action_space = observation_space, action_space
        obs_dim, act_dim = observation_space.shape[0], action_space.shape[0]
        self.actor, self.critic = nn.Linear(obs_dim, act_dim), nn.Linear(obs_dim, 1)
        self.log_std = nn.Parameter(torch.full((act_dim,), self.cfg.init_log_std))

    def _distribution(self, obs: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.actor(obs), self.log_std.exp())

    def get_action(self, td: TensorDict, deterministic: bool = False) -> TensorDict:
        dist = self._distribution(td["obs"])
        action = dist.mean if deterministic else dist.sample()  # stored unclipped: the env clips
        td.set("action", action)
        td.set("sample_log_prob", dist.log_prob(action).sum(-1))
        return self.get_value(td)

    def get_value(self, td: TensorDict) -> TensorDict:
        td.set("value", self.critic(td["obs"]).squeeze(-1))
        return td

    def evaluate_actions(self, td: TensorDict) -> TensorDict:
        dist = self._distribution(td["obs"])
        return TensorDict(
            {
                "sample_log_prob": dist.log_prob(td["action"]).sum(-1),
                "entropy": dist.entropy().sum(-1),
                "value": self.critic(td["obs"]).squeeze(-1),
            },
            batch_size=td.batch_size,
        )

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)  # what rlchain-export writes into a standalone file
