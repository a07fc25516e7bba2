"""The worker process of a slot: its start, the job it runs, and its exit when the launcher is gone.

A worker is started with ``spawn``, which pickles what it runs by reference:
the functions here stay at module level. Its initializer (:func:`init_worker`)
sets ``CUDA_VISIBLE_DEVICES`` and its thread counts before any job can touch
CUDA, so a job sees its device as ``cuda:0``; it leaves the launcher's process
group and installs the handler through which a forwarded stop signal reaches a
job that rlchain's trainer does not yet handle (:mod:`._signals`). After each
job the worker returns the CUDA memory torch cached for it to the device, for
the slot's next job and the jobs that share the device.

Orphans. A worker watches its parent: when the launcher is gone (``kill -9``,
the OOM killer, a crash) the worker sends itself SIGTERM, so a running job
stops after its iteration and records ``interrupted``, and then exits; an idle
worker exits at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals

from hydra_plugins.rlchain_launcher._devices import Slot
from hydra_plugins.rlchain_launcher._jobs import Context, Job, Outcome, TaskRef, describe_error, record_job
from hydra_plugins.rlchain_launcher._signals import STOP_SIGNALS, JobInterrupted

log = logging.getLogger(__name__)

#: Seconds between two looks of a worker at its parent process.
WATCH_INTERVAL_S = 0.5
#: Exit status of a worker that leaves because its launcher is gone (128 + SIGTERM).
ORPHAN_EXIT = 128 + signal.SIGTERM

# A worker's own state (one job at a time, in its main thread).
_worker_lock = threading.Lock()
_job_running = False  # execute() is between its start and its result
_launcher_gone = False  # the parent-watch thread saw the launcher go
_armed = False  # a stop signal raises JobInterrupted (set while a job runs)
_pending_signal: int | None = None  # a stop signal that came while no job was armed


def _on_stop_signal(signum: int, frame: Any) -> None:
    """A worker's SIGINT/SIGTERM handler while rlchain's trainer has not installed its own.

    During a job it raises :class:`JobInterrupted` once (and disarms, so no
    second one lands in the job's clean-up); between jobs it keeps the signal
    for the job it was sent to, which then stops before it starts.
    """
    global _armed, _pending_signal
    if _armed:
        _armed = False
        raise JobInterrupted(signal.Signals(signum).name)
    _pending_signal = signum


def init_worker(environ: dict[str, str], num_threads: int, launcher_pid: int) -> None:
    """Worker initializer: pin the device and threads before any job imports CUDA; watch the launcher.

    The worker leaves the launcher's process group (Ctrl-C at the terminal
    reaches the launcher only; it forwards to busy workers) and starts a
    daemon thread that stops it when the launcher is gone (:func:`_watch_launcher`).
    """
    os.environ.update(environ)
    os.setpgrp()
    for s in STOP_SIGNALS:
        signal.signal(s, _on_stop_signal)
    if os.getppid() != launcher_pid:  # the launcher died while this worker started
        os._exit(ORPHAN_EXIT)
    threading.Thread(target=_watch_launcher, args=(launcher_pid,), name="rlchain-watch-launcher", daemon=True).start()
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(num_threads)


def _watch_launcher(launcher_pid: int) -> None:
    """Stop this worker when its launcher is gone (its parent pid changes: ``kill -9``, OOM killer, crash).

    An idle worker exits at once. A running job gets SIGTERM, as a first
    Ctrl-C would be forwarded: rlchain's trainer finishes the iteration,
    saves ``latest.pt`` and records ``interrupted``; the worker exits as the
    job ends (:func:`execute`). Polling the parent pid works on every POSIX
    system and whichever launcher thread started the worker (Linux's
    ``PR_SET_PDEATHSIG`` fires when that *thread* exits).
    """
    global _launcher_gone
    while os.getppid() == launcher_pid:
        time.sleep(WATCH_INTERVAL_S)
    with _worker_lock:
        _launcher_gone = True
        running = _job_running
    if not running:
        _exit_orphan()
    with contextlib.suppress(Exception):
        log.warning(f"the launcher (pid {launcher_pid}) is gone: this worker (pid {os.getpid()}) stops its job "
                    "after the iteration and exits")  # fmt: skip
    os.kill(os.getpid(), signal.SIGTERM)


def _exit_orphan() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(ORPHAN_EXIT)


def _job_log_file(output_dir: Path) -> logging.FileHandler | None:
    """The file handler Hydra's job logging opened in ``output_dir`` for this job, if any."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == output_dir:
            return handler
    return None


def execute(job: Job, context: Context, slot: Slot) -> Outcome:
    """Run one job in this worker with Hydra's ``run_job``; never raises.

    The job's error (if any) comes back picklable with its traceback text;
    the traceback also goes to the job's log file and ``summary.json``, and
    the launcher's record (slot, device, threads, start and end times) is
    merged into the job's ``summary.json``. A worker whose launcher is gone
    exits once this is done.
    """
    global _job_running
    with _worker_lock:
        if _launcher_gone:
            _exit_orphan()
        _job_running = True
    try:
        return _execute(job, context, slot)
    finally:
        with _worker_lock:
            _job_running = False
            gone = _launcher_gone
        if gone:
            _exit_orphan()


def _execute(job: Job, context: Context, slot: Slot) -> Outcome:
    global _armed, _pending_signal
    setup_globals()
    from omegaconf.basecontainer import BaseContainer

    Singleton.set_state({**context.singleton_state, "omegaconf_resolvers": dict(BaseContainer._resolvers)})
    HydraConfig.instance().set_config(job.config)
    start = time.time()
    try:
        try:
            _armed = True
            if _pending_signal is not None:  # forwarded before this worker took the job up
                name, _pending_signal, _armed = signal.Signals(_pending_signal).name, None, False
                raise JobInterrupted(name)
            task = context.task.resolve() if isinstance(context.task, TaskRef) else context.task
            ret = run_job(
                hydra_context=context.hydra_context, config=job.config, task_function=task,
                job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir",
            )  # fmt: skip
        finally:
            _armed = False
    except BaseException as err:  # a forwarded signal outside the trainer, or an error in Hydra itself
        ret = JobReturn(overrides=job.overrides, status=JobStatus.FAILED, _return_value=err)
    end = time.time()
    error = tb = signal_name = None
    status = "completed"
    handler = _job_log_file(job.output_dir)
    if ret.status is JobStatus.FAILED:
        err = ret._return_value
        if isinstance(err, KeyboardInterrupt):
            status = "interrupted"
            signal_name = err.signal_name if isinstance(err, JobInterrupted) else "SIGINT"
        else:
            status = "failed"
        error, tb = describe_error(err), "".join(traceback.format_exception(err))
        if status == "failed" and handler is not None:  # the traceback goes to the job's log, not the console
            handler.handle(logging.LogRecord(log.name, logging.ERROR, __file__, 0, "job %d failed: %s\n%s",
                                             (job.idx, error, tb.rstrip()), None))  # fmt: skip
        try:
            pickle.loads(pickle.dumps(err))
        except Exception:
            ret._return_value = RuntimeError(error)
    record = {
        "slot": slot.index, "device": slot.label, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "num_threads": slot.num_threads, "pid": os.getpid(), "start_time": start, "end_time": end,
        "wall_s": end - start,
    }  # fmt: skip
    objective = ret._return_value if ret.status is JobStatus.COMPLETED else None
    status = record_job(job.output_dir, record, status, error, objective,
                        traceback_text=tb if status == "failed" else None, signal_name=signal_name)  # fmt: skip
    ret.cfg = ret.hydra_cfg = None  # may hold classes of the worker's own imports; the launcher restores them
    if ret.status is JobStatus.COMPLETED:
        try:
            pickle.dumps(objective)
        except Exception:  # a return value that cannot travel back: send its repr
            ret._return_value = repr(objective)
    _release_cuda_memory()
    return Outcome(ret, status, error, tb, record, handler.baseFilename if handler is not None else None)


def _release_cuda_memory() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
