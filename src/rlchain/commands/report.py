"""Sweep results: ``summary.csv``, ``summary.md`` and learning curves of a multirun.

``rlchain-report <sweep_dir>`` (and, automatically, the end of every job and
of every ``rlchain-train -m`` multirun: :class:`SweepSummary`) reads each job
directory of a sweep (found by its ``.hydra/overrides.yaml``) with its
``summary.json`` (:class:`~rlchain.run.summary.RunSummary`) and ``metrics.jsonl``,
joins the launcher's record of each job (:class:`~rlchain.run.summary.JobRecord`,
where a launcher wrote one), and writes into the sweep directory:

* ``summary.csv``: one row per job: job number, the overrides that vary
  across the sweep (one column each), status, device, wall seconds,
  global_step, final and best eval success rate, final eval return, the
  objective, the objective of ``best.pt`` evaluated on fresh start states
  when the run completed (``summary.json``'s ``best_fresh``; the Markdown
  table adds its 95% confidence interval), the error of a failed job, all
  overrides and the job directory;
  rows sorted by the objective (best first; jobs without one last).
* ``summary.md``: the same jobs as a table, then a second table that groups
  jobs differing only in ``seed``: number of seeds, mean and std (sample std,
  n - 1) of the wall seconds and of each result, sorted by mean objective.
* with ``at_steps`` (``--at-steps``), both tables gain one column per env-step
  budget: the plotted metric at that budget, linearly interpolated between the
  evaluations around it (empty for a job whose evaluations do not reach it), so
  runs that evaluate at different steps compare at equal experience.
* ``learning_curves.png``: the sweep's objective (the jobs' ``trainer.objective``,
  e.g. ``eval/avg_reward`` on a task without success; ``--metric`` another
  ``metrics.jsonl`` key) against env steps for each configuration, the mean
  across seeds with a band of one std; beyond a few configurations the legend
  goes below the axes, in columns.

Usage::

    rlchain-report multirun/2026-11-21/10-00-00_3fa2c1
    rlchain-report multirun/2026-11-21/10-00-00_3fa2c1 --metric eval/success_rate --no-plot
    rlchain-report multirun/2026-11-21/10-00-00_3fa2c1 --at-steps 1e6 5e6
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import logging
import math
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlchain.console import error_line
from rlchain.files import write_text
from rlchain.run.summary import STOPPED, JobRecord, RunSummary

__all__ = [
    "JobResult",
    "SweepFailed",
    "SweepSummary",
    "failure_lines",
    "learning_curves",
    "learning_curves_figure",
    "load_jobs",
    "main",
    "plot_learning_curves",
    "sweep_objective",
    "write_summary",
]

#: Result columns: (summary field, title); `final/...` reads summary.final[...].
RESULTS = [
    ("final/eval/success_rate", "final eval success rate"),
    ("best_eval_success_rate", "best eval success rate"),
    ("final/eval/avg_reward", "final eval return"),
    ("objective", "objective"),
    ("best_fresh", "best.pt on fresh starts"),
]
#: The objective's column in RESULTS, by which jobs and configurations are ranked.
OBJECTIVE_COLUMN = [key for key, _ in RESULTS].index("objective")
SEED_KEYS = {"seed"}
#: What the curves and the ``at_steps`` columns show when no job names its objective (every job failed early).
DEFAULT_METRIC = "eval/success_rate"
#: Legend entries that the curves' axes hold; more go below the axes, in columns.
LEGEND_INSIDE = 4
log = logging.getLogger(__name__)


class SweepFailed(CompactHydraException):
    """Raised at the end of a multirun in which some job failed (Hydra prints the message only)."""


@dataclass
class JobResult:
    """One job of a sweep: its directory, its run's summary and its launcher's record, joined.

    Attributes:
        num: Hydra's job number (``hydra.job.num``).
        dir: the job directory.
        overrides: the job's task overrides (``key=value`` strings).
        summary: its ``summary.json``, or None when the run wrote none.
        record: the launcher's record of it, or None (no such launcher, or the job has not ended).
    """

    num: int
    dir: Path
    overrides: list[str]
    summary: RunSummary | None = None
    record: JobRecord | None = None

    @property
    def status(self) -> str:
        """The run's own status; without a ``summary.json`` the launcher's (a worker that died, or was killed);
        else ``missing``."""
        if self.summary is not None:
            return self.summary.status
        return self.record.status if self.record is not None else "missing"

    @property
    def error(self) -> str | None:
        """What went wrong, on one line: the run's own word, else the launcher's."""
        return (self.summary.error if self.summary is not None else None) or (
            self.record.error if self.record is not None else None
        )

    @property
    def signal(self) -> str | None:
        """The stop signal's name when one stopped the job: the run's own word, else the launcher's."""
        if self.summary is not None:
            return self.summary.signal
        return self.record.signal if self.record is not None else None

    @property
    def failed(self) -> bool:
        """Whether the job neither completed, was pruned, nor was stopped on request (failed, missing or unreadable)."""
        return self.status not in ("completed", "pruned") and self.status not in STOPPED

    @property
    def device(self) -> str | None:
        """The launcher slot's device (``cuda:3``), else the run's own (``cuda:0``/``cpu``)."""
        if self.record is not None and self.record.device:
            return self.record.device
        return self.summary.device if self.summary is not None else None

    @property
    def wall_s(self) -> float | None:
        """Seconds the job ran, start-up included (the launcher's record), else its training loop's ``elapsed_s``."""
        if self.record is not None and self.record.wall_s is not None:
            return self.record.wall_s
        return self.summary.elapsed_s if self.summary is not None else None

    def value(self, key: str) -> float | None:
        """A numeric result by summary field (``final/<metric>`` reads ``summary.final``); None when absent."""
        if self.summary is None:
            return None
        if key.startswith("final/"):
            value = self.summary.final.get(key[len("final/") :])
        elif key == "best_fresh":
            fresh = self.summary.best_fresh_objective
            value = fresh.get("mean") if fresh else None
        else:
            value = getattr(self.summary, key, None)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def params(self) -> dict[str, str]:
        """The overrides as ``{key: value}`` (``+``/``++`` prefixes dropped, deletions kept as keys)."""
        out = {}
        for override in self.overrides:
            key, _, value = override.partition("=")
            out[key.lstrip("+")] = value
        return out

    def value_at(self, metric: str, step: float) -> float | None:
        """``metric`` at ``global_step == step``, linearly interpolated between the logged rows around it.

        None when ``step`` lies outside the logged rows (before the first or
        after the last): a curve is never extrapolated.
        """
        import numpy as np

        steps, values = self.curve(metric)
        if not steps or not steps[0] <= step <= steps[-1]:
            return None
        return float(np.interp(step, steps, values))

    def curve(self, metric: str) -> tuple[list[float], list[float]]:
        """``(global_step, value)`` of every ``metrics.jsonl`` row that has ``metric``."""
        path = self.dir / "metrics.jsonl"
        steps, values = [], []
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except ValueError:  # a line torn by a kill
                    continue
                value = row.get(metric)
                if isinstance(value, (int, float)) and "global_step" in row:
                    steps.append(float(row["global_step"]))
                    values.append(float(value))
        return steps, values


def load_jobs(sweep_dir: str | Path) -> list[JobResult]:
    """Every job directory under ``sweep_dir``, in job-number order.

    Raises:
        FileNotFoundError: ``sweep_dir`` does not exist or holds no job
            (no ``.hydra/overrides.yaml`` below it).
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep directory {str(sweep_dir)!r} does not exist")
    records = JobRecord.read_all(sweep_dir)
    jobs = []
    for overrides_file in sorted(sweep_dir.rglob(".hydra/overrides.yaml")):
        job_dir = overrides_file.parent.parent
        overrides = [str(o) for o in OmegaConf.load(overrides_file)]
        hydra_file = overrides_file.with_name("hydra.yaml")
        num = OmegaConf.select(OmegaConf.load(hydra_file), "hydra.job.num") if hydra_file.is_file() else None
        num = int(num) if num is not None else len(jobs)
        jobs.append(JobResult(num, job_dir, overrides, RunSummary.read(job_dir), records.get(num)))
    if not jobs:
        raise FileNotFoundError(f"{str(sweep_dir)!r} holds no job directory (no .hydra/overrides.yaml below it)")
    return sorted(jobs, key=lambda j: j.num)


#: How :func:`learning_curves` marks a configuration whose every job was pruned.
PRUNED_LABEL = " (pruned)"


def varying_keys(jobs: Sequence[JobResult]) -> list[str]:
    """Override keys whose value differs between jobs (or that some jobs lack), in first-seen order."""
    params = [j.params() for j in jobs]
    keys = list(dict.fromkeys(k for p in params for k in p))
    return [k for k in keys if len({p.get(k) for p in params}) > 1]


def _sort_key(value: float | None, maximize: bool) -> tuple[int, float]:
    if value is None or math.isnan(value):
        return (1, 0.0)
    return (0, -value if maximize else value)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    escape = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(escape, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _steps_label(step: float) -> str:
    """``1M``, ``2.5M``, ``300k``, ``512`` (env steps)."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if step >= scale:
            return f"{step / scale:.4g}{suffix}"
    return f"{step:.4g}"


def _label_of(job: JobResult, keys: Sequence[str]) -> str:
    params = job.params()
    return " ".join(f"{k}={params.get(k, '')}" for k in keys) or " ".join(job.overrides)


def seed_groups(jobs: Sequence[JobResult], keys: Sequence[str]) -> dict[tuple[tuple[str, str], ...], list[JobResult]]:
    """Jobs grouped by their values of ``keys`` other than ``seed`` (insertion ordered)."""
    groups: dict[tuple[tuple[str, str], ...], list[JobResult]] = {}
    for job in jobs:
        params = job.params()
        config = tuple((k, params.get(k, "")) for k in keys if k not in SEED_KEYS)
        groups.setdefault(config, []).append(job)
    return groups


def failure_lines(jobs: Sequence[JobResult], nums: set[int] | None = None) -> list[str]:
    """One line per failed job: ``job <num> (<the overrides that vary>): <its error on one line>``.

    The overrides that vary are those of ``jobs`` (the whole sweep); ``nums``
    keeps only those job numbers.
    """
    keys = varying_keys(jobs)
    return [
        f"job {j.num} ({_label_of(j, keys)}): {error_line(j.error or j.status)}"
        for j in jobs
        if j.failed and (nums is None or j.num in nums)
    ]


def sweep_objective(jobs: Sequence[JobResult]) -> str:
    """The metric the sweep's jobs optimise: the ``objective_name`` most of their summaries give (the resolved
    ``trainer.objective``), else :data:`DEFAULT_METRIC`."""
    names = [
        j.summary.objective_name
        for j in jobs
        if j.summary is not None and j.summary.objective_name and j.summary.objective_name != "auto"
    ]
    return max(dict.fromkeys(names), key=names.count) if names else DEFAULT_METRIC


def write_summary(
    sweep_dir: str | Path,
    maximize: bool | None = None,
    plot: bool = True,
    metric: str | None = None,
    jobs: Sequence[JobResult] | None = None,
    at_steps: Sequence[float] = (),
) -> dict[str, Path]:
    """Write ``summary.csv``, ``summary.md`` (and ``learning_curves.png``) into ``sweep_dir``.

    Args:
        sweep_dir: a multirun's sweep directory.
        maximize: sort by the objective from highest (True) or lowest; None
            follows the jobs' ``trainer.objective_direction`` (lowest first
            when they minimise).
        plot: also draw the learning curves of ``metric``.
        metric: the ``metrics.jsonl`` key plotted against env steps (and
            reported at ``at_steps``); None: the sweep's objective
            (:func:`sweep_objective`).
        jobs: the sweep's jobs when already loaded (:func:`load_jobs`).
        at_steps: env-step budgets (> 0) at which ``metric`` is reported, one
            column each (see :meth:`JobResult.value_at`).

    Returns:
        ``{"csv": path, "md": path}`` plus ``"png"`` when a plot was drawn.

    Raises:
        FileNotFoundError: see :func:`load_jobs`.
        ValueError: an ``at_steps`` budget that is not a positive number.
    """
    bad = [b for b in at_steps if not isinstance(b, (int, float)) or isinstance(b, bool) or not b > 0]
    if bad:
        raise ValueError(f"at_steps={list(at_steps)!r}: expected env-step budgets > 0, got {bad[0]!r}")
    sweep_dir = Path(sweep_dir)
    jobs = load_jobs(sweep_dir) if jobs is None else jobs
    metric = metric or sweep_objective(jobs)
    columns: list[tuple[str, Any]] = [(title, lambda job, key=key: job.value(key)) for key, title in RESULTS]
    columns += [(f"{metric} at {_steps_label(b)} steps", lambda job, b=b: job.value_at(metric, b)) for b in at_steps]
    keys = varying_keys(jobs)
    summaries = [j.summary for j in jobs if j.summary is not None]
    if maximize is None:
        maximize = all(s.objective_direction != "minimize" for s in summaries)
    ranked = sorted(jobs, key=lambda j: (_sort_key(j.value("objective"), maximize), j.num))
    results_of = {
        job.num: [get(job) for _, get in columns] for job in jobs
    }  # each job's files read once for both tables
    objective_name = next((s.objective_name for s in summaries if s.objective_name), "objective")

    header = ["job", *keys, "status", "device", "wall_s", "global_step", *(title for title, _ in columns)]
    csv_rows = []
    md_rows = []
    for job in ranked:
        params = job.params()
        results = results_of[job.num]
        head = [job.num, *(params.get(k, "") for k in keys), job.status, job.device or ""]
        step = job.summary.global_step if job.summary is not None else None
        csv_rows.append(
            [
                *head,
                job.wall_s,
                step,
                *results,
                job.error or "",
                " ".join(job.overrides),
                str(job.dir.relative_to(sweep_dir)),
            ]
        )
        wall = None if job.wall_s is None else round(job.wall_s, 1)
        cells = [_fmt(v) for v in [*head, wall, step, *results]]
        fresh = job.summary.best_fresh_objective if job.summary is not None else None
        if fresh is not None and fresh.get("ci95_low") is not None:  # the fresh score with its 95% confidence interval
            at = len(head) + 2 + [key for key, _ in RESULTS].index("best_fresh")
            cells[at] += f" [{fresh['ci95_low']:.3g}, {fresh['ci95_high']:.3g}]"
        md_rows.append(cells)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*header, "error", "overrides", "dir"])
    writer.writerows(["" if v is None else v for v in row] for row in csv_rows)
    paths = {"csv": write_text(sweep_dir / "summary.csv", buffer.getvalue())}

    group_titles = ["wall_s", *(title for title, _ in columns)]
    group_rows = []
    for config, members in seed_groups(jobs, keys).items():
        cells = []
        stats = []
        for column in zip(*([j.wall_s, *results_of[j.num]] for j in members)):
            mean, std = _mean_std([v for v in column if v is not None])
            stats.append(mean)
            cells.append("" if mean is None else f"{mean:.4g}" + ("" if std is None else f" ± {std:.2g}"))
        completed = sum(j.status == "completed" for j in members)
        label = " ".join(f"{k}={v}" for k, v in config) or "(all jobs)"
        group_rows.append((stats[1 + OBJECTIVE_COLUMN], [label, str(len(members)), str(completed), *cells]))
    group_rows.sort(key=lambda r: _sort_key(r[0], maximize))

    failed = [j for j in jobs if j.failed]
    order = "highest" if maximize else "lowest"
    text = [
        f"# Sweep summary: {sweep_dir}",
        "",
        f"{len(jobs)} jobs: {sum(j.status == 'completed' for j in jobs)} completed, "
        + (f"{sum(j.status == 'pruned' for j in jobs)} pruned, " if any(j.status == "pruned" for j in jobs) else "")
        + f"{sum(j.status == 'interrupted' for j in jobs)} interrupted, "
        f"{sum(j.status == 'aborted' for j in jobs)} aborted, {len(failed)} failed or missing. "
        f"Objective: `{objective_name}` ({order} first).",
        "",
        "## Jobs",
        "",
        _markdown(header, md_rows),
        "",
        "## Configurations over seeds (mean ± std)",
        "",
        _markdown(["configuration", "jobs", "completed", *group_titles], [r for _, r in group_rows]),
    ]
    if failed:
        text += ["", "## Failed jobs", ""]
        text += [f"- {line}" for line in failure_lines(jobs)]
    if plot:
        png = plot_learning_curves(sweep_dir, jobs=jobs, metric=metric)
        if png is not None:
            paths["png"] = png
            text += ["", "## Learning curves", "", f"![{metric} against env steps]({png.name})"]
    paths["md"] = write_text(sweep_dir / "summary.md", "\n".join(text) + "\n")
    return paths


def _label(config: tuple[tuple[str, str], ...]) -> str:
    """``learning_rate=0.001 clip_coef=0.2`` from ``(("algorithm.learning_rate", "0.001"), ...)``."""
    parts = []
    for key, value in config:
        try:
            value = f"{float(value):.3g}" if not value.lstrip("-").isdigit() else value
        except ValueError:
            pass
        parts.append(f"{key.rsplit('.', 1)[-1]}={value}")
    return " ".join(parts)


def learning_curves(
    jobs: Sequence[JobResult],
    metric: str = "eval/success_rate",
) -> dict[str, tuple[list[float], list[float], list[float] | None, int]]:
    """``metric`` against env steps per configuration, over its seeds.

    Seeds of one configuration that logged at different steps are linearly
    interpolated onto the steps they share (up to the shortest run).

    Returns:
        ``{label: (steps, mean, std, n_seeds)}`` in configuration order;
        ``std`` is the sample std (n - 1), None for a single seed. The label
        of a configuration whose every job was pruned (by the Optuna
        sweeper's pruner) ends with `` (pruned)``. Configurations without a
        logged ``metric`` are left out.
    """
    import numpy as np

    out = {}
    for config, members in seed_groups(jobs, varying_keys(jobs)).items():
        curves = [c for c in (j.curve(metric) for j in members) if c[0]]
        if not curves:
            continue
        end = min(steps[-1] for steps, _ in curves)
        grid = np.array(sorted({s for steps, _ in curves for s in steps if s <= end}))
        values = np.stack([np.interp(grid, steps, vals) for steps, vals in curves])
        std = values.std(axis=0, ddof=1).tolist() if len(curves) > 1 else None
        label = (_label(config) or "all jobs") + (PRUNED_LABEL if all(j.status == "pruned" for j in members) else "")
        out[label] = (grid.tolist(), values.mean(axis=0).tolist(), std, len(curves))
    return out


def plot_learning_curves(
    sweep_dir: str | Path,
    jobs: Sequence[JobResult] | None = None,
    metric: str | None = None,
    max_curves: int = 10,
    name: str = "learning_curves.png",
) -> Path | None:
    """Draw :func:`learning_curves` of ``metric`` (None: the sweep's objective, :func:`sweep_objective`) into
    ``<sweep_dir>/<name>``, as :func:`learning_curves_figure` lays them out.

    Returns:
        The PNG path, or None when no job logged ``metric``.
    """
    sweep_dir = Path(sweep_dir)
    jobs = load_jobs(sweep_dir) if jobs is None else jobs
    metric = metric or sweep_objective(jobs)
    curves = learning_curves(jobs, metric)
    if not curves:
        return None
    path = sweep_dir / name
    learning_curves_figure(curves, metric, max_curves).savefig(path, dpi=120)
    return path


def learning_curves_figure(
    curves: dict[str, tuple[list[float], list[float], list[float] | None, int]], metric: str, max_curves: int = 10
) -> Any:
    """A matplotlib ``Figure`` of ``curves`` (:func:`learning_curves` of ``metric``): mean line, band of one std.

    With more than ``max_curves`` configurations that ran to their end, the
    ``max_curves`` with the highest mean final value are drawn (the title says
    so). Pruned configurations are drawn as thin dashed grey lines that end
    where the pruner stopped them, under one legend entry. Up to
    :data:`LEGEND_INSIDE` legend entries stand in the axes; more stand below
    them, in as many columns as their labels fit side by side (the figure
    grows to hold their rows), so that no entry covers a curve or leaves the
    figure.
    """
    from matplotlib.figure import Figure

    pruned = {label: curve for label, curve in curves.items() if label.endswith(PRUNED_LABEL)}
    ran = {label: curve for label, curve in curves.items() if label not in pruned}
    shown = sorted(ran.items(), key=lambda kv: -kv[1][1][-1])[:max_curves]
    labels = [f"{label} (n={n})" for label, (_, _, _, n) in shown]
    labels += [f"pruned ({len(pruned)} configurations)"] if pruned else []
    inside = len(labels) <= LEGEND_INSIDE
    width = 8.0
    columns = 1 if inside else max(1, min(4, int(width * 15) // (max(map(len, labels)) + 6)))  # ~15 chars an inch
    rows = 0 if inside else math.ceil(len(labels) / columns)
    fig = Figure(figsize=(width, 4.8 + 0.17 * rows), layout="constrained")
    ax = fig.add_subplot()
    for i, (steps, mean, _, _) in enumerate(pruned.values()):
        ax.plot(
            steps,
            mean,
            color="0.55",
            linestyle="--",
            linewidth=0.9,
            label=f"pruned ({len(pruned)} configurations)" if i == 0 else None,
        )
    for label, (steps, mean, std, n) in shown:
        (line,) = ax.plot(steps, mean, label=f"{label} (n={n})")
        if std is not None:
            low = [m - s for m, s in zip(mean, std)]
            high = [m + s for m, s in zip(mean, std)]
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if "success_rate" in metric:
        ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("env steps (global_step)")
    ax.set_ylabel(metric)
    title = f"{metric}: mean ± std over seeds"
    if len(ran) > len(shown):
        title += f" (best {len(shown)} of {len(ran)} configurations that ran to the end)"
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)
    if inside:
        ax.legend(fontsize="small", loc="best")
    else:
        fig.legend(loc="outside lower center", ncols=columns, fontsize="x-small", frameon=False)
    return fig


@contextlib.contextmanager
def _locked(sweep_dir: Path) -> Iterator[None]:
    """Hold ``<sweep_dir>/.summary.lock`` (jobs of one sweep end in several processes at once)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: the atomic writes still leave whole files
        yield
        return
    with open(sweep_dir / ".summary.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class SweepSummary(Callback):
    """Hydra callback: keep the sweep's tables current as its jobs end; at its end draw the curves and fail it
    if a job failed.

    Registered by ``rlchain-train``'s config as ``hydra.callbacks.sweep_summary``.

    ``on_job_end`` runs in the process of each job (a worker of the devices
    launcher, a SLURM job) as the job ends, and rewrites ``summary.csv`` and
    ``summary.md``. Hydra runs ``on_multirun_end`` only when the sweeper
    returns: its basic and Optuna sweepers raise a failed job's error at the
    end of its batch (the devices launcher has listed the batch's failed jobs
    by then), and a sweep stopped by Ctrl-C or SIGTERM ends in the devices
    launcher, which runs this callback before it exits with 130 or 143.

    Raises:
        SweepFailed: from ``on_multirun_end`` when any job failed (so the
            multirun exits non-zero): one line per failed job (its number,
            the overrides that vary, its error), then the summary file.

    Args:
        plot: draw ``learning_curves.png``.
        metric: the metric plotted and reported at ``at_steps``; None: the
            sweep's objective (:func:`sweep_objective`).
        at_steps: env-step budgets, see :func:`write_summary`.
    """

    def __init__(self, plot: bool = True, metric: str | None = None, at_steps: Sequence[float] = ()) -> None:
        self.plot, self.metric, self.at_steps = plot, metric, [float(b) for b in at_steps]

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Write the tables (and plot) into ``hydra.sweep.dir``; raise :class:`SweepFailed` on failures."""
        sweep_dir = Path(str(config.hydra.sweep.dir))
        (sweep_dir / ".summary.lock").unlink(missing_ok=True)  # every job has ended: no process holds it now
        try:
            jobs = load_jobs(sweep_dir)
        except FileNotFoundError:
            return
        paths = write_summary(sweep_dir, plot=self.plot, jobs=jobs, metric=self.metric, at_steps=self.at_steps)
        print(f"rlchain: sweep summary of {len(jobs)} jobs: {paths['md']}", flush=True)
        lines = failure_lines(jobs)
        if lines:
            shown = "\n".join(f"  {line}" for line in lines)
            raise SweepFailed(
                f"{len(lines)} of {len(jobs)} jobs failed (each traceback is in the job's summary.json "
                f"and log):\n{shown}\nSee {paths['md']}"
            )

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """In a multirun, rewrite the sweep's tables (not the plot); a table that cannot be written is logged."""
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            with _locked(sweep_dir):
                write_summary(sweep_dir, plot=False, metric=self.metric, at_steps=self.at_steps)
        except Exception as err:  # noqa: BLE001 - the jobs' own files are what matters; never fail a job for a table
            log.warning(f"the sweep's summary tables could not be written in {sweep_dir}: {error_line(err)}")


def main(argv: Sequence[str] | None = None) -> int:
    """``rlchain-report``: regenerate a sweep's tables and learning curves; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="rlchain-report",
        description="Write summary.csv, summary.md and learning_curves.png for an rlchain-train multirun.",
    )
    parser.add_argument("sweep_dir", type=Path, help="the multirun directory, e.g. multirun/2026-11-21/10-00-00_3fa2c1")
    parser.add_argument("--metric", help="metrics.jsonl key to plot (default: the jobs' objective, trainer.objective)")
    parser.add_argument(
        "--minimize",
        action="store_true",
        help="rank jobs by lowest objective first (default: as the jobs' trainer.objective_direction)",
    )
    parser.add_argument("--no-plot", action="store_true", help="write the tables only")
    parser.add_argument(
        "--at-steps",
        type=float,
        nargs="+",
        default=[],
        metavar="STEPS",
        help="env-step budgets (e.g. 1e6 5e6) at which to report --metric, one column each",
    )
    args = parser.parse_args(argv)
    try:
        paths = write_summary(
            args.sweep_dir,
            maximize=False if args.minimize else None,
            plot=not args.no_plot,
            metric=args.metric,
            at_steps=args.at_steps,
        )
    except (FileNotFoundError, ValueError) as err:
        print(f"rlchain-report: {err}", file=sys.stderr)
        return 2
    print(paths["md"].read_text())
    for kind in ("csv", "md", "png"):
        if kind in paths:
            print(f"wrote {paths[kind]}")
    if "png" not in paths and not args.no_plot:
        print(f"no job logged {args.metric or 'its objective'!r}: no plot drawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
