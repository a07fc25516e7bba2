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
* Resuming a saved run (``trainer.resume_from=<run dir>``, a checkpoint in a
  run's ``checkpoints/``, or ``auto`` in a run directory that has a
  ``latest.pt``) rebuilds the run from its own ``.hydra/config.yaml`` and goes on
  in its directory (:func:`resume_in_place`): the overrides it needs are none
  but those it changes (``trainer.*``, ``algorithm.*``, ``device``), and the
  run's saved config, overrides and Hydra config are never rewritten. A
  ``hydra.run.dir`` on the command line naming another directory is refused
  in one line, with nothing written to either directory.
* A run that never took a step (refused after composition: an invalid value,
  a missing checkpoint) holds no run: its directory does not block the
  corrected command, and a single run refused before its first step leaves
  no directory behind (:func:`remove_if_unused`).
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
from rlchain.run.checkpoint import checkpoint_of
from rlchain.settings import SettingError, renamed

__all__ = [
    "RESUME_SETTINGS",
    "RUN_MARKERS",
    "RunDirCallback",
    "RunDirError",
    "existing_run",
    "register_resolver",
    "remove_if_unused",
    "resume_in_place",
    "taken",
]

#: What makes a directory hold a run: written by every run that got past its start (a ``summary.json`` of a run
#: refused before its first step does not count).
RUN_MARKERS = ("summary.json", "metrics.jsonl", "checkpoints/")
#: What a resumed run's overrides may change: the loop's and the update's settings, and the device. The rest (env,
#: policy, seed, the config groups) is the saved run's, which its checkpoints hold the state of.
RESUME_SETTINGS = ("trainer.", "algorithm.", "device")
#: Settings of the trainer that a resume may not change: where the run lives and where its policy came from.
_RESUME_FIXED = ("trainer.output_dir", "trainer.init_from")
#: What Hydra writes into a run directory before the task starts (its saved config and its log).
_HYDRA_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", ".hydra", "train.log")


def register_resolver() -> None:
    """Register ``${rlchain_id:}``: six random hex digits, one value per config (cached)."""
    if not OmegaConf.has_resolver("rlchain_id"):
        OmegaConf.register_new_resolver("rlchain_id", lambda: secrets.token_hex(3), use_cache=True)


def existing_run(path: str | Path) -> str | None:
    """The first of :data:`RUN_MARKERS` (files; a trailing ``/`` marks a directory) in ``path``, else None.

    A ``summary.json`` alone whose run failed before its first step (a refused config) is no run.
    """
    path = Path(path)
    for name in RUN_MARKERS:
        if name.endswith("/") and (path / name).is_dir():
            return name
        if not name.endswith("/") and (path / name).is_file() and not (name == "summary.json" and _never_stepped(path)):
            return name
    return None


def _never_stepped(path: Path) -> bool:
    """Whether ``path``'s ``summary.json`` is of a run refused before its first step (failed at global_step 0)."""
    from rlchain.run.summary import RunSummary

    summary = RunSummary.read(path)
    return summary is not None and summary.status == "failed" and summary.global_step == 0


def remove_if_unused(path: str | Path) -> bool:
    """Empty the run directory ``path`` when it holds nothing but what Hydra wrote before the run started (its
    ``.hydra/`` files and ``train.log``) and a ``summary.json`` of a run that never took a step, and remove it and
    its parents where this process created them (:func:`_check`); return whether it was emptied.

    Anything else in it (a file of the user's, another run's) keeps it and everything in it.
    """
    path = Path(path)
    if not path.is_dir() or existing_run(path) is not None:
        return False
    names = {p.relative_to(path).as_posix() for p in path.rglob("*")}
    if not names <= {*_HYDRA_FILES, "summary.json"}:
        return False
    for name in sorted(names, key=len, reverse=True):  # files before the .hydra directory
        target = path / name
        target.rmdir() if target.is_dir() else target.unlink()
    for directory in _created:  # it and its parents (outputs/<date>/) where this command created them, now empty
        if path.absolute().is_relative_to(directory) and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    return True


#: The directories the run directory's check created in this process (the run directory and its new parents,
#: deepest first), which :func:`remove_if_unused` removes again when they are left empty.
_created: list[Path] = []


def taken(path: str | Path) -> str | None:
    """Why a fresh run may not use ``path``, as the rest of a sentence that names it; None when it may.

    E.g. ``" already holds a run (summary.json): a fresh run never writes ..."``.
    """
    marker = existing_run(path)
    if marker is None:
        return None
    return (
        f" already holds a run ({marker}): a fresh run never writes into another's directory; "
        "resume it with trainer.resume_from=auto, or choose another directory"
    )


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
    created = [p for p in (path.absolute(), *path.absolute().parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        if what == "run":
            _created[:] = created
    except OSError as err:
        raise RunDirError(f"rlchain: cannot create the {what} directory {path}: {err.strerror or err}") from err


def _saved_run(config: DictConfig) -> tuple[Path, Path] | None:
    """``(run directory, checkpoint)`` when ``trainer.resume_from`` resumes a saved run in place, else None.

    A saved run is a directory with ``.hydra/config.yaml``: ``resume_from`` names it (its
    ``checkpoints/latest.pt``) or a checkpoint in its ``checkpoints/``, or is ``auto`` while ``hydra.run.dir`` is
    one with a ``latest.pt``. A checkpoint file outside a run directory is None: that run is composed from the
    command line, in a directory of its own.

    Raises:
        RunDirError: ``resume_from`` does not exist, or is a directory that is no saved run or has no ``latest.pt``.
    """
    value = OmegaConf.select(config, "trainer.resume_from", default=None)
    if value is None:
        return None
    saved = lambda run: (run / ".hydra" / "config.yaml").is_file()  # noqa: E731
    if value == "auto":
        run = Path(str(config.hydra.run.dir))
        latest = run / "checkpoints" / "latest.pt"
        return (run, latest) if saved(run) and latest.is_file() else None
    path = Path(str(value)).absolute()
    if path.is_dir() and not saved(path):
        raise RunDirError(
            f"rlchain: trainer.resume_from={value!r} is a directory without .hydra/config.yaml: "
            "expected an rlchain run directory or a checkpoint file"
        )
    try:
        checkpoint = checkpoint_of(value, "trainer.resume_from")
    except SettingError as err:
        raise RunDirError(f"rlchain: {err}") from None
    if path.is_dir():
        return path, checkpoint
    run = path.parent.parent
    return (run, path) if path.parent.name == "checkpoints" and saved(run) else None


def _resume_may_set(key: str) -> bool:
    """Whether a resume's override may set ``key``: one of :data:`RESUME_SETTINGS` (an entry ending in ``.`` is a
    prefix), unless it is one of the trainer settings a resume keeps."""
    return key not in _RESUME_FIXED and any(
        key == s or (s.endswith(".") and key.startswith(s)) for s in RESUME_SETTINGS
    )


def _check_run_dir_named(config: DictConfig, run: Path) -> None:
    """Refuse a ``hydra.run.dir`` on the command line that is not the saved ``run``'s directory: a resume goes on in
    the run's own directory, and would otherwise leave the directory the user named unused without a word.

    Hydra's default run directory (no ``hydra.run.dir`` on the command line) is replaced by the run's own.

    Raises:
        RunDirError: ``hydra.run.dir`` names another directory (naming it and the run's).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hydra_overrides = OmegaConf.select(config, "hydra.overrides.hydra", default=None) or []
    named = [
        o.input_line
        for o in OverridesParser.create().parse_overrides(list(hydra_overrides))
        if o.key_or_group == "hydra.run.dir"
    ]
    if named and Path(str(config.hydra.run.dir)).resolve() != run.resolve():
        raise RunDirError(
            f"rlchain: {named[-1]} is not allowed when resuming {run}: a resumed run goes on in its own directory; "
            f"drop hydra.run.dir or set it to {run}"
        )


def resume_in_place(config: DictConfig) -> Path | None:
    """Make ``config`` (the composed config, Hydra's node included) the resume of the saved run that
    ``trainer.resume_from`` names (see :func:`_saved_run`); return its directory, or None when it names none.

    The run's task config becomes its saved ``.hydra/config.yaml`` with this command's overrides on top; an
    override the run was composed with (in its ``.hydra/overrides.yaml``) is already in it, and the others may set
    only :data:`RESUME_SETTINGS`. Hydra's config group choices are the saved run's, so the saved config resolves as
    it did (``exp_name``, the top-level keys its groups added); an override that chooses the option the saved run
    has (``algorithm=grpo`` for a run of the ``push_cube_grpo`` preset, so that ``algorithm.group_size=16``
    composes) changes nothing and is let through. The run goes on in its own directory
    (``hydra.run.dir``), and Hydra writes no ``.hydra/`` files there: the saved ones stay the run's. A
    ``hydra.run.dir`` on the command line that names another directory is refused (:func:`_check_run_dir_named`),
    before anything is written anywhere.

    Raises:
        RunDirError: see :func:`_saved_run`; a ``hydra.run.dir`` on the command line other than the run's
            directory; an override that changes what a resume cannot (naming it, the run and what may be set), or
            a key the saved config does not have.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found = _saved_run(config)
    if found is None:
        return None
    run, checkpoint = found
    _check_run_dir_named(config, run)
    hydra_dir = run / ".hydra"
    saved = OmegaConf.load(hydra_dir / "config.yaml")
    if OmegaConf.is_dict(saved.get("env")):  # a run of an earlier release: its settings by today's names
        saved.env = OmegaConf.create(renamed(OmegaConf.to_container(saved.env, resolve=False)))
    original = (
        [str(o) for o in OmegaConf.load(hydra_dir / "overrides.yaml")]
        if (hydra_dir / "overrides.yaml").is_file()
        else []
    )
    choices = (
        OmegaConf.select(OmegaConf.load(hydra_dir / "hydra.yaml"), "hydra.runtime.choices")
        if (hydra_dir / "hydra.yaml").is_file()
        else None
    )
    own = list(config.hydra.overrides.task)
    OmegaConf.set_struct(saved, True)
    added = []
    for override in OverridesParser.create().parse_overrides(own):
        key, line = override.key_or_group, override.input_line
        if key == "trainer.resume_from" or line in original:
            continue
        if (
            choices is not None
            and key in choices
            and not override.is_sweep_override()
            and (str(override.value()) == str(choices[key]))
        ):
            continue  # the option the saved run has (algorithm=grpo, which a preset chose): its keys compose
        if override.is_add() or override.is_force_add() or override.is_delete() or not _resume_may_set(key):
            raise RunDirError(
                f"rlchain: {line} is not allowed when resuming {run}: a resumed run keeps its saved config "
                "(env, policy, seed, presets); overrides may set trainer.<key>, algorithm.<key> and device "
                "(trainer.output_dir and trainer.init_from excepted)"
            )
        try:
            OmegaConf.update(saved, key, override.value(), merge=True)
        except Exception as err:  # noqa: BLE001 - OmegaConf's key and validation errors: one line
            raise RunDirError(
                f"rlchain: {line} is not allowed when resuming {run}: {str(err).splitlines()[0]}"
            ) from None
        added.append(line)
    with open_dict(saved):
        saved.trainer.resume_from = str(checkpoint)
        saved.trainer.pop("trial", None)  # a sweep job of an earlier release: its Optuna trial, now in Hydra's config
    plain = OmegaConf.to_container(saved, resolve=False)  # interpolations stay unresolved until the run resolves them
    with read_write(config), open_dict(config):
        for key, value in plain.items():
            config[key] = value
        config.hydra.run.dir = str(run)
        config.hydra.output_subdir = None
        config.hydra.overrides.task = [*original, *added, f"trainer.resume_from={checkpoint}"]
        if choices is not None:
            config.hydra.runtime.choices = choices
    return run


class RunDirCallback(Callback):
    """Hydra callback: check and create the run (or sweep) directory before Hydra writes into it.

    Registered by ``rlchain-train``'s config as ``hydra.callbacks.run_dir``.

    Raises:
        RunDirError: see :func:`_check`.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``hydra.run.dir`` (resolved once: the same name Hydra then uses); one line and exit 1 if unusable.

        A resume of a saved run first becomes that run's own config, in its directory (:func:`resume_in_place`).

        On a rank other than 0 of a multi-process run (torchrun) Hydra is
        made to write nothing: rank 0 alone writes files. The rank runs in
        the working directory, with no ``.hydra/`` and no log file, and
        learns rank 0's run directory when the ranks join.
        """
        rank, world_size, _ = from_environment()
        try:  # Hydra turns an exception of a callback into a warning and goes on: this one ends the command
            resume_in_place(config)
        except Exception as err:  # noqa: BLE001 - a saved config that cannot be read or merged: one line
            if os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            message = (
                str(err)
                if isinstance(err, RunDirError)
                else (
                    f"rlchain: trainer.resume_from cannot rebuild the saved run: {type(err).__name__}: "
                    f"{str(err).splitlines()[0] if str(err) else ''}"
                )
            )
            print(message, file=sys.stderr, flush=True)
            raise SystemExit(1) from None
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
            print(
                "rlchain: a multirun (-m) cannot run under torchrun, whose processes train one run together: drop -m, "
                "or sweep multi-process runs with the devices launcher (hydra.launcher.devices_per_job)",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(1)
        _check(Path(str(config.hydra.sweep.dir)), config, "sweep")
