"""Observations: one flat tensor, or a TensorDict of named groups.

An env's ``single_observation_space`` is a ``Box`` (one observation, ``[N, *obs_shape]`` from ``reset`` and
``step``) or a ``gymnasium.spaces.Dict`` of ``Box`` es, one per group (a TensorDict of batch size ``[N]`` whose key
``g`` holds ``[N, *shape_g]``). A group is float32, or uint8 for a camera's image (:func:`is_image`); images stay
uint8 in rollout storage, a quarter of float32's memory, and the policy's image encoder converts them. Robot tasks use groups to give the critic more than the actor
sees (privileged simulator state): Isaac Lab's and mjlab's ``policy``/``actor`` and ``critic`` groups, rsl_rl's
``obs_groups``. The one-group case stays a plain tensor, so every env written for one flat vector works as it did;
the policy calls that group :data:`FLAT`.

Everything that handles observations goes through the few functions here, so that both forms are handled in one
place: storage (:func:`zeros`), the step loop's copies (:func:`leaves`), checks (:func:`first_non_finite_step`) and
checkpoints (:func:`to_state`, :func:`from_state`), images (:func:`is_image`, :func:`channels_last`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

import gymnasium as gym
import numpy as np
import torch

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = [
    "FLAT",
    "Obs",
    "channels_last",
    "from_state",
    "group_names",
    "group_spaces",
    "dtype",
    "first_non_finite_step",
    "is_grouped",
    "is_image",
    "leaves",
    "to_state",
    "zeros",
]

#: An observation batch: one tensor, or a TensorDict of groups.
Obs = Union[torch.Tensor, "TensorDict"]
#: The name of the one group of a flat observation (the key it has in a rollout: ``obs``).
FLAT = "obs"


def is_grouped(space: gym.Space) -> bool:
    """Whether observations of ``space`` (one env's) come as a TensorDict of groups (a ``Dict`` space)."""
    return isinstance(space, gym.spaces.Dict)


def group_names(space: gym.Space) -> tuple[str, ...] | None:
    """The group names of one env's observation space, in its order; None for one flat ``Box``."""
    return tuple(group_spaces(space)) if is_grouped(space) else None


def group_spaces(space: gym.Space) -> dict[str, gym.spaces.Box]:
    """The groups of one env's observation space and the ``Box`` of each: ``{FLAT: space}`` for a ``Box``.

    Raises:
        ValueError: a space that is neither a ``Box`` nor a ``Dict`` of ``Box`` es (naming the group).
    """
    if isinstance(space, gym.spaces.Box):
        return {FLAT: space}
    if isinstance(space, gym.spaces.Dict):
        groups = dict(space.spaces)
        bad = {name: sub for name, sub in groups.items() if not isinstance(sub, gym.spaces.Box)}
        if bad or not groups:
            name, sub = next(iter(bad.items())) if bad else ("(none)", None)
            raise ValueError(
                f"observation group {name!r} is {sub}: expected a Dict of Box spaces, one per group "
                "(a nested Dict is not a group)"
            )
        return groups
    raise ValueError(f"observation space {space} is not supported: expected a gymnasium Box or a Dict of Box groups")


def is_image(space: gym.spaces.Box) -> bool:
    """Whether a group (or a flat observation) of ``space`` is a camera's image: uint8, or of three dimensions
    (``[H, W, C]`` or ``[C, H, W]``; a float32 depth image). The policy encodes images with a CNN, vectors with
    an MLP."""
    return space.dtype == np.uint8 or len(space.shape) == 3


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image of ``shape`` ``[H, W, C]`` has its channels last: they are the smaller of its first and
    last dimension (``[64, 64, 3]`` yes, ``[3, 64, 64]`` no; a square tie is taken as channels last)."""
    return shape[-1] <= shape[0]


def dtype(space: gym.spaces.Box) -> torch.dtype:
    """The torch dtype of a group's tensors: uint8 for a uint8 ``Box`` (an image), else float32."""
    return torch.uint8 if space.dtype == np.uint8 else torch.float32


def zeros(space: gym.Space, batch: tuple[int, ...], device: torch.device | str) -> Obs:
    """Zeros of ``batch + shape`` per group, of the group's :func:`dtype`: a tensor for a ``Box``, a TensorDict for
    a ``Dict`` space."""
    from tensordict import TensorDict  # imported where used: see rlchain.commands.config

    if not is_grouped(space):
        return torch.zeros(*batch, *space.shape, dtype=dtype(space), device=device)
    tensors = {g: torch.zeros(*batch, *s.shape, dtype=dtype(s), device=device) for g, s in group_spaces(space).items()}
    return TensorDict(tensors, batch_size=list(batch), device=device)


def leaves(obs: Obs, names: tuple[str, ...] | None = None) -> tuple[torch.Tensor, ...]:
    """The tensors of ``obs``: ``(obs,)`` for a tensor; for a TensorDict each group's, in the order of ``names``
    (the observation space's; an env's TensorDict may hold its groups in another order), else in its key order."""
    if isinstance(obs, torch.Tensor):
        return (obs,)
    return tuple(obs[key] for key in (names if names is not None else obs.keys()))


def first_non_finite_step(obs: Obs) -> int | None:
    """The first index along the first dimension (the step of a ``[T, ...]`` rollout, the env of ``[N, ...]``)
    where some floating group of ``obs`` has a NaN or inf, else None (a host read; images are never non-finite)."""
    bad = [(~torch.isfinite(t)).flatten(1).any(1) for t in leaves(obs) if t.is_floating_point() and t.dim() > 0]
    if not bad:
        return None
    rows = torch.stack(bad).any(0)
    return int(rows.float().argmax()) if bool(rows.any()) else None


def to_state(obs: Obs | None) -> Any:
    """``obs`` as checkpoint data (``torch.load(weights_only=True)`` reads it): a tensor, or a dict of tensors."""
    if obs is None or isinstance(obs, torch.Tensor):
        return obs
    return {key: obs[key] for key in obs.keys()}


def from_state(state: Any, batch: int, device: torch.device | str) -> Obs | None:
    """The inverse of :func:`to_state`, on ``device`` (a dict becomes a TensorDict of batch size ``[batch]``)."""
    from tensordict import TensorDict  # imported where used: see rlchain.commands.config

    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.to(device)
    return TensorDict({key: value.to(device) for key, value in state.items()}, batch_size=[batch], device=device)
