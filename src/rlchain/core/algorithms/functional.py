"""Pure functions for advantages and returns; every tensor is ``[T, N]`` (time, env)."""

from __future__ import annotations

import math

import torch

from rlchain.distributed import world

__all__ = [
    "ADVANTAGE_NORMS",
    "clipped_surrogate",
    "compute_gae",
    "discounted_returns",
    "first_done_mask",
    "group_relative_advantages",
]


def compute_gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) with correct episode ends.

    ``delta_t = r_t + gamma * (1 - terminated_t) * V(s'_t) - V(s_t)`` where
    ``s'_t`` is the state transition ``t`` ended in, so a time-limit truncation
    bootstraps from the value of its final observation and a true termination
    does not; ``A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}`` so no
    advantage leaks across an auto-reset.

    Args:
        reward, value, next_value: float ``[T, N]``; ``next_value[t]`` is
            ``V(s'_t)`` (the collector's ``next_value``).
        terminated, done: bool ``[T, N]``.
        gamma: discount in [0, 1]; gae_lambda: GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, float ``[T, N]``, ``returns = advantages + value``.
    """
    not_terminal = (~terminated).to(reward.dtype)
    not_done = (~done).to(reward.dtype)
    delta = reward + gamma * not_terminal * next_value - value
    decay = gamma * gae_lambda * not_done
    advantages = torch.empty_like(reward)
    last = torch.zeros_like(reward[0])
    for t in range(reward.shape[0] - 1, -1, -1):
        last = delta[t] + decay[t] * last
        advantages[t] = last
    return advantages, advantages + value


def discounted_returns(reward: torch.Tensor, done: torch.Tensor, gamma: float) -> torch.Tensor:
    """Step-wise discounted returns ``R_t = r_t + gamma * (1 - done_t) * R_{t+1}`` within the rollout.

    No bootstrap at the end of the rollout (``R_T = 0``): used by critic-free
    GRPO. Shapes: ``reward`` float ``[T, N]``, ``done`` bool ``[T, N]`` -> ``[T, N]``.
    """
    keep = gamma * (~done).to(reward.dtype)
    returns = torch.empty_like(reward)
    last = torch.zeros_like(reward[0])
    for t in range(reward.shape[0] - 1, -1, -1):
        last = reward[t] + keep[t] * last
        returns[t] = last
    return returns


def first_done_mask(done: torch.Tensor) -> torch.Tensor:
    """Bool ``[T, N]``: true up to and including each env's first done, false after it."""
    before = torch.cumsum(done.to(torch.int32), dim=0) - done.to(torch.int32)
    return before == 0


#: How :func:`group_relative_advantages` scales the group-centred returns.
ADVANTAGE_NORMS = ("std", "none", "rollout_std")


def group_relative_advantages(
    returns: torch.Tensor, mask: torch.Tensor, group_size: int, eps: float = 1e-8, norm: str = "std"
) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024), per time step.

    Envs ``[g * group_size, (g + 1) * group_size)`` form group ``g``. At each
    step the returns of a group's members that are still in ``mask`` are
    centred on their mean, then scaled by ``norm``:

    * ``"std"``: divided by the group's (population) standard deviation plus
      ``eps``, as in Shao et al. 2024;
    * ``"none"``: not scaled, as in Dr. GRPO (Liu et al. 2025, "Understanding
      R1-Zero-Like Training"), which removes the std's bias towards groups
      whose returns barely differ;
    * ``"rollout_std"``: divided by one standard deviation of every live
      centred return of the rollout plus ``eps``, so all groups share a scale
      (in a multi-process run: of every rank's rollout, a collective that
      every rank must call).

    A group whose live members' returns are all equal (a single live member,
    or identical returns) carries no signal: its advantages are exactly 0,
    not the rounding residue of its mean divided by an equally tiny std.
    Masked entries get 0.

    Args:
        returns: float ``[T, N]``; mask: bool ``[T, N]``; group_size divides ``N``.
        eps: added to the standard deviation (``"std"``, ``"rollout_std"``).
        norm: one of :data:`ADVANTAGE_NORMS`.

    Returns:
        float ``[T, N]`` advantages.

    Raises:
        ValueError: an unknown ``norm``.
    """
    if norm not in ADVANTAGE_NORMS:
        raise ValueError(f"norm={norm!r} is not allowed: expected one of {', '.join(map(repr, ADVANTAGE_NORMS))}")
    t, n = returns.shape
    r = returns.view(t, n // group_size, group_size)
    live = mask.view(t, n // group_size, group_size)
    m = live.to(returns.dtype)
    count = m.sum(-1, keepdim=True).clamp_min(1.0)
    mean = (r * m).sum(-1, keepdim=True) / count
    spread = torch.where(live, r, -math.inf).amax(-1, keepdim=True) - torch.where(live, r, math.inf).amin(
        -1, keepdim=True
    )
    signal = live & (spread > 0)  # false for empty, single-member and all-equal groups
    centred = torch.where(signal, r - mean, 0.0)
    if norm == "std":
        std = ((r - mean).square() * m).sum(-1, keepdim=True).div(count).sqrt()
        centred = torch.where(signal, centred / (std + eps), 0.0)  # no 0 / 0 where a group carries no signal
    elif norm == "rollout_std":
        sum_sq, live_count = world().sum(
            torch.stack([centred.square().sum(), signal.sum().to(centred.dtype)]), "the all-reduce of the rollout's std"
        )
        # No host read: a rollout of at most one live sample keeps its centred returns (zeros), on the device.
        centred = torch.where(live_count > 1, centred / (sum_sq.div(live_count).sqrt() + eps), centred)
    return centred.view(t, n)


def clipped_surrogate(
    new_log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip_coef: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample PPO-clip objective (Schulman et al. 2017, eq. 7) and its diagnostics.

    Args:
        new_log_prob, old_log_prob, advantages: float ``[B]``.
        clip_coef: the clipping range epsilon.

    Returns:
        ``(loss, approx_kl, clipped)``, each ``[B]``: ``max(-A r, -A clip(r, 1 -+ eps))``
        to minimise (differentiable), the ``(r - 1) - log r`` KL estimator and
        1.0 where ``|r - 1| > eps`` (both without gradient), ``r`` the probability ratio.
    """
    log_ratio = new_log_prob - old_log_prob
    ratio = log_ratio.exp()
    loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    with torch.no_grad():
        approx_kl = (ratio - 1) - log_ratio
        clipped = ((ratio - 1).abs() > clip_coef).float()
    return loss, approx_kl, clipped
