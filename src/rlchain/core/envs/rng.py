"""A counter-based random stream for batched torch tasks: draws that compile and replay in a CUDA graph.

A torch-native task draws its initial states and observation noise inside ``step`` (same-step auto-reset). A
``torch.Generator`` there cannot be traced by ``torch.compile``, and its state lives on the host. Here every draw
is a pure function of ``(seed, draw counter, element index)`` (a counter-based generator: Salmon et al. 2011,
"Parallel random numbers: as easy as 1, 2, 3"), computed with integer tensor ops on the task's device: SplitMix64's
finaliser (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number generators") mixes the key and the word
index, each 64-bit word gives two elements (one per 32-bit half), and each draw advances the counter, a device
tensor, in place. So a draw needs no host read, ``torch.compile(step, fullgraph=True)`` traces it, a CUDA graph
replays it (the counter's address is fixed), the same seed gives the same stream on the CPU and on CUDA, eager and
compiled alike, and a checkpoint saves the whole stream in two integers. :class:`CounterRng` states the mapping.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
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
# Eager, a word's two 32-bit halves are read by viewing the words as int32 (no copy): low half first in memory.
_LOW_HALF_FIRST = sys.byteorder == "little"


def _shift_right(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` by ``k`` bits (torch's ``>>`` is arithmetic: it copies the sign bit)."""
    return (z >> k).bitwise_and_((1 << (64 - k)) - 1)


def _mix64_(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser of int64 ``z`` (elementwise, any shape), written into ``z`` (a fresh tensor: no
    allocation per step of the mixing) and returned: a bijection of the 64 bits whose every output bit depends on
    every input bit."""
    z.bitwise_xor_(_shift_right(z, 30)).mul_(_MIX1)
    z.bitwise_xor_(_shift_right(z, 27)).mul_(_MIX2)
    return z.bitwise_xor_(_shift_right(z, 31))


def _words(key: torch.Tensor, golden: torch.Tensor, count: int) -> torch.Tensor:
    """The words ``w_j = mix64(j * G + key)`` of :class:`CounterRng`, ``j < ceil(count / 2)``, int64 ``[P, W]``:
    the two halves of each give two of a member's ``count`` elements. ``key`` is each member's draw key
    ``mix64(seed * G + c)``, int64 ``[P]``, ``golden`` ``G`` as a tensor."""
    index = torch.arange((count + 1) // 2, dtype=torch.int64, device=key.device)
    return _mix64_(index.mul_(golden) + key[:, None])


def _halves_by_word(key: torch.Tensor, golden: torch.Tensor, count: int) -> torch.Tensor:
    """The ``h_e`` of :class:`CounterRng`, ``e < count``, as int32 ``[P, count]`` (their bits): each word hashed
    once and read in place as two int32, low half first (so only where memory is little-endian). The eager way
    (compiled, inductor does not fuse a view to a dtype of another width into the draw's kernel). Arguments as
    :func:`_words`'s."""
    return _words(key, golden, count).view(torch.int32)[:, :count]


def _halves_by_stack(key: torch.Tensor, golden: torch.Tensor, count: int) -> torch.Tensor:
    """The ``h_e`` of :class:`CounterRng`, ``e < count``, as the low 32 bits of int64 ``[P, count]``: each word
    hashed once, its low and high halves stacked as elements ``2j`` and ``2j + 1``. The compiled way: inductor fuses
    the hashing and the stack into one kernel (eager, the stack's copies cost more than the int32 view of
    :func:`_halves_by_word`). Arguments as :func:`_words`'s."""
    words = _words(key, golden, count)
    halves = torch.stack((words.bitwise_and(2**32 - 1), _shift_right(words, 32)), -1)
    return halves.view(words.shape[0], -1)[:, :count]


class CounterRng:
    """A task's own random stream: ``[rows, n]`` draws from ``(seed, counter)``, the counter advanced in place.

    Draw ``c`` (the counter's value before it) hashes the 64-bit words ``w_j = mix64(j * G + mix64(seed * G +
    c))``, ``j = 0, 1, ...`` (``G`` SplitMix64's golden-ratio increment, ``mix64`` its finaliser, arithmetic
    modulo ``2**64``). Each word gives two elements: element ``e`` of the draw (row-major) takes the 32-bit half
    ``h_e = (w_{e // 2} >> 32 * (e % 2)) mod 2**32`` (the low half for even ``e``), so ``rows * n`` elements hash
    ``ceil(rows * n / 2)`` words. From ``h_e``:

    * :meth:`uniform`: ``(h_e mod 2**24) / 2**24``, its low 24 bits (a float32's precision);
    * :meth:`integers`: ``(h_e * high) >> 32``, the 32 bits scaled (no modulo bias);
    * :meth:`normal`: elements ``2k`` and ``2k + 1`` are the Box-Muller pair ``r cos(t)`` and ``r sin(t)`` of the
      uniforms ``u_{2k}`` and ``u_{2k+1}``: ``r = sqrt(-2 ln(1 - u_{2k}))``, ``t = 2 pi u_{2k+1}`` (so at most
      ``sqrt(48 ln 2)``, about 5.8, standard deviations from 0).

    The stream is the same on every device and under ``torch.compile``.

    **Members** (a population, :mod:`rlchain.population`): given ``P`` seeds, the stream is ``P`` streams in one,
    one per member, and the envs of a draw (the axis ``env_axis`` of :meth:`uniform` and :meth:`normal`, the one
    axis of :meth:`integers`) are split into ``P`` equal blocks in order: member ``p``'s block is exactly the draw
    that a stream of seed ``seeds[p]`` alone gives for that block's envs. So ``P`` runs of ``N`` envs each, run as
    one task of ``P * N`` envs, see the episodes each sees alone; one draw is still one set of kernels.

    Args:
        seed: a non-negative int (the env's ``seed`` setting), or a sequence of ``P`` of them, one per member.
        device: where the state and every draw live.

    Attributes:
        state: int64 on ``device``: ``(seed, counter)``, ``[2]`` for one seed, ``[P, 2]`` for ``P`` members.
            Written in place only, so that a captured CUDA graph that draws keeps reading it.
        members: ``P`` (1 for one seed).
    """

    def __init__(self, seed: int | Sequence[int], device: torch.device) -> None:
        self.device = device
        self.state = self._initial(seed).to(device)
        self.members = 1 if self.state.dim() == 1 else self.state.shape[0]
        # The increment as a tensor: a Python int times an arange is an index expression to torch.compile's
        # code generator, which would work it out in exact integers and overflow int64.
        self._golden = torch.tensor(_GOLDEN, dtype=torch.int64, device=device)

    @staticmethod
    def _initial(seed: int | Sequence[int]) -> torch.Tensor:
        """``(seed, 0)`` as int64 ``[2]``, or ``[P, 2]`` for a sequence of seeds.

        Raises:
            ValueError: an empty sequence of seeds.
        """
        if isinstance(seed, int | torch.SymInt) or (isinstance(seed, torch.Tensor) and seed.dim() == 0):
            return torch.tensor([int(seed), 0], dtype=torch.int64)
        seeds = [int(s) for s in seed]
        if not seeds:
            raise ValueError("seed is an empty sequence: expected an int, or one int per member")
        return torch.tensor([[s, 0] for s in seeds], dtype=torch.int64)

    def seed(self, seed: int | Sequence[int]) -> None:
        """Restart the stream from ``seed`` (in place): an int, or one per member as at construction.

        Raises:
            ValueError: seeds of another count than the stream's members.
        """
        fresh = self._initial(seed)
        if fresh.shape != self.state.shape:
            raise ValueError(
                f"seed is {seed!r}: expected {'an int' if self.state.dim() == 1 else f'{self.members} seeds'}"
            )
        self.state.copy_(fresh)

    def _halves(self, count: int) -> torch.Tensor:
        """The ``h_e`` of one draw of ``count`` elements, ``count / P`` per member, ``[P, count / P]``: int32 or
        int64 whose low 32 bits are ``h_e``; advances every member's counter by one.

        Raises:
            ValueError: ``count`` not a multiple of the members.
        """
        if count % self.members:
            raise ValueError(f"a draw of {count} elements does not split among {self.members} members")
        state = self.state.view(-1, 2)
        seed, counter = state.unbind(1)
        key = _mix64_(seed * _GOLDEN + counter)
        state[:, 1:].add_(1)
        if _LOW_HALF_FIRST and not torch.compiler.is_compiling():
            return _halves_by_word(key, self._golden, count // self.members)
        return _halves_by_stack(key, self._golden, count // self.members)

    def _uniforms(self, count: int) -> torch.Tensor:
        """float32 ``[P, count / P]``: each member's uniforms of one draw of ``count`` elements."""
        low = self._halves(count).bitwise_and_((1 << _UNIFORM_BITS) - 1)
        return low.to(torch.float32).mul_(2.0**-_UNIFORM_BITS)

    def _check_split(self, rows: int, n: int, env_axis: int) -> None:
        """Before a ``[rows, n]`` draw (nothing drawn yet).

        Raises:
            ValueError: ``env_axis`` not 0 or 1, or its size not a multiple of the members.
        """
        if env_axis not in (0, 1):
            raise ValueError(f"env_axis is {env_axis!r}: expected 0 (envs are rows) or 1 (envs are columns)")
        if (rows, n)[env_axis] % self.members:
            raise ValueError(f"{(rows, n)[env_axis]} envs do not split among {self.members} members")

    def _layout(self, draws: torch.Tensor, rows: int, n: int, env_axis: int) -> torch.Tensor:
        """Each member's ``[P, m]`` elements as the ``[rows, n]`` draw: member ``p``'s block of ``env_axis``."""
        if env_axis == 0:  # member-major rows: each member's block is contiguous
            return draws.reshape(rows, n)
        per = n // self.members
        return draws.view(self.members, rows, per).transpose(0, 1).reshape(rows, n)

    def uniform(self, rows: int, n: int, env_axis: int = 1) -> torch.Tensor:
        """float32 ``[rows, n]`` uniform on ``[0, 1)`` (multiples of ``2**-24``); one draw of the counter.
        ``env_axis``: the axis that indexes envs (split among members; see the class docstring)."""
        self._check_split(rows, n, env_axis)
        return self._layout(self._uniforms(rows * n), rows, n, env_axis)

    def normal(self, rows: int, n: int, env_axis: int = 1) -> torch.Tensor:
        """float32 ``[rows, n]`` standard normal (Box-Muller: one 64-bit word per two elements); one draw of the
        counter. ``env_axis`` as :meth:`uniform`'s."""
        self._check_split(rows, n, env_axis)
        count = rows * n // self.members
        pairs = (count + 1) // 2
        u = self._uniforms(2 * pairs * self.members).view(self.members, pairs, 2)
        radius = torch.sqrt(-2.0 * torch.log1p(-u[..., 0]))  # 1 - u in (0, 1]: a finite logarithm
        angle = (2.0 * torch.pi) * u[..., 1]
        z = torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), dim=-1)
        return self._layout(z.view(self.members, -1)[:, :count], rows, n, env_axis)

    def integers(self, high: int, n: int) -> torch.Tensor:
        """int64 ``[n]`` uniform on ``[0, high)``; one draw of the counter.

        Raises:
            ValueError: ``high`` not in ``[1, 2**31]``.
        """
        if not 1 <= high <= 2**31:
            raise ValueError(f"high is {high}: expected an integer in [1, 2**31]")
        self._check_split(1, n, 1)
        halves = self._halves(n).to(torch.int64).bitwise_and_(2**32 - 1)
        return ((halves * high) >> 32).view(n)

    def state_dict(self) -> torch.Tensor:
        """The stream's state (a copy): int64 ``(seed, counter)``, ``[2]`` (``[P, 2]`` for members)."""
        return self.state.clone()

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict` output (in place).

        Raises:
            ValueError: not an integer tensor of the stream's shape (``[2]``, or ``[P, 2]`` for members).
        """
        shape = tuple(self.state.shape)
        if not isinstance(state, torch.Tensor) or tuple(state.shape) != shape or state.is_floating_point():
            got = tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__
            raise ValueError(
                f"env state rng is {got}: expected an int64 tensor {list(shape)}, the (seed, counter) of "
                f"{'a stream' if len(shape) == 1 else 'each member'}"
            )
        self.state.copy_(state.to(torch.int64))
