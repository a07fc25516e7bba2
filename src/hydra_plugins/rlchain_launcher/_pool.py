"""The scheduling loop of the devices launcher: one worker process per slot, one job per slot at a time.

Each slot (:mod:`._devices`) gets one worker process (:mod:`._worker`), started
with ``spawn`` when the slot takes its first job and reused by its later jobs;
a worker that died (killed, out of memory, crashed) fails its job and is
replaced for the next one. :class:`DevicePool` hands the pending jobs of a
batch to idle slots, collects their outcomes in job order, and relays the
launcher's stop signals to the running jobs (:mod:`._signals`).
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
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf, open_dict

from hydra_plugins.rlchain_launcher._devices import Slot
from hydra_plugins.rlchain_launcher._jobs import (
    Context,
    Job,
    JobFailed,
    Outcome,
    RemoteTraceback,
    describe_error,
    record_job,
)
from hydra_plugins.rlchain_launcher._signals import StopSignals
from hydra_plugins.rlchain_launcher._worker import execute, init_worker

log = logging.getLogger(__name__)

#: Seconds between two looks of the launcher at its running jobs and at the signals it got.
POLL_S = 0.2


class Worker:
    """One slot's worker process (a single-process ``ProcessPoolExecutor``)."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.executor = ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"),
            initializer=init_worker, initargs=(slot.environ(), slot.num_threads, os.getpid()),
        )  # fmt: skip
        self._pid: Future = self.executor.submit(os.getpid)
        self.job: Job | None = None
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
        slots: from :func:`~._devices.make_slots`.
        stagger_s: minimum seconds between two job starts.
        kill_after_s: seconds the running jobs get to end after a second
            stop signal before their workers are killed.
    """

    def __init__(self, slots: list[Slot], stagger_s: float = 0.0, kill_after_s: float = 30.0) -> None:
        self.slots = slots
        self.stagger_s = stagger_s
        self.signals = StopSignals(kill_after_s)
        self.workers: list[Worker | None] = [None] * len(slots)
        self._last_start = 0.0

    def _idle_worker(self) -> Worker | None:
        for worker in self.workers:
            if worker is not None and worker.job is None and not worker.broken:
                return worker
        for i, worker in enumerate(self.workers):
            if worker is None or (worker.broken and worker.job is None):
                if worker is not None:
                    worker.close()
                self.workers[i] = Worker(self.slots[i])
                return self.workers[i]
        return None

    def _busy(self) -> list[Worker]:
        return [w for w in self.workers if w is not None and w.job is not None]

    def run(self, jobs: list[Job], context: Context) -> tuple[list[JobReturn], bool]:
        """Run ``jobs``, at most one per slot at a time; return their results in order.

        The stop signals are acted on only under ``self.signals.handling()``.

        Returns:
            ``(job_returns, stopped)``: ``stopped`` is True when SIGINT or
            SIGTERM ended the batch early; jobs that never started are left
            out of ``job_returns`` then.
        """
        pending = deque(jobs)
        running: dict[Future, Worker] = {}
        results: dict[int, JobReturn] = {}
        while pending or running:
            self.signals.react(self._busy())
            while pending and self.signals.first is None:
                worker = self._idle_worker()
                if worker is None:
                    break
                if self.stagger_s > 0:
                    time.sleep(max(0.0, self._last_start + self.stagger_s - time.time()))
                    if self.signals.first is not None:
                        break
                job = pending.popleft()
                worker.job, worker.signals_sent, worker.killed = job, 0, None
                self._last_start = time.time()
                log.info(f"job {job.idx} started on {worker.slot.label} (slot {worker.slot.index}): {' '.join(job.overrides)}")
                running[worker.executor.submit(execute, job, context, worker.slot)] = worker
            if not running:
                break
            done, _ = wait(running, timeout=POLL_S, return_when=FIRST_COMPLETED)
            self.signals.react(self._busy())
            for future in done:
                worker = running.pop(future)
                results[worker.job.idx] = self._finish(future, worker.job, worker)
                worker.job = None
        self.signals.react(self._busy())
        return [results[job.idx] for job in jobs if job.idx in results], self.signals.first is not None

    def _finish(self, future: Future, job: Job, worker: Worker) -> JobReturn:
        slot = worker.slot
        try:
            outcome: Outcome = future.result()
        except Exception as err:
            status, signal_name = "failed", None
            if isinstance(err, BrokenProcessPool):  # the worker died: killed, out of memory, segfault
                worker.broken = True
                if worker.killed is not None:
                    status, signal_name = "aborted", signal.Signals(self.signals.first).name
                    error = f"killed by the launcher: {worker.killed}"
                else:
                    error = "the worker process died (killed, out of memory or crashed)"
            else:  # e.g. a result that could not travel back
                error = f"the job's result could not be returned: {describe_error(err)}"
            now = time.time()
            record = {"slot": slot.index, "device": slot.label, "num_threads": slot.num_threads, "end_time": now}
            status = record_job(job.output_dir, record, status, error, signal_name=signal_name)
            ret = JobReturn(overrides=job.overrides, status=JobStatus.FAILED, _return_value=RuntimeError(error))
            outcome = Outcome(ret, status, error, None, record)
        ret = outcome.job_return
        ret.hydra_cfg = OmegaConf.masked_copy(job.config, "hydra")
        ret.cfg = copy.deepcopy(job.config)
        with open_dict(ret.cfg):
            del ret.cfg["hydra"]
        if ret.status is JobStatus.FAILED:  # the sweeper raises it: one line, no traceback on the console
            where = f" (traceback: {_shown_path(outcome.log_file)})" if outcome.log_file and outcome.traceback else ""
            what = "failed: " if outcome.status == "failed" else ""
            failed = JobFailed(f"job {job.idx} {what}{outcome.error}{where}")
            if outcome.traceback is not None:
                failed.__cause__ = RemoteTraceback(outcome.traceback)
            ret._return_value = failed
        wall = outcome.record.get("wall_s")
        took = f" after {wall:.1f} s" if wall is not None else ""
        where = f"on {slot.label} (slot {slot.index})"
        if outcome.status == "failed":
            log.error(f"job {job.idx} failed{took} {where}: {outcome.error}")
        else:
            objective = ret._return_value if ret.status is JobStatus.COMPLETED else None
            shown = f"{objective:.4g}" if isinstance(objective, (int, float)) else str(objective)
            log.info(f"job {job.idx} {outcome.status}{took} {where}: objective {shown}")
        return ret

    def shutdown(self) -> None:
        """Stop every worker process (they exit after their current job)."""
        for worker in self.workers:
            if worker is not None:
                worker.close()


def _shown_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
