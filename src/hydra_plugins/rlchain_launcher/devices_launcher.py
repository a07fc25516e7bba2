"""``hydra/launcher=devices``: run a multirun's jobs in parallel, each pinned to a device slot.

Usage::

    rlchain-train -m hydra/launcher=devices algorithm.learning_rate=3e-4,1e-3 seed=0,1,2
    rlchain-train -m hydra.launcher.devices=[0,1] hydra.launcher.jobs_per_device=4 ...
    my_app.py -m hydra/launcher=devices ...          # any @hydra.main app

(rlchain-train selects this launcher by default.) The launcher creates
``len(devices) * jobs_per_device`` slots; a job takes a free slot as soon as
one frees, runs in that slot's worker process with ``CUDA_VISIBLE_DEVICES``
set to the slot's device (so ``device=auto`` resolves to ``cuda:0`` inside the
job) and with ``threads_per_job`` CPU threads. On a machine without CUDA,
``devices=auto`` gives ``jobs_per_device`` CPU slots.

What only the launcher knows of each job (slot, device, threads, start and
end in Unix seconds, a worker that died or that it killed) goes, one JSON line
per job, into ``<sweep dir>/launcher.jsonl`` (:class:`rlchain.run.summary.JobRecord`);
a job's own files are never rewritten. A job that raises is logged and
recorded as failed (its traceback in its Hydra job log and its record) while
the others go on; at the end of the batch each failed job is listed in one
line, and Hydra's sweeper then stops the multirun with a non-zero exit status.

A sweeper that chooses each job from the results so far (rlchain's Optuna
sweeper) calls :meth:`DevicesLauncher.launch_as_completed` instead of
:meth:`~DevicesLauncher.launch`: it is asked for the next job whenever a slot
frees, and gets each result as its job ends.

Ctrl-C or SIGTERM stops the sweep: running jobs save and stop after their
iteration, no new job starts, the multirun-end callbacks run (rlchain's
summary tables), and the multirun exits with 130 (Ctrl-C) or 143 (SIGTERM); a
second signal aborts the jobs, and workers still running ``kill_after_s``
later are killed. Workers exit when the launcher dies.

Modules: :mod:`.config` (the settings), :mod:`._slots` (devices and threads),
:mod:`._pool` (the scheduling loop), :mod:`._worker` (a worker process),
:mod:`._signals` (stop signals). Those whose names start with ``_`` import
the heavy parts lazily: Hydra's plugin scan executes every other module of
``hydra_plugins`` at each start of every Hydra app.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import DictConfig, open_dict

from hydra_plugins.rlchain_launcher.config import DevicesLauncherConf

log = logging.getLogger(__name__)


class SlotLauncher(Launcher):
    """What a launcher that runs its work on device slots does besides choosing the work: the slots' pool, the
    sweep directory, composing each job's config, and the stop signals (:class:`DevicesLauncher`,
    :class:`~hydra_plugins.rlchain_launcher.population_launcher.PopulationLauncher`).

    Args:
        settings: fields of ``settings_class`` (``self.settings``).

    Raises:
        LauncherConfigError: a setting out of range, naming the ``hydra.launcher`` field, the value and what is
            allowed (``devices``, and whether their CUDA ids are visible, at the first launch).
    """

    settings_class: Any = DevicesLauncherConf
    name = "devices launcher"

    def __init__(self, **settings: Any) -> None:
        self.settings = self.settings_class(**settings)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: Callable | None = None
        self.pool = None

    def setup(self, *, hydra_context: HydraContext, task_function: Callable, config: DictConfig) -> None:
        """Keep Hydra's context, the task function and the primary config for :meth:`launch`."""
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def _start(self) -> None:
        """Set up Hydra's logging and globals in this process, the sweep directory and (once) the slots' pool."""
        import weakref

        from hydra.core.utils import configure_log, setup_globals

        from hydra_plugins.rlchain_launcher._pool import DevicePool
        from hydra_plugins.rlchain_launcher._slots import make_slots

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        if self.pool is None:
            cfg = self.settings
            self.pool = DevicePool(
                make_slots(cfg.devices, cfg.jobs_per_device, cfg.threads_per_job, cfg.devices_per_job),
                cfg.stagger_s,
                cfg.kill_after_s,
            )
            weakref.finalize(self, self.pool.shutdown)  # also runs at exit; atexit alone kept them to the end

    def _run(self, next_job: Callable[[], Any], batch: Any) -> Iterator[tuple[int, JobReturn]]:
        """Stream prepared jobs from ``next_job()`` through the pool; on a stop signal, end the multirun."""
        import cloudpickle
        from hydra.core.singleton import Singleton

        from hydra_plugins.rlchain_launcher._slots import exported_threads
        from rlchain.console import error_line

        pool = self.pool
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        devices = sorted({s.label for s in pool.slots})
        slot = pool.slots[0]
        each = (
            f"{slot.ranks} processes of {slot.num_threads} thread(s)"
            if slot.ranks > 1
            else f"{slot.num_threads} thread(s)"
        )
        each += " each" + (
            ", as exported in OMP_NUM_THREADS"
            if self.settings.threads_per_job == "auto" and exported_threads() is not None
            else ""
        )
        log.info(f"{self.name}: {len(pool.slots)} slot(s) ({', '.join(devices)}; {each}); sweep dir {sweep_dir}")
        ran = 0
        with pool.signals.handling():
            context = cloudpickle.dumps((self.task_function, self.hydra_context, Singleton.get_state()))
            for job, ret in pool.stream(next_job, context, sweep_dir, batch):
                ran += 1
                yield job.idx, ret
            if pool.signals.first is not None:
                log.warning(
                    f"sweep stopped by {signal.Signals(pool.signals.first).name} after {ran} job(s); "
                    f"finished jobs and checkpoints are in {sweep_dir}"
                )
                pool.shutdown()
                try:
                    self.hydra_context.callbacks.on_multirun_end(config=self.config)
                except Exception as err:  # noqa: BLE001 - a stopped sweep exits with its signal's code whatever a callback says
                    log.warning(f"a multirun-end callback failed: {error_line(err)}")
                raise SystemExit(pool.signals.exit_code)

    def _prepare(self, idx: int, overrides: Sequence[str]) -> Any:
        """Compose job ``idx``'s config in the launcher process and resolve its output directory."""
        from hydra_plugins.rlchain_launcher._worker import Job

        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
            sweep_config.hydra.job.num = idx
        HydraConfig.instance().set_config(sweep_config)
        sweep = sweep_config.hydra.sweep
        return Job(
            idx, list(overrides), sweep_config, Path(os.path.abspath(os.path.join(str(sweep.dir), str(sweep.subdir))))
        )


class DevicesLauncher(SlotLauncher):
    """A Hydra launcher that runs jobs in parallel on device slots (module docstring).

    Args:
        settings: fields of :class:`~.config.DevicesLauncherConf` (``self.settings``).

    Raises:
        LauncherConfigError: a setting out of range, naming the
            ``hydra.launcher`` field, the value and what is allowed
            (``devices``, and whether their CUDA ids are visible, at the first launch).
    """

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Run one batch of jobs (numbered from ``initial_job_idx``) and return their results in order.

        The slots' worker processes start with the first batch and serve the
        later ones; they exit when Hydra lets go of this launcher (the
        multirun has ended) or at the latest when the program exits.

        Raises:
            SystemExit: 128 + the first stop signal's number (130 for SIGINT,
                Ctrl-C, also when a second one followed; 143 for SIGTERM) once
                every job that was running has stopped and the multirun-end
                callbacks have run: only the launcher saw the signal, and
                Hydra runs no callback after a launcher that ends the multirun.
        """
        from hydra_plugins.rlchain_launcher._pool import Batch

        self._start()
        jobs = [(initial_job_idx + i, overrides) for i, overrides in enumerate(job_overrides)]
        prepared = iter([self._prepare(idx, overrides) for idx, overrides in jobs])  # every config, before any job
        batch = Batch()
        try:
            results = dict(self._run(lambda: next(prepared, None), batch))
        finally:
            _log_failures(jobs, batch.failed)
        return [results[idx] for idx, _ in jobs if idx in results]

    def launch_as_completed(
        self, next_job: Callable[[], tuple[int, Sequence[str]] | None]
    ) -> Iterator[tuple[int, JobReturn]]:
        """Start a job whenever a slot frees; yield ``(job number, JobReturn)`` as each job ends.

        ``next_job()`` returns the next job's number and overrides, or None
        when it has none to start now; it is called only when a slot is free
        and again after each job that ends (after the consumer has seen its
        result), so a sweeper can choose the next job from every result so
        far (rlchain's Optuna sweeper does). The iteration ends when no job
        runs and ``next_job()`` offers none.

        Raises:
            SystemExit: as :meth:`launch`, after the results of the jobs that
                were running when the stop signal came have been yielded.
            Exception: what ``next_job()`` (or composing the job's config)
                raised, once the jobs that were running have ended and their
                results have been yielded.
        """
        from hydra_plugins.rlchain_launcher._pool import Batch

        def prepared() -> Any:
            offered = next_job()
            return None if offered is None else self._prepare(*offered)

        self._start()
        return self._run(prepared, Batch())


def _log_failures(jobs: Sequence[tuple[int, Sequence[str]]], failed: Sequence[tuple[Any, str]]) -> None:
    """One line per failed job of the batch (``jobs``: number and overrides of each): its number, the overrides
    that vary within the batch, its error."""
    if not failed:
        return
    values = {idx: dict(o.lstrip("+").partition("=")[::2] for o in overrides) for idx, overrides in jobs}
    keys = dict.fromkeys(k for v in values.values() for k in v)
    varying = [k for k in keys if len({v.get(k) for v in values.values()}) > 1]
    log.error(f"{len(failed)} job(s) failed (each traceback is in the job's log and the sweep's launcher.jsonl):")
    for job, error in failed:
        label = " ".join(f"{k}={values[job.idx].get(k, '')}" for k in varying)
        log.error(f"  job {job.idx} ({label}): {error}")
