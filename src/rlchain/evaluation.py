"""Deterministic evaluation of a policy: whole episodes from fixed start states, averaged."""

from __future__ import annotations

import math

import torch

from rlchain.collector import step_env
from rlchain.envs.base import VecEnv
from rlchain.policies import Policy

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(env: VecEnv, policy: Policy, num_episodes: int, seed: int) -> dict[str, float]:
    """Run deterministic episodes and average their outcomes.

    Every env of ``env`` runs ``ceil(num_episodes / num_envs)`` complete
    episodes from a reset with ``seed`` (the same start states at every
    evaluation); all of them count, so no bias towards short episodes. The
    done counters are read once per ``max_episode_steps`` steps.

    Returns:
        ``avg_reward`` (undiscounted episode return), ``avg_length`` (steps),
        ``success_rate`` (share of episodes whose last step reported success;
        only for an env whose ``reports_success`` is true), ``episodes``, and
        for every task metric its mean over the episodes' last steps (e.g. the
        final ``distance_to_goal``).

    Raises:
        RuntimeError: an env that does not end its episodes within
            ``max_episode_steps`` steps.
    """
    from tensordict import TensorDict  # imported where used: see rlchain.config

    was_training = policy.training
    policy.eval()
    n = env.num_envs
    per_env = math.ceil(num_episodes / n)
    obs, _ = env.reset(seed=seed)
    dev = env.device
    ret, length = torch.zeros(n, device=dev), torch.zeros(n, device=dev)
    finished = torch.zeros(n, dtype=torch.int64, device=dev)
    tot_ret, tot_len, tot_succ = (torch.zeros(n, device=dev) for _ in range(3))
    metric_sums: dict[str, torch.Tensor] = {}
    episode_limit = int(env.max_episode_steps)
    # Every env ends an episode at least every max_episode_steps steps.
    max_steps = per_env * episode_limit
    for step in range(1, max_steps + 1):
        action = policy.get_action(TensorDict({"obs": obs}, batch_size=[n]), deterministic=True)["action"]
        obs, reward, terminated, truncated, info = step_env(env, obs, action)
        done = terminated | truncated
        counts = done & (finished < per_env)
        ret += reward
        length += 1
        tot_ret += torch.where(counts, ret, 0.0)
        tot_len += torch.where(counts, length, 0.0)
        tot_succ += (counts & info["success"]).float()
        for name, value in info.get("metrics", {}).items():
            metric_sums[name] = metric_sums.get(name, torch.zeros(n, device=dev)) + torch.where(counts, value.float(), 0.0)
        finished += done.long()
        ret.masked_fill_(done, 0.0)
        length.masked_fill_(done, 0.0)
        if step % episode_limit == 0 and bool((finished >= per_env).all()):
            break
    else:
        if not bool((finished >= per_env).all()):
            raise RuntimeError(
                f"evaluation: some envs did not finish {per_env} episodes in {max_steps} steps; "
                f"does the env truncate at max_episode_steps={episode_limit}?"
            )
    if was_training:
        policy.train()
    total = n * per_env
    out = {"avg_reward": tot_ret.sum().item() / total, "avg_length": tot_len.sum().item() / total}
    if env.reports_success:
        out["success_rate"] = tot_succ.sum().item() / total
    out["episodes"] = float(total)
    out.update({name: value.sum().item() / total for name, value in metric_sums.items()})
    return out
