"""Reward scaling by the running standard deviation of the discounted return (PPO's ``reward_norm``).

Engstrom et al. 2020 ("Implementation Matters in Deep Policy Gradients")
count it among the details PPO's results rest on on MuJoCo; SB3's
``VecNormalize`` and CleanRL's ``NormalizeReward`` implement it the same way:
each env keeps a discounted return ``R_t = r_t + gamma * R_{t-1}``, reset to 0
after an episode ends, and the rewards the update learns from are
``r_t / sqrt(Var[R] + eps)``, ``Var[R]`` the running variance of every ``R_t``
collected so far (not centred: the mean of the return is left alone).
"""

from __future__ import annotations

from typing import Any

import torch

from rlchain.core.policies import RunningMeanStd

__all__ = ["RewardScaler"]


class RewardScaler:
    """Scales a rollout's rewards by the running std of the discounted return (see the module docstring).

    Statistics come from collected rollouts only (the update calls it on each
    one); evaluation and the logged episode returns never see the scaled
    rewards. SB3 scales each step by the statistics of the steps before it;
    here a rollout's rewards are scaled once its returns have joined the
    statistics (one batched update per rollout, no per-step host sync). In a
    multi-process run the variance is over every rank's returns
    (:class:`~rlchain.core.policies.RunningMeanStd`); each rank carries its own
    envs' returns.

    Args:
        gamma: the discount of the return (the algorithm's ``gamma``).
        clip: clip the scaled rewards to ``[-clip, clip]``; None: no clip.
        eps: added to the variance.
    """

    def __init__(self, gamma: float, clip: float | None = None, eps: float = 1e-8) -> None:
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.rms = RunningMeanStd(1)
        self.returns: torch.Tensor | None = None
        """float32 ``[N]``: each env's discounted return so far (None: 0 for every env)."""

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Fold a rollout's returns into the statistics and return its scaled rewards.

        Args:
            reward: float ``[T, N]``; done: bool ``[T, N]`` (the episode ended at that step).

        Returns:
            float ``[T, N]``: ``reward / sqrt(var + eps)``, clipped to ``clip``.
        """
        self.rms.to(reward.device)
        carried = self.returns if self.returns is not None else torch.zeros_like(reward[0])
        returns = torch.empty_like(reward)
        for t in range(reward.shape[0]):
            carried = reward[t] + self.gamma * carried
            returns[t] = carried
            carried = carried * (~done[t])
        self.returns = carried
        self.rms.update(returns.reshape(-1, 1))
        scaled = reward / torch.sqrt(self.rms.var + self.eps)
        return scaled.clamp(-self.clip, self.clip) if self.clip is not None else scaled

    @property
    def std(self) -> float:
        """The running std of the discounted return (the divisor, without ``eps``)."""
        return float(self.rms.var.sqrt())

    def state_dict(self) -> dict[str, Any]:
        """The running statistics (the same on every rank)."""
        return self.rms.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.rms.load_state_dict(state)

    def rank_state_dict(self) -> dict[str, Any]:
        """This process's envs' returns (``{}`` before the first rollout)."""
        return {} if self.returns is None else {"returns": self.returns.clone()}

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`rank_state_dict` output (``{}``: every env's return starts at 0)."""
        self.returns = state["returns"].clone() if "returns" in state else None
