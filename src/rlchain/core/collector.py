"""Collection of rollouts: the policy acts in the batched env under ``no_grad``, each step written into storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from rlchain.core import observations
from rlchain.core.buffer import RolloutBuffer
from rlchain.core.envs.base import VecEnv, info_terms
from rlchain.core.observations import Obs, leaves
from rlchain.core.policies import Policy
from rlchain.settings import SettingError

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = [
    "EpisodeWindow",
    "Episodes",
    "Rollout",
    "SyncCollector",
    "check_actions",
    "kept_state",
    "policy_input",
    "step_env",
]

#: The rollout keys the step loop copies when the policy has acted, and when the env has stepped (``done`` it
#: computes in place); ``obs`` stands for every group of a grouped observation, ``final_obs`` for the critic's.
_ACT_KEYS = ("obs", "action", "sample_log_prob", "value")
_STEP_KEYS = ("reward", "terminated", "truncated", "final_obs", "success")


def _rows(
    data: TensorDict, keys: tuple[str, ...], groups: dict[str, tuple[str, ...] | None]
) -> list[tuple[torch.Tensor, ...]]:
    """For each step ``t``, the views ``data[key][t]`` of ``keys``: an observation key gives each of its groups
    ``groups[key]`` (in that order, the step loop's)."""
    columns = [leaf.unbind(0) for key in keys for leaf in observations.leaves(data[key], groups.get(key))]
    return list(zip(*columns))


def _add_terms(sums: dict[str, torch.Tensor], env: VecEnv, info: dict[str, Any], first: bool) -> None:
    """Add one step's reward terms and task metrics (:func:`~rlchain.core.envs.base.info_terms` of ``info``: the
    declared ``[N, K]`` tensors or the dicts of ``[N]`` tensors) to ``sums``, float32 ``[N]`` per term, keys
    ``rewards/<term>`` and ``metrics/<name>``.

    The first step of a rollout sets the terms, which every later step must report.

    Raises:
        ValueError: a step that lacks a term of the first step.
    """
    if first:
        sums.clear()
        for group in ("rewards", "metrics"):
            if group in info:
                names, values = info_terms(env, info, group)
                columns = values.float().clone().unbind(-1)  # one [N, K] total; sums holds its columns
                sums.update({f"{group}/{name}": column for name, column in zip(names, columns)})
        return
    steps: dict[str, dict[str, torch.Tensor]] = {}  # this step's columns by name, per group
    for key, total in sums.items():
        group, name = key.split("/", 1)
        if group not in steps:
            names, values = info_terms(env, info, group) if group in info else ((), None)
            steps[group] = dict(zip(names, values.unbind(-1))) if names else {}
        try:
            total.add_(steps[group][name])
        except KeyError:
            raise ValueError(
                f"info[{group!r}][{name!r}] is missing at some step: an env must report the same terms every step"
            ) from None


def step_env(env: VecEnv, obs: Obs, action: torch.Tensor) -> tuple:
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
        _trace_rejected_action(env, obs, err)


def check_actions(env: VecEnv, obs: Obs) -> None:
    """``env.check_actions()`` (an env that checks its actions on the device raises here, once per rollout), with
    the rejection traced to a non-finite observation as :func:`step_env` does; ``obs`` are the observations the
    policy acted on since the last check (e.g. a rollout's ``[T, N]`` storage).

    Raises:
        ValueError: the env's error, or one that names the observation when ``obs`` is not finite.
    """
    try:
        env.check_actions()
    except ValueError as err:
        _trace_rejected_action(env, obs, err)


def _trace_rejected_action(env: VecEnv, obs: Obs, err: ValueError) -> NoReturn:
    if observations.all_finite(obs):
        raise err
    raise ValueError(
        f"observation contains NaN or inf: {type(env).__name__} returned a non-finite observation, "
        f"and the policy's action from it was rejected ({err})"
    ) from err


def policy_input(obs: Obs, hidden: TensorDict | None) -> TensorDict:
    """What the policy acts on: ``obs`` ``[B, ...]`` (a tensor or a TensorDict of groups) and, for a recurrent
    policy, its state ``hidden`` (None for a feed-forward one), a TensorDict of batch size ``[B]``."""
    from tensordict import TensorDict  # imported where used: see rlchain.commands.config

    batch = [leaves(obs)[0].shape[0]]
    return TensorDict({"obs": obs} if hidden is None else {"obs": obs, "hidden": hidden}, batch_size=batch)


def kept_state(hidden: TensorDict, keep: torch.Tensor) -> TensorDict:
    """A recurrent policy's state ``hidden`` (batch size ``[N]``) zeroed in the envs where ``keep`` (bool or 0/1
    ``[N]``) is false, those whose episode ended (their next observation is a new episode's first): new tensors, no
    host sync."""
    from tensordict import TensorDict  # imported where used: see rlchain.commands.config

    kept = {k: v * keep.view(-1, *(1,) * (v.dim() - 1)) for k, v in hidden.items()}
    return TensorDict(kept, batch_size=hidden.batch_size)


@dataclass
class Episodes:
    """Finished episodes, in step order: undiscounted ``returns``, ``lengths`` (steps), ``successes``."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)


@dataclass
class Rollout:
    """What :meth:`SyncCollector.collect` returns: one rollout and what the trainer logs of it."""

    data: TensorDict
    """The ``[T, N]`` storage (see :class:`~rlchain.core.buffer.RolloutBuffer`); valid until the next collect."""
    episodes: Episodes
    """The episodes the rollout's statistics count (see :meth:`SyncCollector.collect`)."""
    term_means: dict[str, float]
    """Rollout means of the env's reward terms and task metrics, ``rewards/<term>`` and ``metrics/<name>``."""


class SyncCollector:
    """Steps ``env`` with ``policy`` for ``rollout_steps`` steps and fills a :class:`RolloutBuffer`.

    Each step the policy acts (:meth:`~rlchain.core.policies.Policy.get_action`),
    the env steps, and what both returned is written into the step's row of
    the preallocated storage, with the running episode return and length
    (plain in-place ops on the device). The step loop never synchronises host
    and device; :meth:`collect` reads the rollout's finished episodes to the
    host once at its end.

    Bootstrapping (Pardo et al. 2018): ``next_value[t]`` is the value of the
    state transition ``t`` ended in. For a running episode that is the next
    step's observation, whose value the policy already returned with its
    action (``value[t + 1]``; one critic forward on the last observation for
    ``t = T - 1``); for a done row it is ``V(final_obs)``, from one critic
    forward over the done rows of the rollout, the only rows where the
    :class:`~rlchain.core.envs.base.VecEnv` contract gives ``final_obs`` a meaning.
    Algorithms multiply it by ``1 - terminated``, so time-limit truncations
    bootstrap and true terminations do not.

    A recurrent policy (:attr:`~rlchain.core.policies.Policy.is_recurrent`)
    acts from each env's state, which the collector carries from step to
    step and across rollouts, stores before each step (``hidden``) and zeroes
    where an episode ended (the state that sees the auto-reset's first
    observation is fresh); a reset of every env zeroes it too. A done row's
    ``V(final_obs)`` reads the state after that step (``final_hidden``), the
    state that would have seen ``final_obs``; it is stored only for a critic
    that reads a state (:attr:`~rlchain.core.policies.Policy.recurrent_critic`).

    Args:
        env: a :class:`rlchain.core.envs.base.VecEnv`.
        policy: the acting policy, on ``env.device``.
        rollout_steps: steps per env per rollout ``T`` (> 0).
        reset_options: when given, every rollout starts by resetting every env
            with these options (GRPO: ``{"group_size": G}``, see
            :attr:`rlchain.core.algorithms.Algorithm.reset_options`); otherwise
            episodes run on across rollouts. The first rollout always resets.
        spread_episode_starts: after the first reset (without ``reset_options``), move every env to a random
            step of its episode (:meth:`~rlchain.core.envs.base.VecEnv.spread_episode_starts`), so that the
            time limits of its episodes fall at different steps.

    Raises:
        SettingError: non-positive ``rollout_steps``; with ``reset_options``,
            a ``rollout_steps`` below the env's ``max_episode_steps`` (an
            episode longer than the rollout would never end), or
            ``spread_episode_starts`` (every rollout starts from a reset);
            ``spread_episode_starts`` with an env that cannot (``spreads_episode_starts`` False).
    """

    def __init__(
        self,
        env: VecEnv,
        policy: Policy,
        rollout_steps: int,
        reset_options: dict[str, Any] | None = None,
        spread_episode_starts: bool = False,
    ) -> None:
        if reset_options is not None and spread_episode_starts:
            raise SettingError(
                "spread_episode_starts",
                True,
                " is not allowed with an algorithm that resets every env when a rollout starts (GRPO): expected false",
            )
        if spread_episode_starts and not env.spreads_episode_starts:
            raise SettingError(
                "spread_episode_starts",
                True,
                f" is not allowed with {type(env).__name__}, which cannot move its episodes' step counts "
                "(VecEnv.spread_episode_starts): expected false",
            )
        self.spread_episode_starts = spread_episode_starts
        if reset_options is not None and rollout_steps < env.max_episode_steps:
            raise SettingError(
                "rollout_steps",
                rollout_steps,
                f" is shorter than the env's time limit (max_episode_steps={env.max_episode_steps}): the algorithm "
                "resets every env when a rollout starts, so an episode longer than the rollout would never end "
                f"(no whole-episode return, no success); expected rollout_steps >= {env.max_episode_steps}",
            )
        self.env, self.policy, self.reset_options = env, policy, reset_options
        self.act = policy.get_action
        """The acting forward pass (``policy.get_action``; compiled by :meth:`compile`)."""
        space = env.single_observation_space
        self._groups = observations.group_names(space)
        """The observation's group names in the storage's order (None for a flat observation)."""
        self._final_groups = self._groups
        """The groups kept of each final observation: those the critic reads (none without a critic)."""
        if self._groups is not None:
            critic = getattr(policy, "critic_groups", None) if policy.has_critic else ()
            self._final_groups = tuple(g for g in self._groups if critic is None or g in critic)
        recurrent = getattr(policy, "is_recurrent", False)
        hidden = policy.initial_state(env.num_envs, env.device) if recurrent else None
        self.buffer = RolloutBuffer(
            rollout_steps,
            env.num_envs,
            space,
            env.single_action_space,
            env.device,
            final_obs_groups=self._final_groups,
            hidden=hidden,
            final_hidden=bool(getattr(policy, "recurrent_critic", recurrent and policy.has_critic)),
        )
        # The storage's rows, one view per step and key, made once: each step is written into place.
        data = self.buffer.data
        self._acted_rows = _rows(data, _ACT_KEYS, {"obs": self._groups})
        self._stepped_rows = _rows(data, _STEP_KEYS, {"final_obs": self._final_groups})
        self._tally_rows = list(zip(*(data[key].unbind(0) for key in ("done", "episode_return", "episode_length"))))
        self._hidden: TensorDict | None = hidden
        """Each env's state before the next step (a recurrent policy's; None otherwise)."""
        self._hidden_keys = tuple(hidden.keys()) if hidden is not None else ()
        self._hidden_rows = _rows(data, ("hidden",), {"hidden": self._hidden_keys}) if hidden is not None else []
        self._final_hidden_rows = (
            _rows(data, ("final_hidden",), {"final_hidden": self._hidden_keys}) if "final_hidden" in data.keys() else []
        )
        n, dev = env.num_envs, env.device
        self._obs: Obs | None = None
        self._episode_return = torch.zeros(n, dtype=torch.float64, device=dev)  # float64: long sums do not drift
        self._episode_length = torch.zeros(n, dtype=torch.int64, device=dev)
        self._running = torch.ones(n, dtype=torch.int64, device=dev)  # 1 where an episode goes on into the next step
        self._one = torch.ones((), dtype=torch.int64, device=dev)

    @torch.no_grad()
    def compile(self) -> None:
        """Compile the acting forward pass with ``torch.compile`` (``trainer.compile``) and run it once on zeros.

        The run's random streams are left as they were (the warm-up's draws are forked off).

        Raises:
            Exception: what compiling raises (e.g. torch's ``InductorError`` without a C++ compiler).
        """
        self.act = torch.compile(self.policy.get_action)
        obs = self.buffer.data["obs"][0].clone().zero_()
        with torch.random.fork_rng(devices=[self.env.device] if self.env.device.type == "cuda" else []):
            self.act(policy_input(obs, self._hidden))

    @torch.no_grad()
    def collect(self) -> Rollout:
        """Collect one rollout.

        Returns:
            the buffer's ``[T, N]`` TensorDict (valid until the next call: the
            storage is reused), the episodes it counts and the means of the
            env's reward terms and metrics (:class:`Rollout`). The episodes
            counted: without ``reset_options`` (episodes run on across
            rollouts) every episode that ended in the rollout; with them
            (every rollout starts with a reset) only the first episode of each
            env, whatever its length (a later one ends inside the rollout only
            when it is short, so counting it would favour short episodes; the
            episode still running at the end is dropped by the next reset).

        Raises:
            ValueError: the env's error for a bad action (see :func:`step_env`),
                or an ``info["rewards"]``/``info["metrics"]`` term that some
                step lacks.
        """
        env, data = self.env, self.buffer.data
        if self.reset_options is not None or self._obs is None:
            self._obs, _ = env.reset(options=self.reset_options)
            if self.spread_episode_starts:
                env.spread_episode_starts()
            self._restart_episodes()
        obs, hidden = self._obs, self._hidden
        # Step t's episode return and length: the previous step's times `running` (0 where an
        # episode ended there), plus this step's reward and 1; before step 0, the carried episode.
        ret, length, running = self._episode_return, self._episode_length, self._running.fill_(1)
        term_sums: dict[str, torch.Tensor] = {}
        for t, (acted, stepped, (done_row, ret_row, length_row)) in enumerate(
            zip(self._acted_rows, self._stepped_rows, self._tally_rows)
        ):
            step = self.act(policy_input(obs, hidden))
            action = step["action"]
            # Stored before the env steps: an env may reuse its buffers for the next step.
            torch._foreach_copy_(acted, (*leaves(obs, self._groups), action, step["sample_log_prob"], step["value"]))
            if hidden is not None:
                torch._foreach_copy_(self._hidden_rows[t], leaves(hidden, self._hidden_keys))
                hidden = step["next_hidden"]
                if self._final_hidden_rows:
                    torch._foreach_copy_(self._final_hidden_rows[t], leaves(hidden, self._hidden_keys))
            next_obs, reward, terminated, truncated, info = step_env(env, obs, action)
            torch._foreach_copy_(
                stepped,
                (reward, terminated, truncated, *leaves(info["final_obs"], self._final_groups), info["success"]),
            )
            ret = torch.addcmul(reward, ret, running, out=ret_row)
            length = torch.addcmul(self._one, length, running, out=length_row)
            torch.logical_not(torch.logical_or(terminated, truncated, out=done_row), out=running)
            if hidden is not None:  # a fresh state where an episode ended (the env reset it in this step)
                hidden = kept_state(hidden, running)
            _add_terms(term_sums, env, info, first=t == 0)
            obs = next_obs
        # The carries into the next rollout: zero where an episode just ended.
        torch.mul(ret, running, out=self._episode_return)
        torch.mul(length, running, out=self._episode_length)
        self._obs, self._hidden = obs, hidden
        check_actions(env, data["obs"])  # the rollout's one read of an env's deferred action check
        self._bootstrap_values(data, obs)

        # One host read per rollout: the counted episodes and the term means.
        counted = data["done"]
        if self.reset_options is not None:
            counted = counted & (counted.cumsum(0) == 1)  # each env's first episode
        finished = (data["episode_return"][counted], data["episode_length"][counted], data["success"][counted])
        episodes = Episodes(*(x.tolist() for x in finished))
        means = torch.stack(list(term_sums.values())).sum(-1, dtype=torch.float64) / data.numel() if term_sums else None
        return Rollout(data, episodes, dict(zip(term_sums, means.tolist())) if means is not None else {})

    def _bootstrap_values(self, data: TensorDict, last_obs: Obs) -> None:
        """Fill ``next_value`` ``[T, N]``: ``V(s'_t)`` for every transition (see the class docstring).

        Args:
            data: the rollout, with ``value``, ``done`` and ``final_obs`` filled.
            last_obs: ``[N, *obs_shape]`` (or a TensorDict of groups), the observation after the rollout's last step.
        """
        next_value = data["next_value"]
        if not self.policy.has_critic:
            next_value.zero_()
            return
        value = lambda x, h: self.policy.get_value(policy_input(x, h))["value"]  # noqa: E731
        next_value[:-1].copy_(data["value"][1:])
        next_value[-1].copy_(value(last_obs, self._hidden))
        # One host read per rollout: which rows ended (their count sizes the forward).
        ended = data["done"].nonzero(as_tuple=True)
        if ended[0].numel():
            final_hidden = data["final_hidden"][ended] if self._final_hidden_rows else None
            next_value[ended] = value(data["final_obs"][ended], final_hidden)

    def _restart_episodes(self) -> None:
        """Carry no episode (and no recurrent state) into the next rollout (every env was just reset)."""
        self._episode_return.zero_()
        self._episode_length.zero_()
        if self._hidden is not None:
            self._hidden = self._hidden.clone().zero_()

    def restart(self) -> None:
        """Start afresh: reset every env before the next rollout and carry no episode into it.

        For a resume whose env could not restore its state: the saved
        observation and episode carries belong to an env state that is gone.
        """
        self._obs = None
        self._restart_episodes()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue collecting exactly where this collector stopped."""
        obs = observations.to_state(self._obs)
        state = {"obs": obs, "episode_return": self._episode_return, "episode_length": self._episode_length}
        if self._hidden is not None:
            state["hidden"] = observations.to_state(self._hidden)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Raises:
            ValueError: a recurrent policy's collector from a state without the policy's ``hidden`` keys (one
                saved with another policy), naming the keys.
        """
        self._obs = observations.from_state(state["obs"], self.env.num_envs, self.env.device)
        self._episode_return.copy_(state["episode_return"])
        self._episode_length.copy_(state["episode_length"])
        if self._hidden is not None:
            saved = state.get("hidden") or {}
            if set(saved) != set(self._hidden_keys):
                raise ValueError(
                    f"the collector's saved recurrent state has keys {sorted(saved)}, the policy's are "
                    f"{sorted(self._hidden_keys)}: it was saved with another policy"
                )
            self._hidden = observations.from_state(saved, self.env.num_envs, self.env.device)


class EpisodeWindow:
    """The finished episodes that the ``charts/episodic_*`` statistics average.

    Every episode that ended in the latest rollout counts and, when fewer than
    ``min_episodes`` ended, the latest ones before it, up to ``min_episodes``.
    A rollout's finished episodes are never cut to a slice of it: the last
    ``k`` of a rollout would be those that ended at its last steps, e.g. the
    time-limit truncations when every env starts together (GRPO).

    Args:
        min_episodes: see ``trainer.stats_min_episodes`` (> 0).
    """

    def __init__(self, min_episodes: int) -> None:
        self.min_episodes = min_episodes
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.successes: list[bool] = []

    def add(self, episodes: Episodes) -> None:
        """Add a rollout's episodes (:attr:`Rollout.episodes`) and drop those out of the window."""
        keep = max(self.min_episodes, len(episodes.returns))
        for kept, new in (
            (self.returns, episodes.returns),
            (self.lengths, episodes.lengths),
            (self.successes, episodes.successes),
        ):
            kept.extend(new)
            del kept[: max(0, len(kept) - keep)]

    def means(self, success: bool) -> dict[str, float]:
        """``charts/episodic_return`` and ``charts/episodic_length`` (steps), and with ``success``
        ``charts/success_rate``, over the window; empty before the first episode ended."""
        k = len(self.returns)
        if not k:
            return {}
        stats = {"charts/episodic_return": sum(self.returns) / k, "charts/episodic_length": sum(self.lengths) / k}
        if success:
            stats["charts/success_rate"] = sum(self.successes) / k
        return stats

    def state_dict(self) -> dict[str, list]:
        """The episodes in the window."""
        return {"returns": list(self.returns), "lengths": list(self.lengths), "successes": list(self.successes)}

    def load_state_dict(self, state: dict[str, list]) -> None:
        """Restore :meth:`state_dict` output."""
        self.returns, self.lengths, self.successes = (
            list(state["returns"]),
            list(state["lengths"]),
            list(state["successes"]),
        )
