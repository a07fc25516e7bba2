"""The body of :meth:`DevicesLauncher.launch <.devices_launcher.DevicesLauncher.launch>`: one batch of a multirun.

It composes the batch's jobs, runs them on the :class:`~._pool.DevicePool`,
rewrites the sweep's tables, and ends the multirun when a stop signal came.
It lives apart from :mod:`.devices_launcher`, which Hydra's plugin scan
executes at every start, so that the scan does not import torch (see
:mod:`hydra_plugins.rlchain_launcher`).
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Callable, Sequence

from hydra.core.utils import JobReturn, configure_log, setup_globals
from hydra.types import HydraContext
from omegaconf import DictConfig

from hydra_plugins.rlchain_launcher._jobs import Context, TaskRef, describe_error, portable_singleton_state, prepare_job
from hydra_plugins.rlchain_launcher._pool import DevicePool

log = logging.getLogger(__name__)


def launch(
    pool: DevicePool, config: DictConfig, hydra_context: HydraContext, task_function: Callable,
    job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
) -> Sequence[JobReturn]:  # fmt: skip
    """Run one batch of jobs on ``pool``, numbered from ``initial_job_idx``: compose, run, summarise.

    After the batch the sweep's ``summary.csv`` and ``summary.md`` are
    rewritten and each failed job of the batch is logged in one line (job
    number, the overrides that vary, its error). The exit status of a
    stopped sweep comes from here, not from the sweeper or the
    ``SweepSummary`` callback: only the launcher saw the signal, and Hydra
    runs no callback after it.

    Raises:
        SystemExit: 128 + the first stop signal's number (130 for SIGINT,
            Ctrl-C, also when a second one followed; 143 for SIGTERM) once
            every job that was running has stopped and the tables are written.
    """
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    devices = sorted({s.label for s in pool.slots})
    log.info(
        f"devices launcher: {len(job_overrides)} job(s) on {len(pool.slots)} slot(s) "
        f"({', '.join(devices)}; {pool.slots[0].num_threads} thread(s) each); sweep dir {sweep_dir}"
    )
    with pool.signals.handling():
        context = Context(hydra_context, TaskRef.of(task_function), portable_singleton_state())
        jobs = [prepare_job(config, hydra_context, initial_job_idx + i, o) for i, o in enumerate(job_overrides)]
        results, stopped = pool.run(jobs, context)
        _summarise(sweep_dir, {job.idx for job in jobs})
        if stopped:
            name = signal.Signals(pool.signals.first).name
            log.warning(
                f"sweep stopped by {name}: {len(results)} of {len(jobs)} job(s) ran in this batch; finished jobs and "
                f"checkpoints are in {sweep_dir}"
            )
            pool.shutdown()
            raise SystemExit(pool.signals.exit_code)
    return results


def _summarise(sweep_dir: Path, batch: set[int]) -> None:
    """Rewrite the sweep's tables; log each failed job of ``batch`` in one line."""
    from rlchain.report import failure_lines, load_jobs, write_summary

    try:
        jobs = load_jobs(sweep_dir)
        paths = write_summary(sweep_dir, plot=False, jobs=jobs)
    except FileNotFoundError:  # no job started (a stop signal came while the jobs were composed)
        return
    except Exception as err:  # the jobs' own files are what matters; never lose them to a table
        log.warning(f"the sweep's summary tables could not be written in {sweep_dir}: {describe_error(err)}")
        return
    lines = failure_lines(jobs, nums=batch)
    if lines:
        log.error(f"{len(lines)} job(s) failed (each traceback is in the job's summary.json and log; "
                  f"table: {paths['md']}):")  # fmt: skip
        for line in lines:
            log.error(f"  {line}")
