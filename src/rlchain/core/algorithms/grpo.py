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
   :func:`~rlchain.core.algorithms.functional.group_relative_advantages`); a group
   whose live returns are all equal carries no signal (advantage 0);
4. the PPO clipped surrogate (``clip_coef``) and the entropy bonus are averaged
   over the unmasked samples only;
5. with ``kl_coef > 0`` a frozen copy of the initial policy (its networks and
   its observation normaliser; with ``trainer.init_from``, the loaded policy)
   is the reference,
   penalised with the k3 estimator ``exp(q) - q - 1``,
   ``q = log pi_ref(a|s) - log pi(a|s)`` (Schulman 2020, "Approximating KL
   divergence"), as in the GRPO paper. The reference's log-probabilities of
   the rollout's actions are computed once per update, before its epochs
   (``ref_log_prob``); a recurrent reference replays each env's whole rollout
   from its own zero state (every rollout starts from a reset), zeroed where
   an episode ended, never from the trained policy's stored state.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlchain.core.algorithms.base import Algorithm, AlgorithmConfig
from rlchain.core.algorithms.functional import (
    ADVANTAGE_NORMS,
    clipped_surrogate,
    discounted_returns,
    first_done_mask,
    group_relative_advantages,
)
from rlchain.core.buffer import sequence_minibatches
from rlchain.core.envs.base import check_group_size
from rlchain.core.policies import Policy
from rlchain.distributed import world
from rlchain.settings import setting

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["GRPO", "GRPOConfig"]


@dataclass
class GRPOConfig(AlgorithmConfig):
    """GRPO hyperparameters, their defaults and ranges (the shared ones in :class:`AlgorithmConfig`)."""

    _target_: str = "rlchain.core.algorithms.GRPO"
    learning_rate: float = 1e-3
    """Adam step size (tuned on push_cube; initial value under a schedule)."""
    n_epochs: int = 5
    """Passes over each rollout (EmbodiChain uses 10; 5 learns as fast per env step on push_cube in half the time)."""
    batch_size: int = 3200
    kl_coef: float = setting(0.0, ge=0)
    """Weight of the KL penalty to the initial policy (0 when training from scratch)."""
    group_size: int = setting(8, ge=2)
    """Envs per group sharing an initial state (>= 2: a group compares its members; divides num_envs).
    EmbodiChain uses 4; 8 learns faster on push_cube."""
    eps: float = setting(1e-8, gt=0)
    """Added to the standard deviation that advantage_norm divides by."""
    advantage_norm: str = setting("std", choices=ADVANTAGE_NORMS)
    """How group-centred returns are scaled: 'std' (per group and step, Shao et al. 2024), 'none' (mean-centred
    only, Dr. GRPO, Liu et al. 2025) or 'rollout_std' (one std pooled over the rollout)."""
    truncate_at_first_done: bool = True
    """Mask every step after an env's first done."""


class GRPO(Algorithm):
    """Critic-free GRPO; see the module docstring for the objective.

    Args:
        policy: any policy; an :class:`rlchain.core.policies.ActorOnly` wastes no
            compute on a critic.
        settings: fields of :class:`GRPOConfig` (``self.cfg``).

    ``update(rollout)`` returns ``policy_loss``, ``entropy``, ``approx_ref_kl``
    (0 when ``kl_coef == 0``), ``approx_kl`` (to the rollout policy),
    ``clipfrac``, ``grad_norm``, ``learning_rate`` and ``live_fraction``
    (unmasked share of the rollout).

    Raises:
        ValueError: a setting out of its range (see :class:`GRPOConfig`),
            naming it; from :meth:`check_env`, a ``num_envs`` that
            ``group_size`` does not divide.
        NonFiniteError: from ``update``, at the first non-finite loss, gradient
            norm, reported term or parameter (see :class:`Algorithm`).
    """

    trains_sequences = True
    term_names = ("policy_loss", "entropy", "approx_ref_kl", "approx_kl", "clipfrac")

    def __init__(self, policy: Policy, **settings: Any) -> None:
        super().__init__(policy, GRPOConfig(**settings))
        # Every rollout starts from a group reset: only then do a group's envs share a start (and a recurrent
        # policy's state is zeros at every rollout's first step, the reference's as the trained policy's).
        self.reset_options = {"group_size": self.cfg.group_size}
        self.ref_policy: Policy | None = None
        self.reset_reference()

    def reset_reference(self) -> None:
        """With ``kl_coef > 0``, freeze a copy of the policy as it is now as the KL reference.

        The copy includes the observation normaliser: the reference is a fixed
        function of the observation, whatever the live statistics do later.
        """
        if self.cfg.kl_coef > 0:
            self.ref_policy = copy.deepcopy(self.policy).requires_grad_(False).eval()

    def check_env(self, env: Any) -> None:
        """Raise :class:`~rlchain.settings.SettingError` (naming ``algorithm.group_size`` and ``env.num_envs``)
        unless the one divides the other: the one check of ``group_size`` against the env, before any step."""
        check_group_size(self.cfg.group_size, env.num_envs, names=("algorithm.group_size", "env.num_envs"))

    def advantages(self, rollout: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Group-relative advantages and the live mask of a ``[T, N]`` rollout (float, bool)."""
        done = rollout["done"]
        cfg = self.cfg
        returns = discounted_returns(rollout["reward"], done, cfg.gamma)
        mask = first_done_mask(done) if cfg.truncate_at_first_done else torch.ones_like(done)
        return group_relative_advantages(returns, mask, cfg.group_size, cfg.eps, cfg.advantage_norm), mask

    def update(self, rollout: TensorDict) -> dict[str, float]:
        """One GRPO update on a ``[T, N]`` rollout of an env that :meth:`check_env` accepted; see the class docstring."""
        advantages, mask = self.advantages(rollout)
        data = self._samples(rollout, "obs", "action", "sample_log_prob")
        data.set("advantages", advantages)
        data.set("mask", mask.float())
        if self.ref_policy is not None:
            data.set("ref_log_prob", self.reference_log_prob(rollout))
        stats, _ = self._optimise(data, weight=data["mask"])
        self.policy.update_obs_normalizer(rollout["obs"])
        stats.update(
            learning_rate=self.current_lr,
            live_fraction=float(world().mean(mask.float().mean(), "the all-reduce of live_fraction")),
        )
        return stats

    @torch.no_grad()
    def reference_log_prob(self, rollout: TensorDict) -> torch.Tensor:
        """The reference policy's log-probabilities of the rollout's actions, float32 ``[T, N]``.

        A recurrent reference steps through each env's whole rollout from its
        own zero state (:meth:`~rlchain.core.policies.Policy.initial_state`),
        zeroed after a step that ended an episode, as it would have acted: a
        GRPO rollout starts from a reset of every env, so zeros are its state
        at step 0, and the trained policy's stored ``hidden`` is another
        network's state. Forward passes of at most ``batch_size`` samples (a
        recurrent one: ``max(1, batch_size // T)`` whole envs).

        Args:
            rollout: a ``[T, N]`` rollout of the collector with ``obs``, ``action`` and ``done``.

        Raises:
            RuntimeError: without a reference (``kl_coef == 0``).
        """
        if self.ref_policy is None:
            raise RuntimeError("GRPO has no reference policy: kl_coef is 0")
        steps, n = rollout.batch_size
        data = rollout.select("obs", "action", "done")
        if self.recurrent:  # each env's whole rollout, envs in order, from the reference's zero state
            data.set("hidden", self.ref_policy.initial_state(n, rollout.device).expand(steps, n))
            chunks, dim = sequence_minibatches(data, steps, self.cfg.batch_size, generator=None), 1
        else:
            chunks, dim = self._minibatches(data, shuffled=False), 0
        log_prob = torch.cat([self.ref_policy.evaluate_actions(chunk)["sample_log_prob"] for chunk in chunks], dim)
        return log_prob.reshape(steps, n)

    def _minibatch_loss(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        """Masked clipped surrogate, entropy bonus and reference KL (from ``ref_log_prob``) of one minibatch."""
        m = batch["mask"]
        # Each rank divides its masked sums by the ranks' mean live count, so the mean of the ranks' gradients (and
        # terms) is the masked mean over every rank's live samples: one process's update on all the envs. The
        # ranks' live counts differ where episodes end at different steps.
        w = world()
        live = w.sum(m.sum(), "the all-reduce of the minibatch's live count").clamp_min(1.0) / w.world_size

        def masked_mean(x: torch.Tensor) -> torch.Tensor:
            return (x * m).sum() / live

        new = self.policy.evaluate_actions(batch)
        surrogate, approx_kl, clipped = clipped_surrogate(
            new["sample_log_prob"], batch["sample_log_prob"], batch["advantages"], self.cfg.clip_coef
        )
        policy_loss, entropy = masked_mean(surrogate), masked_mean(new["entropy"])
        loss = policy_loss - self.cfg.ent_coef * entropy
        if self.ref_policy is not None:
            q = batch["ref_log_prob"] - new["sample_log_prob"]
            ref_kl = masked_mean(q.exp() - q - 1)
            loss = loss + self.cfg.kl_coef * ref_kl
        else:
            ref_kl = torch.zeros((), device=loss.device)
        return {
            "loss": loss,
            "policy_loss": policy_loss,
            "entropy": entropy,
            "approx_ref_kl": ref_kl,
            "approx_kl": masked_mean(approx_kl),
            "clipfrac": masked_mean(clipped),
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
