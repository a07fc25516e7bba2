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

A recurrent policy (``rnn_type``: a GRU or an LSTM before the actor's and/or the critic's MLP,
:class:`~rlchain.core.networks.Memory`) also reads its state ``td["hidden"]`` (a TensorDict ``[B]``) and writes ``td["next_hidden"]``; its
``evaluate_actions`` takes sequences ``[L, S]`` (see :class:`Policy`), and
:meth:`ActorCritic.deterministic_step` is what ``rlchain-export`` traces.

Running observation normalisation (``obs_normalization=True``) keeps a mean
and variance of the observations in buffers, so they travel with the
``state_dict`` and every checkpoint; they change only through
:meth:`Policy.update_obs_normalizer`, which the algorithm calls with the
observations of each rollout it learns from.
"""

from __future__ import annotations

import math
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
      ``is_recurrent`` (False), :meth:`initial_state` (None) and
      :attr:`recurrent_critic` (``is_recurrent and has_critic``).

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

    def _memories(self) -> list[tuple[str, Memory]]:
        """``(network name, its core)`` of the recurrent networks, actor first."""
        return [(net, m) for net, m in (("actor", self.actor_memory), ("critic", self.critic_memory)) if m is not None]

    def _state(self, hidden: TensorDict, net: str) -> tuple[torch.Tensor, ...]:
        """The state of ``net``'s core in ``hidden``: ``hidden[f"{net}_{name}"]`` in the core's order."""
        memory = self.actor_memory if net == "actor" else self.critic_memory
        return tuple(hidden[f"{net}_{name}"] for name in memory.state_names)

    def _recur(
        self, x: torch.Tensor, critic_x: torch.Tensor, td: TensorDict, sequences: bool
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The actor's and the critic's inputs through their cores from ``td["hidden"]``: one step (``[B]``), or
        ``sequences`` ``[L, S]`` replayed from ``td["hidden"][0]`` with resets after ``td["done"]``; also the state
        after them, by key."""
        if not self.is_recurrent:
            return x, critic_x, {}
        hidden, new = td["hidden"], {}
        starts = None
        if sequences:
            hidden, done = hidden[0], td["done"]
            starts = torch.cat((torch.zeros_like(done[:1]), done[:-1]))
        outs = []
        for net, memory, features in (("actor", self.actor_memory, x), ("critic", self.critic_memory, critic_x)):
            if memory is None:
                outs.append(features)
                continue
            state = self._state(hidden, net)
            out, state = memory.sequence(features, state, starts) if sequences else memory.step(features, state)
            outs.append(out)
            new.update({f"{net}_{name}": s for name, s in zip(memory.state_names, state)})
        return outs[0], outs[1], new

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

    def get_action(self, td: TensorDict, deterministic: bool = False) -> TensorDict:
        """Write ``action``, ``sample_log_prob [B]`` and ``value [B]`` for ``td["obs"]`` into ``td`` and return it;
        a recurrent policy reads ``td["hidden"]`` and writes ``td["next_hidden"]``.

        ``deterministic`` takes the Gaussian mean or the most likely category.
        """
        x, critic_x = self._inputs(td["obs"])
        x, critic_x, new = self._recur(x, critic_x, td, sequences=False)
        dist = self._distribution(x)
        if deterministic:
            action = dist.probs.argmax(-1) if self.discrete else dist.mean
        else:
            action = dist.sample()
        td["action"], td["sample_log_prob"], td["value"] = action, self._log_prob(dist, action), self._value(critic_x)
        if self.is_recurrent:
            td["next_hidden"] = type(td)(new, batch_size=td.batch_size)
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
        """Write ``value`` ``[B]`` into ``td`` and return it (a recurrent critic reads ``td["hidden"]``)."""
        if self.critic is None:  # zeros of the batch's shape
            td["value"] = self._value(self._features(td["obs"], self.actor_groups, self.actor_encoders))
            return td
        x = self._features(td["obs"], self.critic_groups, self.critic_encoders)
        if self.critic_memory is not None:
            x, _ = self.critic_memory.step(x, self._state(td["hidden"], "critic"))
        td["value"] = self._value(x)
        return td

    def evaluate_actions(self, td: TensorDict) -> TensorDict:
        """Return a new TensorDict with differentiable ``sample_log_prob``, ``entropy``, ``value`` of ``td``'s
        batch shape: ``[B]``, or for a recurrent policy ``[L, S]`` sequences (see :class:`Policy`)."""
        from tensordict import TensorDict  # imported where used: see rlchain.commands.config

        x, critic_x = self._inputs(td["obs"])
        x, critic_x, _ = self._recur(x, critic_x, td, sequences=True)
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


class ActorOnly(ActorCritic):
    """The actor of :class:`ActorCritic` without a critic: ``value`` is always 0.

    For critic-free algorithms such as GRPO (Shao et al. 2024). Arguments and
    errors as :class:`ActorCritic`.
    """

    has_critic = False
