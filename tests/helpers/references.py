"""Plain references of the maths: per-env, per-step loops that tests hold the vectorised code against."""

from __future__ import annotations

import torch


def reference_gae(reward, value, next_value, terminated, truncated, gamma, lam):
    """Plain per-env, per-step loop: bootstrap on truncation, not on termination."""
    T, N = reward.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, n]:
                delta = reward[t, n] - value[t, n]
                running = delta
            elif truncated[t, n]:
                delta = reward[t, n] + gamma * next_value[t, n] - value[t, n]
                running = delta
            else:
                delta = reward[t, n] + gamma * next_value[t, n] - value[t, n]
                running = delta + gamma * lam * running
            adv[t, n] = running
    return adv


def reference_group_advantages(returns, mask, group_size, eps, norm):
    """Plain loops over steps and groups: centre on the live members' mean, then scale."""
    T, N = returns.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for t in range(T):
        for g in range(0, N, group_size):
            live = [n for n in range(g, g + group_size) if mask[t, n]]
            values = [float(returns[t, n]) for n in live]
            if len(values) < 2 or max(values) == min(values):
                continue
            mean = sum(values) / len(values)
            std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
            for n, v in zip(live, values):
                adv[t, n] = (v - mean) / (std + eps) if norm == "std" else v - mean
    if norm == "rollout_std":
        live = adv != 0
        adv[live] /= adv[live].pow(2).mean().sqrt() + eps
    return adv
