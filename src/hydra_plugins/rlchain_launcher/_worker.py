"""The worker process of a slot: its start, the job it runs, and its exit when the launcher is gone.

A worker is started with ``spawn``. Its initializer (:func:`init_worker`) sets
the slot's ``CUDA_VISIBLE_DEVICES`` and thread counts before any job can
touch CUDA, so a job sees its device as ``cuda:0``; it leaves the launcher's
process group and installs the handler through which a forwarded stop signal
reaches a job that does not handle it itself yet. Each job comes with its
batch's context, sent as Hydra's joblib launcher sends it: the task function,
Hydra's context and Hydra's singleton state (OmegaConf's resolvers included),
pickled with cloudpickle, so a task function defined inside a function, or a
resolver registered only in the launching process, reaches the worker too.
After each job the worker returns the CUDA memory torch cached for it to the
device, for the slot's next job and the jobs that share the device.

A job of ``devices_per_job`` > 1 is one multi-process run: the worker
starts the job's other ranks (:func:`run_rank`, ``spawn``) with the
variables torchrun would set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), runs rank 0 itself, and waits for them
when rank 0's job has ended (killing those still running
:data:`RANK_GRACE_S` later). Only rank 0 runs Hydra's ``run_job``, so only
it writes the job's files; the stop signals the launcher forwards reach it,
and the ranks agree to stop after the same iteration. A rank whose worker is
gone exits.

A population (``hydra/launcher=population``) is one unit of work of several
jobs: the worker runs its ``run`` function on its jobs (each built by
Hydra's ``run_job`` in its own directory, then all trained together) and
reports one :class:`Outcome` per job.

Orphans. A worker watches its parent: when the launcher is gone (``kill -9``,
the OOM killer, a crash) the worker sends itself SIGTERM, so a running job
stops after its iteration and records ``interrupted``, and then exits; an idle
worker exits at once.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import gc
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra.errors import CompactHydraException
from omegaconf import OmegaConf, open_dict, read_write

from rlchain.console import error_line
from rlchain.run.summary import STOP_SIGNALS, STOPPED, RunSummary, signal_exit_code

log = logging.getLogger(__name__)

#: Seconds between two looks of a worker at its parent process.
WATCH_INTERVAL_S = 0.5
#: Exit status of a worker that leaves because its launcher is gone.
ORPHAN_EXIT = signal_exit_code(signal.SIGTERM)
#: Seconds the other ranks of a multi-process job get to end after rank 0's job ended before they are killed
#: (as torchrun gives its ranks).
RANK_GRACE_S = 30.0

# A worker's own state (one job at a time, in its main thread).
_worker_lock = threading.Lock()
_job_running = False  # execute() is between its start and its result
_launcher_gone = False  # the parent-watch thread saw the launcher go
_armed = False  # a stop signal raises JobInterrupted (set while a job runs)
_pending_signal: int | None = None  # a stop signal that came while no job was armed
_ranks = 1  # processes of each job (devices_per_job)


class JobInterrupted(KeyboardInterrupt):
    """Raised in a worker by a forwarded stop signal while the job does not handle it (e.g. as its env is built)."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


@dataclass
class Job:
    """One job of a batch, with its composed config and output directory (composed in the launcher)."""

    idx: int
    overrides: list[str]
    config: Any
    output_dir: Path


@dataclass
class Population:
    """Jobs that one worker trains as one population (``hydra/launcher=population``).

    ``run(jobs, hydra_context)`` builds and trains them and returns one ``JobReturn`` per job, in order, with the
    value each hands its sweeper (a module-level function, pickled by reference).
    """

    jobs: list[Job]
    run: Any


@dataclass
class Outcome:
    """A finished job as the worker reports it (it pickles with the standard library)."""

    job_return: bytes
    """The ``JobReturn``, cloudpickled (its return value or error may be of any picklable type)."""
    status: str
    """``completed``, ``failed``, ``interrupted`` or ``aborted`` (a run's own status where it wrote one)."""
    error: str | None
    signal: str | None
    traceback: str | None
    start_time: float
    end_time: float
    pid: int | None
    """The worker's pid (None when the worker died before the launcher learnt it)."""
    log_file: str | None


def _on_stop_signal(signum: int, frame: Any) -> None:
    """A worker's SIGINT/SIGTERM handler while the job has not installed its own.

    During a job it raises :class:`JobInterrupted` once (and disarms, so no
    second one lands in the job's clean-up); between jobs it keeps the signal
    for the job it was sent to, which then stops before it starts.
    """
    global _armed, _pending_signal
    if _armed:
        _armed = False
        raise JobInterrupted(signal.Signals(signum).name)
    _pending_signal = signum


def init_worker(environ: dict[str, str], num_threads: int, launcher_pid: int, ranks: int = 1) -> None:
    """Worker initializer: take the slot's environment before any job imports CUDA; watch the launcher.

    ``spawn`` may have imported torch already (it re-imports the launching
    program's main module, ``rlchain.commands.train`` under ``python -m rlchain.commands.train``), too early
    for ``OMP_NUM_THREADS``: its thread count is then set here. The worker
    leaves the launcher's process group (Ctrl-C at the terminal reaches the
    launcher only; it forwards to busy workers) and starts a daemon thread
    that stops it when the launcher is gone (:func:`_watch_launcher`). At its exit it freezes what is
    alive, as the commands do (see :mod:`_rlchain_cli`).
    """
    global _ranks
    _ranks = ranks
    atexit.register(gc.freeze)
    os.environ.update(environ)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(num_threads)
    os.setpgrp()
    for s in STOP_SIGNALS:
        signal.signal(s, _on_stop_signal)
    if os.getppid() != launcher_pid:  # the launcher died while this worker started
        os._exit(ORPHAN_EXIT)
    threading.Thread(target=_watch_launcher, args=(launcher_pid,), name="rlchain-watch-launcher", daemon=True).start()


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
    log.warning(
        f"the launcher (pid {launcher_pid}) is gone: this worker (pid {os.getpid()}) stops its job "
        "after the iteration and exits"
    )
    os.kill(os.getpid(), signal.SIGTERM)


def _exit_orphan() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(ORPHAN_EXIT)


def execute(work: bytes, context: bytes) -> list[Outcome]:
    """Run one unit of work, a cloudpickled :class:`Job` or :class:`Population`, in this worker with Hydra's
    ``run_job``; one :class:`Outcome` per job; never raises.

    ``context`` is the cloudpickled ``(task_function, hydra_context,
    singleton_state)`` of the job's batch. A worker whose launcher is gone
    exits once this is done.
    """
    global _job_running
    with _worker_lock:
        if _launcher_gone:
            _exit_orphan()
        _job_running = True
    try:
        unit = cloudpickle.loads(work)
        task_function, hydra_context, singleton_state = cloudpickle.loads(context)
        if isinstance(unit, Population):
            return _execute(unit.jobs, lambda: unit.run(unit.jobs, hydra_context), singleton_state)
        with _other_ranks(work, context):
            return _execute([unit], lambda: [run_sweep_job(unit, task_function, hydra_context)], singleton_state)
    finally:
        with _worker_lock:
            _job_running = False
            gone = _launcher_gone
        if gone:
            _exit_orphan()


def run_sweep_job(job: Job, task_function: Any, hydra_context: Any) -> JobReturn:
    """``task_function`` on ``job``'s config as Hydra runs a job of a sweep (``run_job``: its run directory,
    ``.hydra/`` files, job logging and callbacks)."""
    return run_job(
        hydra_context=hydra_context,
        config=job.config,
        task_function=task_function,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


def _execute(jobs: list[Job], run: Any, singleton_state: dict[str, Any]) -> list[Outcome]:
    """``run()`` (the ``JobReturn`` of each of ``jobs``) with a forwarded stop signal armed; each job's outcome."""
    global _armed, _pending_signal
    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(jobs[0].config)
    start = time.time()
    try:
        try:
            _armed = True
            if _pending_signal is not None:  # forwarded before this worker took the job up
                name, _pending_signal, _armed = signal.Signals(_pending_signal).name, None, False
                raise JobInterrupted(name)
            returns = run()
        finally:
            _armed = False
    except BaseException as err:  # noqa: BLE001 - a stopped run's SystemExit, a forwarded signal, an error of Hydra itself
        returns = [JobReturn(overrides=job.overrides, status=JobStatus.FAILED, _return_value=err) for job in jobs]
    end = time.time()
    outcomes = [_outcome(job, ret, start, end) for job, ret in zip(jobs, returns)]
    del returns  # a failure's traceback holds the run's frames (a population's tensors): free them for the next
    gc.collect()
    _release_cuda_memory()
    return outcomes


def _outcome(job: Job, ret: JobReturn, start: float, end: float) -> Outcome:
    """Job ``job``'s outcome from its ``JobReturn``; a failure's traceback goes to the job's log, not the console."""
    ret, status, error, signal_name, tb = _how_it_ended(ret, job.output_dir, start)
    handler, opened = job_log_file(job.output_dir), None
    if handler is None and tb is not None:  # a population's member: its Hydra log handler is closed by now
        path = job.output_dir / f"{OmegaConf.select(job.config, 'hydra.job.name')}.log"
        if path.exists():
            handler = opened = logging.FileHandler(path)
            handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    if status == "failed" and tb is not None and handler is not None:
        handler.handle(
            logging.LogRecord(
                log.name,
                logging.ERROR,
                __file__,
                0,
                "job %d failed: %s\n%s",
                (job.idx, error, (tb or "").rstrip()),
                None,
            )
        )
    ret.cfg = ret.hydra_cfg = None  # the launcher restores them from the job's config
    try:
        payload = cloudpickle.dumps(ret)
        pickle.loads(payload)
    except Exception:  # noqa: BLE001 - a return value or an error that cannot travel back: send it as text
        ret._return_value = RuntimeError(error) if ret.status is JobStatus.FAILED else repr(ret._return_value)
        payload = cloudpickle.dumps(ret)
    log_file = handler.baseFilename if handler else None
    if opened is not None:
        opened.close()
    return Outcome(payload, status, error, signal_name, tb, start, end, os.getpid(), log_file)


def _how_it_ended(
    ret: JobReturn,
    output_dir: Path,
    start: float,
) -> tuple[JobReturn, str, str | None, str | None, str | None]:
    """``(JobReturn, status, error on one line, stop signal, traceback)`` of a job that began at ``start``.

    Where the job raised, the run's own ``summary.json``, if it wrote one
    during the job, says more: a stop signal ended it (``SystemExit`` with
    128 + the signal's number), it failed (its own one-line error), or it had
    ended on its own (completed, pruned, failed, stopped) before a forwarded
    signal reached the worker's handler (for a population's members: the
    signal came while another member was built, or after they all ended).
    """
    if ret.status is not JobStatus.FAILED:
        return ret, "completed", None, None, None
    err = ret._return_value
    summary = RunSummary.read(output_dir)
    if summary is not None and (summary.end_time or 0) < start:
        summary = None  # an earlier attempt's
    if isinstance(err, JobInterrupted) and summary is not None:
        if summary.status in ("completed", "pruned"):
            completed = JobReturn(overrides=ret.overrides, status=JobStatus.COMPLETED, _return_value=summary.objective)
            return completed, "completed", None, None, None
        if summary.status == "failed":
            return ret, "failed", summary.error, None, None  # its traceback is in its summary.json
    if isinstance(err, (SystemExit, JobInterrupted)) and summary is not None and summary.status in STOPPED:
        return ret, summary.status, f"{summary.status} by {summary.signal}", summary.signal, None
    if isinstance(err, JobInterrupted):
        return ret, "interrupted", f"interrupted by {err.signal_name}", err.signal_name, None
    own = summary.error if summary is not None and summary.status == "failed" else None  # the run's own word
    return ret, "failed", own or describe_error(err), None, "".join(traceback.format_exception(err))


def describe_error(err: BaseException) -> str:
    """``err`` in one line (:func:`rlchain.console.error_line`; a Hydra one-line error: its message alone)."""
    return error_line(str(err) if isinstance(err, CompactHydraException) else err)


def job_log_file(output_dir: Path) -> logging.FileHandler | None:
    """The file handler Hydra's job logging opened in ``output_dir`` for this job, if any."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == output_dir:
            return handler
    return None


def _release_cuda_memory() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _other_ranks(job: bytes, context: bytes) -> Iterator[None]:
    """Run the block as rank 0 of a job of ``_ranks`` processes, the others started here (nothing for one)."""
    if _ranks == 1:
        yield
        return
    with socket.socket() as s:  # a free port for the ranks' rendezvous, as torchrun --standalone picks one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(_ranks),
        "LOCAL_WORLD_SIZE": str(_ranks),
    }
    spawn = multiprocessing.get_context("spawn")
    ranks = [
        spawn.Process(
            target=run_rank,
            args=(job, context, {**world, "RANK": str(r), "LOCAL_RANK": str(r)}, os.getpid()),
            name=f"rlchain-rank-{r}",
        )
        for r in range(1, _ranks)
    ]
    for rank in ranks:
        rank.start()
    saved = {key: os.environ.get(key) for key in (*world, "RANK", "LOCAL_RANK")}
    os.environ.update(world, RANK="0", LOCAL_RANK="0")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        deadline = time.monotonic() + RANK_GRACE_S
        for rank in ranks:
            rank.join(max(0.0, deadline - time.monotonic()))
            if rank.is_alive():
                log.warning(f"{rank.name} (pid {rank.pid}) had not ended {RANK_GRACE_S:g} s after rank 0: killed")
                rank.kill()
                rank.join()


def run_rank(job: bytes, context: bytes, environ: dict[str, str], worker_pid: int) -> None:
    """A rank other than 0 of a multi-process job: the job's task function on its config, with no file written.

    Hydra's ``run_job`` is not run (rank 0 writes the job's files); the
    config's ``hydra.runtime.output_dir`` is the job's directory. The rank
    exits when its worker is gone; a stop signal reaches it only through
    rank 0 (the ranks agree to stop). At its exit it freezes what is alive, as the commands do.
    """
    atexit.register(gc.freeze)
    os.environ.update(environ)
    os.setpgrp()  # out of the launcher's way: signals reach rank 0, which tells the others
    threading.Thread(target=_watch_worker, args=(worker_pid,), name="rlchain-watch-worker", daemon=True).start()
    job_ = cloudpickle.loads(job)
    task_function, _, singleton_state = cloudpickle.loads(context)
    setup_globals()
    Singleton.set_state(singleton_state)
    config = copy.deepcopy(job_.config)
    with read_write(config.hydra.runtime):
        config.hydra.runtime.output_dir = str(job_.output_dir)
    HydraConfig.instance().set_config(config)
    task_cfg = copy.deepcopy(config)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    try:
        task_function(task_cfg)
    except BaseException as err:  # noqa: BLE001 - rank 0 reports the run; this rank's one line goes to the console
        code = err.code if isinstance(err, SystemExit) and isinstance(err.code, int) else 1
        if not isinstance(err, SystemExit):
            print(describe_error(err), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)


def _watch_worker(worker_pid: int) -> None:
    """End this rank when its worker (rank 0's process) is gone."""
    while os.getppid() == worker_pid:
        time.sleep(WATCH_INTERVAL_S)
    os._exit(ORPHAN_EXIT)
