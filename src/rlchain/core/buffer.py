"""Preallocated on-device storage of one rollout, and minibatch iteration."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import gymnasium as gym
import torch

from rlchain.core import observations
from rlchain.utils import check_positive

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["RolloutBuffer", "minibatches", "sequence_minibatches"]


class RolloutBuffer:
    """One rollout of ``T = rollout_steps`` steps of ``N = num_envs`` envs, allocated once.

    ``data`` is a TensorDict of batch size ``[T, N]`` on ``device`` holding, for
    step ``t`` of env ``n``:

    ==================  ==================  =============================================
    key                 dtype, shape        meaning
    ==================  ==================  =============================================
    obs                 f32 [T,N,*obs]      observation the action was taken in (for a Dict
                                            observation space, a TensorDict of its groups,
                                            f32 [T,N,*group] each: see rlchain.core.observations)
    action              f32 [T,N,*act] /    action as sampled (unclipped), int64 [T,N]
                        i64 [T,N]           for Discrete spaces
    sample_log_prob     f32 [T,N]           log-probability of ``action`` when sampled
    value               f32 [T,N]           critic value of ``obs`` (0 without a critic)
    reward              f32 [T,N]           reward of the transition
    terminated          bool [T,N]          episode ended in a terminal state
    truncated           bool [T,N]          episode cut by the time limit
    done                bool [T,N]          ``terminated | truncated``
    final_obs           f32 [T,N,*obs]      on done rows, the observation the episode
                                            ended on (before the auto-reset); elsewhere
                                            as the env left it (unspecified); of a Dict
                                            space, the groups ``final_obs_groups`` names
    next_value          f32 [T,N]           value of the state the transition ended in:
                                            ``V(final_obs)`` on done rows, else the next
                                            step's value; the bootstrap target, filled
                                            after the rollout by the collector
    episode_return      f64 [T,N]           undiscounted return so far, incl. this step
    episode_length      i64 [T,N]           steps so far, incl. this step
    success             bool [T,N]          the env reported success on this step
    hidden              f32 [T,N,...]       recurrent policy only: its state before step
                                            ``t`` (zeros at an episode's first step), a
                                            TensorDict of the keys of ``initial_state``
    final_hidden        f32 [T,N,...]       recurrent critic only: on done rows, the
                                            state after the step, the one that would
                                            see ``final_obs`` (bootstrapping)
    ==================  ==================  =============================================

    Args:
        rollout_steps: ``T`` (> 0).
        num_envs: ``N`` (the env's; its schema checks it).
        observation_space / action_space: gymnasium spaces of one env.
        device: torch device of every tensor.
        final_obs_groups: the groups of a ``Dict`` observation space that ``final_obs`` keeps: those the critic
            reads (its bootstrap values are all that ``final_obs`` is for); None: every group. An actor's camera
            image that the critic does not read then takes no second copy.
        hidden: a recurrent policy's state of the ``N`` envs (:meth:`~rlchain.core.policies.Policy.initial_state`),
            or None: no ``hidden`` storage.
        final_hidden: with ``hidden``, whether to store ``final_hidden`` too (a critic that reads the state:
            :attr:`~rlchain.core.policies.Policy.recurrent_critic`).

    Raises:
        SettingError: a non-positive ``rollout_steps``.
    """

    def __init__(
        self,
        rollout_steps: int,
        num_envs: int,
        observation_space: gym.Space,
        action_space: gym.Space,
        device: torch.device | str,
        final_obs_groups: Sequence[str] | None = None,
        hidden: TensorDict | None = None,
        final_hidden: bool = False,
    ) -> None:
        from tensordict import TensorDict  # imported where used: see rlchain.commands.config

        check_positive("rollout_steps", rollout_steps, integer=True)
        self.rollout_steps, self.num_envs = rollout_steps, num_envs
        t, n = rollout_steps, num_envs
        if isinstance(action_space, gym.spaces.Discrete):
            action = torch.zeros(t, n, dtype=torch.int64, device=device)
        else:
            action = torch.zeros(t, n, *action_space.shape, dtype=torch.float32, device=device)
        f32 = lambda *shape: torch.zeros(t, n, *shape, dtype=torch.float32, device=device)  # noqa: E731
        b = lambda: torch.zeros(t, n, dtype=torch.bool, device=device)  # noqa: E731
        self.data = TensorDict(
            {
                "obs": observations.zeros(observation_space, (t, n), device),
                "action": action,
                "sample_log_prob": f32(),
                "value": f32(),
                "reward": f32(),
                "terminated": b(),
                "truncated": b(),
                "done": b(),
                "final_obs": _final_obs_zeros(observation_space, final_obs_groups, (t, n), device),
                "next_value": f32(),
                "episode_return": torch.zeros(t, n, dtype=torch.float64, device=device),  # long sums do not drift
                "episode_length": torch.zeros(t, n, dtype=torch.int64, device=device),
                "success": b(),
            },
            batch_size=[t, n],
            device=device,
        )
        if hidden is not None:
            self.data["hidden"] = hidden.expand(t, n).clone().zero_()
            if final_hidden:
                self.data["final_hidden"] = self.data["hidden"].clone()


def minibatch_order(
    samples: int, batch_size: int, generator: torch.Generator, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The update's minibatches of ``samples`` samples, as indices: int64 ``[samples // size, size]`` with
    ``size = min(batch_size, samples)``, every sample at most once, in a seeded random order.

    Minibatches are all of one size (one shape for a compiled or captured update): the ``samples % size`` samples
    the order puts last are left out (a different remainder at every call).

    Args:
        samples: samples in the rollout (> 0).
        batch_size: samples per minibatch (> 0).
        generator: seeds the order (on the device of the indices).
        out: int64 ``[samples]`` to write the order into (a fixed buffer), or None for a new tensor.

    Raises:
        ValueError: a non-positive ``batch_size``.
    """
    check_positive("batch_size", batch_size, integer=True)
    size = min(batch_size, samples)
    order = torch.randperm(samples, generator=generator, device=generator.device, out=out)
    return order[: samples // size * size].view(-1, size)


def minibatches(data: TensorDict, batch_size: int, generator: torch.Generator) -> Iterator[TensorDict]:
    """Yield the minibatches of :func:`minibatch_order`: random minibatches of equal size, every sample at most
    once.

    Args:
        data: TensorDict of any batch shape; it is flattened to ``[B]``.
        batch_size: samples per minibatch (> 0).
        generator: seeds the order (on ``data``'s device).

    Raises:
        ValueError: a non-positive ``batch_size``.
    """
    flat = data.reshape(-1)
    for indices in minibatch_order(flat.batch_size[0], batch_size, generator).to(flat.device):
        yield flat[indices]


def sequence_minibatches(
    data: TensorDict, seq_len: int, batch_size: int, generator: torch.Generator | None
) -> Iterator[TensorDict]:
    """Yield minibatches of whole sequences covering every step of a rollout once (a recurrent policy's update).

    The ``[T, N]`` rollout is cut into ``(T / seq_len) * N`` sequences, env ``n``'s steps ``c * seq_len`` to
    ``(c + 1) * seq_len - 1`` each; a minibatch is ``S = max(1, batch_size // seq_len)`` of them, time first:
    ``[seq_len, S]`` (the last may hold fewer sequences).

    Args:
        data: the ``[T, N]`` TensorDict.
        seq_len: steps per sequence; divides ``T``.
        batch_size: samples per minibatch, rounded down to whole sequences (at least one).
        generator: seeds the order of the sequences (on ``data``'s device); None: in order.

    Raises:
        ValueError: a ``seq_len`` that does not divide ``T``.
    """
    steps, n = data.batch_size
    if steps % seq_len:
        raise ValueError(f"seq_len={seq_len} does not divide the rollout's {steps} steps")
    count = steps // seq_len * n
    if generator is None:
        order = torch.arange(count, device=data.device)
    else:
        order = torch.randperm(count, generator=generator, device=generator.device).to(data.device)
    per = max(1, batch_size // seq_len)
    offsets = torch.arange(seq_len, device=data.device)[:, None]
    for start in range(0, count, per):
        chosen = order[start : start + per]
        rows = torch.div(chosen, n, rounding_mode="floor") * seq_len
        yield data[rows[None, :] + offsets, (chosen % n)[None, :].expand(seq_len, -1)]


def _final_obs_zeros(
    space: gym.Space, groups: Sequence[str] | None, batch: tuple[int, ...], device: torch.device | str
) -> observations.Obs:
    """The storage of ``final_obs``: :func:`rlchain.core.observations.zeros` of ``space``'s ``groups`` (a ``Dict``
    space's, in its order; every group for None or a ``Box``), an empty TensorDict for no group (no critic)."""
    from tensordict import TensorDict  # imported where used: see rlchain.commands.config

    if groups is None or not observations.is_grouped(space):
        return observations.zeros(space, batch, device)
    if not groups:
        return TensorDict({}, batch_size=list(batch), device=device)
    return observations.zeros(gym.spaces.Dict({g: s for g, s in space.spaces.items() if g in groups}), batch, device)
