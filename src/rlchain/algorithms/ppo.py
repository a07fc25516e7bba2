"""Proximal Policy Optimization (Schulman et al. 2017) with GAE (Schulman et al. 2016)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from rlchain.algorithms.base import Algorithm, AlgorithmConfig, check_probability
from rlchain.algorithms.functional import clipped_surrogate, compute_gae
from rlchain.policies import Policy
from rlchain.utils import check_non_negative, check_positive

__all__ = ["PPO", "PPOConfig", "ppo_loss"]


@dataclass
class PPOConfig(AlgorithmConfig):
    """PPO hyperparameters and their defaults (the shared ones in :class:`AlgorithmConfig`)."""

    _target_: str = "rlchain.algorithms.PPO"
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_vloss: bool = True
    """Clip the value update to +-clip_coef around the old value."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    norm_adv: bool = True
    """Normalise advantages over the rollout to zero mean and unit std."""
    stop_at_target_kl: bool = False
    """Stop the epochs of an update once approx_kl exceeds target_kl."""


_D = PPOConfig()


def ppo_loss(
    new: TensorDict,
    batch: TensorDict,
    clip_coef: float,
    clip_vloss: bool,
    vf_coef: float,
    ent_coef: float,
) -> dict[str, torch.Tensor]:
    """The PPO objective on one minibatch (Schulman et al. 2017, eq. 7 and 9).

    Args:
        new: ``sample_log_prob``, ``entropy``, ``value`` ``[B]`` of the current policy.
        batch: ``sample_log_prob``, ``value`` (at collection), ``advantages``, ``returns`` ``[B]``.

    Returns:
        scalar tensors ``loss`` (to minimise), ``policy_loss``, ``value_loss``,
        ``entropy``, ``approx_kl`` (the ``(r - 1) - log r`` estimator) and
        ``clip_fraction``.
    """
    surrogate, approx_kl, clipped = clipped_surrogate(
        new["sample_log_prob"], batch["sample_log_prob"], batch["advantages"], clip_coef
    )
    policy_loss = surrogate.mean()
    value, old_value, returns = new["value"], batch["value"], batch["returns"]
    value_loss = (value - returns).square()
    if clip_vloss:
        clipped_value = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        value_loss = torch.maximum(value_loss, (clipped_value - returns).square())
    value_loss = 0.5 * value_loss.mean()
    entropy = new["entropy"].mean()
    approx_kl, clip_fraction = approx_kl.mean(), clipped.mean()
    return {
        "loss": policy_loss + vf_coef * value_loss - ent_coef * entropy,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
    }


class PPO(Algorithm):
    """PPO-clip with GAE, value clipping, entropy bonus and gradient clipping.

    Args:
        policy: an actor-critic policy (``value`` must come from a critic).
        Others: see :class:`PPOConfig`.

    ``update(rollout)`` reads the collector's ``[T, N]`` TensorDict and returns
    ``policy_loss``, ``value_loss``, ``entropy``, ``approx_kl``,
    ``clip_fraction`` (means over the minibatches run), ``explained_variance``
    (of the returns by the old values; NaN when the returns do not vary),
    ``grad_norm`` (mean, before clipping),
    ``learning_rate`` and ``epochs`` (run, < n_epochs after a KL stop).

    Raises:
        ValueError: out-of-range hyperparameters (see :class:`Algorithm`),
            ``gamma``/``gae_lambda`` outside [0, 1], negative coefficients.
        NonFiniteError: from ``update``, at the first non-finite loss, gradient
            norm, reported term or parameter (see :class:`Algorithm`).
    """

    def __init__(
        self,
        policy: Policy,
        learning_rate: float = _D.learning_rate,
        n_epochs: int = _D.n_epochs,
        batch_size: int = _D.batch_size,
        gamma: float = _D.gamma,
        gae_lambda: float = _D.gae_lambda,
        clip_coef: float = _D.clip_coef,
        clip_vloss: bool = _D.clip_vloss,
        vf_coef: float = _D.vf_coef,
        ent_coef: float = _D.ent_coef,
        max_grad_norm: float = _D.max_grad_norm,
        norm_adv: bool = _D.norm_adv,
        lr_schedule: str = _D.lr_schedule,
        target_kl: float | None = _D.target_kl,
        stop_at_target_kl: bool = _D.stop_at_target_kl,
        total_iterations: int | None = _D.total_iterations,
        seed: int = _D.seed,
    ) -> None:
        check_probability("gamma", gamma)
        check_probability("gae_lambda", gae_lambda)
        check_positive("clip_coef", clip_coef)
        check_non_negative("vf_coef", vf_coef)
        check_non_negative("ent_coef", ent_coef)
        if stop_at_target_kl and target_kl is None:
            raise ValueError("target_kl=None is not allowed with stop_at_target_kl=True: expected a number > 0")
        if not getattr(policy, "has_critic", True):
            raise ValueError(
                f"policy={type(policy).__name__} has no critic: PPO needs one (use policy=actor_critic)"
            )
        super().__init__(
            policy, learning_rate, n_epochs, batch_size, max_grad_norm, lr_schedule, target_kl, total_iterations, seed
        )
        self.gamma, self.gae_lambda = float(gamma), float(gae_lambda)
        self.clip_coef, self.clip_vloss = float(clip_coef), bool(clip_vloss)
        self.vf_coef, self.ent_coef = float(vf_coef), float(ent_coef)
        self.norm_adv, self.stop_at_target_kl = bool(norm_adv), bool(stop_at_target_kl)

    def update(self, rollout: TensorDict) -> dict[str, float]:
        """One PPO update on a ``[T, N]`` rollout; see the class docstring for the returned keys."""
        advantages, returns = compute_gae(
            rollout["reward"], rollout["value"], rollout["next_value"],
            rollout["terminated"], rollout["done"], self.gamma, self.gae_lambda,
        )  # fmt: skip
        # As CleanRL: undefined (NaN) for returns that do not vary, here up to
        # float32 rounding (returns = advantages + values can leave a residue).
        var_returns = float(returns.var())
        constant = var_returns <= (1e-6 * float(returns.abs().max())) ** 2
        explained_variance = math.nan if constant else 1 - float((returns - rollout["value"]).var()) / var_returns
        if self.norm_adv:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        data = rollout.select("obs", "action", "sample_log_prob", "value").clone(False)
        data.set("advantages", advantages)
        data.set("returns", returns)

        stats, epochs = self._optimise(
            data,
            lambda batch: ppo_loss(
                self.policy.evaluate_actions(batch), batch, self.clip_coef, self.clip_vloss, self.vf_coef, self.ent_coef
            ),
            stop_kl=self.target_kl if self.stop_at_target_kl else None,
        )
        stats.update(
            explained_variance=float(explained_variance),
            learning_rate=self.current_lr,
            epochs=float(epochs),
        )
        return stats
