"""Atomic writing of checkpoints, JSON and text files.

A file is written to a temporary name in the same directory, flushed and
fsynced, then renamed over the target (``os.replace`` is atomic on POSIX and
Windows), so a kill at any moment leaves either the old file or the new one,
never a torn one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["atomic_write_json", "atomic_write_text", "load_checkpoint", "save_checkpoint"]


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
    """Write ``state`` with ``torch.save`` atomically and return the path."""
    path = Path(path)
    _atomic_write(path, lambda f: torch.save(state, f))
    return path


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises:
        FileNotFoundError: naming the path when it does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    return torch.load(path, map_location=map_location, weights_only=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically and return the path."""
    path = Path(path)
    data = text.encode()
    _atomic_write(path, lambda f: f.write(data))
    return path


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically and return the path."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
