"""A counter-based random stream for batched torch tasks: draws that compile and replay in a CUDA graph.

A torch-native task draws its initial states and observation noise inside ``step`` (same-step auto-reset). A
``torch.Generator`` there cannot be traced by ``torch.compile``, and its state lives on the host. Here every draw
is a pure function of ``(seed, draw counter, element index)`` (a counter-based generator: Salmon et al. 2011,
"Parallel random numbers: as easy as 1, 2, 3"), computed with int64 tensor ops on the task's device: SplitMix64's
finaliser (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number generators") mixes the key, and each
draw advances the counter, a device tensor, in place. So a draw needs no host read, ``torch.compile(step,
fullgraph=True)`` traces it, a CUDA graph replays it (the counter's address is fixed), the same seed gives the
same stream on the CPU and on CUDA, eager and compiled alike, and a checkpoint saves the whole stream in two
integers.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CounterRng"]

# SplitMix64's constants, as the int64 values of their 64 bits (torch has no uint64 arithmetic); products wrap
# modulo 2**64 as unsigned ones would.
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64
_MIX1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX2 = 0x94D049BB133111EB - 2**64
#: Bits of a float32 uniform (its mantissa and the implicit one): values k / 2**24, k in [0, 2**24).
_UNIFORM_BITS = 24


def _shift_right(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` by ``k`` bits (torch's ``>>`` is arithmetic: it copies the sign bit)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser of int64 ``z`` (elementwise, any shape): a bijection of the 64 bits whose every
    output bit depends on every input bit."""
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


class CounterRng:
    """A task's own random stream: ``[rows, n]`` draws from ``(seed, counter)``, the counter advanced in place.

    Draw ``c`` (the counter's value before it) gives element ``i`` (row-major) the bits
    ``mix64(i * G + mix64(seed * G + c))`` (``G`` SplitMix64's golden-ratio increment); a uniform keeps the top 24
    bits. The stream is the same on every device and under ``torch.compile``.

    Args:
        seed: a non-negative int (the env's ``seed`` setting).
        device: where the state and every draw live.

    Attributes:
        state: int64 ``[2]`` on ``device``: ``(seed, counter)``. Written in place only, so that a captured CUDA
            graph that draws keeps reading it.
    """

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.state = torch.tensor([int(seed), 0], dtype=torch.int64, device=device)
        # The increment as a tensor: a Python int times an arange is an index expression to torch.compile's
        # code generator, which would work it out in exact integers and overflow int64.
        self._golden = torch.tensor(_GOLDEN, dtype=torch.int64, device=device)

    def seed(self, seed: int) -> None:
        """Restart the stream from ``seed`` (in place)."""
        self.state.copy_(torch.tensor([int(seed), 0], dtype=torch.int64))

    def _bits(self, rows: int, n: int) -> torch.Tensor:
        """int64 ``[rows, n]`` of 64 random bits each; advances the counter by one."""
        seed, counter = self.state.unbind()
        key = mix64(seed * _GOLDEN + counter)
        self.state[1:].add_(1)
        index = torch.arange(rows * n, dtype=torch.int64, device=self.device).view(rows, n)
        return mix64(index * self._golden + key)

    def uniform(self, rows: int, n: int) -> torch.Tensor:
        """float32 ``[rows, n]`` uniform on ``[0, 1)`` (multiples of ``2**-24``); one draw of the counter."""
        bits = _shift_right(self._bits(rows, n), 64 - _UNIFORM_BITS)
        return bits.to(torch.float32) * (2.0**-_UNIFORM_BITS)

    def normal(self, rows: int, n: int) -> torch.Tensor:
        """float32 ``[rows, n]`` standard normal (Box-Muller over two uniforms of one draw, so at most about 5.8
        standard deviations from 0); one draw of the counter."""
        u = self.uniform(2 * rows, n)
        radius = torch.sqrt(-2.0 * torch.log1p(-u[:rows]))  # 1 - u in (0, 1]: a finite logarithm
        return radius * torch.cos((2.0 * torch.pi) * u[rows:])

    def integers(self, high: int, n: int) -> torch.Tensor:
        """int64 ``[n]`` uniform on ``[0, high)``; one draw of the counter.

        Raises:
            ValueError: ``high`` not in ``[1, 2**31]``.
        """
        if not 1 <= high <= 2**31:
            raise ValueError(f"high is {high}: expected an integer in [1, 2**31]")
        return (_shift_right(self._bits(1, n)[0], 32) * high) >> 32  # the top 32 bits scaled: no modulo bias

    def state_dict(self) -> torch.Tensor:
        """The stream's state (a copy): int64 ``[2]``, ``(seed, counter)``."""
        return self.state.clone()

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict` output (in place).

        Raises:
            ValueError: not an integer tensor of shape ``[2]``.
        """
        if not isinstance(state, torch.Tensor) or state.shape != (2,) or state.is_floating_point():
            shape = tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__
            raise ValueError(f"env state rng is {shape}: expected an int64 tensor [2], the (seed, counter) of a stream")
        self.state.copy_(state.to(torch.int64))
