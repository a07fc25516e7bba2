"""Run directories: one per run, never shared.

* Names: ``outputs/<date>/<time>_<id>/`` for a run and
  ``multirun/<date>/<time>_<id>/`` for a sweep, where ``<id>`` is six random
  hex digits from the ``${rlchain_id:}`` resolver. Two runs started in the
  same second from one directory (a job array, a shell loop) get two
  directories. The resolver is cached like Hydra's ``${now:}``, so one run
  resolves one name everywhere.
* A fresh run refuses a directory that already holds a run
  (:func:`taken`); resuming into it is fine. :class:`RunDirCallback`
  checks before Hydra writes the run's ``.hydra/`` files, so an earlier run's
  config is never overwritten; the trainer checks its ``output_dir`` the same
  way for runs started from Python.
* A run directory that cannot be created (a read-only file system, a path
  below a regular file) is one line, not a traceback.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from rlchain.distributed import from_environment

__all__ = ["RUN_MARKERS", "RunDirCallback", "RunDirError", "existing_run", "register_resolver", "taken"]

#: What makes a directory hold a run: written by every run that got past its start.
RUN_MARKERS = ("summary.json", "metrics.jsonl", "checkpoints/")


def register_resolver() -> None:
    """Register ``${rlchain_id:}``: six random hex digits, one value per config (cached)."""
    if not OmegaConf.has_resolver("rlchain_id"):
        OmegaConf.register_new_resolver("rlchain_id", lambda: secrets.token_hex(3), use_cache=True)


def existing_run(path: str | Path) -> str | None:
    """The first of :data:`RUN_MARKERS` (files; a trailing ``/`` marks a directory) in ``path``, else None."""
    path = Path(path)
    return next((name for name in RUN_MARKERS if ((path / name).is_dir() if name.endswith("/") else (path / name).is_file())), None)


def taken(path: str | Path) -> str | None:
    """Why a fresh run may not use ``path``, as the rest of a sentence that names it; None when it may.

    E.g. ``" already holds a run (summary.json): a fresh run never writes ..."``.
    """
    marker = existing_run(path)
    if marker is None:
        return None
    return (f" already holds a run ({marker}): a fresh run never writes into another's directory; "
            "resume it with trainer.resume_from=auto, or choose another directory")  # fmt: skip


class RunDirError(CompactHydraException):
    """A run directory that cannot be used; Hydra prints just this one line."""


def _resuming(config: DictConfig) -> bool:
    return OmegaConf.select(config, "trainer.resume_from", default=None) is not None


def _check(path: Path, config: DictConfig, what: str) -> None:
    """Create ``path`` (a run or sweep directory) or say in one line why it cannot be used.

    Raises:
        RunDirError: it cannot be created, or (for a fresh run) it already holds a run.
    """
    if not _resuming(config):
        runs = [path] if what == "run" else ([p for p in path.iterdir() if p.is_dir()] if path.is_dir() else [])
        for run in runs:
            reason = taken(run)
            if reason is not None:
                raise RunDirError(f"rlchain: {run}{reason} (hydra.{what}.dir)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"rlchain: cannot create the {what} directory {path}: {err.strerror or err}") from err


class RunDirCallback(Callback):
    """Hydra callback: check and create the run (or sweep) directory before Hydra writes into it.

    Registered by ``rlchain-train``'s config as ``hydra.callbacks.run_dir``.

    Raises:
        RunDirError: see :func:`_check`.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``hydra.run.dir`` (resolved once: the same name Hydra then uses); one line and exit 1 if unusable.

        On a rank other than 0 of a multi-process run (torchrun) Hydra is
        made to write nothing: rank 0 alone writes files. The rank runs in
        the working directory, with no ``.hydra/`` and no log file, and
        learns rank 0's run directory when the ranks join.
        """
        rank, world_size, _ = from_environment()
        if world_size > 1 and rank > 0:
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.run.dir = os.getcwd()
                config.hydra.output_subdir = None
                config.hydra.job_logging = {"version": 1, "root": None}
            return
        try:
            _check(Path(str(config.hydra.run.dir)), config, "run")
        except RunDirError as err:
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            print(err, file=sys.stderr, flush=True)
            raise SystemExit(1) from None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``hydra.sweep.dir``: no job directory in it may hold a run, unless resuming.

        Refused under torchrun, which runs one run over its processes.
        """
        if from_environment()[1] > 1:
            print("rlchain: a multirun (-m) cannot run under torchrun, whose processes train one run together: drop -m, "
                  "or sweep multi-process runs with the devices launcher (hydra.launcher.devices_per_job)",
                  file=sys.stderr, flush=True)  # fmt: skip
            raise SystemExit(1)
        _check(Path(str(config.hydra.sweep.dir)), config, "sweep")
