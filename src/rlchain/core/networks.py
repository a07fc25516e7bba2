"""Networks of the policies: the MLP, the image encoder, the recurrent core, and the log-std bound.

:class:`MLP` (the actor's and the critic's, orthogonally initialised by default), :class:`CNNEncoder` (one image
group's encoder, Mnih et al. 2015's network by default, with a :class:`SpatialSoftmax` head as an option),
:class:`Memory` (a GRU or an LSTM before an MLP, whose state is plain tensors ``[B, num_layers, hidden_size]``),
and :func:`bounded` (a clamp whose gradient can always bring a parameter back into range). Each takes and returns
plain tensors; :mod:`rlchain.core.policies` composes them into policies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from rlchain.core import observations
from rlchain.settings import SettingError

__all__ = [
    "ACTIVATIONS",
    "CNNEncoder",
    "MAX_CNN_FEATURES",
    "MLP",
    "Memory",
    "RNN_TYPES",
    "SpatialSoftmax",
    "bounded",
]

#: The recurrent cores a policy can have (``rnn_type``): the GRU (Cho et al. 2014) or the LSTM (Hochreiter and
#: Schmidhuber 1997).
RNN_TYPES = ("gru", "lstm")

#: The activations a network can have (``activation``), by name.
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
}


class _InwardClamp(torch.autograd.Function):
    """``clamp`` whose backward passes every gradient that moves the input back into range (written with
    ``setup_context`` and a ``vmap`` rule, so that a population's vmapped policies take it too)."""

    @staticmethod
    def forward(x: torch.Tensor, low: float, high: float) -> torch.Tensor:  # type: ignore[override]
        return x.clamp(low, high)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:  # type: ignore[override]
        x, low, high = inputs
        ctx.save_for_backward(x)
        ctx.low, ctx.high = low, high

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        # A descent step moves x by -grad: below the range only a negative
        # gradient (x grows) passes, above it only a positive one.
        keep = ((x >= ctx.low) | (grad < 0)) & ((x <= ctx.high) | (grad > 0))
        return grad.masked_fill(~keep, 0.0), None, None

    @staticmethod
    def vmap(info, in_dims: tuple, x: torch.Tensor, low: float, high: float) -> tuple[torch.Tensor, int | None]:
        """Elementwise, so the batched tensor takes the function as it is (cheaper than a generated rule)."""
        return _InwardClamp.apply(x, low, high), in_dims[0]


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
        low: the lower bound.
        high: the upper bound, ``>= low``.

    Returns:
        a tensor of ``x``'s shape and dtype, in ``[low, high]``.
    """
    return _InwardClamp.apply(x, low, high)


class MLP(nn.Sequential):
    """Multi-layer perceptron, orthogonally initialised by default.

    With ``ortho_init``, hidden layers get orthogonal weights with gain sqrt(2) and zero biases, and the output
    layer gain ``output_gain`` (0.01 for policy heads, 1 for value heads, as in CleanRL's PPO and SB3); without,
    every layer keeps PyTorch's default init of ``nn.Linear`` (weights and biases uniform in
    ``±1/sqrt(fan_in)``, as rsl_rl's networks).

    Args:
        in_dim: input features.
        hidden_sizes: widths of the hidden layers (may be empty).
        out_dim: output features.
        activation: name in :data:`ACTIVATIONS`.
        layer_norm: LayerNorm after every hidden linear layer.
        output_gain: orthogonal gain of the last layer (with ``ortho_init``).
        ortho_init: orthogonal init (see above); False: PyTorch's default.

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
        ortho_init: bool = True,
    ) -> None:
        layers: list[nn.Module] = []
        last = in_dim
        for width in hidden_sizes:
            linear = nn.Linear(last, width)
            if ortho_init:
                nn.init.orthogonal_(linear.weight, math.sqrt(2))
                nn.init.zeros_(linear.bias)
            layers.append(linear)
            if layer_norm:
                layers.append(nn.LayerNorm(width))
            layers.append(ACTIVATIONS[activation]())
            last = width
        head = nn.Linear(last, out_dim)
        if ortho_init:
            nn.init.orthogonal_(head.weight, output_gain)
            nn.init.zeros_(head.bias)
        layers.append(head)
        super().__init__(*layers)


#: The most features an image encoder's convolutions may hand to its linear layer (a larger image needs more
#: stride or fewer channels: 65,536 features make a 16.8M-parameter layer at 256 cnn_features).
MAX_CNN_FEATURES = 65_536


class CNNEncoder(nn.Module):
    """Convolutional encoder of one image group (the network of Mnih et al. 2015 by default, as CleanRL's and
    SB3's ``NatureCNN``): convolutions, each followed by the activation, then a linear layer and the activation.

    A uint8 image is scaled to ``[0, 1]`` (``/ 255``) inside :meth:`forward`, so rollouts keep images as uint8 and
    every minibatch is converted as it is used; a float32 image (depth) is taken as it is. Weights are orthogonal
    with gain sqrt(2), biases zero.

    Args:
        group: the group's name (for errors).
        shape: one image's shape, ``[H, W, C]`` or ``[C, H, W]`` (:func:`rlchain.core.observations.channels_last`).
        channels: output channels of each convolution.
        kernel_sizes: kernel size of each convolution, pixels (one per entry of ``channels``).
        strides: stride of each convolution, pixels (one per entry of ``channels``).
        features: output features.
        activation: name in :data:`ACTIVATIONS`.
        field: the setting that named the group (for errors).
        head: ``flatten`` (the last convolution's activations, flattened) or ``spatial_softmax``
            (:class:`SpatialSoftmax` of its logits) before the linear layer.

    Shapes: ``[*B, *shape]`` uint8 or float32 -> float32 ``[*B, features]`` (any leading dimensions).

    Raises:
        SettingError: an image that is not 3-D (naming the actor's or critic's groups field), smaller than the
            convolutions' receptive field (naming ``cnn_kernel_sizes``), or whose convolutions would hand more than
            :data:`MAX_CNN_FEATURES` features to the linear layer (naming ``cnn_strides``).
    """

    def __init__(
        self,
        group: str,
        shape: Sequence[int],
        channels: Sequence[int],
        kernel_sizes: Sequence[int],
        strides: Sequence[int],
        features: int,
        activation: str = "relu",
        field: str = "actor_obs",
        head: str = "flatten",
    ) -> None:
        super().__init__()
        shape = tuple(int(d) for d in shape)
        if len(shape) != 3:
            raise SettingError(
                field,
                group,
                f" is not allowed: the image group {group!r} has shape {shape}, and the CNN encoder takes images of "
                "3 dimensions, [H, W, C] or [C, H, W]",
            )
        self.shape, self.channels_last = shape, observations.channels_last(shape)
        c, h, w = (shape[2], shape[0], shape[1]) if self.channels_last else shape
        layers: list[nn.Module] = []
        maps = 0
        for out, kernel, stride in zip(channels, kernel_sizes, strides):
            conv = nn.Conv2d(c, out, kernel, stride)
            nn.init.orthogonal_(conv.weight, math.sqrt(2))
            nn.init.zeros_(conv.bias)
            layers += [conv, ACTIVATIONS[activation]()]
            c, h, w = out, (h - kernel) // stride + 1, (w - kernel) // stride + 1
            maps += c * h * w
            if h < 1 or w < 1:
                raise SettingError(
                    "cnn_kernel_sizes",
                    list(kernel_sizes),
                    f" is not allowed with cnn_strides={list(strides)}: the image group {group!r} {shape} is smaller "
                    "than the convolutions' receptive field; expected smaller kernels or strides (or a larger image)",
                )
        if head == "spatial_softmax":
            layers.pop()  # the softmax reads the last convolution's logits
            reader, width = SpatialSoftmax(h, w), 2 * c
        elif c * h * w > MAX_CNN_FEATURES:
            raise SettingError(
                "cnn_strides",
                list(strides),
                f" is not allowed: the image group {group!r} {shape} is too large for the encoder, whose "
                f"convolutions give {c} x {h} x {w} = {c * h * w:,} features (at most {MAX_CNN_FEATURES:,}); "
                "expected larger strides, fewer cnn_channels, or a smaller image",
            )
        else:
            reader, width = nn.Flatten(), c * h * w
        linear = nn.Linear(width, features)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        self.net = nn.Sequential(*layers, reader, linear, ACTIVATIONS[activation]())
        self.features = features
        #: Floats of one image's activations: every convolution's output map and the features.
        self.activation_floats = maps + features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[: x.dim() - 3]
        x = x.reshape(-1, *self.shape)
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.net(x).reshape(*lead, self.features)


class SpatialSoftmax(nn.Module):
    """Each channel's expected image position under the softmax of its activations (Levine et al. 2016).

    Shapes: float32 ``[B, C, H, W]`` -> float32 ``[B, 2 C]``: the x of every channel, then the y, in ``[-1, 1]``
    (x from the left edge's pixel centre to the right's, y from the top row's to the bottom's).
    """

    def __init__(self, height: int, width: int) -> None:
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
        self.register_buffer("xs", xs.reshape(-1), persistent=False)
        self.register_buffer("ys", ys.reshape(-1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(x.flatten(2), dim=-1)
        return torch.cat(((p * self.xs).sum(-1), (p * self.ys).sum(-1)), dim=-1)


class Memory(nn.Module):
    """A recurrent core, GRU (Cho et al. 2014) or LSTM (Hochreiter and Schmidhuber 1997): ``torch.nn.GRU`` or
    ``torch.nn.LSTM`` with orthogonal weights and zero biases (as CleanRL's ``ppo_atari_lstm``).

    Its state is a tuple of float32 tensors ``[B, num_layers, hidden_size]``, batch first (rollout storage keeps
    ``[T, N, ...]``): ``(h,)`` for a GRU, ``(h, c)`` for an LSTM (:attr:`state_names`). Zeros are the state before
    an episode's first observation.

    Args:
        rnn_type: ``gru`` or ``lstm``.
        in_dim: input features.
        hidden_size: state features per layer (and output features).
        num_layers: stacked layers.
    """

    def __init__(self, rnn_type: str, in_dim: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.rnn = (nn.GRU if rnn_type == "gru" else nn.LSTM)(in_dim, hidden_size, num_layers)
        for name, param in self.rnn.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)
        self.state_names = ("h",) if rnn_type == "gru" else ("h", "c")
        """The names of the state's tensors, in order."""
        self.state_shape = (num_layers, hidden_size)
        """One env's shape of each state tensor."""

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """One step: input ``[B, in_dim]`` and state -> output ``[B, hidden_size]`` and the next state."""
        out, new = self.rnn(x.unsqueeze(0), self._native(state))
        return out.squeeze(0), self._batch_first(new)

    def sequence(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...], starts: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Steps ``x`` ``[L, S, in_dim]`` (``S`` sequences, time first) from ``state`` (each ``[S, num_layers,
        hidden_size]``, the state before step 0), zeroing the state before step ``t > 0`` where ``starts[t]``
        (bool ``[L, S]``: the observation of step ``t`` begins an episode; ``starts[0]`` is not read, ``state``
        already holds that reset). Returns the outputs ``[L, S, hidden_size]`` and the state after the last step.

        The same computation as :meth:`step` applied ``L`` times with those resets: torch's RNN runs over the
        steps between two steps where some sequence begins an episode, and the state is zeroed there (one host
        read finds those steps).
        """
        native = self._native(state)
        keep = (~starts).to(x.dtype).unsqueeze(-1)  # [L, S, 1]
        cuts = (starts[1:].any(-1).nonzero().flatten() + 1).tolist()
        outs, begin = [], 0
        for end in [*cuts, x.shape[0]]:
            if begin:
                native = tuple(s * keep[begin] for s in native) if isinstance(native, tuple) else native * keep[begin]
            out, native = self.rnn(x[begin:end], native)
            outs.append(out)
            begin = end
        return torch.cat(outs), self._batch_first(native)

    def _native(self, state: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The state as torch's RNN takes it: ``[num_layers, B, hidden_size]``, one tensor (GRU) or a pair (LSTM)."""
        native = tuple(s.transpose(0, 1).contiguous() for s in state)
        return native[0] if len(native) == 1 else native

    def _batch_first(self, native: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(s.transpose(0, 1) for s in (native if isinstance(native, tuple) else (native,)))
