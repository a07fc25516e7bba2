"""Atomic writing of files (standard library only).

A file is written to a temporary name in its directory (with the mode
``open()`` would give it), flushed and fsynced, then renamed over the target
(``os.replace`` is atomic on POSIX and Windows), so a kill at any moment
leaves either the old file or the new one, never a torn one. A kill before the rename can leave the temporary file
(``.<name>.<random>.tmp``); :func:`remove_torn` deletes those.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

__all__ = ["remove_torn", "write_bytes", "write_json", "write_text"]


def write_bytes(path: str | os.PathLike, data: bytes | memoryview) -> Path:
    """Write ``data`` to ``path`` atomically (creating its directory) and return the path.

    Raises:
        OSError: the file cannot be written (a full disk, no permission); the
            previous file at ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    # O_EXCL: never another's file; 0o666 less the umask, as open() gives (mkstemp's 0o600 would hide a run's
    # files from the rest of a team).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) atomically and return the path; see :func:`write_bytes`."""
    return write_bytes(path, text.encode())


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically and return the path; see :func:`write_bytes`."""
    return write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def remove_torn(directory: str | os.PathLike) -> None:
    """Delete the temporary files that a write cut short by ``kill -9`` left in ``directory``."""
    for stale in Path(directory).glob(".*.tmp"):
        stale.unlink(missing_ok=True)
