"""Collection of rollouts: the policy acts in the batched env under ``no_grad``."""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from tensordict import TensorDict

from rlchain.buffer import RolloutBuffer
from rlchain.envs.base import VecEnv
from rlchain.policies import Policy, resolve_act

__all__ = ["SyncCollector", "step_env"]

#: The per-step rollout keys, in the order the step loop records them.
_STEP_KEYS = ("obs", "action", "sample_log_prob", "value", "reward", "terminated", "truncated", "final_obs", "success")


def _term_means(infos: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Rollout means (0-d float32) of every ``info["rewards"]`` and ``info["metrics"]`` entry.

    Keys are ``rewards/<term>`` and ``metrics/<name>``; the terms are those of
    the first step, which every step must report.

    Raises:
        ValueError: a step that lacks a term of the first step.
    """
    first = infos[0]
    means = {}
    for group in ("rewards", "metrics"):
        for name in first.get(group, {}):
            try:
                column = [info[group][name] for info in infos]
            except KeyError:
                raise ValueError(
                    f"info[{group!r}][{name!r}] is missing at some step: an env must report the same terms every step"
                ) from None
            means[f"{group}/{name}"] = torch.stack(column).float().mean()
    return means


def step_env(env: VecEnv, obs: torch.Tensor, action: torch.Tensor) -> tuple:
    """``env.step(action)``, with an env's rejection of a non-finite action traced to its cause.

    A policy turns NaN or inf observations into NaN actions, which the env
    then rejects as actions; the real fault is the env's observation. The
    check costs nothing on the normal path: ``obs`` is inspected only once
    ``step`` has raised.

    Raises:
        ValueError: ``env.step``'s own error, or, when ``obs`` (what the
            policy acted on) is not finite, one that names the observation.
    """
    try:
        return env.step(action)
    except ValueError as err:
        if bool(torch.isfinite(obs).all()):
            raise
        raise ValueError(
            f"observation contains NaN or inf: {type(env).__name__} returned a non-finite observation, "
            f"and the policy's action from it was rejected ({err})"
        ) from err


class SyncCollector:
    """Steps ``env`` with ``policy`` for ``rollout_steps`` steps and fills a :class:`RolloutBuffer`.

    The step loop never synchronises host and device and does no bookkeeping:
    it calls the policy (its tensor form, :meth:`~rlchain.policies.Policy.act`)
    and the env and keeps references to what they return.
    After the loop one ``torch.stack`` per key writes the preallocated storage,
    and ``episode_return``/``episode_length`` are computed for the whole
    rollout at once from rewards and dones; :meth:`collect` reads the finished
    episodes to the host once at the end. This relies on the
    :class:`~rlchain.envs.base.VecEnv` contract that returned tensors are not
    modified by later steps (policies' outputs likewise). The price is memory:
    until the stacks, the step tensors of one rollout are alive next to the
    storage, so peak rollout memory is about twice the buffer's.

    Bootstrapping (Pardo et al. 2018): ``next_value[t]`` is the value of the
    state transition ``t`` ended in. For a running episode that is the next
    step's observation, whose value the policy already returned with its
    action (``value[t + 1]``; one critic forward on the last observation for
    ``t = T - 1``); for a done row it is ``V(final_obs)``, from one critic
    forward over the done rows only, the only rows where the
    :class:`~rlchain.envs.base.VecEnv` contract gives ``final_obs`` a meaning.
    Algorithms multiply it by ``1 - terminated``, so time-limit truncations
    bootstrap and true terminations do not.

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
        self._episode_return = torch.zeros(n, dtype=torch.float64, device=dev)  # float64, as the reward sums
        self._episode_length = torch.zeros(n, dtype=torch.int64, device=dev)
        # Scratch of _episode_statistics, allocated once. Its ops run once per
        # rollout but with caches cold from stepping the env, so each one counts.
        self._step1 = torch.arange(1, rollout_steps + 1, device=dev).unsqueeze(1)  # [T, 1]: t + 1
        self._mark = torch.empty(rollout_steps + 1, n, dtype=torch.int64, device=dev)
        self._cum_reward = torch.empty(rollout_steps + 1, n, dtype=torch.float64, device=dev)
        self._cummax = (torch.empty_like(self._mark), torch.empty_like(self._mark))
        self._no_start = torch.tensor(torch.iinfo(torch.int64).min, device=dev)  # below every start
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
        obs, act = self._obs, resolve_act(policy)
        # The loop only keeps references; after it, one stack per key writes the
        # storage (T times fewer copies than writing every step).
        steps: list[tuple[torch.Tensor, ...]] = []
        infos: list[dict[str, Any]] = []
        for _ in range(self.rollout_steps):
            action, sample_log_prob, value = act(obs)
            next_obs, reward, terminated, truncated, info = step_env(env, obs, action)
            steps.append((obs, action, sample_log_prob, value, reward, terminated, truncated,
                          info["final_obs"], info["success"]))  # fmt: skip
            infos.append(info)
            obs = next_obs
        self._obs = obs
        for key, column in zip(_STEP_KEYS, zip(*steps)):
            torch.stack(column, out=data[key])
        del steps
        torch.logical_or(data["terminated"], data["truncated"], out=data["done"])
        self._episode_statistics(data)

        self._bootstrap_values(data, obs)

        # One host read per rollout: the finished episodes and the term means.
        term_means = _term_means(infos)
        del infos
        done = data["done"]
        finished = (data["episode_return"][done], data["episode_length"][done], data["success"][done])
        returns, lengths, successes = (x.tolist() for x in finished)
        keep = max(self.stats_window, len(returns))
        for dq, new in ((self.episode_returns, returns), (self.episode_lengths, lengths), (self.episode_successes, successes)):
            dq.extend(new)
            while len(dq) > keep:
                dq.popleft()
        self.last_stats = dict(zip(term_means, torch.stack(list(term_means.values())).tolist())) if term_means else {}
        return data

    def _bootstrap_values(self, data: TensorDict, last_obs: torch.Tensor) -> None:
        """Fill ``next_value`` ``[T, N]``: ``V(s'_t)`` for every transition (see the class docstring).

        Args:
            data: the rollout, with ``value``, ``done`` and ``final_obs`` filled.
            last_obs: ``[N, *obs_shape]``, the observation after the rollout's last step.
        """
        next_value = data["next_value"]
        if not getattr(self.policy, "has_critic", True):
            next_value.zero_()
            return
        value = lambda x: self.policy.get_value(TensorDict({"obs": x}, batch_size=x.shape[:1]))["value"]  # noqa: E731
        next_value[:-1].copy_(data["value"][1:])
        next_value[-1].copy_(value(last_obs))
        # One host read per rollout: which rows ended (their count sizes the forward).
        ended = data["done"].nonzero(as_tuple=True)
        if ended[0].numel():
            next_value[ended] = value(data["final_obs"][ended])

    def _episode_statistics(self, data: TensorDict) -> None:
        """Fill ``episode_return`` and ``episode_length`` of the rollout from its rewards and dones.

        Step ``t`` of env ``n`` belongs to the episode that began after the
        latest ``done`` before ``t`` or, without one, to the episode carried in
        from the previous rollout, which began ``episode_length`` (the carry)
        steps before step 0 and brings its return so far. Rewards are summed
        in float64, so returns do not drift over long rollouts. Vectorised over
        ``[T, N]``: a dozen tensor ops, no step loop.
        """
        reward, done = data["reward"], data["done"]
        # mark[t + 1] = t + 1 where an episode ended at t (the next one starts
        # there), else the int64 minimum; mark[0] = the carried episode's start
        # (<= 0). Its running max over rows 0..t is the start of step t's episode.
        mark = self._mark
        torch.neg(self._episode_length, out=mark[0])
        torch.where(done, self._step1, self._no_start, out=mark[1:])
        start = torch.cummax(mark, dim=0, out=self._cummax).values[:-1]  # [T, N]
        torch.sub(self._step1, start, out=data["episode_length"])
        # cum[t + 1] = rewards of steps 0..t; cum[0] = minus the carried return,
        # so the carried episode (the only one with start <= 0) gets it added.
        cum = self._cum_reward
        torch.neg(self._episode_return, out=cum[0])
        torch.cumsum(reward, dim=0, dtype=torch.float64, out=cum[1:])
        cum_at_start = cum.gather(0, start.clamp(min=0))
        torch.sub(cum[1:], cum_at_start, out=data["episode_return"])
        # The carries into the next rollout: zero where an episode just ended.
        last_done = done[-1]
        torch.sub(cum[-1], cum_at_start[-1], out=self._episode_return).masked_fill_(last_done, 0.0)
        self._episode_length.copy_(data["episode_length"][-1]).masked_fill_(last_done, 0)

    def episode_stats(self) -> dict[str, float]:
        """Means over the episode window (see ``stats_window``; empty before the first episode).

        ``success_rate`` only for an env whose ``reports_success`` is true.
        """
        if not self.episode_returns:
            return {}
        k = len(self.episode_returns)
        stats = {
            "episode_reward_avg_100": sum(self.episode_returns) / k,
            "episode_length_avg_100": sum(self.episode_lengths) / k,
        }
        if getattr(self.env, "reports_success", True):
            stats["success_rate"] = sum(self.episode_successes) / k
        return stats

    def restart(self) -> None:
        """Start afresh: reset every env before the next rollout and carry no episode into it.

        For a resume whose env could not restore its state: the saved
        observation and episode carries belong to an env state that is gone.
        The finished episodes of the statistics window are kept.
        """
        self._obs = None
        self._episode_return.zero_()
        self._episode_length.zero_()

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
