"""The one step that collection and evaluation share: the policy acts, the env steps, the episodes are tallied.

:class:`EnvStepper` holds what carries from step to step in fixed buffers (the current observation, a recurrent
policy's state, each env's running episode return and length) and writes them in place, so that a loop over it
(:class:`~rlchain.core.collector.SyncCollector`'s rollout, :func:`~rlchain.core.evaluation.evaluate`'s episodes)
keeps one set of addresses: what ``torch.compile(fullgraph=True)`` and a CUDA graph of the collection step need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import torch

from rlchain.core import observations
from rlchain.core.envs.base import VecEnv, info_terms
from rlchain.core.observations import Obs
from rlchain.core.policies import Policy

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["EnvStepper", "Transition", "check_actions", "policy_input", "rejected_action", "step_env"]


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


def check_actions(env: VecEnv, obs: Obs, actions: torch.Tensor | None = None) -> None:
    """``env.check_actions()`` (an env that checks its actions on the device raises here, once per rollout), with
    the rejection traced to a non-finite observation as :func:`step_env` does.

    Args:
        env: the env.
        obs: the observations the policy acted on since the last check, in step order along the first dimension
            (e.g. a rollout's ``[T, N, ...]`` storage).
        actions: the actions it took from them (``[T, N, ...]``), or None. Where given, the observation is blamed
            only if its first non-finite step comes at or before the first non-finite action's: a NaN action of
            the policy's own (from finite observations) makes a simulated state, and so the later observations,
            NaN too, and the fault is then the action's.

    Raises:
        ValueError: the env's error, or one that names the observation when ``obs`` is not finite (and, with
            ``actions``, was not finite first).
    """
    try:
        env.check_actions()
    except ValueError as err:
        _trace_rejected_action(env, obs, err, actions)


def _trace_rejected_action(env: VecEnv, obs: Obs, err: ValueError, actions: torch.Tensor | None = None) -> NoReturn:
    error = rejected_action(env, obs, err, actions)
    if error is err:
        raise err
    raise error from err


def rejected_action(env: VecEnv, obs: Obs, err: ValueError, actions: torch.Tensor | None = None) -> ValueError:
    """The error to report for ``env``'s rejection ``err`` of an action taken from ``obs`` (``[T, N, ...]`` in step
    order, or one step's): ``err`` itself, or, where ``obs`` is not finite (and, with ``actions``, was not finite at
    or before the first non-finite action's step), one that names the observation as the fault."""
    obs_step = observations.first_non_finite_step(obs)
    if obs_step is None:
        return err
    if actions is not None and actions.is_floating_point():
        action_step = observations.first_non_finite_step(actions)
        if action_step is not None and action_step < obs_step:
            return err
    return ValueError(
        f"observation contains NaN or inf: {type(env).__name__} returned a non-finite observation, "
        f"and the policy's action from it was rejected ({err})"
    )


def policy_input(obs: Obs, hidden: TensorDict | None) -> TensorDict:
    """What the policy acts on: ``obs`` ``[B, ...]`` (a tensor or a TensorDict of groups) and, for a recurrent
    policy, its state ``hidden`` (None for a feed-forward one), a TensorDict of batch size ``[B]``."""
    from tensordict import TensorDict  # imported where used: see rlchain.commands.config

    batch = [observations.leaves(obs)[0].shape[0]]
    return TensorDict({"obs": obs} if hidden is None else {"obs": obs, "hidden": hidden}, batch_size=batch)


class Transition(NamedTuple):
    """What one :meth:`EnvStepper.step` produced (``N = env.num_envs``); the buffers named are the stepper's own,
    valid until its next :meth:`~EnvStepper.advance`."""

    obs: Obs
    """The observation the policy acted on, ``[N, *obs_shape]`` (or groups): the stepper's buffer."""
    hidden: dict[str, torch.Tensor] | None
    """A recurrent policy's state before the step (each ``[N, num_layers, hidden]``), None otherwise."""
    next_hidden: dict[str, torch.Tensor] | None
    """Its state after the step (the state that would see ``final_obs``; :meth:`EnvStepper.advance` zeroes it
    where the episode ended)."""
    action: torch.Tensor
    """The action, ``[N, act_dim]`` float32 (Box, as sampled: the env clips) or ``[N]`` int64 (Discrete)."""
    log_prob: torch.Tensor
    """float32 ``[N]``: the action's log-probability under the acting policy."""
    value: torch.Tensor
    """float32 ``[N]``: the critic's value of ``obs`` (0 without a critic)."""
    next_obs: Obs
    """The env's observation after the step (a new episode's first where ``done``)."""
    reward: torch.Tensor
    """float32 ``[N]``."""
    terminated: torch.Tensor
    """bool ``[N]``."""
    truncated: torch.Tensor
    """bool ``[N]``."""
    done: torch.Tensor
    """bool ``[N]``: ``terminated | truncated``."""
    info: dict[str, Any]
    """The env's ``info`` (``final_obs``, ``success``, reward terms and metrics)."""
    episode_return: torch.Tensor
    """float64 ``[N]``: the undiscounted return of each env's episode up to and including this step."""
    episode_length: torch.Tensor
    """int64 ``[N]``: its length in steps, this step included."""


class EnvStepper:
    """One act -> ``env.step`` -> tally step over fixed buffers, shared by collection and evaluation.

    :meth:`step` lets the policy act on :attr:`obs` (from :attr:`hidden` for a recurrent one), steps the env
    (:func:`~rlchain.core.stepping.step_env`) and adds the step to each env's running episode return and
    length; :meth:`advance` then moves to the next observation and state, in place. Between the two the caller
    reads the :class:`Transition` (the collector writes it into the rollout's row; evaluation keeps each finished
    episode). Neither reads the host nor branches on a tensor's value: a whole collection step compiles with
    ``torch.compile(fullgraph=True)`` when the env's step does.

    Args:
        env: the env; ``N = env.num_envs``.
        policy: acts through :meth:`~rlchain.core.policies.Policy.get_action` (its tensor core where it has one).
        deterministic: act with the distribution's mode (evaluation) instead of a sample.

    Attributes:
        obs: the current observation, ``[N, *obs_shape]`` or a dict of groups, written in place.
        hidden: a recurrent policy's state, a dict of ``[N, num_layers, hidden]`` tensors, or None.
        episode_return: float64 ``[N]``, each env's return so far (float64: long sums do not drift).
        episode_length: int64 ``[N]``, its length so far, steps.
    """

    def __init__(self, env: VecEnv, policy: Policy, deterministic: bool = False) -> None:
        self.env, self.policy, self.deterministic = env, policy, deterministic
        n, dev = env.num_envs, env.device
        self.groups = observations.group_names(env.single_observation_space)
        """The observation's group names (None for a flat observation)."""
        self.obs: Obs = observations.zeros(env.single_observation_space, (n,), dev)
        if self.groups is not None:
            self.obs = {g: self.obs[g] for g in self.groups}
        state = policy.initial_state(n, dev) if getattr(policy, "is_recurrent", False) else None
        self.hidden: dict[str, torch.Tensor] | None = None if state is None else dict(state.items())
        self.episode_return = torch.zeros(n, dtype=torch.float64, device=dev)
        self.episode_length = torch.zeros(n, dtype=torch.int64, device=dev)
        self._running = torch.zeros(n, dtype=torch.int64, device=dev)  # 1 where an episode goes on into this step
        self._one = torch.ones((), dtype=torch.int64, device=dev)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Reset every env (``env.reset(seed=seed, options=options)``) and start every episode afresh: returns,
        lengths and a recurrent state zeroed."""
        obs, _ = self.env.reset(seed=seed, options=options)
        self.set_obs(obs)
        self.restart_episodes()

    def set_obs(self, obs: Obs) -> None:
        """Copy ``obs`` (``[N, *obs_shape]`` or groups) into :attr:`obs`, one ``copy_`` per group (no foreach op: this
        runs inside the compiled collection step; see :mod:`rlchain.core.compiling`)."""
        for mine, new in zip(observations.leaves(self.obs, self.groups), observations.leaves(obs, self.groups)):
            mine.copy_(new)

    def restart_episodes(self) -> None:
        """Carry no episode into the next step: returns, lengths and a recurrent state zeroed."""
        self.carry(torch.zeros_like(self.episode_return), torch.zeros_like(self.episode_length))
        if self.hidden is not None:
            for state in self.hidden.values():
                state.zero_()

    def carry(self, episode_return: torch.Tensor, episode_length: torch.Tensor) -> None:
        """Take ``episode_return`` (float ``[N]``) and ``episode_length`` (int ``[N]``, steps) as the episodes
        carried into the next step (what :meth:`settle` leaves, and a checkpoint saves): the next step adds to
        them."""
        self.episode_return.copy_(episode_return)
        self.episode_length.copy_(episode_length)
        self._running.fill_(1)

    def settle(self) -> None:
        """Fold the last step's ends into :attr:`episode_return` and :attr:`episode_length` (zero where an episode
        ended), so that they hold the episodes carried into the next step (what a checkpoint saves)."""
        self.episode_return.mul_(self._running)
        self.episode_length.mul_(self._running)
        self._running.fill_(1)

    def act(self, obs: Obs, hidden: dict[str, torch.Tensor] | None) -> tuple[torch.Tensor, ...]:
        """The policy's ``(action, log_prob, value, next_hidden)`` for ``obs`` from ``hidden``: its tensor core
        ``act`` where it has one, else :meth:`~rlchain.core.policies.Policy.get_action` on a TensorDict."""
        core = getattr(self.policy, "act", None)
        if core is not None:
            return core(obs, hidden, deterministic=self.deterministic)
        td = self.policy.get_action(policy_input(obs, hidden), deterministic=self.deterministic)
        nxt = dict(td["next_hidden"].items()) if hidden is not None else None
        return td["action"], td["sample_log_prob"], td["value"], nxt

    def value(self, obs: Obs, hidden: TensorDict | dict[str, torch.Tensor] | None) -> torch.Tensor:
        """The critic's value of ``obs`` ``[B, ...]`` (from a recurrent critic's state ``hidden``), float32 ``[B]``:
        the policy's tensor core ``value`` where it has one, else
        :meth:`~rlchain.core.policies.Policy.get_value` on a TensorDict."""
        core = getattr(self.policy, "value", None)
        if core is not None:
            return core(obs, hidden)
        return self.policy.get_value(policy_input(obs, hidden))["value"]

    def step(self) -> Transition:
        """Act on :attr:`obs`, step the env, add the step to each env's episode; see :class:`Transition`.

        Raises:
            ValueError: the env's error for a bad action (see :func:`~rlchain.core.stepping.step_env`).
        """
        obs, hidden = self.obs, self.hidden
        action, log_prob, value, next_hidden = self.act(obs, hidden)
        next_obs, reward, terminated, truncated, info = step_env(self.env, obs, action)
        done = terminated | truncated
        # This step's episode return and length: the previous step's times `running` (0 where an episode ended
        # there), plus this step's reward and 1.
        self.episode_return.mul_(self._running).add_(reward)
        self.episode_length.mul_(self._running).add_(self._one)
        torch.logical_not(done, out=self._running)
        return Transition(
            obs,
            hidden,
            next_hidden,
            action,
            log_prob,
            value,
            next_obs,
            reward,
            terminated,
            truncated,
            done,
            info,
            self.episode_return,
            self.episode_length,
        )

    def advance(self, transition: Transition) -> None:
        """Move to the step's next observation and state (copied into :attr:`obs` and :attr:`hidden`, the state
        zeroed where an episode ended)."""
        self.set_obs(transition.next_obs)
        if self.hidden is not None:  # a fresh state where an episode ended (the env reset it in this step)
            keep = self._running
            for key, state in self.hidden.items():
                torch.mul(transition.next_hidden[key], keep.view(-1, *(1,) * (state.dim() - 1)), out=state)

    def terms(self, info: dict[str, Any], group: str) -> tuple[tuple[str, ...], torch.Tensor]:
        """The step's reward terms (``"rewards"``) or metrics (``"metrics"``) as names and float32 ``[N, K]``
        (:func:`~rlchain.core.envs.base.info_terms`); none (``[N, 0]``) where ``info`` has no such group."""
        if group not in info:
            return (), torch.zeros(self.env.num_envs, 0, device=self.env.device)
        return info_terms(self.env, info, group)
