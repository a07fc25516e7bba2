"""Small validation and device helpers shared by every rlchain component.

Every check raises :class:`~rlchain.settings.SettingError` (a ``ValueError``) that names the field,
the value it got and what is allowed, so a bad config fails before any work
is done.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rlchain.settings import SettingError

__all__ = ["MAX_SEED", "check_positive", "indexed_device", "resolve_device", "to_device"]

#: Seeds are unsigned 32-bit integers: every generator rlchain seeds (torch,
#: numpy, gymnasium) takes them.
MAX_SEED = 2**32 - 1


def check_positive(name: str, value: Any, *, integer: bool = False) -> None:
    """Raise unless ``value`` is a finite number > 0 (an ``int`` when ``integer``).

    Raises:
        SettingError: naming ``name``, the value and the allowed range.
    """
    kind = "an integer" if integer else "a number"
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise SettingError(name, value, f" is not allowed: expected {kind} > 0")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise SettingError(name, value, f" is not allowed: expected {kind} > 0")


def resolve_device(device: str | torch.device, name: str = "device") -> torch.device:
    """Turn a device spec into a :class:`torch.device` that exists on this machine.

    ``"auto"`` means ``cuda`` when a CUDA device is visible, else ``cpu``.

    Raises:
        SettingError: for an unparsable spec, a CPU with an index (``cpu:1``: torch
            has one CPU device, and loading a checkpoint onto ``cpu:1`` fails), or a
            CUDA device when CUDA is not available or the index is out of range.
    """
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise SettingError(name, device, " is not a torch device: expected 'auto', 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SettingError(name, device, " is not available: this machine has no CUDA device; use 'cpu' or 'auto'")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise SettingError(name, device, f" is not available: visible CUDA devices are cuda:0..cuda:{count - 1}")
    elif dev.type == "cpu" and dev.index is not None:
        raise SettingError(
            name,
            device,
            " is not supported: the CPU is one device, 'cpu' without an index; "
            "expected 'auto', 'cpu', 'cuda' or 'cuda:N'",
        )
    elif dev.type != "cpu":
        raise SettingError(name, device, " is not supported: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return dev


def indexed_device(device: torch.device) -> torch.device:
    """``device`` with its index: ``cuda`` is the current CUDA device, e.g. ``cuda:0``; ``cpu`` stays ``cpu``.

    A simulator that takes a device by name (mjlab and Warp, ManiSkill) and a generator that must be the one it
    draws from need the same, explicit device.
    """
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def to_device(state: Any, device: torch.device | str) -> Any:
    """``state`` (nested dicts, lists and tuples) with every tensor moved to ``device``."""
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {key: to_device(value, device) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(to_device(value, device) for value in state)
    return state
