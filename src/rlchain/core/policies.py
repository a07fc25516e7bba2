"""Policies: ``torch.nn.Module`` s that act on plain tensors, with a TensorDict interface over them.

The tensor core, which the step loops of collection and evaluation call directly (no TensorDict is built, no
host read, no Python branch on a tensor's value, so each compiles whole with ``torch.compile(...,
fullgraph=True)``); the minibatch update calls the TensorDict interface's :meth:`Policy.evaluate_actions` (in the
algorithms' losses), which in :class:`ActorCritic` is a thin wrapper over :meth:`Policy.evaluate`, so the compiled
update builds its one TensorDict at trace time. ``obs`` is float32 ``[B, obs_dim]``, or a mapping of group name ->
``[B, *group_shape]`` (:mod:`rlchain.core.observations`), ``state`` a recurrent policy's state (below) or None:

* :meth:`Policy.act` ``(obs, state, deterministic)`` -> ``(action, log_prob, value, next_state)``: the action
  (``[B, act_dim]`` float32 for Box, ``[B]`` int64 for Discrete), its log-probability ``[B]``, the value ``[B]``;
* :meth:`Policy.value` ``(obs, state)`` -> the value ``[B]``;
* :meth:`Policy.evaluate` ``(obs, action, state, done)`` -> ``(log_prob, entropy, value)`` of stored actions, each
  ``[B]``, differentiable;
* :meth:`Policy.deterministic_action` (observations -> the deterministic action), what ``rlchain-export`` traces
  into a standalone file.

The TensorDict interface, the contract a user's policy implements (:class:`Policy`), reads ``td["obs"]``:

* :meth:`Policy.get_action` writes ``action``, ``sample_log_prob`` and ``value``;
* :meth:`Policy.get_value` writes ``value``;
* :meth:`Policy.evaluate_actions` (reads ``action`` too) returns ``sample_log_prob``, ``entropy`` and ``value``.

In :class:`ActorCritic` these three are thin wrappers over the tensor core; in :class:`Policy` the tensor core's
defaults build a TensorDict and call them, so a policy written to the TensorDict contract acts wherever rlchain
calls the tensor core.

Box actions use a diagonal Gaussian with a learnable, state-independent log-std (as in PPO, Schulman et al. 2017):
:func:`gaussian_sample`, :func:`gaussian_log_prob`, :func:`gaussian_entropy`; the sampled action is stored
unclipped so its log-probability is exact, and the env clips it. Discrete actions use a Categorical over logits:
:func:`categorical_sample` (the Gumbel-max draw), :func:`categorical_log_prob`, :func:`categorical_entropy`. The
draws come from torch's global RNG.

A recurrent policy (``rnn_type``: a GRU or an LSTM before the actor's and/or the critic's MLP,
:class:`~rlchain.core.networks.Memory`) also reads its state: a plain dict of tensors in the tensor core (keyed as
:meth:`~Policy.initial_state`'s keys), ``td["hidden"]`` (a TensorDict ``[B]``) in the TensorDict interface, which
writes the state after the step as ``td["next_hidden"]``; its ``evaluate`` and ``evaluate_actions`` take sequences
``[L, S]`` (see :class:`Policy`), and :meth:`ActorCritic.deterministic_step` is what ``rlchain-export`` traces.

Running observation normalisation (``obs_normalization=True``) keeps a mean and variance of the observations in
buffers (:class:`~rlchain.core.normalization.RunningMeanStd`), so they travel with the ``state_dict`` and every
checkpoint; they change only through :meth:`Policy.update_obs_normalizer`, which the algorithm calls with the
observations of each rollout it learns from. The networks are those of :mod:`rlchain.core.networks`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import torch
from torch import nn

from rlchain.core import observations

# MAX_CNN_FEATURES, SpatialSoftmax and _InwardClamp are imported for those who import them from here, their home
# before rlchain.core.networks.
from rlchain.core.networks import (  # noqa: F401
    ACTIVATIONS,
    MAX_CNN_FEATURES,
    MLP,
    RNN_TYPES,
    CNNEncoder,
    Memory,
    SpatialSoftmax,
    _InwardClamp,
    bounded,
)
from rlchain.core.normalization import RunningMeanStd
from rlchain.core.observations import Obs
from rlchain.settings import SettingError, Settings, setting

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = [
    "ActorCritic",
    "ActorCriticConfig",
    "ActorOnly",
    "ActorOnlyConfig",
    "Policy",
    "categorical_entropy",
    "categorical_log_prob",
    "categorical_sample",
    "gaussian_entropy",
    "gaussian_log_prob",
    "gaussian_sample",
]


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
    ortho_init: bool = True
    """Orthogonal weights and zero biases in the actor's and the critic's MLP (see
    :class:`~rlchain.core.networks.MLP`; CleanRL's and SB3's init); false: PyTorch's default init of ``nn.Linear``
    (rsl_rl's, which mjlab registers for its tasks)."""
    init_log_std: float = -0.5
    """Initial log standard deviation of the Gaussian (Box actions)."""
    log_std_min: float = -5.0
    """Lower bound of the log-std (see :func:`~rlchain.core.networks.bounded`: a log-std past it still gets the
    gradient that brings it back)."""
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
    cnn_channels: list[int] = setting([32, 64, 64], gt=0)
    """Output channels of each convolution of an image group's encoder (Mnih et al. 2015's by default)."""
    cnn_kernel_sizes: list[int] = setting([8, 4, 3], gt=0)
    """Kernel size of each convolution, pixels (one per entry of cnn_channels)."""
    cnn_strides: list[int] = setting([4, 2, 1], gt=0)
    """Stride of each convolution, pixels (one per entry of cnn_channels)."""
    cnn_features: int = setting(256, gt=0)
    """Features of an image group after its encoder (a linear layer and the activation after the convolutions)."""
    cnn_head: str = setting("flatten", choices=("flatten", "spatial_softmax"))
    """What the linear layer reads of the last convolution: 'flatten', every activation (Mnih et al. 2015);
    'spatial_softmax', each channel's expected image position, x and y in [-1, 1] (Levine et al. 2016): where
    things are, what manipulation from pixels needs."""

    rnn_type: str | None = setting(None, choices=RNN_TYPES)
    """The recurrent core before the MLPs: 'gru' or 'lstm' (a policy with memory, for what one observation does
    not show: velocities, contacts, latency); None: feed-forward."""
    rnn_hidden_size: int = setting(256, gt=0)
    """Features of the recurrent core's state, per layer."""
    rnn_num_layers: int = setting(1, gt=0)
    """Stacked recurrent layers."""
    rnn_actor: bool = True
    """Whether the actor has the recurrent core (with rnn_type)."""
    rnn_critic: bool = True
    """Whether the critic has one (its own; with rnn_type): a recurrent actor with a feed-forward critic, or the
    reverse."""

    def check(self) -> None:
        """``log_std_min <= init_log_std <= log_std_max``; one kernel size and one stride per CNN layer; a
        ``rnn_type`` for at least one of the actor and the critic."""
        if self.rnn_type is not None and not (self.rnn_actor or self.rnn_critic):
            raise SettingError(
                "rnn_type",
                self.rnn_type,
                " is not allowed with rnn_actor=False and rnn_critic=False: expected None (feed-forward), or true for "
                "either",
            )
        for name in ("cnn_kernel_sizes", "cnn_strides"):
            if len(getattr(self, name)) != len(self.cnn_channels):
                raise SettingError(
                    name,
                    list(getattr(self, name)),
                    f" is not allowed with cnn_channels={list(self.cnn_channels)}: expected one entry per layer "
                    f"({len(self.cnn_channels)})",
                )
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


#: Added to a run's seed to key its action noise's stream (:meth:`ActorCritic.seed_actions`), apart from the
#: env's stream of the same seed.
ACTION_STREAM = 2**62

#: ``log(sqrt(2 pi))``: the normalising constant of a standard Gaussian's log-density, per dimension.
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_sample(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """A draw of the diagonal Gaussian ``N(mean, exp(log_std)^2)``: ``mean + std * noise``.

    The draw carries no gradient (differentiate its :func:`gaussian_log_prob`).

    Args:
        mean: float ``[*B, D]``.
        log_std: float ``[D]`` (or any shape that broadcasts against ``mean``), natural log of the standard
            deviation.
        noise: standard normal draws of ``mean``'s shape (a policy's counter stream,
            :attr:`ActorCritic.action_rng`); None: ``torch.randn_like(mean)``, torch's global RNG.

    Returns:
        float ``[*B, D]``, ``mean``'s dtype.
    """
    with torch.no_grad():
        return torch.addcmul(mean, log_std.exp(), torch.randn_like(mean) if noise is None else noise)


def gaussian_log_prob(action: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log-density of ``action`` under the diagonal Gaussian ``N(mean, exp(log_std)^2)``, summed over its
    dimensions: ``sum(-(action - mean)^2 / (2 var) - log_std - log(sqrt(2 pi)))``, as
    ``torch.distributions.Normal(mean, std).log_prob(action).sum(-1)``.

    Args:
        action: float ``[*B, D]``.
        mean: float ``[*B, D]``.
        log_std: float ``[D]`` (or any shape that broadcasts against ``mean``).

    Returns:
        float ``[*B]``, differentiable in ``mean`` and ``log_std``.
    """
    z = (action - mean) / log_std.exp()
    return torch.addcmul(log_std + LOG_SQRT_2PI, z, z, value=0.5).sum(-1).neg()


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of the diagonal Gaussian of log standard deviations ``log_std`` ``[..., D]``, nats:
    ``sum(0.5 + log(sqrt(2 pi)) + log_std)`` over the last dimension, ``[...]`` (a scalar for the state-independent
    log-std ``[D]``; it does not depend on the mean)."""
    return (log_std + (0.5 + LOG_SQRT_2PI)).sum(-1)


def categorical_sample(logits: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """A draw of the Categorical of ``logits`` (float ``[*B, K]``, unnormalised or log-probabilities): the Gumbel-max
    draw ``argmax(logits - log(-log(u)))``, ``u ~ U[0, 1)`` the uniforms ``noise`` of ``logits``' shape, or None:
    ``torch.rand_like`` (torch's global RNG). A ``u`` of exactly 0, of probability about 2^-24 in float32, leaves
    its category out of that draw. Returns int64 ``[*B]``, no gradient."""
    with torch.no_grad():
        u = torch.rand_like(logits) if noise is None else noise
        return (logits - u.log().neg().log()).argmax(-1)


def categorical_log_prob(log_probs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The entry of ``log_probs`` (float ``[*B, K]``, ``log_softmax`` of the logits) at ``action`` (integer
    ``[*B]``): float ``[*B]``, as ``torch.distributions.Categorical(logits=...).log_prob(action)``."""
    return log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def categorical_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum(p log p)`` of the Categorical of ``log_probs`` (float ``[*B, K]``, ``log_softmax`` of the
    logits, finite), nats: float ``[*B]``."""
    return (log_probs.exp() * log_probs).sum(-1).neg()


class Policy(nn.Module):
    """Base class of rlchain policies; the module docstring gives the shapes of the interface.

    The contract of a subclass (the docs page "Extending rlchain" has a minimal one):

    * required: ``__init__(observation_space, action_space, **settings)``
      (the spaces come from the env when the policy is built, never from
      YAML); :meth:`get_action`, :meth:`get_value`, :meth:`evaluate_actions`;
      the attributes ``observation_space`` and ``action_space``.
    * optional, with their defaults here: ``has_critic`` (True),
      :meth:`deterministic_action` (raises ``NotImplementedError``: such a
      policy cannot be exported), :meth:`update_obs_normalizer` (nothing),
      ``is_recurrent`` (False), :meth:`initial_state` (None),
      :attr:`recurrent_critic` (``is_recurrent and has_critic``) and the
      tensor core :meth:`act`, :meth:`value`, :meth:`evaluate` (a TensorDict
      built per call and :meth:`get_action`, :meth:`get_value`,
      :meth:`evaluate_actions` called; a policy that computes them directly,
      as :class:`ActorCritic` does, spares that and can be compiled whole).

    A recurrent policy (``is_recurrent``) keeps a state per env, a TensorDict
    of batch size ``[B]`` (:meth:`initial_state`: zeros, the state before an
    episode's first observation). :meth:`get_action` reads it as
    ``td["hidden"]`` and writes the state after the step as
    ``td["next_hidden"]``; :meth:`get_value` reads ``td["hidden"]``;
    :meth:`evaluate_actions` takes sequences, a TensorDict ``[L, S]`` (time
    first) with ``hidden`` (only ``hidden[0]``, the state before each
    sequence's first step, is read) and ``done`` (bool: the state is zeroed
    after a done step), and returns ``[L, S]``. The collector zeroes the state
    of an env whose episode ended, stores it with the rollout, and the
    algorithms cut rollouts into whole sequences.

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
    is_recurrent: bool = False

    @property
    def recurrent_critic(self) -> bool:
        """Whether :meth:`get_value` reads the state ``td["hidden"]``: the collector then stores, for the
        bootstrap values of done rows, the state after each step (``final_hidden``). Here ``is_recurrent and
        has_critic``; a policy whose critic is feed-forward (:class:`ActorCritic` with ``rnn_critic=False``) says
        False."""
        return self.is_recurrent and self.has_critic

    def initial_state(self, batch: int, device: torch.device | str | None = None) -> TensorDict | None:
        """The state of ``batch`` envs before an episode's first observation (zeros), a TensorDict of batch size
        ``[batch]`` on ``device``; None for a feed-forward policy."""
        return None

    # ----------------------------------------------------------- tensor core (defaults over the TensorDict methods)
    def act(
        self,
        obs: Obs | Mapping[str, torch.Tensor],
        state: Mapping[str, torch.Tensor] | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor] | None]:
        """Act on ``obs``: plain tensors in and out, for the step loops of collection and evaluation.

        Here through :meth:`get_action` (a TensorDict built per call); :class:`ActorCritic` computes it directly.

        Args:
            obs: float32 ``[B, obs_dim]``, or a mapping (a dict or a TensorDict) of group name -> ``[B, *shape]``.
            state: a recurrent policy's state, a mapping with :meth:`initial_state`'s keys, each ``[B, ...]``; None
                for a feed-forward policy.
            deterministic: take the mode of the action distribution (evaluation) instead of a draw.

        Returns:
            ``(action, log_prob, value, next_state)``: the action, ``[B, act_dim]`` float32 (Box) or ``[B]`` int64
            (Discrete); its log-probability, float32 ``[B]``; the value, float32 ``[B]``; the state after the step,
            a dict of :meth:`initial_state`'s keys (None for a feed-forward policy).
        """
        td = self.get_action(_tensordict({"obs": obs}, _batch(obs), state), deterministic)
        next_state = dict(td["next_hidden"].items()) if self.is_recurrent else None
        return td["action"], td["sample_log_prob"], td["value"], next_state

    def value(
        self, obs: Obs | Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The value of ``obs`` (as :meth:`act` takes it; ``state`` read by a recurrent critic): float32 ``[B]``.

        Here through :meth:`get_value`; :class:`ActorCritic` computes it directly.
        """
        return self.get_value(_tensordict({"obs": obs}, _batch(obs), state))["value"]

    def evaluate(
        self,
        obs: Obs | Mapping[str, torch.Tensor],
        action: torch.Tensor,
        state: Mapping[str, torch.Tensor] | None = None,
        done: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability, entropy and value of stored actions, differentiable, for the minibatch update.

        Here through :meth:`evaluate_actions`; :class:`ActorCritic` computes it directly.

        Args:
            obs: as :meth:`act` takes it, ``[B, ...]``; for a recurrent policy sequences ``[L, S, ...]`` (time
                first).
            action: the actions taken, ``[B, act_dim]`` float32 (Box) or ``[B]`` int64 (Discrete); ``[L, S, ...]``
                for a recurrent policy.
            state: a recurrent policy's state before each sequence's first step (:meth:`initial_state`'s keys,
                each ``[S, ...]``); None for a feed-forward policy.
            done: bool ``[L, S]``, a recurrent policy's episode ends: the state is zeroed after a done step; None:
                no episode ends inside the sequences.

        Returns:
            ``(log_prob, entropy, value)``, float32 ``[B]`` each (``[L, S]`` for a recurrent policy).
        """
        if not self.is_recurrent:
            return _unpack(self.evaluate_actions(_tensordict({"obs": obs, "action": action}, action.shape[:1])))
        steps = action.shape[:2]
        if done is None:
            done = torch.zeros(steps, dtype=torch.bool, device=action.device)
        hidden = None if state is None else {k: v.unsqueeze(0).expand(steps[0], *v.shape) for k, v in state.items()}
        return _unpack(self.evaluate_actions(_tensordict({"obs": obs, "action": action, "done": done}, steps, hidden)))

    # ----------------------------------------------------------- TensorDict interface
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
    """MLP actor and MLP critic with a Gaussian (Box) or Categorical (Discrete) head, each optionally behind a
    recurrent core (:class:`~rlchain.core.networks.Memory`).

    Observation groups (a ``Dict`` observation space, :mod:`rlchain.core.observations`): the actor sees the
    groups ``actor_obs`` names and the critic those of ``critic_obs``, each vector group through its own running
    normaliser, flattened and concatenated in the order named; with a privileged ``critic`` group the critic
    learns values from state the actor does not observe (asymmetric actor-critic, Pinto et al. 2018). An image
    group (uint8, or 3-D: :func:`rlchain.core.observations.is_image`) goes through a
    :class:`~rlchain.core.networks.CNNEncoder`, the actor's and the critic's each their own, whose ``cnn_features``
    join the vectors in the named order.

    With ``rnn_type`` the actor (``rnn_actor``) and the critic (``rnn_critic``) each read those features through
    their own :class:`~rlchain.core.networks.Memory` before their MLP; the state (:meth:`initial_state`) holds
    ``actor_h`` (and ``actor_c`` for an LSTM) and ``critic_h`` (``critic_c``), each float32 ``[B, rnn_num_layers,
    rnn_hidden_size]``.

    Args:
        observation_space: one env's flat ``gymnasium.spaces.Box`` (a vector, or one image), or a ``Dict`` of
            ``Box`` groups.
        action_space: ``Box`` (1-D) or ``Discrete`` of one env.
        settings: fields of :class:`ActorCriticConfig` (``self.cfg``).

    Raises:
        ValueError: a Box observation space that is neither a vector nor an image, or one that is neither a Box
            nor a Dict of Box groups, an action space other than 1-D Box or Discrete; a setting out of its range (an
            unknown activation, a non-positive hidden size, an ``init_log_std`` outside ``[log_std_min,
            log_std_max]``, an ``actor_obs`` or ``critic_obs`` group the env does not have, an image the CNN
            encoder cannot take: see :class:`~rlchain.core.networks.CNNEncoder`), naming it; an ``rnn_type`` that no
            network takes (the actor's off with ``rnn_actor=False``, and no critic).
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
        self.action_rng: Any = None
        """The counter stream of the action noise (:meth:`seed_actions`; a
        :class:`~rlchain.core.envs.rng.CounterRng`), or None: torch's global RNG."""
        self._tensordict_methods = {
            name: getattr(type(self), name) is not getattr(ActorCritic, name)
            for name in ("get_action", "get_value", "evaluate_actions")
        }
        """Which TensorDict methods a subclass overrides: :meth:`act`, :meth:`value` and :meth:`evaluate` then go
        through them (as :class:`Policy`'s do), so that a subclass written to the TensorDict contract acts as it says
        wherever rlchain calls the tensor core."""
        self.observation_space, self.action_space = observation_space, action_space
        if isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) != 1:
            if not observations.is_image(observation_space):
                raise ValueError(
                    f"observation_space={observation_space} is not supported: expected a flat (1-D) Box, an image "
                    "(uint8, [H, W, C] or [C, H, W]) or a Dict of groups"
                )
        spaces = observations.group_spaces(observation_space)
        self.grouped = observations.is_grouped(observation_space)
        self.actor_groups = _chosen_groups("actor_obs", cfg.actor_obs, spaces, _default_actor_groups(spaces))
        self.critic_groups = _chosen_groups(
            "critic_obs", cfg.critic_obs, spaces, ["critic"] if "critic" in spaces else self.actor_groups
        )
        used = [g for g in spaces if g in self.actor_groups or (self.has_critic and g in self.critic_groups)]
        self._shapes = {g: tuple(spaces[g].shape) for g in used}
        self.image_groups = [g for g in used if observations.is_image(spaces[g])]
        """The groups that are camera images, each read through a CNN encoder (one for the actor, one for the
        critic); the others are vectors, normalised and concatenated."""
        dims = {g: math.prod(shape) for g, shape in self._shapes.items() if g not in self.image_groups}

        def encoders(groups: list[str], field: str) -> nn.ModuleDict:
            cnn = dict(
                channels=cfg.cnn_channels,
                kernel_sizes=cfg.cnn_kernel_sizes,
                strides=cfg.cnn_strides,
                features=cfg.cnn_features,
                activation=cfg.activation,
                field=field,
                head=cfg.cnn_head,
            )
            return nn.ModuleDict({g: CNNEncoder(g, self._shapes[g], **cnn) for g in groups if g in self.image_groups})

        def width(groups: list[str]) -> int:
            return sum(cfg.cnn_features if g in self.image_groups else dims[g] for g in groups)

        self.actor_encoders = encoders(self.actor_groups, "actor_obs")
        self.critic_encoders = encoders(self.critic_groups, "critic_obs") if self.has_critic else nn.ModuleDict()
        self.obs_dim = width(self.actor_groups)
        """Features of the actor's MLP input (an image group counts its encoder's cnn_features)."""
        self.act_dim = act_out
        mlp = dict(
            hidden_sizes=cfg.hidden_sizes,
            activation=cfg.activation,
            layer_norm=cfg.layer_norm,
            ortho_init=cfg.ortho_init,
        )
        critic_dim = width(self.critic_groups) if self.has_critic else 0

        def memory(wanted: bool, in_dim: int) -> Memory | None:
            if cfg.rnn_type is None or not wanted:
                return None
            return Memory(cfg.rnn_type, in_dim, cfg.rnn_hidden_size, cfg.rnn_num_layers)

        self.actor_memory = memory(cfg.rnn_actor, self.obs_dim)
        self.critic_memory = memory(cfg.rnn_critic and self.has_critic, critic_dim)
        self.is_recurrent = self.actor_memory is not None or self.critic_memory is not None
        if cfg.rnn_type is not None and not self.is_recurrent:
            raise SettingError(
                "rnn_actor",
                False,
                f" is not allowed with rnn_type={cfg.rnn_type!r}: {type(self).__name__} has no critic, so no "
                "network would be recurrent; expected true (or rnn_type=None)",
            )
        actor_in = cfg.rnn_hidden_size if self.actor_memory is not None else self.obs_dim
        self.actor = MLP(actor_in, out_dim=act_out, output_gain=0.01, **mlp)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((act_out,), cfg.init_log_std))
        self._shared_input = not self.has_critic or (self.critic_groups == self.actor_groups and not self.image_groups)
        """Whether the critic's input is the actor's (the same vector groups, or no critic): computed once per
        forward. Images are not shared: the actor and the critic each have their own encoder."""
        critic_in = cfg.rnn_hidden_size if self.critic_memory is not None else critic_dim
        self.critic = MLP(critic_in, out_dim=1, output_gain=1.0, **mlp) if self.has_critic else None
        self.obs_normalizer: RunningMeanStd | nn.ModuleDict | None = None
        """One flat observation's normaliser, or (grouped) one per vector group the networks see, by group name
        (images are scaled by their encoder instead)."""
        if cfg.obs_normalization and dims:
            self.obs_normalizer = (
                nn.ModuleDict({g: RunningMeanStd(d) for g, d in dims.items()})
                if self.grouped
                else RunningMeanStd(self.obs_dim)
            )

    # ----------------------------------------------------------- internals
    def _features(self, obs: Obs, groups: list[str], encoders: nn.ModuleDict) -> torch.Tensor:
        """The network input of ``groups``: each vector group normalised and flattened to ``[B, dim]``, each image
        group through its encoder in ``encoders``, concatenated."""
        if not self.grouped:
            if encoders:
                return encoders[observations.FLAT](obs)
            return self.obs_normalizer.normalize(obs) if self.obs_normalizer is not None else obs
        parts = []
        for g in groups:
            x = obs[g]
            if g in encoders:
                parts.append(encoders[g](x))
                continue
            x = x.flatten(x.dim() - len(self._shapes[g])) if len(self._shapes[g]) != 1 else x
            parts.append(self.obs_normalizer[g].normalize(x) if self.obs_normalizer is not None else x)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _inputs(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actor input, critic input)``; one tensor when both see the same vector groups."""
        x = self._features(obs, self.actor_groups, self.actor_encoders)
        return x, x if self._shared_input else self._features(obs, self.critic_groups, self.critic_encoders)

    def _log_std(self) -> torch.Tensor:
        """The Gaussian's log-std ``[act_dim]``, within ``[log_std_min, log_std_max]`` (:func:`bounded`)."""
        return bounded(self.log_std, self.cfg.log_std_min, self.cfg.log_std_max)

    def _critic_value(self, x: torch.Tensor) -> torch.Tensor:
        """The critic's value of its input ``x`` ``[*B, critic_dim]``: float32 ``[*B]``; zeros without a critic."""
        if self.critic is None:
            return torch.zeros(x.shape[:-1], device=x.device, dtype=x.dtype)
        return self.critic(x).squeeze(-1)

    def _memories(self) -> list[tuple[str, Memory]]:
        """``(network name, its core)`` of the recurrent networks, actor first."""
        return [(net, m) for net, m in (("actor", self.actor_memory), ("critic", self.critic_memory)) if m is not None]

    def _state(self, state: Mapping[str, torch.Tensor] | None, net: str) -> tuple[torch.Tensor, ...]:
        """The state of ``net``'s core in ``state``: ``state[f"{net}_{name}"]`` in the core's order.

        Raises:
            ValueError: ``state`` is None (a recurrent network needs its state).
        """
        memory = self.actor_memory if net == "actor" else self.critic_memory
        if state is None:
            keys = [f"{n}_{name}" for n, m in self._memories() for name in m.state_names]
            raise ValueError(f"state=None is not allowed: the {net} is recurrent; expected a state with keys {keys}")
        return tuple(state[f"{net}_{name}"] for name in memory.state_names)

    def _recur(
        self,
        x: torch.Tensor,
        critic_x: torch.Tensor,
        state: Mapping[str, torch.Tensor] | None,
        starts: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor] | None]:
        """The actor's and the critic's inputs through their cores from ``state``: one step (``[B]``; ``starts``
        None), or sequences ``[L, S]`` replayed from ``state`` (each ``[S, ...]``) with the state zeroed before the
        steps where ``starts`` (bool ``[L, S]``); also the state after them, by key (None for a feed-forward
        policy, whose inputs pass unchanged)."""
        if not self.is_recurrent:
            return x, critic_x, None
        new, outs = {}, []
        for net, memory, features in (("actor", self.actor_memory, x), ("critic", self.critic_memory, critic_x)):
            if memory is None:
                outs.append(features)
                continue
            core = self._state(state, net)
            out, core = memory.step(features, core) if starts is None else memory.sequence(features, core, starts)
            outs.append(out)
            new.update({f"{net}_{name}": s for name, s in zip(memory.state_names, core)})
        return outs[0], outs[1], new

    def _core_act(
        self,
        obs: Obs | Mapping[str, torch.Tensor],
        state: Mapping[str, torch.Tensor] | None,
        deterministic: bool,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor] | None]:
        """What :meth:`act` returns, computed here (no TensorDict). ``noise``: the draw's standard normals ``[B,
        act_dim]`` (Box) or uniforms ``[B, n]`` (Discrete); None: from :attr:`action_rng` where set, else from
        torch's global RNG (a population passes each member's, :mod:`rlchain.population`)."""
        x, critic_x = self._inputs(obs)
        x, critic_x, next_state = self._recur(x, critic_x, state)
        out = self.actor(x)
        if noise is None and not deterministic and self.action_rng is not None:
            noise = self.action_noise(out.shape[0])
        if self.discrete:
            log_probs = torch.log_softmax(out, dim=-1)
            action = out.argmax(-1) if deterministic else categorical_sample(log_probs, noise)
            log_prob = categorical_log_prob(log_probs, action)
        else:
            log_std = self._log_std()
            action = out if deterministic else gaussian_sample(out, log_std, noise)
            log_prob = gaussian_log_prob(action, out, log_std)
        return action, log_prob, self._critic_value(critic_x), next_state

    def _core_value(
        self, obs: Obs | Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor] | None
    ) -> torch.Tensor:
        """What :meth:`value` returns, computed here."""
        if self.critic is None:  # zeros of the batch's shape
            return self._critic_value(self._features(obs, self.actor_groups, self.actor_encoders))
        x = self._features(obs, self.critic_groups, self.critic_encoders)
        if self.critic_memory is not None:
            x, _ = self.critic_memory.step(x, self._state(state, "critic"))
        return self._critic_value(x)

    def _core_evaluate(
        self,
        obs: Obs | Mapping[str, torch.Tensor],
        action: torch.Tensor,
        state: Mapping[str, torch.Tensor] | None,
        done: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What :meth:`evaluate` returns, computed here; ``done`` None: no episode ends inside the sequences."""
        x, critic_x = self._inputs(obs)
        if self.is_recurrent:
            if done is None:
                starts = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
            else:
                starts = torch.cat((torch.zeros_like(done[:1]), done[:-1]))
            x, critic_x, _ = self._recur(x, critic_x, state, starts)
        out = self.actor(x)
        if self.discrete:
            log_probs = torch.log_softmax(out, dim=-1)
            log_prob, entropy = categorical_log_prob(log_probs, action), categorical_entropy(log_probs)
        else:
            log_std = self._log_std()
            log_prob = gaussian_log_prob(action, out, log_std)
            entropy = gaussian_entropy(log_std).expand(out.shape[:-1])
        return log_prob, entropy, self._critic_value(critic_x)

    # ------------------------------------------------------------- action noise
    def seed_actions(self, seed: int) -> None:
        """Draw the action noise from a counter stream of ``seed`` (:attr:`action_rng`, on the policy's device)
        from now on, instead of torch's global RNG: what ``rlchain-train`` does with the run's seed, so that a run
        and the same run as a member of a population (:mod:`rlchain.population`) act alike. The stream's key is
        ``seed + ACTION_STREAM`` (2**62), apart from the env's stream of the same seed."""
        from rlchain.core.envs.rng import CounterRng

        self.action_rng = CounterRng(int(seed) + ACTION_STREAM, next(self.parameters()).device)

    def action_noise(self, batch: int) -> torch.Tensor:
        """One step's draw of :attr:`action_rng` for ``batch`` envs: standard normals float32 ``[batch, act_dim]``
        (Box) or uniforms ``[batch, n]`` (Discrete), envs along the rows (a population's members in blocks)."""
        width = int(self.action_space.n) if self.discrete else int(self.action_space.shape[0])
        draw = self.action_rng.uniform if self.discrete else self.action_rng.normal
        return draw(batch, width, env_axis=0)

    # ----------------------------------------------------------- interface
    @property
    def recurrent_critic(self) -> bool:
        """Whether the critic has a recurrent core (``rnn_type`` with ``rnn_critic`` and a critic)."""
        return self.critic_memory is not None

    def initial_state(self, batch: int, device: torch.device | str | None = None) -> TensorDict | None:
        """Zeros: ``actor_h``, ``critic_h`` (an LSTM's ``actor_c``, ``critic_c`` too) of the recurrent networks,
        float32 ``[batch, rnn_num_layers, rnn_hidden_size]`` each; None for a feed-forward policy."""
        from tensordict import TensorDict  # imported where used: see rlchain.commands.config

        if not self.is_recurrent:
            return None
        if device is None:
            device = next(self.parameters()).device
        zeros = {
            f"{net}_{name}": torch.zeros(batch, *memory.state_shape, device=device)
            for net, memory in self._memories()
            for name in memory.state_names
        }
        return TensorDict(zeros, batch_size=[batch], device=device)

    def act(
        self,
        obs: Obs | Mapping[str, torch.Tensor],
        state: Mapping[str, torch.Tensor] | None = None,
        deterministic: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor] | None]:
        """Act on ``obs``: the actor's draw (or, ``deterministic``, the Gaussian's mean or the most likely
        category), its log-probability and the critic's value, from plain tensors.

        Args:
            obs: float32 ``[B, obs_dim]`` (an image: uint8 ``[B, *image_shape]``), or grouped a mapping (a dict or
                a TensorDict) holding at least the groups the actor and the critic read, each ``[B, *shape]``.
            state: a recurrent policy's state, a mapping of :meth:`initial_state`'s keys (``actor_h``,
                ``critic_h``; an LSTM's ``actor_c``, ``critic_c``), each float32 ``[B, rnn_num_layers,
                rnn_hidden_size]``; None for a feed-forward policy.
            deterministic: the Gaussian's mean or the most likely category instead of a draw.

        Returns:
            ``(action, log_prob, value, next_state)``: ``[B, act_dim]`` float32 (Box, unclipped) or ``[B]`` int64
            (Discrete); float32 ``[B]``; float32 ``[B]`` (zeros without a critic); the state after the step, a dict
            of ``state``'s keys and shapes (None for a feed-forward policy). Draws come from torch's global RNG.

        Raises:
            ValueError: ``state`` is None for a recurrent policy.
        """
        if self._tensordict_methods["get_action"]:  # a subclass's own get_action: acts through it
            return super().act(obs, state, deterministic)
        return self._core_act(obs, state, deterministic)

    def value(
        self, obs: Obs | Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The critic's value of ``obs`` (as :meth:`act` takes it; ``state`` read by a recurrent critic only):
        float32 ``[B]``, zeros without a critic.

        Raises:
            ValueError: ``state`` is None for a recurrent critic.
        """
        if self._tensordict_methods["get_value"]:
            return super().value(obs, state)
        return self._core_value(obs, state)

    def evaluate(
        self,
        obs: Obs | Mapping[str, torch.Tensor],
        action: torch.Tensor,
        state: Mapping[str, torch.Tensor] | None = None,
        done: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability, entropy and value of stored actions under the current networks, differentiable.

        Args:
            obs: as :meth:`act` takes it, ``[B, ...]``; for a recurrent policy sequences ``[L, S, ...]`` (time
                first).
            action: ``[B, act_dim]`` float32 (Box) or ``[B]`` int64 (Discrete); ``[L, S, ...]`` for a recurrent
                policy.
            state: a recurrent policy's state before each sequence's first step, a mapping of
                :meth:`initial_state`'s keys, each float32 ``[S, rnn_num_layers, rnn_hidden_size]``; None for a
                feed-forward policy.
            done: bool ``[L, S]`` (recurrent): the state is zeroed after a done step; None: no episode ends inside
                the sequences.

        Returns:
            ``(log_prob, entropy, value)``, float32 ``[B]`` each (``[L, S]`` for a recurrent policy); the Gaussian's
            entropy does not depend on the observation (an expanded view).

        Raises:
            ValueError: ``state`` is None for a recurrent policy.
        """
        if self._tensordict_methods["evaluate_actions"]:
            return super().evaluate(obs, action, state, done)
        return self._core_evaluate(obs, action, state, done)

    def get_action(self, td: TensorDict, deterministic: bool = False) -> TensorDict:
        """:meth:`act` on ``td["obs"]`` (and a recurrent policy's ``td["hidden"]``): writes ``action``,
        ``sample_log_prob`` ``[B]``, ``value`` ``[B]`` (and ``next_hidden``) into ``td`` and returns it."""
        hidden = td["hidden"] if self.is_recurrent else None
        action, log_prob, value, next_state = self._core_act(td["obs"], hidden, deterministic)
        td["action"], td["sample_log_prob"], td["value"] = action, log_prob, value
        if next_state is not None:
            td["next_hidden"] = type(td)(next_state, batch_size=td.batch_size)
        return td

    def deterministic_action(self, obs: Obs | dict[str, torch.Tensor]) -> torch.Tensor:
        """The Gaussian's mean (Box, ``[B, act_dim]``) or the most likely category (Discrete, ``[B]`` int64) for
        ``obs`` ``[B, obs_dim]`` (grouped: a dict or TensorDict holding at least the actor's groups),
        observation normalisation included.

        Raises:
            NotImplementedError: a recurrent actor (it acts through :meth:`deterministic_step`).
        """
        if self.actor_memory is not None:
            raise NotImplementedError("a recurrent actor acts through deterministic_step(obs, state)")
        out = self.actor(self._features(obs, self.actor_groups, self.actor_encoders))
        return out.argmax(-1) if self.discrete else out

    def deterministic_step(
        self, obs: Obs | dict[str, torch.Tensor], state: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """:meth:`deterministic_action` of a recurrent actor, from plain tensors: ``obs`` and the actor's state
        (``actor_h``, and an LSTM's ``actor_c``, each float32 ``[B, rnn_num_layers, rnn_hidden_size]``) -> the
        action and the actor's next state (traceable by ``torch.jit.trace`` and ``torch.onnx.export``).

        Raises:
            NotImplementedError: a feed-forward actor (it acts through :meth:`deterministic_action`).
        """
        if self.actor_memory is None:
            raise NotImplementedError("a feed-forward actor acts through deterministic_action(obs)")
        x, state = self.actor_memory.step(self._features(obs, self.actor_groups, self.actor_encoders), state)
        out = self.actor(x)
        return (out.argmax(-1) if self.discrete else out), state

    def get_value(self, td: TensorDict) -> TensorDict:
        """:meth:`value` of ``td["obs"]`` (a recurrent critic reads ``td["hidden"]``): writes ``value`` ``[B]`` into
        ``td`` and returns it."""
        td["value"] = self._core_value(td["obs"], td["hidden"] if self.critic_memory is not None else None)
        return td

    def evaluate_actions(self, td: TensorDict) -> TensorDict:
        """:meth:`evaluate` of ``td["obs"]`` and ``td["action"]``: a new TensorDict of differentiable
        ``sample_log_prob``, ``entropy``, ``value`` of ``td``'s batch shape, ``[B]``, or for a recurrent policy
        ``[L, S]`` sequences read with ``td["hidden"][0]`` and ``td["done"]`` (see :class:`Policy`)."""
        from tensordict import TensorDict  # imported where used: see rlchain.commands.config

        state = done = None
        if self.is_recurrent:
            state, done = {k: v[0] for k, v in td["hidden"].items()}, td["done"]
        log_prob, entropy, value = self._core_evaluate(td["obs"], td["action"], state, done)
        return TensorDict({"sample_log_prob": log_prob, "entropy": entropy, "value": value}, batch_size=td.batch_size)

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


def _batch(obs: Obs | Mapping[str, torch.Tensor]) -> list[int]:
    """The batch size ``[B]`` of observations ``obs`` (a tensor ``[B, ...]`` or a mapping of groups)."""
    return [observations.leaves(obs)[0].shape[0]]


def _tensordict(
    entries: dict[str, Any], batch: Sequence[int], hidden: Mapping[str, torch.Tensor] | None = None
) -> TensorDict:
    """``entries`` (and a recurrent policy's state ``hidden`` as ``"hidden"``) as a TensorDict of batch size
    ``batch``: the input of the TensorDict interface."""
    from tensordict import TensorDict  # imported where used: see rlchain.commands.config

    if hidden is not None:
        entries = {**entries, "hidden": TensorDict(dict(hidden.items()), batch_size=batch)}
    return TensorDict(entries, batch_size=batch)


def _unpack(td: TensorDict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sample_log_prob, entropy, value)`` of what :meth:`Policy.evaluate_actions` returned."""
    return td["sample_log_prob"], td["entropy"], td["value"]


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


class ActorOnly(ActorCritic):
    """The actor of :class:`ActorCritic` without a critic: ``value`` is always 0.

    For critic-free algorithms such as GRPO (Shao et al. 2024). Arguments and
    errors as :class:`ActorCritic`.
    """

    has_critic = False
