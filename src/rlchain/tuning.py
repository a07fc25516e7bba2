"""Optuna studies as rlchain's sweeper and its jobs share them: storages, pruners, and the trial a run reports to.

The sweeper (:mod:`hydra_plugins.rlchain_optuna`) asks Optuna for trials and
launches one job per trial; each job's trainer reports its objective at every
evaluation to its own trial and stops when the study's pruner says so. Both
sides open the study through this module, so that they agree on what a
``storage`` string means and how a pruner is built:

* :func:`open_storage`: an SQLAlchemy URL (``sqlite:///study.db``,
  ``postgresql://...``) is an RDB storage; anything else is the path of an
  Optuna journal file (``JournalStorage(JournalFileBackend(path))``, which
  locks with files and so works on a shared file system, for SLURM).
* :func:`make_pruner`: ``median``, ``successive_halving``, ``hyperband`` or
  ``none``, with Optuna's keyword arguments.
* :class:`TrialLink`: the trial a job reports to, as the job's config names it
  (``trainer.trial``): storage, study name, trial number, pruner.

Optuna is an optional dependency (``pip install "rlchain[sweep]"``); this
module imports it only when a function needs it. Pruning steps are trainer
iterations (the unit of ``trainer.eval_freq``).
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rlchain.summary import error_line

__all__ = ["PRUNERS", "SAMPLERS", "TRIAL_KEY", "StudyError", "TrialLink", "make_pruner", "open_storage", "quiet_optuna"]

#: The run setting that takes a job's trial link (:class:`TrialLink`); the sweeper adds it to each job's overrides.
TRIAL_KEY = "trainer.trial"
#: Pruner names and the Optuna classes they build (``none``: never prune).
PRUNERS = {
    "median": "MedianPruner",
    "successive_halving": "SuccessiveHalvingPruner",
    "hyperband": "HyperbandPruner",
    "none": "NopPruner",
}
#: Sampler names and the Optuna classes they build.
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler", "grid": "GridSampler"}


class StudyError(ValueError):
    """A study setting that cannot be used, as one line naming the setting, its value and what is allowed."""


def quiet_optuna() -> None:
    """Keep Optuna's own INFO lines ("A new study created ...") off the console; rlchain says what matters."""
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)


def _rdb_storage(url: str, attempts: int = 5) -> Any:
    """Optuna's ``RDBStorage(url)``, opened again when another process created the same new database's tables
    at the same moment (SQLAlchemy's "table ... already exists" or a duplicate schema version: Optuna creates
    them without a lock); the tables are complete on the next attempt."""
    from optuna.storages import RDBStorage
    from sqlalchemy.exc import IntegrityError, OperationalError

    for attempt in range(attempts):
        try:
            return RDBStorage(url)
        except (IntegrityError, OperationalError) as err:
            racing = "already exists" in str(err) or "UNIQUE constraint failed: alembic_version" in str(err)
            if not racing or attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


def open_storage(storage: str, name: str = "storage") -> Any:
    """The Optuna storage ``storage`` names.

    Args:
        storage: an SQLAlchemy URL (it holds ``://``: ``sqlite:///study.db``,
            ``postgresql://user@host/db``), or the path of a journal file
            (created with its parent directories when missing).
        name: the setting's name for messages (``hydra.sweeper.storage``).

    Raises:
        StudyError: the database cannot be opened (an unknown dialect, a
            missing driver, a path that cannot be created, a server that does
            not answer), naming ``name``, the value and the cause.
    """
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    try:
        if "://" in storage:
            if storage.startswith("sqlite:///"):
                Path(storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
            return _rdb_storage(storage)
        path = Path(storage)
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    except (optuna.exceptions.OptunaError, ImportError, OSError, ValueError) as err:
        raise StudyError(f"{name}={storage!r} cannot be opened: {error_line(str(err)) or type(err).__name__}; "
                         "expected an SQLAlchemy URL (sqlite:///study.db) or the path of a journal file "
                         "(study.log)") from None  # fmt: skip
    except Exception as err:  # SQLAlchemy's errors (a server that does not answer, a bad URL) are not Optuna's
        if type(err).__module__.split(".")[0] != "sqlalchemy":
            raise
        raise StudyError(f"{name}={storage!r} cannot be opened: {error_line(str(err))}") from None


def _options(cls: type, options: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``options`` as keyword arguments of ``cls``; an unknown key raises :class:`StudyError` naming the allowed ones."""
    allowed = [p for p in inspect.signature(cls).parameters if p not in ("self", "search_space")]
    unknown = [key for key in options if key not in allowed]
    if unknown:
        raise StudyError(f"{name}.{unknown[0]}={options[unknown[0]]!r} is not allowed: {cls.__name__} takes "
                         f"{', '.join(allowed) or 'no options'}")  # fmt: skip
    return dict(options)


def _choice(kind: dict[str, str], value: Any, name: str) -> str:
    if value not in kind:
        raise StudyError(f"{name}={value!r} is not allowed: expected one of {', '.join(kind)}")
    return kind[value]


def make_pruner(pruner: str, options: Mapping[str, Any] | None = None, name: str = "pruner") -> Any:
    """The Optuna pruner ``pruner`` names, built with ``options`` (Optuna's keyword arguments and defaults).

    ``median``: MedianPruner (a trial whose best value so far is worse than
    the median of earlier trials at the same step); ``successive_halving``
    and ``hyperband``: asynchronous successive halving (Li et al. 2020) and
    Hyperband (Li et al. 2018); ``none``: never prune (``options`` are ignored).

    Raises:
        StudyError: an unknown pruner or option, or an option value Optuna rejects, naming it.
    """
    import optuna

    cls = getattr(optuna.pruners, _choice(PRUNERS, pruner, name))
    if pruner == "none":  # the options of the pruner it replaces (a preset's) have nothing to set
        return cls()
    kwargs = _options(cls, options or {}, f"{name}_options")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise StudyError(f"{name}_options={dict(kwargs)!r} is not allowed for {pruner}: {err}") from None


def make_sampler(sampler: str, options: Mapping[str, Any] | None, seed: int | None,
                 grid: Mapping[str, list[Any]] | None = None, name: str = "sampler") -> Any:  # fmt: skip
    """The Optuna sampler ``sampler`` names (``tpe``, ``random``, ``cmaes``, ``grid``), seeded with ``seed``.

    ``grid`` is the grid of the ``grid`` sampler (every value of each parameter).

    Raises:
        StudyError: an unknown sampler or option, an option value Optuna
            rejects, or ``cmaes`` without the ``cmaes`` package, naming it.
    """
    import optuna

    cls = getattr(optuna.samplers, _choice(SAMPLERS, sampler, name))
    kwargs = _options(cls, options or {}, f"{name}_options")
    if "seed" in kwargs:
        raise StudyError(f"{name}_options.seed={kwargs['seed']!r} is not allowed: the sampler's seed is "
                         "hydra.sweeper.seed")  # fmt: skip
    if sampler == "cmaes":
        import importlib.util

        if importlib.util.find_spec("cmaes") is None:
            raise StudyError(f'{name}=cmaes needs the cmaes package: pip install "rlchain[sweep]"')
    if sampler == "tpe":
        kwargs.setdefault("constant_liar", True)  # running trials count as bad ones: parallel trials spread out
    try:
        return _grid_class()(grid, seed=seed, **kwargs) if sampler == "grid" else cls(seed=seed, **kwargs)
    except (TypeError, ValueError) as err:
        raise StudyError(f"{name}_options={dict(kwargs)!r} is not allowed for {sampler}: {err}") from None


def _grid_class() -> type:
    """Optuna's ``GridSampler`` that leaves the end of the search to the sweeper (built on first use: Optuna is
    optional)."""
    import optuna

    class Grid(optuna.samplers.GridSampler):
        """Optuna's grid sampler without its ``study.stop()`` once the grid is covered: ``stop`` works only inside
        ``Study.optimize``, and the sweeper caps ``n_trials`` at the grid's size itself."""

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return Grid


@dataclass
class TrialLink:
    """The Optuna trial a run reports to: what the sweeper writes into the job's ``trainer.trial``.

    A run that has one reports its objective at every evaluation
    (:meth:`report`) and stops after that iteration when the study's pruner
    prunes the trial. The sweeper alone ends the trial in the study
    (``tell``), from the run's ``summary.json``.

    Raises:
        StudyError: (:meth:`open`) the storage cannot be opened, the study or
            the trial is not in it, or an unknown pruner.
    """

    storage: str
    """The study's storage (see :func:`open_storage`)."""
    study_name: str
    number: int
    """The trial's number in the study."""
    pruner: str = "none"
    """The study's pruner (see :func:`make_pruner`)."""
    pruner_options: dict[str, Any] = field(default_factory=dict)

    def open(self) -> _OpenTrial:
        """Connect to the trial (once, before the run's first step)."""
        import optuna

        quiet_optuna()
        name = "trainer.trial"
        storage = open_storage(self.storage, f"{name}.storage")
        try:
            study = optuna.load_study(study_name=self.study_name, storage=storage,
                                      pruner=make_pruner(self.pruner, self.pruner_options, f"{name}.pruner"))  # fmt: skip
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, self.number)
        except KeyError as err:
            raise StudyError(f"{name}: no study {self.study_name!r} with trial {self.number} in {self.storage!r} "
                             f"({err})") from None  # fmt: skip
        return _OpenTrial(optuna.trial.Trial(study, trial_id))


class _OpenTrial:
    """A :class:`TrialLink` connected to its study."""

    def __init__(self, trial: Any) -> None:
        self.trial = trial

    def report(self, value: float | None, step: int) -> bool:
        """Report the objective ``value`` at trainer iteration ``step``; True when the pruner prunes the trial.

        A None or non-finite value is not reported (Optuna would store NaN);
        the trial is then not pruned at this step. When the study cannot be
        reached (a locked database, a full disk, a trial another sweep has
        ended), the run says so once and trains on without reporting: the
        sweeper tells the study how it ended.
        """
        import math

        if self.trial is None or value is None or not math.isfinite(value):
            return False
        try:
            self.trial.report(float(value), step)
            return bool(self.trial.should_prune())
        except Exception as err:  # noqa: BLE001 - the run matters more than its intermediate values
            from rlchain.console import notice

            notice(f"trainer.trial: reporting to trial {self.trial.number} failed, the run goes on without it: "
                   f"{error_line(str(err)) or type(err).__name__}")  # fmt: skip
            self.trial = None
            return False
