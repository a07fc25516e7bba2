"""Atomic writing of checkpoints, JSON and text files.

A file is written to a temporary name in the same directory, flushed and
fsynced, then renamed over the target (``os.replace`` is atomic on POSIX and
Windows), so a kill at any moment leaves either the old file or the new one,
never a torn one.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKPOINT_KEYS", "atomic_write_json", "atomic_write_text", "check_state_matches", "load_checkpoint", "save_checkpoint"]


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` with ``torch.save`` atomically and return the path.

    The state is serialised in memory and then written as plain bytes, so a
    full disk or a file-size limit surfaces as the operating system's error
    (torch's own file writer reports it as an internal assertion).

    Raises:
        OSError: the file cannot be written, naming it and the reason; the
            previous file at ``path`` is left as it was.
    """
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    try:
        _atomic_write(path, lambda f: f.write(buffer.getbuffer()))
    except OSError as err:
        raise OSError(err.errno, f"cannot write the checkpoint {path}: {err.strerror or err}") from err
    return path


#: Keys every trainer checkpoint holds.
CHECKPOINT_KEYS = ("policy", "algorithm", "collector", "global_step", "iteration")


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a trainer checkpoint written by :func:`save_checkpoint` (tensors and plain data only).

    Raises:
        FileNotFoundError: naming the path when it does not exist.
        ValueError: naming the path when it is not an rlchain checkpoint (not
            a torch file, torn, empty, or without the trainer's keys).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for a file it cannot read; none is the user's fault
        reason = "an empty file" if path.stat().st_size == 0 else f"unreadable as a torch checkpoint ({type(err).__name__})"
        raise ValueError(f"{str(path)!r} is not an rlchain checkpoint: {reason}") from None
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise ValueError(f"{str(path)!r} is not an rlchain checkpoint: it has no {', '.join(missing)}")
    return state


def check_state_matches(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Raise unless ``state`` has exactly ``module``'s parameter and buffer names and shapes.

    Raises:
        ValueError: ``<source>: its policy does not match ...`` naming the
            first mismatched shapes (checkpoint vs. here), missing and extra names.
    """
    own = module.state_dict()
    shapes = [f"{k} is {tuple(state[k].shape)} there, {tuple(v.shape)} here"
              for k, v in own.items() if k in state and tuple(state[k].shape) != tuple(v.shape)]  # fmt: skip
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    problems = shapes[:4] + ([f"missing there: {', '.join(missing[:4])}"] if missing else []) + (
        [f"not here: {', '.join(extra[:4])}"] if extra else [])  # fmt: skip
    if problems:
        raise ValueError(f"{source}: the checkpoint's policy does not match this run's: {'; '.join(problems)}")


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically and return the path."""
    path = Path(path)
    data = text.encode()
    _atomic_write(path, lambda f: f.write(data))
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically and return the path."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
