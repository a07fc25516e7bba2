"""A minimal algorithm of your own: vanilla policy gradient with a value baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from rlchain.core.algorithms import Algorithm, AlgorithmConfig
from rlchain.core.algorithms.functional import compute_gae
from rlchain.core.policies import Policy
from rlchain.settings import setting


@dataclass
class VPGConfig(AlgorithmConfig):
    """Settings of :class:`VPG`: those every algorithm has (learning_rate, batch_size, gamma, ...) and its own."""

    _target_: str = "my_rl.vpg.VPG"
    n_epochs: int = 1
    """Passes over each rollout (one: the gradient is on-policy)."""
    gae_lambda: float = setting(1.0, ge=0, le=1)
    """GAE lambda of the advantages (1: discounted returns minus the value)."""
    vf_coef: float = setting(0.5, ge=0)
    """Weight of the value loss."""


class VPG(Algorithm):
    """``loss = -log pi(a|s) * A + vf_coef * (V(s) - R)^2 / 2 - ent_coef * entropy`` over minibatches."""

    term_names = ("policy_loss", "value_loss", "entropy")  # what _minibatch_loss reports besides the loss

    def __init__(self, policy: Policy, **settings: Any) -> None:
        super().__init__(policy, VPGConfig(**settings))

    def update(self, rollout: TensorDict) -> dict[str, float]:
        cfg = self.cfg
        advantages, returns = compute_gae(
            rollout["reward"],
            rollout["value"],
            rollout["next_value"],
            rollout["terminated"],
            rollout["done"],
            cfg.gamma,
            cfg.gae_lambda,
        )
        data = self._samples(rollout, "obs", "action")  # the rollout keys the loss reads
        data.set("advantages", (advantages - advantages.mean()) / (advantages.std() + 1e-8))
        data.set("returns", returns)
        stats, _ = self._optimise(data)  # minibatches, Adam, schedule, clipping, non-finite checks
        self.policy.update_obs_normalizer(rollout["obs"])
        return stats  # logged under losses/

    def _minibatch_loss(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        out = self.policy.evaluate_actions(batch)
        policy_loss = -(out["sample_log_prob"] * batch["advantages"]).mean()
        value_loss = 0.5 * (out["value"] - batch["returns"]).pow(2).mean()
        entropy = out["entropy"].mean()
        loss = policy_loss + self.cfg.vf_coef * value_loss - self.cfg.ent_coef * entropy
        return {
            "loss": loss,
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "entropy": entropy.detach(),
        }
