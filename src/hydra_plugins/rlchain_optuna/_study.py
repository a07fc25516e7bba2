"""One search of the rlchain_optuna sweeper: its study, the trials it asks for, and what it tells the study.

Imported when a sweep starts (Optuna is heavy, and Hydra's plugin scan runs
every public module of ``hydra_plugins`` at each start of every Hydra app).
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.rlchain_optuna._space import SweeperError, grid_of, search_space
from hydra_plugins.rlchain_optuna.config import OptunaSweeperConf
from rlchain.console import error_line
from rlchain.files import write_text
from rlchain.run.summary import RunSummary
from rlchain.run.tuning import (
    PRUNED_AT,
    TRIAL_SETTING,
    StudyError,
    make_pruner,
    make_sampler,
    open_storage,
    quiet_optuna,
)

log = logging.getLogger(__name__)

#: Where the study lives when ``hydra.sweeper.storage`` is null (in the sweep directory).
DEFAULT_JOURNAL = "optuna_journal.log"
#: The study's direction when neither ``hydra.sweeper.direction`` nor the task's config names one (Hydra's plugin's).
DEFAULT_DIRECTION = "minimize"
#: A parameter a trial lacks, in its grid point (no grid holds this value).
_ABSENT = object()
#: The result file and Optuna's plots, in the sweep directory.
RESULTS = "optimization_results.yaml"
PLOTS = {
    "optimization_history.png": "plot_optimization_history",
    "param_importances.png": "plot_param_importances",
    "trial_timeline.png": "plot_timeline",
}


def _grammar(value: Any) -> str:
    """``value`` (None, bool, number, str, list, dict) written in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_grammar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_grammar(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as an override")


def _absolute(storage: str) -> str:
    """``storage`` with a relative sqlite path or journal path made absolute (jobs may run elsewhere)."""
    if storage.startswith("sqlite:///") and not storage.startswith("sqlite:////"):
        return "sqlite:///" + os.path.abspath(storage.removeprefix("sqlite:///"))
    if "://" in storage:
        return storage
    return os.path.abspath(storage)


class Search:
    """The study of one sweep and the trials it runs; see :mod:`~.optuna_sweeper`.

    Args:
        settings: the sweeper's settings.
        config: the primary config (its ``hydra`` node: sweep directory, job name).
        arguments: the command line's sweep overrides (added to ``settings.params``).

    Raises:
        SweeperError: see :class:`~.optuna_sweeper.OptunaSweeper`.
    """

    def __init__(self, settings: OptunaSweeperConf, config: DictConfig, arguments: Sequence[str]) -> None:
        import optuna

        quiet_optuna()
        s = self.settings = settings
        _check(s)
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.distributions, self.fixed = search_space(s.params, arguments)
        if not self.distributions:
            raise SweeperError(
                "hydra.sweeper.params is empty: nothing to search (give a key=interval(...), "
                "range(...) or choice(...) there or on the command line)"
            )
        self.direction = _direction(s.direction, OmegaConf.select(config, "trainer.objective_direction", default=None))
        self.metric_name = _metric_name(s.metric_name, OmegaConf.select(config, "trainer.objective", default=None))
        self.study_name = s.study_name or str(config.hydra.job.name)
        self.storage = _absolute(s.storage if s.storage is not None else str(self.sweep_dir / DEFAULT_JOURNAL))
        grid = grid_of(self.distributions) if s.sampler == "grid" else None
        try:
            storage = open_storage(self.storage, "hydra.sweeper.storage")
            sampler = make_sampler(s.sampler, s.sampler_options, s.seed, grid, "hydra.sweeper.sampler")
            pruner = make_pruner(s.pruner, s.pruner_options, "hydra.sweeper.pruner")
            self.study = optuna.create_study(
                study_name=self.study_name,
                storage=storage,
                sampler=sampler,
                pruner=pruner,
                direction=self.direction,
                load_if_exists=True,
            )
        except StudyError as err:
            raise SweeperError(str(err)) from None
        stored = self.study.direction.name.lower()
        if stored != self.direction:
            raise SweeperError(
                f"hydra.sweeper.direction={self.direction!r} is not allowed for study {self.study_name!r} in "
                f"{self.storage}: it was created to {stored}; use its direction or another hydra.sweeper.study_name"
            )
        self.grid = None if grid is None else [dict(zip(grid, point)) for point in itertools.product(*grid.values())]
        """Every point of a grid search, in the grid's order (None: another sampler)."""
        self.n_trials = s.n_trials if self.grid is None else min(s.n_trials, len(self.grid))
        self._grid_failures: collections.Counter[tuple] = collections.Counter()
        self._fail_orphans()
        self.finished = self._finished()
        self._name_metric(self.metric_name)
        self.failures = 0
        self.running: dict[int, Any] = {}
        resumed = (
            f", resuming {len(self.study.trials)} trial(s), {self.finished} finished or pruned"
            if self.study.trials
            else ""
        )
        log.info(
            f"Optuna study {self.study_name!r} in {self.storage}: {s.sampler} sampler, {s.pruner} pruner, "
            f"{self.direction} the objective, {self.n_trials} trial(s){resumed}"
        )
        log.info("search space: " + ", ".join(f"{k}: {_shown(d)}" for k, d in self.distributions.items()))

    def _name_metric(self, name: str | None) -> None:
        """Give the study's objective its name (optuna-dashboard's axis) where it has another or none."""
        if name is None or self.study.metric_names == [name]:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks set_metric_names experimental
            self.study.set_metric_names([name])

    def _point(self, params: dict[str, Any]) -> tuple:
        """The grid point of a trial's parameters (the grid's keys in order; a key it lacks: a value no grid has)."""
        return tuple(params.get(key, _ABSENT) for key in self.distributions)

    def _grid_taken(self, *states: str) -> set[tuple]:
        """The grid points that have a trial in one of ``states`` (a waiting trial: the parameters it was enqueued
        with)."""
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False, states=tuple(TrialState[s] for s in states))
        return {
            self._point(t.system_attrs.get("fixed_params", {}) if t.state == TrialState.WAITING else t.params)
            for t in trials
        }

    def _next_point(self) -> dict[str, Any] | None:
        """The grid point the next trial runs: of the points with no finished, pruned, running or waiting trial,
        the one this sweep saw fail least often, first in the grid's order; None when there is none."""
        taken = self._grid_taken("COMPLETE", "PRUNED", "RUNNING", "WAITING")
        free = [point for point in self.grid if self._point(point) not in taken]
        return min(free, key=lambda point: self._grid_failures[self._point(point)]) if free else None

    def grid_not_run(self) -> list[dict[str, Any]]:
        """The grid points with no finished or pruned trial (a grid search; [] otherwise)."""
        if self.grid is None:
            return []
        done = self._grid_taken("COMPLETE", "PRUNED")
        return [point for point in self.grid if self._point(point) not in done]

    def _finished(self) -> int:
        """The study's finished and pruned trials; in a grid search, its grid points that have one."""
        if self.grid is None:
            return self._count("COMPLETE", "PRUNED")
        return len(self.grid) - len(self.grid_not_run())

    def _count(self, *states: str) -> int:
        from optuna.trial import TrialState

        wanted = tuple(TrialState[s] for s in states)
        return len(self.study.get_trials(deepcopy=False, states=wanted))

    def _fail_orphans(self) -> None:
        """Mark the trials a killed sweep left running as failed: this sweep owns the study now.

        Waiting trials (``study.enqueue_trial``) stay: they are the next ones asked for.
        """
        import optuna
        from optuna.trial import TrialState

        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self._fail(
                optuna.trial.Trial(self.study, frozen._trial_id),
                "abandoned",
                "left running by a sweep that ended before it",
            )
            log.warning(f"trial {frozen.number} was left running by a sweep that ended before it: marked failed")

    def _fail(self, trial: Any, status: str, error: str) -> None:
        """Tell the study that ``trial`` failed; its user attributes ``status`` and ``error`` say how."""
        from optuna.trial import TrialState

        trial.set_user_attr("status", status)
        trial.set_user_attr("error", error)
        self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)

    def next_trial(self) -> tuple[int, list[str]] | None:
        """Ask the study for the next trial: ``(its number, its job's overrides)``, or None when the budget is
        taken (finished and running trials) or ``n_trials`` trials of this sweep failed.

        A grid search enqueues the point it runs (:meth:`_next_point`); the job's overrides are the trial's
        parameters, and ``hydra.sweeper.trial`` names the trial in the job's Hydra config."""
        if self.finished + len(self.running) >= self.n_trials or self.failures >= self.n_trials:
            return None
        if self.grid is not None and not self._count("WAITING"):  # a waiting trial (enqueued) runs first
            point = self._next_point()
            if point is None:
                return None
            self.study.enqueue_trial(point)
        trial = self.study.ask(self.distributions)
        for key, value in self.fixed.items():
            trial.set_user_attr(key, value)
        self.running[trial.number] = trial
        link = {
            "storage": self.storage,
            "study_name": self.study_name,
            "number": trial.number,
            "pruner": self.settings.pruner,
            "pruner_options": self.settings.pruner_options,
        }
        overrides = [f"{k}={v}" for k, v in trial.params.items()] + [f"{k}={v}" for k, v in self.fixed.items()]
        return trial.number, overrides + [f"++{TRIAL_SETTING}={_grammar(link)}"]  # ++: into the empty dict

    def tell(self, number: int, ret: JobReturn) -> None:
        """Tell the study how trial ``number``'s job ended: pruned when the study's pruner pruned the trial (the job
        marked it, :data:`rlchain.run.tuning.PRUNED_AT`) and no stop signal ended the job; else from its
        ``summary.json``, else from its return."""
        from optuna.trial import TrialState

        trial = self.running.pop(number)
        pruned_at = self.study._storage.get_trial(trial._trial_id).user_attrs.get(PRUNED_AT)
        where = job_dir(ret)
        summary = RunSummary.read(where) if where is not None else None
        if summary is not None and (summary.start_time or 0.0) < trial.datetime_start.timestamp():
            summary = None  # a run from before this trial (its job refused the directory it holds)
        if where is not None:
            trial.set_user_attr("job_dir", str(where))
        value = returned_value(ret)
        status = summary.status if summary is not None else ("completed" if value is not None else "failed")
        error = summary.error if summary is not None else None
        if ret.status is JobStatus.FAILED and status in ("completed", "pruned"):  # the job raised after its run ended
            status, error = "failed", None
        if status == "completed" and value is None:
            status, error = "failed", f"the job returned no objective ({ret._return_value!r})"
        if pruned_at is not None and status not in ("interrupted", "aborted"):  # the pruner's word, however it ended
            status = "pruned"
        if self.metric_name is None and summary is not None and summary.status in ("completed", "pruned"):
            self.metric_name = summary.objective_name  # trainer.objective=auto, as the run resolved it
            self._name_metric(self.metric_name)
        if status == "pruned":
            frozen = self.study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
            self.finished = self._finished()
            log.info(f"trial {number} pruned at step {frozen.last_step} ({frozen.value}): {_params(frozen.params)}")
        elif status == "completed":
            self.study.tell(trial, value, skip_if_finished=True)
            self.finished = self._finished()
            log.info(
                f"trial {number} finished with {value:.4g}: {_params(trial.params)}; best so far "
                f"{self.study.best_value:.4g} (trial {self.study.best_trial.number})"
            )
        else:
            if error is None and ret._return_value is not None and not isinstance(ret._return_value, (int, float)):
                error = error_line(ret._return_value)
            self._fail(trial, status, error or status)
            if status not in ("interrupted", "aborted"):
                self.failures += 1
                self._grid_failures[self._point(trial.params)] += 1
            log.warning(f"trial {number} {status}: {error or status} (it does not count toward n_trials)")

    def finish(self) -> None:
        """Write ``optimization_results.yaml`` and Optuna's plots in the sweep directory; say how the search ended.

        Trials whose jobs did not come back (a stop signal ended the sweep while
        an in-process launcher ran them) are marked failed, with ``status: interrupted``.

        Raises:
            SweeperError: ``n_trials`` trials of this sweep failed.
        """
        for trial in self.running.values():
            self._fail(trial, "interrupted", "the sweep was stopped while it ran")
        self.running.clear()
        try:
            self._write_results()
        except OSError as err:
            log.warning(f"{RESULTS} could not be written in {self.sweep_dir}: {err}")
        missing = "; ".join(_params(p) for p in self.grid_not_run()) if self.finished < self.n_trials else ""
        if self.failures >= self.n_trials and self.finished < self.n_trials:
            not_run = f"; grid points not run: {missing}" if missing else ""
            raise SweeperError(
                f"the search stopped: {self.failures} trial(s) of this sweep failed, "
                f"{self.finished} of {self.n_trials} finished{not_run} (see {self.sweep_dir / RESULTS})"
            )
        if missing:
            log.warning(f"grid points not run: {missing} (the same command runs them)")

    def _write_results(self) -> None:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        counts = {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}
        results: dict[str, Any] = {
            "name": "rlchain_optuna",
            "study_name": self.study_name,
            "storage": self.storage,
            "direction": self.direction,
            "n_trials": self.n_trials,
            "trials": {k: v for k, v in counts.items() if v},
        }
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        if complete:
            best = self.study.best_trial
            results.update(
                best_params=dict(best.params),
                best_value=best.value,
                best_trial=best.number,
                best_job_dir=best.user_attrs.get("job_dir"),
            )
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        write_text(self.sweep_dir / RESULTS, OmegaConf.to_yaml(OmegaConf.create(results)))
        log.info(f"{RESULTS}: {_summary_line(results)}")
        self._plots(complete)

    def _plots(self, complete: list[Any]) -> None:
        """Optuna's matplotlib plots as PNG; a plot that cannot be drawn yet (too few trials) is skipped."""
        if not complete:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import optuna.visualization.matplotlib as vis

        for name, function in PLOTS.items():
            if function == "plot_param_importances" and (len(complete) < 2 or len(self.distributions) < 2):
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                    ax = getattr(vis, function)(self.study)
                figure = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
                figure.savefig(self.sweep_dir / name, dpi=100, bbox_inches="tight")
                plt.close(figure)
            except Exception as err:  # noqa: BLE001 - a plot is a courtesy; the study and the YAML are the results
                log.warning(f"{name} could not be drawn: {error_line(err)}")


def _direction(sweeper: str | None, trainer: str | None) -> str:
    """The study's direction: the run's ``trainer.objective_direction`` (its one home in rlchain-train), else
    ``hydra.sweeper.direction``, else minimize.

    Raises:
        SweeperError: a direction that is neither maximize nor minimize, or one that differs from the run's.
    """
    if sweeper is not None and sweeper not in ("maximize", "minimize"):
        raise SweeperError(f"hydra.sweeper.direction={sweeper!r} is not allowed: expected maximize or minimize")
    if sweeper is not None and trainer is not None and sweeper != trainer:
        raise SweeperError(
            f"hydra.sweeper.direction={sweeper!r} is not allowed with "
            f"trainer.objective_direction={trainer!r}: the study optimises the run's objective; "
            "set trainer.objective_direction alone"
        )
    return trainer or sweeper or DEFAULT_DIRECTION


def _metric_name(sweeper: str | None, trainer: str | None) -> str | None:
    """The study's name for its objective: the run's ``trainer.objective`` (its one home in rlchain-train; None for
    ``auto`` until a trial resolves it), else ``hydra.sweeper.metric_name``.

    Raises:
        SweeperError: a name that differs from the run's ``trainer.objective``.
    """
    if sweeper is not None and trainer is not None and sweeper != trainer:
        raise SweeperError(
            f"hydra.sweeper.metric_name={sweeper!r} is not allowed with trainer.objective={trainer!r}: "
            "the study optimises the run's objective; set trainer.objective alone"
        )
    if trainer is not None:
        return None if trainer == "auto" else trainer
    return sweeper


def _check(s: OptunaSweeperConf) -> None:
    """The numbers' ranges, checked when the sweep starts: a setting the sweeper's constructor rejected would reach
    the user wrapped in Hydra's instantiation error."""
    for name in ("n_trials", "n_jobs"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SweeperError(f"hydra.sweeper.{name}={value!r} is not allowed: expected an integer >= 1")
    if s.seed is not None and (isinstance(s.seed, bool) or not isinstance(s.seed, int) or s.seed < 0):
        raise SweeperError(f"hydra.sweeper.seed={s.seed!r} is not allowed: expected an integer >= 0 or null")


def _shown(distribution: Any) -> str:
    """A distribution in a few words: ``[1e-4, 3e-3] log``, ``{3, 4, ..., 10}``, ``choice(a, b)``."""
    from optuna.distributions import CategoricalDistribution

    if isinstance(distribution, CategoricalDistribution):
        return "choice(" + ", ".join(str(c) for c in distribution.choices) + ")"
    step = f" step {distribution.step}" if getattr(distribution, "step", None) not in (None, 1) else ""
    kind = "int" if type(distribution).__name__.startswith("Int") else "float"
    return f"{kind} [{distribution.low:g}, {distribution.high:g}]{' log' if distribution.log else ''}{step}"


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _summary_line(results: dict[str, Any]) -> str:
    counts = ", ".join(f"{v} {k}" for k, v in results["trials"].items())
    best = (
        f"best {results['best_value']:.4g} (trial {results['best_trial']}): {_params(results['best_params'])}"
        if "best_value" in results
        else "no trial finished yet"
    )
    return f"{counts}; {best}"


def job_dir(ret: JobReturn) -> Path | None:
    """The output directory of a job (``hydra.runtime.output_dir``), or None when its return does not say."""
    output_dir = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir", default=None) if ret.hydra_cfg else None
    return Path(str(output_dir)) if output_dir else None


def returned_value(ret: JobReturn) -> float | None:
    """The job's return value as a finite float, or None (a failed job, a non-number, NaN)."""
    if ret.status is not JobStatus.COMPLETED:
        return None
    value = ret._return_value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
