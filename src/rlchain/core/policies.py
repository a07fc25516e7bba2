"""Policies: ``torch.nn.Module`` s with a TensorDict interface.

Every policy reads ``td["obs"]`` (float32 ``[B, obs_dim]``) and writes:

* :meth:`Policy.get_action` -> ``action`` (``[B, act_dim]`` float32 for Box,
  ``[B]`` int64 for Discrete), ``sample_log_prob`` ``[B]``, ``value`` ``[B]``;
  the one method the step loops of collection and evaluation call;
* :meth:`Policy.deterministic_action`: plain tensors in and out (observations
  ``[B, obs_dim]`` -> the deterministic action), what ``rlchain-export``
  traces into a standalone file;
* :meth:`Policy.get_value` -> ``value`` ``[B]``;
* :meth:`Policy.evaluate_actions` (reads ``action`` too) -> ``sample_log_prob``,
  ``entropy`` and ``value``, each ``[B]``, differentiable.

Box actions use a diagonal Gaussian with a learnable, state-independent
log-std (as in PPO, Schulman et al. 2017); the sampled action is stored
unclipped so its log-probability is exact, and the env clips it. Discrete
actions use a Categorical over logits.

Running observation normalisation (``obs_normalization=True``) keeps a mean
and variance of the observations in buffers, so they travel with the
``state_dict`` and every checkpoint; they change only through
:meth:`Policy.update_obs_normalizer`, which the algorithm calls with the
observations of each rollout it learns from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlchain.core import observations
from rlchain.core.observations import Obs
from rlchain.distributed import moments
from rlchain.settings import SettingError, Settings, setting

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = [
    "ActorCritic",
    "ActorCriticConfig",
    "ActorOnly",
    "ActorOnlyConfig",
    "MLP",
    "Policy",
    "RunningMeanStd",
    "bounded",
]

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
}


@dataclass
class ActorCriticConfig(Settings):
    """Settings of :class:`ActorCritic`, their defaults and ranges."""

    _target_: str = "rlchain.core.policies.ActorCritic"
    hidden_sizes: list[int] = setting([128, 128], gt=0)
    """Hidden layer widths of the actor and of the critic MLP."""
    activation: str = setting("elu", choices=tuple(ACTIVATIONS))
    """One of relu, elu, tanh, gelu, silu, leaky_relu."""
    layer_norm: bool = False
    """LayerNorm after every hidden linear layer."""
    init_log_std: float = -0.5
    """Initial log standard deviation of the Gaussian (Box actions)."""
    log_std_min: float = -5.0
    """Lower bound of the log-std (see :func:`bounded`: a log-std past it still gets the gradient that brings it back)."""
    log_std_max: float = 2.0
    """Upper bound of the log-std (likewise)."""
    obs_normalization: bool = True
    """Normalise observations with running mean and variance (one normaliser per observation group)."""
    actor_obs: list[str] | None = None
    """The observation groups the actor sees, concatenated in this order (an env's observation of one flat vector
    is the group 'obs'); None: the env's 'actor' or 'policy' group where it has one, else every group but 'critic'."""
    critic_obs: list[str] | None = None
    """The observation groups the critic sees, e.g. [actor, critic] for both; None: the env's 'critic' group where
    it has one (privileged state the actor lacks), else the actor's groups."""

    def check(self) -> None:
        """``log_std_min <= init_log_std <= log_std_max``."""
        if self.log_std_min > self.log_std_max or not self.log_std_min <= self.init_log_std <= self.log_std_max:
            raise SettingError(
                "init_log_std",
                self.init_log_std,
                f" is not allowed with log_std_min={self.log_std_min}, log_std_max={self.log_std_max}: "
                "expected log_std_min <= init_log_std <= log_std_max",
            )


@dataclass
class ActorOnlyConfig(ActorCriticConfig):
    """Settings of :class:`ActorOnly` (same as the actor part of :class:`ActorCritic`)."""

    _target_: str = "rlchain.core.policies.ActorOnly"


class _InwardClamp(torch.autograd.Function):
    """``clamp`` whose backward passes every gradient that moves the input back into range."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, low: float, high: float) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        ctx.low, ctx.high = low, high
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        # A descent step moves x by -grad: below the range only a negative
        # gradient (x grows) passes, above it only a positive one.
        keep = ((x >= ctx.low) | (grad < 0)) & ((x <= ctx.high) | (grad > 0))
        return grad.masked_fill(~keep, 0.0), None, None


def bounded(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``x.clamp(low, high)`` with a gradient that can always bring ``x`` back into ``[low, high]``.

    A plain clamp has zero gradient outside its bounds, so a parameter that an
    optimiser step (or Adam's momentum) carried past a bound stays there for
    good: the policy's standard deviation freezes. Here the value is the same
    as the clamp's; the gradient is the identity's inside the range and,
    outside it, is kept where gradient descent would move ``x`` back towards
    the range and zeroed where it would push ``x`` further out.

    Args:
        x: any float tensor (e.g. the log-std parameter ``[act_dim]``).
        low, high: the bounds, ``low <= high``.

    Returns:
        a tensor of ``x``'s shape and dtype, in ``[low, high]``.
    """
    return _InwardClamp.apply(x, low, high)


class MLP(nn.Sequential):
    """Multi-layer perceptron with orthogonal initialisation.

    Hidden layers get orthogonal weights with gain sqrt(2) and zero biases; the
    output layer gets gain ``output_gain`` (0.01 for policy heads, 1 for value
    heads, as in CleanRL's PPO).

    Args:
        in_dim: input features.
        hidden_sizes: widths of the hidden layers (may be empty).
        out_dim: output features.
        activation: name in :data:`ACTIVATIONS`.
        layer_norm: LayerNorm after every hidden linear layer.
        output_gain: orthogonal gain of the last layer.

    Shapes: ``[B, in_dim] -> [B, out_dim]``.
    """

    def __init__(
        self,
        in_dim: int,
        hidden_sizes: Sequence[int],
        out_dim: int,
        activation: str = "elu",
        layer_norm: bool = False,
        output_gain: float = 1.0,
    ) -> None:
        layers: list[nn.Module] = []
        last = in_dim
        for width in hidden_sizes:
            linear = nn.Linear(last, width)
            nn.init.orthogonal_(linear.weight, math.sqrt(2))
            nn.init.zeros_(linear.bias)
            layers.append(linear)
            if layer_norm:
                layers.append(nn.LayerNorm(width))
            layers.append(ACTIVATIONS[activation]())
            last = width
        head = nn.Linear(last, out_dim)
        nn.init.orthogonal_(head.weight, output_gain)
        nn.init.zeros_(head.bias)
        layers.append(head)
        super().__init__(*layers)


class RunningMeanStd(nn.Module):
    """Running mean and variance of a stream of batches (Chan et al. 1979 parallel update).

    Buffers ``mean`` / ``var`` (float32 ``[dim]``) and ``count`` (float64 scalar)
    are part of the ``state_dict``. :meth:`update` runs on the device with no
    host sync; :meth:`normalize` returns ``clamp((x - mean) / sqrt(var + eps), ±clip)``.
    """

    def __init__(self, dim: int, eps: float = 1e-8, clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.eps, self.clip = eps, clip

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch ``x`` of shape ``[..., dim]`` into the statistics (every rank's batch, in a multi-process run)."""
        x = x.reshape(-1, x.shape[-1]).float()
        batch_mean, batch_var, batch_count = moments(x, "the all-reduce of the observation statistics", unbiased=False)
        total = self.count + batch_count
        w = (batch_count / total).float()
        delta = batch_mean - self.mean
        self.mean += delta * w
        self.var.copy_(self.var * (1 - w) + batch_var * w + delta.square() * w * (1 - w))
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised ``x``, same shape."""
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)


class Policy(nn.Module):
    """Base class of rlchain policies; the module docstring gives the shapes of the interface.

    The contract of a subclass (the docs page "Extending rlchain" has a minimal one):

    * required: ``__init__(observation_space, action_space, **settings)``
      (the spaces come from the env when the policy is built, never from
      YAML); :meth:`get_action`, :meth:`get_value`, :meth:`evaluate_actions`;
      the attributes ``observation_space`` and ``action_space``.
    * optional, with their defaults here: ``has_critic`` (True),
      :meth:`deterministic_action` (raises ``NotImplementedError``: such a
      policy cannot be exported), :meth:`update_obs_normalizer` (nothing).

    Attributes:
        observation_space: gymnasium Box of one env's observation (flat).
        action_space: gymnasium Box or Discrete of one env's action.
        has_critic: whether ``value`` comes from a critic. A policy without
            one (its ``value`` is 0; GRPO's :class:`ActorOnly`) sets it False:
            the collector then computes no bootstrap values, and PPO refuses it.
    """

    observation_space: gym.spaces.Box
    action_space: gym.spaces.Box | gym.spaces.Discrete
    has_critic: bool = True

    def get_action(self, td: TensorDict, deterministic: bool = False) -> TensorDict:
        """Write ``action``, ``sample_log_prob`` and ``value`` for ``td["obs"]`` into ``td`` and return it.

        ``deterministic`` takes the mode of the action distribution (evaluation).
        """
        raise NotImplementedError

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The action ``get_action(..., deterministic=True)`` takes for ``obs`` (float32 ``[B, obs_dim]``), from
        plain tensors (traceable by ``torch.jit.trace`` and ``torch.onnx.export``): ``[B, act_dim]`` float32 (Box,
        unclipped) or ``[B]`` int64 (Discrete).

        Raises:
            NotImplementedError: a policy that does not provide it (it cannot be exported).
        """
        raise NotImplementedError(f"{type(self).__name__} has no deterministic_action(obs)")

    def get_value(self, td: TensorDict) -> TensorDict:
        """Write ``value`` ``[B]`` for ``td["obs"]``."""
        raise NotImplementedError

    def evaluate_actions(self, td: TensorDict) -> TensorDict:
        """Return ``sample_log_prob``, ``entropy`` and ``value`` (each ``[B]``) for stored actions."""
        raise NotImplementedError

    def update_obs_normalizer(self, obs: torch.Tensor) -> None:
        """Fold observations ``[..., obs_dim]`` into the running statistics (no-op without normalisation)."""


class ActorCritic(Policy):
    """MLP actor and MLP critic with a Gaussian (Box) or Categorical (Discrete) head.

    Observation groups (a ``Dict`` observation space, :mod:`rlchain.core.observations`): the actor sees the
    groups ``actor_obs`` names and the critic those of ``critic_obs``, each group through its own running
    normaliser, flattened and concatenated in the order named; with a privileged ``critic`` group the critic
    learns values from state the actor does not observe (asymmetric actor-critic, Pinto et al. 2018).

    Args:
        observation_space: one env's flat ``gymnasium.spaces.Box``, or a ``Dict`` of vector ``Box`` groups.
        action_space: ``Box`` (1-D) or ``Discrete`` of one env.
        settings: fields of :class:`ActorCriticConfig` (``self.cfg``).

    Raises:
        ValueError: a non-flat Box observation space or one that is neither a Box nor a Dict of Box groups, an
            action space other than 1-D Box or Discrete; a setting out of its range (an unknown activation, a
            non-positive hidden size, an ``init_log_std`` outside ``[log_std_min, log_std_max]``, an ``actor_obs``
            or ``critic_obs`` group the env does not have, an image group), naming it.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, **settings: Any) -> None:
        super().__init__()
        if isinstance(action_space, gym.spaces.Discrete):
            self.discrete, act_out = True, int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self.discrete, act_out = False, int(action_space.shape[0])
        else:
            raise ValueError(f"action_space={action_space} is not supported: expected a 1-D Box or a Discrete space")
        self.cfg = cfg = ActorCriticConfig(**settings)
        self.observation_space, self.action_space = observation_space, action_space
        if isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) != 1:
            raise ValueError(
                f"observation_space={observation_space} is not supported: expected a flat (1-D) Box or a Dict of "
                "groups; flatten image observations in the env"
            )
        spaces = observations.group_spaces(observation_space)
        self.grouped = observations.is_grouped(observation_space)
        self.actor_groups = _chosen_groups("actor_obs", cfg.actor_obs, spaces, _default_actor_groups(spaces))
        self.critic_groups = _chosen_groups(
            "critic_obs", cfg.critic_obs, spaces, ["critic"] if "critic" in spaces else self.actor_groups
        )
        used = [g for g in spaces if g in self.actor_groups or (self.has_critic and g in self.critic_groups)]
        for group in used:
            _check_vector(group, spaces[group], "critic_obs" if group not in self.actor_groups else "actor_obs")
        self._shapes = {g: tuple(spaces[g].shape) for g in used}
        dims = {g: math.prod(shape) for g, shape in self._shapes.items()}
        self.obs_dim = sum(dims[g] for g in self.actor_groups)
        self.act_dim = act_out
        mlp = dict(hidden_sizes=cfg.hidden_sizes, activation=cfg.activation, layer_norm=cfg.layer_norm)
        self.actor = MLP(self.obs_dim, out_dim=act_out, output_gain=0.01, **mlp)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((act_out,), cfg.init_log_std))
        critic_dim = sum(dims[g] for g in self.critic_groups) if self.has_critic else 0
        self._shared_input = self.critic_groups == self.actor_groups or not self.has_critic
        """Whether the critic's input is the actor's (the same groups, or no critic): computed once per forward."""
        self.critic = MLP(critic_dim, out_dim=1, output_gain=1.0, **mlp) if self.has_critic else None
        self.obs_normalizer: RunningMeanStd | nn.ModuleDict | None = None
        """One flat observation's normaliser, or (grouped) one per group the networks see, by group name."""
        if cfg.obs_normalization:
            self.obs_normalizer = (
                nn.ModuleDict({g: RunningMeanStd(dims[g]) for g in used})
                if self.grouped
                else RunningMeanStd(self.obs_dim)
            )

    # ----------------------------------------------------------- internals
    def _features(self, obs: Obs, groups: list[str]) -> torch.Tensor:
        """The network input of ``groups``: normalised, each group flattened to ``[B, dim]``, concatenated."""
        if not self.grouped:
            return self.obs_normalizer.normalize(obs) if self.obs_normalizer is not None else obs
        parts = []
        for g in groups:
            x = obs[g]
            x = x.flatten(x.dim() - len(self._shapes[g])) if len(self._shapes[g]) != 1 else x
            parts.append(self.obs_normalizer[g].normalize(x) if self.obs_normalizer is not None else x)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _inputs(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actor input, critic input)``; one tensor when both see the same groups."""
        x = self._features(obs, self.actor_groups)
        return x, x if self._shared_input else self._features(obs, self.critic_groups)

    def _distribution(self, x: torch.Tensor) -> torch.distributions.Distribution:
        out = self.actor(x)
        if self.discrete:
            return torch.distributions.Categorical(logits=out, validate_args=False)
        std = bounded(self.log_std, self.cfg.log_std_min, self.cfg.log_std_max).exp().expand_as(out)
        return torch.distributions.Normal(out, std, validate_args=False)

    def _log_prob(self, dist, action: torch.Tensor) -> torch.Tensor:
        return dist.log_prob(action) if self.discrete else dist.log_prob(action).sum(-1)

    def _entropy(self, dist) -> torch.Tensor:
        return dist.entropy() if self.discrete else dist.entropy().sum(-1)

    def _value(self, x: torch.Tensor) -> torch.Tensor:
        """The critic's value of its input ``x`` ``[B, critic_dim]``; zeros without a critic."""
        if self.critic is None:
            return torch.zeros(x.shape[:-1], device=x.device, dtype=x.dtype)
        return self.critic(x).squeeze(-1)

    # ----------------------------------------------------------- interface
    def get_action(self, td: TensorDict, deterministic: bool = False) -> TensorDict:
        """Write ``action``, ``sample_log_prob [B]`` and ``value [B]`` for ``td["obs"]`` into ``td`` and return it.

        ``deterministic`` takes the Gaussian mean or the most likely category.
        """
        x, critic_x = self._inputs(td["obs"])
        dist = self._distribution(x)
        if deterministic:
            action = dist.probs.argmax(-1) if self.discrete else dist.mean
        else:
            action = dist.sample()
        td["action"], td["sample_log_prob"], td["value"] = action, self._log_prob(dist, action), self._value(critic_x)
        return td

    def deterministic_action(self, obs: Obs | dict[str, torch.Tensor]) -> torch.Tensor:
        """The Gaussian's mean (Box, ``[B, act_dim]``) or the most likely category (Discrete, ``[B]`` int64) for
        ``obs`` ``[B, obs_dim]`` (grouped: a dict or TensorDict holding at least the actor's groups),
        observation normalisation included."""
        out = self.actor(self._features(obs, self.actor_groups))
        return out.argmax(-1) if self.discrete else out

    def get_value(self, td: TensorDict) -> TensorDict:
        """Write ``value`` ``[B]`` into ``td`` and return it."""
        groups = self.critic_groups if self.critic is not None else self.actor_groups  # zeros of the batch's shape
        td["value"] = self._value(self._features(td["obs"], groups))
        return td

    def evaluate_actions(self, td: TensorDict) -> TensorDict:
        """Return a new TensorDict with differentiable ``sample_log_prob``, ``entropy``, ``value`` ``[B]``."""
        from tensordict import TensorDict  # imported where used: see rlchain.commands.config

        x, critic_x = self._inputs(td["obs"])
        dist = self._distribution(x)
        log_prob, entropy = self._log_prob(dist, td["action"]), self._entropy(dist)
        return TensorDict(
            {"sample_log_prob": log_prob, "entropy": entropy, "value": self._value(critic_x)},
            batch_size=td.batch_size,
        )

    def update_obs_normalizer(self, obs: Obs) -> None:
        """Fold observations ``[..., obs_dim]`` (grouped: ``[..., *group_shape]`` per group) into the running
        statistics, each group's into its own normaliser (no-op without normalisation)."""
        if self.obs_normalizer is None:
            return
        if not self.grouped:
            self.obs_normalizer.update(obs)
            return
        for g, normalizer in self.obs_normalizer.items():
            normalizer.update(obs[g].reshape(-1, math.prod(self._shapes[g])))


def _default_actor_groups(spaces: dict[str, gym.spaces.Box]) -> list[str]:
    """The actor's groups when ``actor_obs`` is None: 'actor' or 'policy' (Isaac Lab's and mjlab's names) where
    the env has one, else every group but 'critic'."""
    for name in ("actor", "policy"):
        if name in spaces:
            return [name]
    return [g for g in spaces if g != "critic"] or list(spaces)


def _chosen_groups(field: str, chosen: list[str] | None, spaces: dict[str, Any], default: list[str]) -> list[str]:
    """``chosen`` (``policy.<field>``), checked against the env's groups, or ``default``.

    Raises:
        SettingError: an empty list, a repeated group, or a group the env does not have (listing those it has).
    """
    if chosen is None:
        return list(default)
    missing = [g for g in chosen if g not in spaces]
    if missing or not chosen or len(set(chosen)) != len(chosen):
        what = f"the env has no group {missing[0]!r}" if missing else "expected distinct groups, at least one"
        raise SettingError(field, list(chosen), f" is not allowed: {what}; its observation groups are {list(spaces)}")
    return list(chosen)


def _check_vector(group: str, space: gym.spaces.Box, field: str) -> None:
    """Raise :class:`SettingError` for a group the MLP cannot take: an image (uint8, or ``[H, W, C]``)."""
    if space.dtype == np.uint8 or len(space.shape) >= 3:
        raise SettingError(
            field,
            group,
            f" is not allowed: the group {group!r} is an image {tuple(space.shape)} {space.dtype}, and the MLP policy "
            "takes vectors (no image encoder yet): expected vector groups",
        )


class ActorOnly(ActorCritic):
    """The actor of :class:`ActorCritic` without a critic: ``value`` is always 0.

    For critic-free algorithms such as GRPO (Shao et al. 2024). Arguments and
    errors as :class:`ActorCritic`.
    """

    has_critic = False
