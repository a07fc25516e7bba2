"""The scheduling loop of the devices launcher: one worker process per slot, one job per slot at a time.

Each slot (:mod:`._slots`) gets one worker process (:mod:`._worker`), started
with ``spawn`` when the slot takes its first job and reused by its later jobs;
a worker that died (killed, out of memory, crashed) fails its job and is
replaced for the next one. :class:`DevicePool` hands the pending jobs of a
batch to idle slots as soon as one frees, relays the launcher's stop signals
to the running jobs (:mod:`._signals`), and as each job ends logs it, writes
the launcher's record of it (:class:`~rlchain.run.summary.JobRecord`, in the
sweep directory) and yields its ``JobReturn`` as it ends
(:meth:`DevicePool.stream`), so that a sweeper can choose the next job from
the results so far.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from omegaconf import OmegaConf, open_dict, read_write

from hydra_plugins.rlchain_launcher._signals import StopSignals
from hydra_plugins.rlchain_launcher._slots import Slot
from hydra_plugins.rlchain_launcher._worker import Job, Outcome, Population, describe_error, execute, init_worker
from rlchain.run.summary import JobRecord

log = logging.getLogger(__name__)

#: Seconds between two looks of the launcher at its running jobs and at the signals it got.
POLL_S = 0.2


class JobFailed(CompactHydraException):
    """What a job that did not complete hands its sweeper: one line with the job number, its status and error.

    Hydra prints it without a traceback; the worker's traceback is its
    ``__cause__`` (printed with ``HYDRA_FULL_ERROR=1``) and is kept in the
    job's log file and the launcher's record of it.
    """


class RemoteTraceback(Exception):
    """Carries a worker's traceback text as the ``__cause__`` of a job's error."""

    def __str__(self) -> str:
        return self.args[0]


@dataclass
class Batch:
    """What the launcher keeps of a stream of jobs besides their results: the jobs that failed."""

    failed: list[tuple[Job, str]] = field(default_factory=list)
    """The jobs that failed, each with its error on one line."""


class Worker:
    """One slot's worker process (a single-process ``ProcessPoolExecutor``)."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.executor = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=init_worker,
            initargs=(slot.environ(), slot.num_threads, os.getpid(), slot.ranks),
        )
        self._pid: Future = self.executor.submit(os.getpid)
        self.jobs: list[Job] | None = None  # the current unit's jobs: one, or a population's
        self.population = False  # the current unit is a population
        self.started = 0.0  # when the launcher handed it the current unit (Unix seconds)
        self.broken = False
        self.signals_sent = 0  # stop signals forwarded to the current job
        self.killed: str | None = None  # why the launcher killed the current job's process

    @property
    def pid(self) -> int | None:
        """The worker process's pid once it has started (None before, or when it could not start)."""
        if self._pid.done() and self._pid.exception() is None:
            return self._pid.result()
        return None

    def send(self, signum: int) -> bool:
        """Send ``signum`` to the worker process; False when it has not started yet."""
        pid = self.pid
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        return True

    def kill(self, reason: str) -> None:
        """SIGKILL the worker process (started or still starting); its job is recorded as aborted for ``reason``."""
        self.killed = reason
        pids = {self.pid} if self.pid is not None else set(getattr(self.executor, "_processes", None) or ())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Shut the worker down without waiting: its process exits after its current job."""
        self.executor.shutdown(wait=False, cancel_futures=True)


class DevicePool:
    """Runs batches of jobs over :class:`Slot` workers, one job per slot at a time.

    Args:
        slots: from :func:`~._slots.make_slots`.
        stagger_s: minimum seconds between two job starts.
        kill_after_s: seconds the running jobs get to end after a second
            stop signal before their workers are killed.
    """

    def __init__(self, slots: list[Slot], stagger_s: float, kill_after_s: float) -> None:
        self.slots = slots
        self.stagger_s = stagger_s
        self.signals = StopSignals(kill_after_s)
        self.workers: list[Worker | None] = [None] * len(slots)
        self._last_start = 0.0

    def _idle_worker(self) -> Worker | None:
        for worker in self.workers:
            if worker is not None and worker.jobs is None and not worker.broken:
                return worker
        for i, worker in enumerate(self.workers):
            if worker is None or (worker.broken and worker.jobs is None):
                if worker is not None:
                    worker.close()
                self.workers[i] = Worker(self.slots[i])
                return self.workers[i]
        return None

    def _busy(self) -> list[Worker]:
        return [w for w in self.workers if w is not None and w.jobs is not None]

    def _relay_signals(self) -> None:
        """Act on the stop signals received: announce them, forward them to the running jobs, kill when due."""
        self.signals.announce()
        reason = self.signals.kill_reason()
        for worker in self._busy():
            for signum in self.signals.to_forward(worker.signals_sent):
                if not worker.send(signum):
                    break  # not started yet: it gets them on a later look
                worker.signals_sent += 1
            if reason is not None and worker.killed is None:
                worker.kill(reason)

    def stream(
        self, next_job: Callable[[], Job | Population | None], context: bytes, sweep_dir: Path, batch: Batch
    ) -> Iterator[tuple[Job, JobReturn]]:
        """Start a job (or a population of jobs) from ``next_job()`` whenever a slot is free; yield each job with
        its result as it ends (a population's jobs as the population ends).

        ``next_job()`` is called only when a slot is free, and again after
        every job that ends, so it can choose the next job from the results
        so far; it returns None when it has no job to start now. The stream
        ends when no job runs and ``next_job()`` offers none, or, after a stop
        signal, when the running jobs have ended (no job starts after one).
        Failed jobs are also added to ``batch.failed``.

        The stop signals are acted on only under ``self.signals.handling()``.

        Raises:
            Exception: what ``next_job()`` raised, once the jobs that were
                running have ended (their results are yielded first); no job
                starts after it.
        """
        waiting: deque[Job | Population] = deque()  # work whose worker died before it started: to a fresh worker
        running: dict[Future, Worker] = {}
        offering: BaseException | None = None  # what next_job() raised: no job starts after it
        while True:
            self._relay_signals()
            while self.signals.first is None and offering is None and len(self._busy()) < len(self.slots):
                if self.stagger_s > 0:
                    time.sleep(max(0.0, self._last_start + self.stagger_s - time.time()))
                    if self.signals.first is not None:
                        break
                try:
                    job = waiting.popleft() if waiting else next_job()
                except Exception as err:  # noqa: BLE001 - the sweeper's error, handed to the sweep as it is
                    offering = err
                    break
                if job is None:
                    break
                worker = self._idle_worker()
                try:
                    future = worker.executor.submit(execute, cloudpickle.dumps(job), context)
                except BrokenProcessPool:  # its process died while it was idle: a fresh worker takes the job
                    worker.broken = True
                    waiting.appendleft(job)
                    continue
                worker.population = isinstance(job, Population)
                worker.jobs = job.jobs if worker.population else [job]
                worker.signals_sent, worker.killed = 0, None
                worker.started = self._last_start = time.time()
                where = f"{worker.slot.label} (slot {worker.slot.index})"
                if isinstance(job, Population):
                    log.info(f"population of jobs {_numbers(job.jobs)} started on {where}")
                else:
                    log.info(f"job {job.idx} started on {where}: {_shown_overrides(job.overrides)}")
                running[future] = worker
            if not running:
                break
            done, _ = wait(running, timeout=POLL_S, return_when=FIRST_COMPLETED)
            self._relay_signals()
            for future in done:
                worker = running.pop(future)
                jobs = worker.jobs
                results = self._finish(future, worker, sweep_dir, batch)
                worker.jobs = None
                yield from zip(jobs, results)
        self._relay_signals()
        if offering is not None:
            raise offering

    def _finish(self, future: Future, worker: Worker, sweep_dir: Path, batch: Batch) -> list[JobReturn]:
        """The ``JobReturn`` of each job of a finished unit; logs each, adds those that failed to
        ``batch.failed`` and writes the launcher's record of each."""
        try:
            outcomes: list[Outcome] = future.result()
        except Exception as err:  # noqa: BLE001 - a worker's failure of any kind is its jobs'
            status, signal_name, now = "failed", None, time.time()
            if isinstance(err, BrokenProcessPool):  # the worker died: killed, out of memory, segfault
                worker.broken = True
                if worker.killed is not None:
                    status, error = "aborted", f"killed by the launcher: {worker.killed}"
                    signal_name = signal.Signals(self.signals.first).name
                else:
                    error = "the worker process died (killed, out of memory or crashed)"
            else:  # e.g. a result that could not travel back
                error = f"the job's result could not be returned: {describe_error(err)}"
            outcomes = [
                Outcome(
                    cloudpickle.dumps(
                        JobReturn(overrides=job.overrides, status=JobStatus.FAILED, _return_value=RuntimeError(error))
                    ),
                    status,
                    error,
                    signal_name,
                    None,
                    worker.started,
                    now,
                    worker.pid,
                    None,
                )
                for job in worker.jobs
            ]
        returns = [
            self._record(job, outcome, worker.slot, sweep_dir, batch) for job, outcome in zip(worker.jobs, outcomes)
        ]
        if worker.population:  # members whose worker died before Hydra wrote their .hydra/ (not built yet)
            for job, ret in zip(worker.jobs, returns):
                if ret.status is JobStatus.FAILED:
                    _keep_job_dir(job, ret)
        return returns

    def _record(self, job: Job, outcome: Outcome, slot: Slot, sweep_dir: Path, batch: Batch) -> JobReturn:
        """Job ``job``'s ``JobReturn`` from its outcome; logs it, adds it to ``batch.failed`` if it failed and
        writes the launcher's record of it."""
        ret = cloudpickle.loads(outcome.job_return)
        ret.hydra_cfg = OmegaConf.masked_copy(job.config, "hydra")
        with read_write(ret.hydra_cfg.hydra.runtime):
            ret.hydra_cfg.hydra.runtime.output_dir = str(job.output_dir)  # as Hydra's run_job sets it in the job
        ret.cfg = copy.deepcopy(job.config)
        with open_dict(ret.cfg):
            del ret.cfg["hydra"]
        if outcome.status != "completed":  # the sweeper raises it: one line, no traceback on the console
            where = f" (traceback: {_shown_path(outcome.log_file)})" if outcome.log_file and outcome.traceback else ""
            failed = JobFailed(
                f"job {job.idx} {'failed: ' if outcome.status == 'failed' else ''}{outcome.error}{where}"
            )
            if outcome.traceback is not None:
                failed.__cause__ = RemoteTraceback(outcome.traceback)
            ret.status, ret._return_value = JobStatus.FAILED, failed
        wall = outcome.end_time - outcome.start_time
        record = JobRecord(
            job=job.idx,
            status=outcome.status,
            error=outcome.error,
            signal=outcome.signal,
            traceback=outcome.traceback,
            slot=slot.index,
            device=slot.label,
            cuda_visible_devices=slot.environ()["CUDA_VISIBLE_DEVICES"],
            num_threads=slot.num_threads,
            pid=outcome.pid,
            start_time=outcome.start_time,
            end_time=outcome.end_time,
            wall_s=wall,
        )
        try:
            record.append(sweep_dir)
        except OSError as err:  # the job's own files are what matters
            log.warning(f"the launcher's record of job {job.idx} could not be written in {sweep_dir}: {err}")
        where = f"after {wall:.1f} s on {slot.label} (slot {slot.index})"
        if outcome.status == "failed":
            batch.failed.append((job, outcome.error))
            log.error(f"job {job.idx} failed {where}: {outcome.error}")
        else:
            objective = ret._return_value if ret.status is JobStatus.COMPLETED else None
            shown = f"{objective:.4g}" if isinstance(objective, (int, float)) else str(objective)
            log.info(f"job {job.idx} {outcome.status} {where}: objective {shown}")
        return ret

    def shutdown(self) -> None:
        """Stop every worker process (they exit after their current job)."""
        for worker in self.workers:
            if worker is not None:
                worker.close()


def _shown_overrides(overrides: list[str], width: int = 60) -> str:
    """The overrides on one line, each value longer than ``width`` characters cut short with ``...``."""
    shown = []
    for override in overrides:
        key, eq, value = override.partition("=")
        shown.append(f"{key}{eq}{value[: width - 3]}..." if len(value) > width else override)
    return " ".join(shown)


def _keep_job_dir(job: Job, ret: JobReturn) -> None:
    """Write the ``.hydra/`` files of a population's member that ended before Hydra's ``run_job`` wrote them (its
    worker died first, or a stop signal came, while an earlier member was built), as ``run_job`` writes them, so
    that the sweep's tables list the job with the launcher's record of it."""
    subdir = OmegaConf.select(job.config, "hydra.output_subdir")
    if subdir is None or (job.output_dir / str(subdir) / "overrides.yaml").exists():
        return
    hydra_dir = job.output_dir / str(subdir)
    try:
        hydra_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(ret.cfg, hydra_dir / "config.yaml")
        OmegaConf.save(ret.hydra_cfg, hydra_dir / "hydra.yaml")
        OmegaConf.save(OmegaConf.create(list(job.overrides)), hydra_dir / "overrides.yaml")
    except OSError as err:  # the launcher's record is what matters
        log.warning(f"job {job.idx}'s .hydra/ files could not be written in {job.output_dir}: {err}")


def _numbers(jobs: list[Job]) -> str:
    """The jobs' numbers, consecutive ones as a range: ``0-3, 6``."""
    runs: list[list[int]] = []
    for idx in sorted(job.idx for job in jobs):
        if runs and idx == runs[-1][-1] + 1:
            runs[-1].append(idx)
        else:
            runs.append([idx])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _shown_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
