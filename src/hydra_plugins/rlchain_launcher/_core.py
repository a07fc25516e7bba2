"""Device slots, worker processes and the scheduling loop of the devices launcher.

Each slot is one device (a CUDA id, or the CPU) and one worker process
(``spawn`` start method), started on demand and reused by the slot's later
jobs. The worker sets ``CUDA_VISIBLE_DEVICES`` and its thread counts in its
initializer, before any job can touch CUDA, so a job sees its device as
``cuda:0``. A CUDA id the launcher cannot see is rejected before any job
starts (:func:`resolve_devices`).

Signals. Workers run in their own process group, so Ctrl-C at the terminal
reaches the launcher only. The first SIGINT or SIGTERM the launcher gets is
forwarded to the busy workers (rlchain's trainer then finishes its iteration,
saves ``latest.pt`` and records ``interrupted`` with the signal) and no new job
starts; once the running jobs have stopped the sweep's tables are written and
the multirun exits with 128 + that first signal's number (130 for Ctrl-C, 143
for SIGTERM). A second signal is forwarded too (the trainer aborts at once,
``aborted``); a worker whose job has not ended ``kill_after_s`` seconds later,
or at a third signal, is killed (SIGKILL) and its job recorded as aborted.

Orphans. A worker watches its parent: when the launcher is gone (``kill -9``,
the OOM killer, a crash) the worker sends itself SIGTERM, so a running job
stops after its iteration and records ``interrupted``, and then exits; an idle
worker exits at once.

Failures. A job that fails is logged in one line as it ends, and again with
the other failed jobs of its batch at the end of the batch (job number, the
overrides that vary, the one-line error); its traceback goes to the job's own
``summary.json`` (``traceback``) and Hydra job log (``<job dir>/<job name>.log``),
not to the console.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.errors import CompactHydraException
from hydra.types import HydraContext
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from rlchain.utils import LAUNCHER_SLOT_ENV, one_line

log = logging.getLogger(__name__)


class LauncherConfigError(CompactHydraException):
    """A ``hydra.launcher.*`` value the devices launcher rejects (printed without traceback)."""


# ------------------------------------------------------------------ slots
@dataclass(frozen=True)
class Slot:
    """One place a job can run: a device and a thread budget.

    Attributes:
        index: slot number, 0 .. devices * jobs_per_device - 1.
        device: ``"cpu"``, or the CUDA id written to ``CUDA_VISIBLE_DEVICES``.
        num_threads: torch intra-op / OpenMP / MKL threads of the job.
    """

    index: int
    device: str
    num_threads: int

    @property
    def label(self) -> str:
        """``"cpu"`` or ``"cuda:<id>"`` with the id as the machine numbers it."""
        return "cpu" if self.device == "cpu" else f"cuda:{self.device}"

    def environ(self) -> dict[str, str]:
        """The environment a worker of this slot runs its jobs in."""
        threads = str(self.num_threads)
        return {
            "CUDA_VISIBLE_DEVICES": "" if self.device == "cpu" else self.device,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            LAUNCHER_SLOT_ENV: str(self.index),
        }


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def visible_cuda_devices() -> list[str]:
    """The CUDA devices this process can hand to a worker, named as ``CUDA_VISIBLE_DEVICES`` takes them.

    With ``CUDA_VISIBLE_DEVICES`` set in the launcher's environment, its
    entries (as many as CUDA accepts); otherwise ``"0" .. "<count - 1>"`` as
    ``nvidia-smi`` numbers the devices; ``[]`` without CUDA. Asks
    ``torch.cuda.device_count()``, which counts through NVML where it can and
    does not initialise CUDA in torch either way (workers are started with
    ``spawn``, so a worker's own ``CUDA_VISIBLE_DEVICES`` decides what it sees).
    """
    import torch

    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


def resolve_devices(devices: Any, visible: Sequence[str] | None = None) -> list[str]:
    """Turn ``hydra.launcher.devices`` into a list of device ids.

    Args:
        devices: ``"auto"``: every visible CUDA device, or ``["cpu"]`` when
            there is none; or a list of entries: ``cpu``, CUDA ids as
            ``nvidia-smi`` numbers them (integers), UUIDs or MIG ids.
        visible: the CUDA devices the launcher can hand out (see
            :func:`visible_cuda_devices`, asked when None). An integer id
            must be one of them: with ``CUDA_VISIBLE_DEVICES=2,3`` in the
            launcher's environment, ``[2]`` is allowed and ``[0]`` is not. A
            UUID or MIG id is written through unchecked while any CUDA device
            is visible.

    Raises:
        LauncherConfigError: not ``auto`` nor a non-empty list of distinct ids
            (non-negative integers, id strings or ``cpu``), or a CUDA id that
            is not visible, naming the visible devices.
    """
    allowed = "expected 'auto' or a list of CUDA device ids such as [0,1,3] (or [cpu])"
    if isinstance(devices, str) and devices.strip() == "auto":
        ids = list(visible_cuda_devices() if visible is None else visible)
        return ids or ["cpu"]
    if isinstance(devices, ListConfig):
        devices = OmegaConf.to_container(devices)
    if isinstance(devices, int) and not isinstance(devices, bool):
        devices = [devices]
    if not isinstance(devices, (list, tuple)) or not devices:
        raise LauncherConfigError(f"hydra.launcher.devices={devices!r} is not allowed: {allowed}")
    ids = []
    for entry in devices:
        if isinstance(entry, bool) or not isinstance(entry, (int, str)) or (isinstance(entry, int) and entry < 0):
            raise LauncherConfigError(f"hydra.launcher.devices={devices!r} is not allowed: entry {entry!r}; {allowed}")
        text = str(entry).strip()
        if not text or "," in text:
            raise LauncherConfigError(f"hydra.launcher.devices={devices!r} is not allowed: entry {entry!r}; {allowed}")
        ids.append(str(int(text)) if text.isdigit() else "cpu" if text.lower() == "cpu" else text)
    if len(set(ids)) != len(ids):
        raise LauncherConfigError(
            f"hydra.launcher.devices={devices!r} is not allowed: a device is listed twice; "
            "use hydra.launcher.jobs_per_device to run several jobs on one device"
        )
    cuda = [i for i in ids if i != "cpu"]
    if cuda:
        visible = list(visible_cuda_devices() if visible is None else visible)
        missing = [i for i in cuda if (i.isdigit() and i not in visible) or not visible]
        if missing:
            what = f"CUDA device {missing[0]} is" if len(missing) == 1 else f"CUDA devices {', '.join(missing)} are"
            if not visible:
                seen = "none (use [cpu] or auto)"
            elif "CUDA_VISIBLE_DEVICES" in os.environ:
                seen = f"{', '.join(visible)} (the launcher's CUDA_VISIBLE_DEVICES)"
            else:
                seen = f"{', '.join(visible)} (as nvidia-smi numbers them)"
            raise LauncherConfigError(
                f"hydra.launcher.devices={devices!r} is not allowed: {what} not visible; visible CUDA devices: {seen}"
            )
    return ids


def make_slots(devices: Any, jobs_per_device: int, threads_per_job: Any,
               visible: Sequence[str] | None = None) -> list[Slot]:  # fmt: skip
    """Slots for ``devices`` x ``jobs_per_device``, ordered round-robin over the devices.

    The round-robin order makes the first jobs of a sweep land on distinct
    devices. ``threads_per_job="auto"`` shares the usable cores evenly
    (at least one thread per job). ``visible``: see :func:`resolve_devices`.

    Raises:
        LauncherConfigError: ``jobs_per_device`` or ``threads_per_job`` not a
            positive integer (or ``auto``); see :func:`resolve_devices`.
    """
    if isinstance(jobs_per_device, bool) or not isinstance(jobs_per_device, int) or jobs_per_device < 1:
        raise LauncherConfigError(
            f"hydra.launcher.jobs_per_device={jobs_per_device!r} is not allowed: expected an integer >= 1"
        )
    if threads_per_job != "auto" and (
        isinstance(threads_per_job, bool) or not isinstance(threads_per_job, int) or threads_per_job < 1
    ):
        raise LauncherConfigError(
            f"hydra.launcher.threads_per_job={threads_per_job!r} is not allowed: expected 'auto' or an integer >= 1"
        )
    ids = resolve_devices(devices, visible)
    n_slots = len(ids) * jobs_per_device
    threads = max(1, usable_cpus() // n_slots) if threads_per_job == "auto" else threads_per_job
    return [Slot(i, ids[i % len(ids)], threads) for i in range(n_slots)]


# ------------------------------------------------------ what a worker gets
@dataclass(frozen=True)
class TaskRef:
    """A task function named by module and qualified name, resolved in the worker.

    ``@hydra.main`` hands launchers the undecorated function while its module
    attribute is the decorated one, so plain pickle refuses it; this reference
    resolves the attribute in the worker and takes its ``__wrapped__``.
    """

    module: str
    qualname: str

    @staticmethod
    def of(task_function: Callable) -> Callable | "TaskRef":
        """``task_function`` itself when it pickles, else a reference to it.

        Raises:
            LauncherConfigError: the function is neither picklable nor the
                ``__wrapped__`` of a module-level attribute (e.g. a lambda or a
                function defined inside another).
        """
        with contextlib.suppress(Exception):
            pickle.dumps(task_function)
            return task_function
        module, qualname = getattr(task_function, "__module__", None), getattr(task_function, "__qualname__", "")
        owner: Any = sys.modules.get(module or "")
        for part in qualname.split("."):
            owner = getattr(owner, part, None)
        if owner is not None and getattr(owner, "__wrapped__", None) is task_function:
            return TaskRef(module, qualname)
        raise LauncherConfigError(
            f"hydra/launcher=devices runs each job in a fresh process and cannot send the task function "
            f"{module}.{qualname} there: define it at the top level of an importable module"
        )

    def resolve(self) -> Callable:
        """The undecorated task function, imported in this process."""
        owner: Any = import_module(self.module)
        for part in self.qualname.split("."):
            owner = getattr(owner, part)
        return owner.__wrapped__


@dataclass
class Job:
    """One job of a batch, with its composed config and output directory."""

    idx: int
    overrides: list[str]
    config: DictConfig
    output_dir: Path


@dataclass
class Context:
    """What every job of a batch shares: Hydra's context, the task and Hydra's singletons."""

    hydra_context: HydraContext
    task: Callable | TaskRef
    singleton_state: dict[str, Any]


@dataclass
class Outcome:
    """A finished job as the worker reports it."""

    job_return: JobReturn
    status: str
    """``completed``, ``interrupted``, ``aborted`` or ``failed`` (the run's own status when it wrote one)."""
    error: str | None = None
    """The error on one line (None when there is none)."""
    traceback: str | None = None
    record: dict[str, Any] = field(default_factory=dict)
    log_file: str | None = None
    """The job's Hydra log file, which holds a failed job's traceback (None without job logging)."""


class RemoteTraceback(Exception):
    """Carries a worker's traceback text as the ``__cause__`` of a job's error."""

    def __str__(self) -> str:
        return self.args[0]


class JobFailed(CompactHydraException):
    """What a job that did not complete hands its sweeper: one line with the job number, its status and error.

    Hydra prints it without a traceback; the worker's traceback is its
    ``__cause__`` (printed with ``HYDRA_FULL_ERROR=1``) and is kept in the
    job's ``summary.json`` and log file.
    """


class JobInterrupted(KeyboardInterrupt):
    """Raised in a worker by a forwarded SIGINT or SIGTERM while no trainer handles it (e.g. as the env is built).

    Args:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
    """

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def portable_singleton_state() -> dict[str, Any]:
    """Hydra's singleton state without OmegaConf's resolvers (closures that do
    not pickle); a worker registers its own with ``setup_globals`` and imports."""
    state = Singleton.get_state()
    return {key: value for key, value in state.items() if key != "omegaconf_resolvers"}


def prepare_job(config: DictConfig, hydra_context: HydraContext, idx: int, overrides: Sequence[str]) -> Job:
    """Compose job ``idx``'s config in the launcher process and resolve its output dir."""
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    output_dir = Path(os.path.abspath(os.path.join(str(sweep_config.hydra.sweep.dir), str(sweep_config.hydra.sweep.subdir))))
    return Job(idx, list(overrides), sweep_config, output_dir)


def record_job(output_dir: Path, record: dict[str, Any], status: str, error: str | None, objective: Any = None, *,
               traceback_text: str | None = None, signal_name: str | None = None) -> str:  # fmt: skip
    """Merge the launcher's ``record`` into ``<output_dir>/summary.json`` and return the job status.

    A run that wrote its own summary keeps it (and its status); otherwise a
    minimal one is written with ``status``, ``error``, ``signal`` and
    ``objective``. A failed job's ``traceback_text`` is added as
    ``traceback`` when the summary has none.
    """
    from rlchain.checkpoint import atomic_write_json

    path = output_dir / "summary.json"
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads(path.read_text())
    if not summary:
        summary = {"status": status, "error": error, "signal": signal_name,
                   "objective": objective if isinstance(objective, (int, float)) else None}  # fmt: skip
    if traceback_text and summary.get("status") == "failed" and not summary.get("traceback"):
        summary["traceback"] = traceback_text
    summary["launcher"] = record
    atomic_write_json(path, summary)
    return str(summary.get("status", status))


# ------------------------------------------------------------- the worker
#: Signals that stop a job: forwarded by the launcher, or sent to itself by an orphaned worker.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
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


def _init_worker(environ: dict[str, str], num_threads: int, launcher_pid: int) -> None:
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


def _describe(err: BaseException) -> str:
    if isinstance(err, JobInterrupted):
        return f"interrupted by {err.signal_name}"
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    text = one_line(err)
    if isinstance(err, CompactHydraException):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


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
        error, tb = _describe(err), "".join(traceback.format_exception(err))
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


# --------------------------------------------------------------- the pool
#: Seconds between two looks of the launcher at its running jobs and at the signals it got.
POLL_S = 0.2


class _Worker:
    """One slot's worker process (a single-process ``ProcessPoolExecutor``)."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.executor = ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker, initargs=(slot.environ(), slot.num_threads, os.getpid()),
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
        self.executor.shutdown(wait=False, cancel_futures=True)


class DevicePool:
    """Runs batches of jobs over :class:`Slot` workers, one job per slot at a time.

    Args:
        slots: from :func:`make_slots`.
        stagger_s: minimum seconds between two job starts.
        kill_after_s: seconds the running jobs get to end after a second
            stop signal before their workers are killed.
    """

    def __init__(self, slots: list[Slot], stagger_s: float = 0.0, kill_after_s: float = 30.0) -> None:
        self.slots = slots
        self.stagger_s = stagger_s
        self.kill_after_s = kill_after_s
        self.workers: list[_Worker | None] = [None] * len(slots)
        self._last_start = 0.0
        self._received: list[int] = []  # the stop signals received, in order
        self._reported = 0  # of them, those acted on (message printed, kill scheduled)
        self._kill_at: float | None = None
        self._kill_reason = ""

    @property
    def stop_signal(self) -> int | None:
        """The first SIGINT/SIGTERM received (the sweep stops), or None."""
        return self._received[0] if self._received else None

    @property
    def exit_code(self) -> int:
        """128 + the first stop signal's number (130 Ctrl-C, 143 SIGTERM); 0 when none came."""
        return 128 + self._received[0] if self._received else 0

    def _idle_worker(self) -> _Worker | None:
        for worker in self.workers:
            if worker is not None and worker.job is None and not worker.broken:
                return worker
        for i, worker in enumerate(self.workers):
            if worker is None or (worker.broken and worker.job is None):
                if worker is not None:
                    worker.close()
                self.workers[i] = _Worker(self.slots[i])
                return self.workers[i]
        return None

    def _busy(self) -> list[_Worker]:
        return [w for w in self.workers if w is not None and w.job is not None]

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only note it: the scheduling loop prints, forwards and kills (no reentrant writes, no double sends).
        self._received.append(signum)

    @contextlib.contextmanager
    def handling_signals(self) -> Iterator[None]:
        """Catch SIGINT and SIGTERM in the launcher for the duration (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _react(self) -> None:
        """Act on the stop signals received: announce them, forward them to busy workers, kill when due.

        Each busy worker gets the first two signals in order, as soon as its
        process has started (a worker still starting gets them then).
        """
        while self._reported < len(self._received):
            name = signal.Signals(self._received[self._reported]).name
            self._reported += 1
            if self._reported == 1:
                message = (f"{name}: stopping the sweep: running jobs save and stop after their iteration, "
                           "no new job starts; Ctrl-C (or SIGTERM) again aborts them")  # fmt: skip
            elif self._reported == 2:
                self._kill_at = time.monotonic() + self.kill_after_s
                self._kill_reason = f"it had not stopped {self.kill_after_s:g} s after the second stop signal ({name})"
                message = (f"{name} again: the running jobs abort now (no new checkpoint); a worker still running "
                           f"in {self.kill_after_s:g} s is killed")  # fmt: skip
            else:
                self._kill_at = time.monotonic()
                self._kill_reason = f"a third stop signal ({name}) came"
                message = f"{name} a third time: killing the running jobs' workers now"
            print(f"\nrlchain: {message}", file=sys.stderr, flush=True)
        for worker in self._busy():
            while worker.signals_sent < min(len(self._received), 2):
                if not worker.send(self._received[worker.signals_sent]):
                    break  # not started yet: it gets them on a later look
                worker.signals_sent += 1
            if self._kill_at is not None and time.monotonic() >= self._kill_at and worker.killed is None:
                worker.kill(self._kill_reason)

    def run(self, jobs: list[Job], context: Context) -> tuple[list[JobReturn], bool]:
        """Run ``jobs``, at most one per slot at a time; return their results in order.

        Signals are acted on only under :meth:`handling_signals`.

        Returns:
            ``(job_returns, stopped)``: ``stopped`` is True when SIGINT or
            SIGTERM ended the batch early; jobs that never started are left
            out of ``job_returns`` then.
        """
        pending = deque(jobs)
        running: dict[Future, _Worker] = {}
        results: dict[int, JobReturn] = {}
        while pending or running:
            self._react()
            while pending and self.stop_signal is None:
                worker = self._idle_worker()
                if worker is None:
                    break
                if self.stagger_s > 0:
                    time.sleep(max(0.0, self._last_start + self.stagger_s - time.time()))
                    if self.stop_signal is not None:
                        break
                job = pending.popleft()
                worker.job, worker.signals_sent, worker.killed = job, 0, None
                self._last_start = time.time()
                log.info(f"job {job.idx} started on {worker.slot.label} (slot {worker.slot.index}): {' '.join(job.overrides)}")
                running[worker.executor.submit(execute, job, context, worker.slot)] = worker
            if not running:
                break
            done, _ = wait(running, timeout=POLL_S, return_when=FIRST_COMPLETED)
            self._react()
            for future in done:
                worker = running.pop(future)
                results[worker.job.idx] = self._finish(future, worker.job, worker)
                worker.job = None
        self._react()
        return [results[job.idx] for job in jobs if job.idx in results], self.stop_signal is not None

    def _finish(self, future: Future, job: Job, worker: _Worker) -> JobReturn:
        slot = worker.slot
        try:
            outcome: Outcome = future.result()
        except Exception as err:
            status, signal_name = "failed", None
            if isinstance(err, BrokenProcessPool):  # the worker died: killed, out of memory, segfault
                worker.broken = True
                if worker.killed is not None:
                    status, signal_name = "aborted", signal.Signals(self._received[0]).name
                    error = f"killed by the launcher: {worker.killed}"
                else:
                    error = "the worker process died (killed, out of memory or crashed)"
            else:  # e.g. a result that could not travel back
                error = f"the job's result could not be returned: {_describe(err)}"
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


def launch(
    pool: DevicePool, config: DictConfig, hydra_context: HydraContext, task_function: Callable,
    job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
) -> Sequence[JobReturn]:  # fmt: skip
    """The body of :meth:`DevicesLauncher.launch`: compose, run, summarise.

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
    with pool.handling_signals():
        context = Context(hydra_context, TaskRef.of(task_function), portable_singleton_state())
        jobs = [prepare_job(config, hydra_context, initial_job_idx + i, o) for i, o in enumerate(job_overrides)]
        results, stopped = pool.run(jobs, context)
        _summarise(sweep_dir, {job.idx for job in jobs})
        if stopped:
            name = signal.Signals(pool.stop_signal).name
            log.warning(
                f"sweep stopped by {name}: {len(results)} of {len(jobs)} job(s) ran in this batch; finished jobs and "
                f"checkpoints are in {sweep_dir}"
            )
            pool.shutdown()
            raise SystemExit(pool.exit_code)
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
        log.warning(f"the sweep's summary tables could not be written in {sweep_dir}: {_describe(err)}")
        return
    lines = failure_lines(jobs, nums=batch)
    if lines:
        log.error(f"{len(lines)} job(s) failed (each traceback is in the job's summary.json and log; "
                  f"table: {paths['md']}):")  # fmt: skip
        for line in lines:
            log.error(f"  {line}")
