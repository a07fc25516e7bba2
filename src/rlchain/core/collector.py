"""Collection of rollouts: the policy acts in the batched env under ``no_grad``, each step written into storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from rlchain.core import observations
from rlchain.core.buffer import RolloutBuffer
from rlchain.core.compiling import STEP_COMPILE_OPTIONS, Step
from rlchain.core.envs.base import VecEnv
from rlchain.core.policies import Policy
from rlchain.core.stepping import EnvStepper, check_actions, policy_input, step_env
from rlchain.settings import SettingError

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = [
    "EpisodeWindow",
    "Episodes",
    "Rollout",
    "SyncCollector",
    "check_actions",
    "policy_input",
    "step_env",
]


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

    Each step is one :meth:`_collect_step`: the policy acts, the env steps and
    the running episode return and length are tallied (:class:`~rlchain.core.stepping.EnvStepper`,
    the step evaluation runs too), and what they returned is written into the
    step's row of the preallocated storage (``index_copy_`` at a step counter
    kept on the device), the env's reward terms and metrics added to fixed
    ``[N, K]`` sums. The step reads nothing on the host and branches on no
    tensor; it is :attr:`step`, which ``trainer.compile`` compiles whole where the env's step compiles.
    :meth:`collect` reads the rollout's finished episodes to the host once at
    its end.

    Bootstrapping (Pardo et al. 2018): ``next_value[t]`` is the value of the
    state transition ``t`` ended in. For a running episode that is the next
    step's observation, whose value the policy already returned with its
    action (``value[t + 1]``; one critic forward on the last observation for
    ``t = T - 1``); for a done row it is ``V(final_obs)``, the only rows where the
    :class:`~rlchain.core.envs.base.VecEnv` contract gives ``final_obs`` a meaning: the
    critic reads every row's ``final_obs`` (fixed shapes, in chunks of whole
    steps) and ``torch.where`` keeps the done rows' values.
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
        self.stepper = EnvStepper(env, policy)
        """The act -> env.step -> tally step and its buffers (the current observation, the recurrent state)."""
        space = env.single_observation_space
        self._groups = observations.group_names(space)
        """The observation's group names in the storage's order (None for a flat observation)."""
        self._final_groups = self._groups
        """The groups kept of each final observation: those the critic reads (none without a critic)."""
        if self._groups is not None:
            critic = getattr(policy, "critic_groups", None) if policy.has_critic else ()
            self._final_groups = tuple(g for g in self._groups if critic is None or g in critic)
        hidden = self.stepper.hidden
        self.buffer = RolloutBuffer(
            rollout_steps,
            env.num_envs,
            space,
            env.single_action_space,
            env.device,
            final_obs_groups=self._final_groups,
            hidden=policy.initial_state(env.num_envs, env.device) if hidden is not None else None,
            final_hidden=bool(getattr(policy, "recurrent_critic", hidden is not None and policy.has_critic)),
        )
        data = self.buffer.data
        self._hidden_keys = tuple(hidden) if hidden is not None else ()
        self._final_hidden = "final_hidden" in data.keys()
        n, dev = env.num_envs, env.device
        self._t = torch.zeros(1, dtype=torch.int64, device=dev)
        """The row the next step writes, on the device (a compiled or captured step reads it there)."""
        self._fresh = True
        """Whether the next collect must reset every env first (the first rollout; after :meth:`restart`)."""
        self._term_names: dict[str, tuple[str, ...]] = {}
        self._term_sums: dict[str, torch.Tensor] = {}
        """Per group (``rewards``, ``metrics``): the names and float32 ``[N, K]`` sums of the rollout's steps."""
        for group, attribute in (("rewards", "reward_terms"), ("metrics", "metric_names")):
            names = getattr(env, attribute, None)
            if names is not None:  # declared: fixed from the start
                self._term_names[group] = tuple(names)
                self._term_sums[group] = torch.zeros(n, len(names), device=dev)
        self.step = Step(
            "collection step",
            self._collect_step,
            dev,
            warm_up=self._warm_up,
            snapshot=self._snapshot,
            restore=self._restore,
            blocker=self._blocker(),
            part=self._compile_act,
            options=STEP_COMPILE_OPTIONS,
        )
        """The collection step the rollout loop runs (:meth:`_collect_step`), a
        :class:`~rlchain.core.compiling.Step`: ``trainer.compile`` compiles it whole where the env's step compiles
        (else the policy's acting pass alone), ``trainer.cudagraphs`` captures it."""

    def _blocker(self) -> str | None:
        """Why the whole collection step cannot compile with ``fullgraph=True``, or None when it can: the env's
        step must compile (``env.compiles_step``) and declare its reward terms and metrics; a recurrent policy
        replays sequences with a host read (its acting pass alone compiles)."""
        if not getattr(self.env, "compiles_step", False):
            return f"{type(self.env).__name__} steps outside torch's compiler (VecEnv.compiles_step is false)"
        if set(self._term_names) != {"rewards", "metrics"}:
            return f"{type(self.env).__name__} does not declare its reward_terms and metric_names"
        if self.stepper.hidden is not None:
            return "a recurrent policy's step is not compiled whole yet"
        return None

    def _compile_act(self, compile_fn: Any) -> None:
        """Where the whole step cannot compile: the policy's acting pass alone (:meth:`EnvStepper.act`)."""
        self.stepper.act = compile_fn(self.stepper.act)

    @torch.no_grad()
    def _warm_up(self) -> None:
        """What :attr:`step`'s compile warms up with: a rollout's first step, as :meth:`collect` runs it; where only
        the acting pass compiled (an env stepping outside torch's compiler), that pass alone, the env untouched."""
        if self.step.mode == "part":
            self.stepper.act(self.stepper.obs, self.stepper.hidden)
            return
        self._start_rollout()
        self.step()

    def _snapshot(self) -> tuple[Any, ...]:
        """What a warm-up changes, as copies, which :meth:`_restore` puts back: the policy's action stream (where
        it draws from one) and, where the warm-up stepped the env, the env's and the collector's state."""
        import copy

        rng = getattr(self.stepper.policy, "action_rng", None)
        stream = None if rng is None else rng.state.clone()
        if self.step.mode == "part":
            return stream, None
        return stream, (copy.deepcopy(self.env.state_dict()), copy.deepcopy(self.state_dict()))

    def _restore(self, saved: tuple[Any, ...]) -> None:
        stream, stepped = saved
        if stream is not None:
            self.stepper.policy.action_rng.state.copy_(stream)
        if stepped is None:
            return
        env_state, state = stepped
        self.env.load_state_dict(env_state)
        self.load_state_dict(state)
        self.env.check_actions()  # clears a deferred check that the warm-up's action may have set
        if getattr(self.env, "is_split", False):  # a task split into members: each member's flag (not raised)
            self.env.take_invalid_members()

    def _start_rollout(self) -> None:
        """Reset where the rollout must (the first one; every one with ``reset_options``) and zero the sums."""
        if self.reset_options is not None or self._fresh:
            self.stepper.reset(options=self.reset_options)
            if self.spread_episode_starts and self._fresh:
                self.env.spread_episode_starts()
            self._fresh = False
        self._t.zero_()
        for sums in self._term_sums.values():
            sums.zero_()

    @torch.no_grad()
    def _collect_step(self) -> None:
        """One step of the rollout (see the class docstring), written at row :attr:`_t` of the storage."""
        data, t = self.buffer.data, self._t
        step = self.stepper.step()

        def put(column: torch.Tensor, value: torch.Tensor) -> None:
            column.index_copy_(0, t, value.unsqueeze(0))

        for column, value in zip(
            observations.leaves(data["obs"], self._groups), observations.leaves(step.obs, self._groups)
        ):
            put(column, value)
        final = step.info["final_obs"]
        for group in self._final_groups or ():
            put(data["final_obs"][group], final[group])
        if self._final_groups is None:
            put(data["final_obs"], final)
        for key, value in (
            ("action", step.action),
            ("sample_log_prob", step.log_prob),
            ("value", step.value),
            ("reward", step.reward),
            ("terminated", step.terminated),
            ("truncated", step.truncated),
            ("done", step.done),
            ("success", step.info["success"]),
            ("episode_return", step.episode_return),
            ("episode_length", step.episode_length),
        ):
            put(data[key], value)
        for key in self._hidden_keys:
            put(data["hidden"][key], step.hidden[key])
            if self._final_hidden:
                put(data["final_hidden"][key], step.next_hidden[key])
        self._add_terms(step.info)
        self.stepper.advance(step)
        t.add_(1)

    def _add_terms(self, info: dict[str, Any]) -> None:
        """Add one step's reward terms and metrics to the rollout's ``[N, K]`` sums. An env that declares their
        names adds its ``[N, K]`` tensors as they are; one that returns dicts sets its names at a rollout's first
        step, and every later step must report them.

        Raises:
            ValueError: a dict env's step that lacks a term of the rollout's first step.
        """
        for group in ("rewards", "metrics"):
            names, values = self.stepper.terms(info, group)
            known = self._term_names.get(group)
            if known is None or (names != known and not int(self._t)):  # a dict env's first step sets them
                self._term_names[group] = names
                self._term_sums[group] = values.float().clone()
                continue
            if names != known:
                columns = dict(zip(names, values.unbind(-1)))
                missing = next((name for name in known if name not in columns), None)
                if missing is not None:
                    raise ValueError(
                        f"info[{group!r}][{missing!r}] is missing at some step: an env must report the same "
                        "terms every step"
                    )
                values = torch.stack([columns[name] for name in known], -1)
            self._term_sums[group].add_(values)

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
            ValueError: the env's error for a bad action (see :func:`~rlchain.core.stepping.step_env`),
                or an ``info["rewards"]``/``info["metrics"]`` term that some step lacks.
        """
        env, data = self.env, self.buffer.data
        self._start_rollout()
        for _ in range(self.buffer.rollout_steps):
            self.step()
        self.stepper.settle()  # the carries into the next rollout: zero where an episode just ended
        check_actions(env, data["obs"], data["action"])  # the rollout's one read of an env's deferred action check
        self._bootstrap_values(data)

        return Rollout(data, *self._statistics(data))

    def _statistics(self, data: TensorDict, envs: slice = slice(None)) -> tuple[Episodes, dict[str, float]]:
        """The episodes the rollout ``data`` counts and the means of its reward terms and metrics, over the envs
        ``envs``: one host read."""
        data = data[:, envs]
        counted = data["done"]
        if self.reset_options is not None:
            counted = counted & (counted.cumsum(0) == 1)  # each env's first episode
        finished = (data["episode_return"][counted], data["episode_length"][counted], data["success"][counted])
        episodes = Episodes(*(x.tolist() for x in finished))
        names = [f"{group}/{name}" for group in self._term_names for name in self._term_names[group]]
        if not names:
            return episodes, {}
        sums = torch.cat([self._term_sums[group][envs].sum(0, dtype=torch.float64) for group in self._term_names])
        return episodes, dict(zip(names, (sums / data.numel()).tolist()))

    def member_rollouts(self, rollout: Rollout, members: int) -> list[Rollout]:
        """``rollout`` (the latest :meth:`collect`) of a population's ``members`` runs, one per member: its block of
        envs (``[T, N]`` views of the ``[T, P * N]`` storage), its episodes and term means."""
        n = self.env.num_envs // members
        blocks = [slice(p * n, (p + 1) * n) for p in range(members)]
        return [Rollout(rollout.data[:, block], *self._statistics(rollout.data, block)) for block in blocks]

    def _bootstrap_values(self, data: TensorDict) -> None:
        """Fill ``next_value`` ``[T, N]``: ``V(s'_t)`` for every transition (see the class docstring), in fixed
        shapes: the critic reads every row's ``final_obs`` (in chunks of whole steps, at most 65,536 samples
        each) and ``torch.where`` keeps the values of the done rows."""
        next_value = data["next_value"]
        if not self.policy.has_critic:
            next_value.zero_()
            return
        value, (steps, n) = self.stepper.value, data.batch_size
        next_value[:-1].copy_(data["value"][1:])
        next_value[-1].copy_(value(self.stepper.obs, self.stepper.hidden))
        chunk = max(1, 65_536 // n)
        for start in range(0, steps, chunk):
            rows = data[start : start + chunk].reshape(-1)
            final_hidden = rows["final_hidden"] if self._final_hidden else None
            final_value = value(rows["final_obs"], final_hidden).view(-1, n)
            done = data["done"][start : start + chunk]
            next_value[start : start + chunk] = torch.where(done, final_value, next_value[start : start + chunk])

    def restart(self) -> None:
        """Start afresh: reset every env before the next rollout and carry no episode into it.

        For a resume whose env could not restore its state: the saved
        observation and episode carries belong to an env state that is gone.
        """
        self._fresh = True
        self.stepper.restart_episodes()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue collecting exactly where this collector stopped."""
        stepper = self.stepper
        obs = None if self._fresh else observations.to_state(stepper.obs)
        state = {"obs": obs, "episode_return": stepper.episode_return, "episode_length": stepper.episode_length}
        if stepper.hidden is not None:
            state["hidden"] = dict(stepper.hidden)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output, into the collector's own buffers (their addresses stay).

        Raises:
            ValueError: a recurrent policy's collector from a state without the policy's ``hidden`` keys (one
                saved with another policy), naming the keys.
        """
        stepper = self.stepper
        obs = observations.from_state(state["obs"], self.env.num_envs, self.env.device)
        self._fresh = obs is None
        if obs is not None:
            stepper.set_obs(obs)
        stepper.carry(state["episode_return"], state["episode_length"])
        if stepper.hidden is not None:
            saved = state.get("hidden") or {}
            if set(saved) != set(self._hidden_keys):
                raise ValueError(
                    f"the collector's saved recurrent state has keys {sorted(saved)}, the policy's are "
                    f"{sorted(self._hidden_keys)}: it was saved with another policy"
                )
            hidden = observations.from_state(saved, self.env.num_envs, self.env.device)
            for key in self._hidden_keys:
                stepper.hidden[key].copy_(hidden[key])


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
