"""Proximal Policy Optimization (Schulman et al. 2017) with GAE (Schulman et al. 2016)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlchain.core.algorithms.base import Algorithm, AlgorithmConfig
from rlchain.core.algorithms.functional import clipped_surrogate, compute_gae
from rlchain.core.algorithms.reward_scaling import RewardScaler
from rlchain.core.policies import Policy
from rlchain.distributed import moments, world
from rlchain.settings import SettingError, setting

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["PPO", "PPOConfig", "ppo_loss"]


@dataclass
class PPOConfig(AlgorithmConfig):
    """PPO hyperparameters, their defaults and ranges (the shared ones in :class:`AlgorithmConfig`)."""

    _target_: str = "rlchain.core.algorithms.PPO"
    learning_rate: float = 1e-3
    """Adam step size (tuned on push_cube; initial value under a schedule)."""
    batch_size: int = 2048
    ent_coef: float = 0.01
    """Weight of the entropy bonus (keeps push_cube's action noise from collapsing before the task is solved)."""
    gae_lambda: float = setting(0.95, ge=0, le=1)
    """GAE lambda."""
    clip_vloss: bool = True
    """Clip the value update to +-clip_coef around the old value."""
    vf_coef: float = setting(0.5, ge=0)
    """Weight of the value loss."""
    norm_adv: bool = True
    """Normalise advantages over the rollout (every rank's, in a multi-process run) to zero mean and unit std."""
    stop_at_target_kl: bool = False
    """Stop the epochs of an update after one whose last minibatch's approx_kl exceeds target_kl (CleanRL's rule)."""
    reward_norm: bool = False
    """Learn from rewards scaled by the running std of the discounted return (Engstrom et al. 2020; SB3's
    VecNormalize, CleanRL's NormalizeReward): rlchain.core.algorithms.reward_scaling. Logged episode returns, evaluation
    and the objective stay in the env's units."""
    reward_clip: float | None = setting(None, gt=0)
    """Clip the scaled rewards to [-reward_clip, reward_clip] (with reward_norm); None: no clip."""

    def check(self) -> None:
        """The shared rules; ``stop_at_target_kl`` needs a ``target_kl``, ``reward_clip`` needs ``reward_norm``."""
        super().check()
        if self.stop_at_target_kl and self.target_kl is None:
            raise SettingError("target_kl", None, " is not allowed with stop_at_target_kl=True: expected a number > 0")
        if self.reward_clip is not None and not self.reward_norm:
            raise SettingError(
                "reward_clip",
                self.reward_clip,
                " is not allowed with reward_norm=False: it clips scaled rewards; expected None",
            )

    def target_kl_readers(self) -> dict[str, tuple[bool, str]]:
        """The schedule, and ``stop_at_target_kl``."""
        return {**super().target_kl_readers(), "stop_at_target_kl": (self.stop_at_target_kl, "stop_at_target_kl=True")}


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
        ``clipfrac`` (the share of samples whose ratio was clipped).
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
    approx_kl, clipfrac = approx_kl.mean(), clipped.mean()
    return {
        "loss": policy_loss + vf_coef * value_loss - ent_coef * entropy,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


class PPO(Algorithm):
    """PPO-clip with GAE, value clipping, entropy bonus and gradient clipping.

    Args:
        policy: an actor-critic policy (``value`` must come from a critic).
        settings: fields of :class:`PPOConfig` (``self.cfg``).

    ``update(rollout)`` reads the collector's ``[T, N]`` TensorDict and returns
    ``policy_loss``, ``value_loss``, ``entropy``, ``approx_kl``,
    ``clipfrac`` (means over the minibatches run), ``explained_variance``
    (of the returns by the old values; NaN when the returns do not vary),
    ``grad_norm`` (mean, before clipping),
    ``learning_rate`` and ``epochs`` (run, < n_epochs after a KL stop); with
    ``reward_norm``, ``return_std`` (the divisor of the rewards).

    Raises:
        ValueError: a setting out of its range or a broken rule between
            settings (see :class:`PPOConfig`), naming it; a policy without a critic.
        NonFiniteError: from ``update``, at the first non-finite loss, gradient
            norm, reported term or parameter (see :class:`Algorithm`).
    """

    trains_sequences = True
    term_names = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")

    def __init__(self, policy: Policy, **settings: Any) -> None:
        if not policy.has_critic:
            raise ValueError(f"policy={type(policy).__name__} has no critic: PPO needs one (use policy=actor_critic)")
        super().__init__(policy, PPOConfig(**settings))
        self.reward_scaler = RewardScaler(self.cfg.gamma, self.cfg.reward_clip) if self.cfg.reward_norm else None

    def update(self, rollout: TensorDict) -> dict[str, float]:
        """One PPO update on a ``[T, N]`` rollout; see the class docstring for the returned keys."""
        cfg = self.cfg
        reward = rollout["reward"]
        if self.reward_scaler is not None:
            reward = self.reward_scaler(reward, rollout["done"])
        advantages, returns = compute_gae(
            reward,
            rollout["value"],
            rollout["next_value"],
            rollout["terminated"],
            rollout["done"],
            cfg.gamma,
            cfg.gae_lambda,
        )
        # As CleanRL: undefined (NaN) for returns that do not vary, here up to
        # float32 rounding (returns = advantages + values can leave a residue).
        _, variances, _ = moments(
            torch.stack([returns, returns - rollout["value"]], -1).reshape(-1, 2),
            "the all-reduce of the explained variance",
        )
        var_returns, var_residual = variances.tolist()
        constant = (
            var_returns <= (1e-6 * float(world().max(returns.abs().max(), "the all-reduce of max |return|"))) ** 2
        )
        explained_variance = math.nan if constant else 1 - var_residual / var_returns
        if cfg.norm_adv:  # over every rank's rollout
            mean, var, _ = moments(advantages.reshape(-1), "the all-reduce of the advantages' mean and std")
            advantages = (advantages - mean) / (var.sqrt() + 1e-8)
        data = self._samples(rollout, "obs", "action", "sample_log_prob", "value")
        data.set("advantages", advantages)
        data.set("returns", returns)

        stats, epochs = self._optimise(data, stop_kl=cfg.target_kl if cfg.stop_at_target_kl else None)
        self.policy.update_obs_normalizer(rollout["obs"])
        stats.update(
            explained_variance=float(explained_variance),
            learning_rate=self.current_lr,
            epochs=float(epochs),
        )
        if self.reward_scaler is not None:
            stats["return_std"] = self.reward_scaler.std
        return stats

    def _minibatch_loss(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """:func:`ppo_loss` of the current policy on ``batch``."""
        cfg = self.cfg
        return ppo_loss(
            self.policy.evaluate_actions(batch), batch, cfg.clip_coef, cfg.clip_vloss, cfg.vf_coef, cfg.ent_coef
        )

    def state_dict(self) -> dict[str, Any]:
        """The shared state and, with ``reward_norm``, the return statistics."""
        state = super().state_dict()
        if self.reward_scaler is not None:
            state["reward_scaler"] = self.reward_scaler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (a checkpoint without return statistics leaves them fresh)."""
        super().load_state_dict(state)
        if self.reward_scaler is not None and "reward_scaler" in state:
            self.reward_scaler.load_state_dict(state["reward_scaler"])

    def rank_state_dict(self) -> dict[str, Any]:
        """With ``reward_norm``, this process's envs' discounted returns."""
        return {} if self.reward_scaler is None else self.reward_scaler.rank_state_dict()

    def load_rank_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`rank_state_dict` output."""
        if self.reward_scaler is not None:
            self.reward_scaler.load_rank_state_dict(state)
