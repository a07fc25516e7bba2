"""Collection of rollouts: the policy acts in the batched env under ``no_grad``."""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from tensordict import TensorDict

from rlchain.buffer import RolloutBuffer
from rlchain.envs.base import VecEnv
from rlchain.policies import Policy

__all__ = ["SyncCollector"]


class SyncCollector:
    """Steps ``env`` with ``policy`` for ``rollout_steps`` steps and fills a :class:`RolloutBuffer`.

    The step loop never synchronises host and device: every per-step write is
    an in-place copy into preallocated storage, and episode statistics stay in
    the rollout (``episode_return``, ``episode_length``, ``success`` at ``done``
    steps) until :meth:`collect` reads them once at the end.

    Bootstrapping (Pardo et al. 2018): after the loop one batched critic
    forward over ``final_obs`` gives ``next_value``, the value of the state each
    transition ended in. Algorithms multiply it by ``1 - terminated``, so
    time-limit truncations bootstrap and true terminations do not.

    Args:
        env: a :class:`rlchain.envs.base.VecEnv`.
        policy: the acting policy, on ``env.device``.
        rollout_steps: steps per env per rollout ``T`` (> 0).
        stats_window: the moving averages cover the last ``stats_window``
            finished episodes, or every episode finished in the latest rollout
            when there were more (so the window is never a biased slice of
            one rollout, e.g. only the episodes cut at its last step).

    Raises:
        ValueError: non-positive ``rollout_steps``.
    """

    def __init__(self, env: VecEnv, policy: Policy, rollout_steps: int, stats_window: int = 100) -> None:
        self.env, self.policy = env, policy
        self.buffer = RolloutBuffer(
            rollout_steps, env.num_envs, env.single_observation_space, env.single_action_space, env.device
        )
        self.rollout_steps = rollout_steps
        n, dev = env.num_envs, env.device
        self._obs: torch.Tensor | None = None
        self._episode_return = torch.zeros(n, device=dev)
        self._episode_length = torch.zeros(n, dtype=torch.int64, device=dev)
        self.stats_window = stats_window
        self.episode_returns: deque[float] = deque()
        self.episode_lengths: deque[int] = deque()
        self.episode_successes: deque[bool] = deque()

    @torch.no_grad()
    def collect(self, reset_options: dict[str, Any] | None = None) -> TensorDict:
        """Collect one rollout and return the buffer's ``[T, N]`` TensorDict.

        Args:
            reset_options: when given, every env is reset with these options
                first (GRPO: ``{"group_size": G}``) and episodes in progress are
                dropped from the statistics. The first call always resets.

        Returns:
            the rollout; valid until the next call (the storage is reused).
            ``self.last_stats`` then holds the rollout's reward-term and metric
            means (keys ``rewards/<term>``, ``metrics/<name>``) as floats.
        """
        env, policy, data = self.env, self.policy, self.buffer.data
        if reset_options is not None or self._obs is None:
            self._obs, _ = env.reset(options=reset_options)
            self._episode_return.zero_()
            self._episode_length.zero_()
        obs = self._obs
        store = dict(data.items())  # plain tensors: per-step writes skip TensorDict dispatch
        sums: dict[str, torch.Tensor] = {}
        for t in range(self.rollout_steps):
            td = policy.get_action(TensorDict({"obs": obs}, batch_size=[env.num_envs]))
            next_obs, reward, terminated, truncated, info = env.step(td["action"])
            done = terminated | truncated
            self._episode_return += reward
            self._episode_length += 1
            for key, value in (
                ("obs", obs), ("action", td["action"]), ("sample_log_prob", td["sample_log_prob"]),
                ("value", td["value"]), ("reward", reward), ("terminated", terminated),
                ("truncated", truncated), ("done", done), ("final_obs", info["final_obs"]),
                ("episode_return", self._episode_return), ("episode_length", self._episode_length),
                ("success", info["success"]),
            ):  # fmt: skip
                store[key][t].copy_(value)
            for group in ("rewards", "metrics"):
                for name, value in info.get(group, {}).items():
                    key = f"{group}/{name}"
                    sums[key] = sums[key] + value if key in sums else value.clone()
            self._episode_return.masked_fill_(done, 0.0)
            self._episode_length.masked_fill_(done, 0)
            obs = next_obs
        self._obs = obs

        if getattr(policy, "has_critic", True):
            flat_final = data["final_obs"].reshape(-1, *data["final_obs"].shape[2:])
            final_value = policy.get_value(TensorDict({"obs": flat_final}, batch_size=[flat_final.shape[0]]))["value"]
            data["next_value"].copy_(final_value.view(self.rollout_steps, env.num_envs))
        else:
            data["next_value"].zero_()

        # One host read per rollout: the finished episodes and the term means.
        done = data["done"]
        finished = (data["episode_return"][done], data["episode_length"][done], data["success"][done])
        means = torch.stack([v.float().mean() / self.rollout_steps for v in sums.values()]) if sums else None
        returns, lengths, successes = (x.tolist() for x in finished)
        keep = max(self.stats_window, len(returns))
        for dq, new in ((self.episode_returns, returns), (self.episode_lengths, lengths), (self.episode_successes, successes)):
            dq.extend(new)
            while len(dq) > keep:
                dq.popleft()
        self.last_stats = dict(zip(sums, means.tolist())) if means is not None else {}
        return data

    def episode_stats(self) -> dict[str, float]:
        """Means over the episode window (see ``stats_window``; empty before the first episode)."""
        if not self.episode_returns:
            return {}
        k = len(self.episode_returns)
        return {
            "episode_reward_avg_100": sum(self.episode_returns) / k,
            "episode_length_avg_100": sum(self.episode_lengths) / k,
            "success_rate": sum(self.episode_successes) / k,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue collecting exactly where this collector stopped."""
        return {
            "obs": self._obs,
            "episode_return": self._episode_return,
            "episode_length": self._episode_length,
            "episode_returns": list(self.episode_returns),
            "episode_lengths": list(self.episode_lengths),
            "episode_successes": list(self.episode_successes),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self._obs = None if state["obs"] is None else state["obs"].to(self.env.device)
        self._episode_return.copy_(state["episode_return"])
        self._episode_length.copy_(state["episode_length"])
        for name in ("episode_returns", "episode_lengths", "episode_successes"):
            dq = getattr(self, name)
            dq.clear()
            dq.extend(state[name])
