"""Checkpoints: written atomically, read as data (``torch.load(weights_only=True)``), and a run's two of them.

A checkpoint is a dict of tensors and plain data (composed by
:func:`rlchain.run.state.run_state`); nothing in it is executed when it
is read. :class:`Checkpoints` keeps a run's ``checkpoints/latest.pt`` and
``checkpoints/best.pt`` consistent with each other and with a resume.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

from rlchain.files import remove_torn, write_bytes
from rlchain.settings import SettingError

__all__ = [
    "CHECKPOINT_KEYS",
    "Checkpoints",
    "check_state_matches",
    "checkpoint_of",
    "load_checkpoint",
    "save_checkpoint",
]

#: Keys every trainer checkpoint holds.
CHECKPOINT_KEYS = ("policy", "algorithm", "collector", "global_step", "iteration")


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` with ``torch.save`` atomically and return the path.

    The state is serialised in memory and then written as plain bytes, so a
    full disk or a file-size limit surfaces as the operating system's error
    (torch's own file writer reports it as an internal assertion).

    Raises:
        OSError: the file cannot be written, naming it and the reason; the
            previous file at ``path`` is left as it was.
    """
    return _write(Path(path), _serialised(state))


def _serialised(state: dict[str, Any]) -> memoryview:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer()


def _write(path: Path, data: memoryview) -> Path:
    try:
        return write_bytes(path, data)
    except OSError as err:
        raise OSError(err.errno, f"cannot write the checkpoint {path}: {err.strerror or err}") from err


def load_checkpoint(
    path: str | os.PathLike, map_location: str | torch.device = "cpu", name: str = "checkpoint"
) -> dict[str, Any]:
    """Read a trainer checkpoint written by :func:`save_checkpoint` (tensors and plain data only).

    Args:
        name: the setting that named ``path``, for the messages (``resume_from``).

    Raises:
        FileNotFoundError: naming the path when it does not exist.
        SettingError: ``<name>='<path>' is not an rlchain checkpoint: ...`` (not
            a torch file, torn, empty, or without the trainer's keys).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception:  # noqa: BLE001 - torch raises several types for a file it cannot read; none is the user's fault
        reason = "an empty file" if path.stat().st_size == 0 else "unreadable as a torch checkpoint"
        raise SettingError(name, str(path), f" is not an rlchain checkpoint: {reason}") from None
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise SettingError(name, str(path), f" is not an rlchain checkpoint: it has no {', '.join(missing)}")
    return state


def check_state_matches(
    module: torch.nn.Module, state: dict[str, torch.Tensor], name: str, path: str | os.PathLike
) -> None:
    """Raise unless ``state`` has exactly ``module``'s parameter and buffer names and shapes.

    Raises:
        SettingError: ``<name>='<path>': the checkpoint's policy does not match ...``
            naming the first mismatched shapes (checkpoint vs. here), missing and extra names.
    """
    own = module.state_dict()
    shapes = [
        f"{k} is {tuple(state[k].shape)} there, {tuple(v.shape)} here"
        for k, v in own.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    problems = (
        shapes[:4]
        + ([f"missing there: {', '.join(missing[:4])}"] if missing else [])
        + ([f"not here: {', '.join(extra[:4])}"] if extra else [])
    )
    if problems:
        raise SettingError(
            name, str(path), f": the checkpoint's policy does not match this run's: {'; '.join(problems)}"
        )


class Checkpoints:
    """A run's ``checkpoints/`` directory: ``latest.pt`` and ``best.pt``.

    ``best.pt`` is the state at the evaluation that was best by the run
    objective; it is written together with ``latest.pt`` (the same state), so
    ``best.pt`` is never ahead of ``latest.pt``, and a resume from
    ``latest.pt`` never inherits a ``best.pt`` from the branch it discards.
    Both carry the objective's best value, step and id (``best_objective``,
    ``best_objective_step``, ``best_objective_id``: random, new with every
    best) as the run knew them. Creating one with ``writer=True`` removes the
    temporary files of a save that ``kill -9`` cut short.

    Args:
        directory: ``<run dir>/checkpoints``.
        writer: whether this process writes them (False: a rank other than 0
            of a multi-process run, which only names them).
    """

    def __init__(self, directory: str | os.PathLike, writer: bool = True) -> None:
        self.directory = Path(directory)
        self.latest = self.directory / "latest.pt"
        self.best = self.directory / "best.pt"
        if writer:
            remove_torn(self.directory)

    def save(self, state: dict[str, Any]) -> Path:
        """Write ``latest.pt``; see :func:`save_checkpoint`."""
        return save_checkpoint(self.latest, state)

    def save_best(self, state: dict[str, Any]) -> Path:
        """Write ``state`` as ``latest.pt``, then as ``best.pt``; returns the path of ``best.pt``.

        Raises:
            OSError: see :func:`save_checkpoint`; ``best.pt`` is left as it was.
        """
        data = _serialised(state)  # once, for both files
        _write(self.latest, data)
        return _write(self.best, data)

    def files(self) -> dict[str, str]:
        """``{"latest": path, "best": path}`` of the checkpoints there are."""
        return {path.stem: str(path) for path in (self.latest, self.best) if path.is_file()}

    def align_best(self, state: dict[str, Any], source: str | os.PathLike) -> bool:
        """After a resume from ``source`` (whose ``state`` this is): make ``best.pt`` the one ``state`` names.

        ``state`` holds the id (older checkpoints: the step and value) of its
        best evaluation. The checkpoint of that evaluation is this directory's
        ``best.pt``, the ``best.pt`` beside ``source``, or ``source`` itself
        (when its own evaluation was the best); the first that matches becomes
        ``best.pt``. A ``best.pt`` that matches none (a branch the resume
        discards, another run's) is removed.

        Returns:
            False when ``state`` names a best evaluation whose checkpoint is
            nowhere: the caller then forgets that best.

        Raises:
            OSError: ``best.pt`` cannot be written or removed.
        """
        if state.get("best_objective_step") is not None:
            source = Path(source)
            for candidate in (self.best, source.parent / "best.pt", source):
                if _holds_best(candidate, state):
                    if candidate.resolve() != self.best.resolve():
                        write_bytes(self.best, candidate.read_bytes())
                    return True
        self.best.unlink(missing_ok=True)
        return state.get("best_objective_step") is None


def _holds_best(path: Path, state: dict[str, Any]) -> bool:
    """Whether ``path`` is the checkpoint of the best evaluation that ``state`` records: one written at that
    evaluation's step (``best.pt`` is written then, with ``latest.pt``) that carries its id (older checkpoints: its
    value)."""
    if not path.is_file():
        return False
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - not a checkpoint (torn, foreign): not the one
        return False
    if not isinstance(saved, dict) or saved.get("global_step") != state.get("best_objective_step"):
        return False  # a later checkpoint of the same run carries the best's id too, but not its policy
    if state.get("best_objective_id") is not None:
        return saved.get("best_objective_id") == state["best_objective_id"]
    return saved.get("best_objective") == state.get("best_objective")


def checkpoint_of(source: str | Path, name: str) -> Path:
    """The checkpoint file the setting ``name=source`` names: ``source`` itself, or a run directory's
    ``checkpoints/latest.pt`` (what ``trainer.resume_from`` and ``trainer.init_from`` take).

    Raises:
        SettingError: ``<name>=<source>``: the path does not exist, or is a
            directory without ``checkpoints/latest.pt`` (no run wrote one there).
    """
    path = Path(source)
    if path.is_dir():
        path = path / "checkpoints" / "latest.pt"
        if not path.is_file():
            raise SettingError(
                name,
                str(source),
                " is a directory without checkpoints/latest.pt: expected an rlchain "
                "run directory that wrote a checkpoint, or a checkpoint file",
            )
    elif not path.is_file():
        raise SettingError(
            name,
            str(source),
            " does not exist: expected a run directory (outputs/<date>/<time>_<id>) or a checkpoint file",
        )
    return path
