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
* :func:`make_sampler`: ``tpe``, ``random``, ``cmaes`` or ``grid``; a seeded
  sampler draws each trial from a stream of its own (:func:`trial_seed`).
* :class:`TrialLink`: the trial a job runs for, as the sweeper names it in the
  job's Hydra config (``hydra.sweeper.trial``): storage, study name, trial
  number, pruner.

Any task function a sweep of ``hydra/sweeper=rlchain_optuna`` runs reports
intermediate values of its objective with :func:`report` (or through the
:class:`JobTrial` that :func:`trial` returns)::

    from rlchain import tuning

    @hydra.main(...)
    def main(cfg):
        for step in range(cfg.steps):
            value = ...                          # the objective so far
            if tuning.report(value, step):       # False outside a sweep's job
                return value                     # pruned: the sweeper records the trial as pruned
        return value

rlchain-train's trainer reports its objective at every evaluation, at step =
iteration. Optuna is an optional dependency (``pip install "rlchain[sweep]"``);
this module imports it only when a function needs it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlchain.console import error_line

__all__ = [
    "PRUNED_AT",
    "PRUNERS",
    "SAMPLERS",
    "TRIAL_SETTING",
    "JobTrial",
    "StudyError",
    "TrialLink",
    "make_pruner",
    "make_sampler",
    "open_storage",
    "quiet_optuna",
    "report",
    "trial",
    "trial_seed",
]

#: Where a job finds its trial link (:class:`TrialLink`): a field of the sweeper's settings, set for each job by a
#: ``hydra.`` override, so that the task's own config is the app's alone.
TRIAL_SETTING = "hydra.sweeper.trial"
#: The user attribute a job sets on its trial when the study's pruner prunes it: the step; the sweeper then
#: records the trial as pruned, however the job ends.
PRUNED_AT = "pruned_at_step"
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
        raise StudyError(
            f"{name}={storage!r} cannot be opened: {error_line(str(err)) or type(err).__name__}; "
            "expected an SQLAlchemy URL (sqlite:///study.db) or the path of a journal file "
            "(study.log)"
        ) from None
    except Exception as err:  # SQLAlchemy's errors (a server that does not answer, a bad URL) are not Optuna's
        if type(err).__module__.split(".")[0] != "sqlalchemy":
            raise
        raise StudyError(f"{name}={storage!r} cannot be opened: {error_line(str(err))}") from None


def _options(cls: type, options: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``options`` as keyword arguments of ``cls``; an unknown key raises :class:`StudyError` naming the allowed ones."""
    allowed = [p for p in inspect.signature(cls).parameters if p not in ("self", "search_space")]
    unknown = [key for key in options if key not in allowed]
    if unknown:
        raise StudyError(
            f"{name}.{unknown[0]}={options[unknown[0]]!r} is not allowed: {cls.__name__} takes "
            f"{', '.join(allowed) or 'no options'}"
        )
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


def make_sampler(
    sampler: str,
    options: Mapping[str, Any] | None,
    seed: int | None,
    grid: Mapping[str, list[Any]] | None = None,
    name: str = "sampler",
) -> Any:
    """The Optuna sampler ``sampler`` names (``tpe``, ``random``, ``cmaes``, ``grid``), seeded with ``seed``.

    A seeded ``tpe``, ``random`` or ``cmaes`` sampler is built afresh for
    each trial, seeded with :func:`trial_seed` of ``seed`` and the trial's
    number: every trial draws from a stream of its own, so a resumed study
    continues instead of replaying the draws of its first sweep, and the
    parameters of trial ``k`` depend only on ``seed``, ``k`` and the trials
    the study held when it was asked for (the same whether the study ran in
    one sweep or in several). ``grid`` is the grid of the ``grid`` sampler
    (every value of each parameter); the sweeper enqueues its points itself.

    Raises:
        StudyError: an unknown sampler or option, an option value Optuna
            rejects, or ``cmaes`` without the ``cmaes`` package, naming it.
    """
    import optuna

    cls = getattr(optuna.samplers, _choice(SAMPLERS, sampler, name))
    kwargs = _options(cls, options or {}, f"{name}_options")
    if "seed" in kwargs:
        raise StudyError(
            f"{name}_options.seed={kwargs['seed']!r} is not allowed: the sampler's seed is hydra.sweeper.seed"
        )
    if sampler == "cmaes":
        import importlib.util

        if importlib.util.find_spec("cmaes") is None:
            raise StudyError(f'{name}=cmaes needs the cmaes package: pip install "rlchain[sweep]"')
    if sampler == "tpe":
        kwargs.setdefault("constant_liar", True)  # running trials count as bad ones: parallel trials spread out
    try:
        if sampler == "grid":
            return _grid_class()(grid, seed=seed, **kwargs)
        first = cls(seed=seed, **kwargs)  # the options' check
    except (TypeError, ValueError) as err:
        raise StudyError(f"{name}_options={dict(kwargs)!r} is not allowed for {sampler}: {err}") from None
    return first if seed is None else _per_trial_class()(functools.partial(cls, **kwargs), seed)


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number``'s sampler in a study searched with ``seed``: 32 bits of NumPy's
    ``SeedSequence([seed, number])``, a hash of both (no two trials of a study share a stream)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


@functools.cache
def _per_trial_class() -> type:
    """The sampler that builds its sampler afresh for each trial, seeded with :func:`trial_seed` (built on first
    use: Optuna is optional)."""
    import optuna

    class PerTrialSeed(optuna.samplers.BaseSampler):
        """``build(seed=trial_seed(seed, trial.number))`` for each trial; every call about a trial goes to its own.

        Samplers keep no state between trials that the study does not hold
        (TPE, random; CMA-ES stores its optimiser in the study), so a sampler
        per trial samples as one sampler would, with the seed of each trial.
        """

        def __init__(self, build: Any, seed: int) -> None:
            self._build, self._seed = build, seed
            self._samplers: dict[int, Any] = {}

        def _of(self, trial: Any) -> Any:
            if trial.number not in self._samplers:
                self._samplers[trial.number] = self._build(seed=trial_seed(self._seed, trial.number))
            return self._samplers[trial.number]

        def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
            return self._of(trial).infer_relative_search_space(study, trial)

        def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
            return self._of(trial).sample_relative(study, trial, search_space)

        def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
            return self._of(trial).sample_independent(study, trial, param_name, param_distribution)

        def before_trial(self, study: Any, trial: Any) -> None:
            self._of(trial).before_trial(study, trial)

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            self._of(trial).after_trial(study, trial, state, values)
            self._samplers.pop(trial.number, None)

        def reseed_rng(self) -> None:
            return None  # each trial's stream is its seed's

    return PerTrialSeed


def _grid_class() -> type:
    """Optuna's ``GridSampler`` that leaves the end of the search to the sweeper (built on first use: Optuna is
    optional)."""
    import optuna

    class Grid(optuna.samplers.GridSampler):
        """Optuna's grid sampler without its ``study.stop()`` once the grid is covered: ``stop`` works only inside
        ``Study.optimize``, and the sweeper ends the search itself. The sweeper enqueues every grid point it runs
        (a point without a finished, pruned or running trial), so this sampler only checks the grid: Optuna's
        own choice counts a failed trial's point as visited and lands a retry on a random point."""

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return Grid


@dataclass
class TrialLink:
    """The Optuna trial a job runs for: what the sweeper sets in the job's Hydra config (``hydra.sweeper.trial``).

    The job reports intermediate values of its objective to the trial
    (:meth:`JobTrial.report`); the sweeper alone ends the trial in the study
    (``tell``), from what the job returned (and the ``summary.json`` of an
    rlchain-train run).

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

    def open(self) -> JobTrial:
        """Connect to the trial (once, before the job's first report)."""
        import optuna

        quiet_optuna()
        storage = open_storage(self.storage, f"{TRIAL_SETTING}.storage")
        try:
            pruner = make_pruner(self.pruner, self.pruner_options, f"{TRIAL_SETTING}.pruner")
            study = optuna.load_study(study_name=self.study_name, storage=storage, pruner=pruner)
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, self.number)
        except KeyError as err:
            raise StudyError(
                f"{TRIAL_SETTING}: no study {self.study_name!r} with trial {self.number} in {self.storage!r} ({err})"
            ) from None
        return JobTrial(optuna.trial.Trial(study, trial_id))


class JobTrial:
    """The Optuna trial of a sweep's job, connected to its study (:func:`trial`, :meth:`TrialLink.open`).

    Args:
        trial: the job's ``optuna.trial.Trial``.
    """

    def __init__(self, trial: Any) -> None:
        self.trial: Any = trial
        self.number: int = trial.number
        """The trial's number in the study (the job's number in its sweep directory)."""
        self.pruned_at: int | None = None
        """The step at which the study's pruner pruned the trial (None: not pruned)."""

    def report(self, value: float | None, step: int) -> bool:
        """Report the objective's ``value`` at ``step``; True when the study's pruner prunes the trial.

        Once pruned, the trial stays pruned (True from then on): the job
        should end, and the sweeper records the trial as pruned however the
        job ends (Optuna's study keeps the last reported value). A None or
        non-finite value is not reported (Optuna would store NaN); the trial
        is then not pruned at this step. When the study cannot be reached (a
        locked database, a full disk, a trial another sweep has ended), the
        job says so once and goes on without reporting: the sweeper tells the
        study how it ended.
        """
        if self.pruned_at is not None:
            return True
        if self.trial is None or value is None or not math.isfinite(value):
            return False
        try:
            self.trial.report(float(value), step)
            if not self.trial.should_prune():
                return False
            self.trial.set_user_attr(PRUNED_AT, step)
        except Exception as err:  # noqa: BLE001 - the run matters more than its intermediate values
            from rlchain.console import notice

            notice(
                f"{TRIAL_SETTING}: reporting to trial {self.number} failed, the job goes on without it: "
                f"{error_line(str(err)) or type(err).__name__}"
            )
            self.trial = None
            return False
        self.pruned_at = step
        return True


_connected: tuple[dict[str, Any], JobTrial] | None = None
"""The trial this process connected to last, with its link (a worker of a launcher runs one job after another)."""


def trial() -> JobTrial | None:
    """The Optuna trial the running job is a trial of, connected to its study; None outside a job of
    ``hydra/sweeper=rlchain_optuna`` (a single run, another sweeper, no Hydra job at all).

    The link is ``hydra.sweeper.trial`` of the job's Hydra config
    (:class:`hydra.core.hydra_config.HydraConfig`), which the sweeper sets for
    each job; the task's config is untouched. A job connects once: later
    calls return the same :class:`JobTrial`.

    Raises:
        StudyError: the link is no :class:`TrialLink`, optuna is not
            installed, or the study or the trial cannot be opened, naming
            ``hydra.sweeper.trial``.
    """
    global _connected
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    link = OmegaConf.select(HydraConfig.get(), TRIAL_SETTING.removeprefix("hydra."), default=None)
    if not link:
        return None
    link = OmegaConf.to_container(link, resolve=True) if OmegaConf.is_config(link) else link
    if _connected is not None and _connected[0] == link:
        return _connected[1]
    try:
        opened = TrialLink(**link).open()
    except TypeError:
        raise StudyError(
            f"{TRIAL_SETTING}={link!r} is not allowed: expected {{storage, study_name, number, pruner, "
            "pruner_options}} (set by the rlchain_optuna sweeper)"
        ) from None
    except ImportError:
        raise StudyError(f'{TRIAL_SETTING}: reporting to a trial needs optuna: pip install "rlchain[sweep]"') from None
    _connected = (link, opened)
    return opened


def report(value: float | None, step: int) -> bool:
    """Report ``value``, the objective so far, at ``step`` to the running job's trial (:func:`trial`); True when
    the study's pruner prunes the trial, and from then on.

    A pruned job should end: however it ends (returning, raising
    ``optuna.TrialPruned``), the sweeper records its trial as pruned, with
    the last value reported. Outside a job of ``hydra/sweeper=rlchain_optuna``
    this does nothing and returns False. Steps are the task's own unit
    (rlchain-train reports at step = iteration); the pruners' options
    (``n_warmup_steps``, ``min_resource``) count in it.

    Raises:
        StudyError: see :func:`trial`.
    """
    job = trial()
    return job.report(value, step) if job is not None else False
