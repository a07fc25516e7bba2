"""Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath) adapted to control.

Language-model GRPO samples a group of completions for one prompt and scores
each against the group. Here a *group* is ``group_size`` consecutive envs that
start every rollout from one shared initial state (``env.reset(options=
{"group_size": G})``); they then act with independent action noise. No critic:

1. step-wise discounted returns ``R_t = r_t + gamma * R_{t+1}`` (reset at done);
2. with ``truncate_at_first_done`` every step after an env's first done is
   masked out (after it the env no longer shares a start with its group);
3. at each step, the returns of the group's live members are centred on
   their mean and scaled as ``advantage_norm`` says (see
   :func:`~rlchain.algorithms.functional.group_relative_advantages`); a group
   whose live returns are all equal carries no signal (advantage 0);
4. the PPO clipped surrogate (``clip_coef``) and the entropy bonus are averaged
   over the unmasked samples only;
5. with ``kl_coef > 0`` a frozen copy of the initial policy (its networks and
   its observation normaliser; with ``trainer.init_from``, the loaded policy)
   is the reference,
   penalised with the k3 estimator ``exp(q) - q - 1``,
   ``q = log pi_ref(a|s) - log pi(a|s)`` (Schulman 2020, "Approximating KL
   divergence"), as in the GRPO paper.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from rlchain.algorithms.base import Algorithm, AlgorithmConfig, check_probability
from rlchain.algorithms.functional import (
    ADVANTAGE_NORMS,
    clipped_surrogate,
    discounted_returns,
    first_done_mask,
    group_relative_advantages,
)
from rlchain.envs.base import check_group_size
from rlchain.policies import Policy
from rlchain.utils import check_choice, check_non_negative, check_positive

__all__ = ["GRPO", "GRPOConfig"]


@dataclass
class GRPOConfig(AlgorithmConfig):
    """GRPO hyperparameters and their defaults (the shared ones in :class:`AlgorithmConfig`)."""

    _target_: str = "rlchain.algorithms.GRPO"
    learning_rate: float = 1e-3
    """Adam step size (tuned on push_cube; initial value under a schedule)."""
    n_epochs: int = 5
    """Passes over each rollout (EmbodiChain uses 10; 5 learns as fast per env step on push_cube in half the time)."""
    batch_size: int = 4096
    """Samples (env transitions) per minibatch."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the initial policy (0 when training from scratch)."""
    group_size: int = 8
    """Envs per group sharing an initial state (>= 2, divides num_envs); EmbodiChain uses 4, 8 learns faster on push_cube."""
    eps: float = 1e-8
    """Added to the standard deviation that advantage_norm divides by."""
    advantage_norm: str = "std"
    """How group-centred returns are scaled: 'std' (per group and step, Shao et al. 2024), 'none' (mean-centred
    only, Dr. GRPO, Liu et al. 2025) or 'rollout_std' (one std pooled over the rollout)."""
    truncate_at_first_done: bool = True
    """Mask every step after an env's first done."""


_D = GRPOConfig()


class GRPO(Algorithm):
    """Critic-free GRPO; see the module docstring for the objective.

    Args:
        policy: any policy; an :class:`rlchain.policies.ActorOnly` wastes no
            compute on a critic.
        Others: see :class:`GRPOConfig`.

    ``update(rollout)`` returns ``actor_loss``, ``entropy``, ``approx_ref_kl``
    (0 when ``kl_coef == 0``), ``approx_kl`` (to the rollout policy),
    ``clip_fraction``, ``grad_norm``, ``learning_rate`` and ``live_fraction``
    (unmasked share of the rollout).

    Raises:
        ValueError: ``group_size`` < 2, out-of-range hyperparameters; from
            :meth:`check_env`, a ``num_envs`` that ``group_size`` does not divide.
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
        clip_coef: float = _D.clip_coef,
        ent_coef: float = _D.ent_coef,
        kl_coef: float = _D.kl_coef,
        group_size: int = _D.group_size,
        eps: float = _D.eps,
        advantage_norm: str = _D.advantage_norm,
        truncate_at_first_done: bool = _D.truncate_at_first_done,
        max_grad_norm: float = _D.max_grad_norm,
        lr_schedule: str = _D.lr_schedule,
        target_kl: float | None = _D.target_kl,
        total_iterations: int | None = _D.total_iterations,
        seed: int = _D.seed,
    ) -> None:
        check_positive("group_size", group_size, integer=True)
        if group_size < 2:
            raise ValueError(f"group_size={group_size} is not allowed: expected an integer >= 2 (a group compares its members)")
        check_probability("gamma", gamma)
        check_positive("clip_coef", clip_coef)
        check_non_negative("ent_coef", ent_coef)
        check_non_negative("kl_coef", kl_coef)
        check_positive("eps", eps)
        check_choice("advantage_norm", advantage_norm, ADVANTAGE_NORMS)
        super().__init__(
            policy, learning_rate, n_epochs, batch_size, max_grad_norm, lr_schedule, target_kl, total_iterations, seed
        )
        self.gamma, self.clip_coef, self.ent_coef, self.kl_coef = float(gamma), float(clip_coef), float(ent_coef), float(kl_coef)
        self.group_size, self.eps = int(group_size), float(eps)
        self.truncate_at_first_done = bool(truncate_at_first_done)
        self.advantage_norm = advantage_norm
        # Every rollout starts from a group reset: only then do a group's envs share a start.
        self.reset_options = {"group_size": self.group_size}
        self.ref_policy: Policy | None = None
        self.reset_reference()

    def reset_reference(self) -> None:
        """With ``kl_coef > 0``, freeze a copy of the policy as it is now as the KL reference.

        The copy includes the observation normaliser: the reference is a fixed
        function of the observation, whatever the live statistics do later.
        """
        if self.kl_coef > 0:
            self.ref_policy = copy.deepcopy(self.policy).requires_grad_(False).eval()

    def check_env(self, env: Any) -> None:
        """Raise ``ValueError`` unless ``group_size`` divides ``env.num_envs``."""
        check_group_size(self.group_size, env.num_envs)

    def advantages(self, rollout: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Group-relative advantages and the live mask of a ``[T, N]`` rollout (float, bool)."""
        done = rollout["done"]
        returns = discounted_returns(rollout["reward"], done, self.gamma)
        mask = first_done_mask(done) if self.truncate_at_first_done else torch.ones_like(done)
        return group_relative_advantages(returns, mask, self.group_size, self.eps, self.advantage_norm), mask

    def update(self, rollout: TensorDict) -> dict[str, float]:
        """One GRPO update on a ``[T, N]`` rollout; see the class docstring for the returned keys."""
        check_group_size(self.group_size, rollout.batch_size[1])
        advantages, mask = self.advantages(rollout)
        data = rollout.select("obs", "action", "sample_log_prob").clone(False)
        data.set("advantages", advantages)
        data.set("mask", mask.float())
        stats, _ = self._optimise(data, self._minibatch_loss)
        stats.update(learning_rate=self.current_lr, live_fraction=float(mask.float().mean()))
        return stats

    def _minibatch_loss(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """Masked clipped surrogate, entropy bonus and reference KL of one minibatch."""
        m = batch["mask"]
        live = m.sum().clamp_min(1.0)

        def masked_mean(x: torch.Tensor) -> torch.Tensor:
            return (x * m).sum() / live

        new = self.policy.evaluate_actions(batch)
        surrogate, approx_kl, clipped = clipped_surrogate(
            new["sample_log_prob"], batch["sample_log_prob"], batch["advantages"], self.clip_coef
        )
        actor_loss, entropy = masked_mean(surrogate), masked_mean(new["entropy"])
        loss = actor_loss - self.ent_coef * entropy
        if self.ref_policy is not None:
            with torch.no_grad():
                ref_log_prob = self.ref_policy.evaluate_actions(batch)["sample_log_prob"]
            q = ref_log_prob - new["sample_log_prob"]
            ref_kl = masked_mean(q.exp() - q - 1)
            loss = loss + self.kl_coef * ref_kl
        else:
            ref_kl = torch.zeros((), device=loss.device)
        return {
            "loss": loss,
            "actor_loss": actor_loss,
            "entropy": entropy,
            "approx_ref_kl": ref_kl,
            "approx_kl": masked_mean(approx_kl),
            "clip_fraction": masked_mean(clipped),
        }

    def state_dict(self) -> dict[str, Any]:
        """Optimiser, schedule, generator and (with ``kl_coef > 0``) the reference policy."""
        state = super().state_dict()
        if self.ref_policy is not None:
            state["ref_policy"] = self.ref_policy.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        super().load_state_dict(state)
        if self.ref_policy is not None and "ref_policy" in state:
            self.ref_policy.load_state_dict(state["ref_policy"])
