"""Device slots, worker processes and the scheduling loop of the devices launcher.

Each slot is one device (a CUDA id, or the CPU) and one worker process
(``spawn`` start method), started on demand and reused by the slot's later
jobs. The worker sets ``CUDA_VISIBLE_DEVICES`` and its thread counts in its
initializer, before any job can touch CUDA, so a job sees its device as
``cuda:0``. Workers run in their own process group: Ctrl-C reaches the
launcher only, which forwards it to the busy workers (rlchain's trainer then
finishes the iteration, saves and returns ``interrupted``) and starts no new
job; a second Ctrl-C, or SIGTERM, terminates the workers.
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

from rlchain.utils import LAUNCHER_SLOT_ENV

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


def resolve_devices(devices: Any) -> list[str]:
    """Turn ``hydra.launcher.devices`` into a list of device ids.

    ``"auto"`` gives every CUDA device torch sees (named as in the launcher's
    own ``CUDA_VISIBLE_DEVICES`` when that is set), or ``["cpu"]`` when there
    is none. A list gives its entries as strings; integers are CUDA ids.

    Raises:
        LauncherConfigError: not ``auto`` nor a non-empty list of distinct ids
            (non-negative integers, id strings or ``cpu``), or an id this
            machine does not have (checked when CUDA is present).
    """
    allowed = "expected 'auto' or a list of CUDA device ids such as [0,1,3] (or [cpu])"
    if isinstance(devices, str) and devices.strip() == "auto":
        import torch

        count = torch.cuda.device_count()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            ids = [d.strip() for d in visible.split(",") if d.strip()][:count]
        else:
            ids = [str(i) for i in range(count)]
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
        ids.append(text)
    if len(set(ids)) != len(ids):
        raise LauncherConfigError(
            f"hydra.launcher.devices={devices!r} is not allowed: a device is listed twice; "
            "use hydra.launcher.jobs_per_device to run several jobs on one device"
        )
    import torch

    count = torch.cuda.device_count()
    if count and "CUDA_VISIBLE_DEVICES" not in os.environ:
        missing = [i for i in ids if i.isdigit() and int(i) >= count]
        if missing:
            raise LauncherConfigError(
                f"hydra.launcher.devices={devices!r} is not allowed: this machine has {count} CUDA "
                f"device(s), ids 0..{count - 1}"
            )
    return ids


def make_slots(devices: Any, jobs_per_device: int, threads_per_job: Any) -> list[Slot]:
    """Slots for ``devices`` x ``jobs_per_device``, ordered round-robin over the devices.

    The round-robin order makes the first jobs of a sweep land on distinct
    devices. ``threads_per_job="auto"`` shares the usable cores evenly
    (at least one thread per job).

    Raises:
        LauncherConfigError: see :func:`resolve_devices`; ``jobs_per_device``
            or ``threads_per_job`` not a positive integer (or ``auto``).
    """
    if isinstance(jobs_per_device, bool) or not isinstance(jobs_per_device, int) or jobs_per_device < 1:
        raise LauncherConfigError(
            f"hydra.launcher.jobs_per_device={jobs_per_device!r} is not allowed: expected an integer >= 1"
        )
    ids = resolve_devices(devices)
    n_slots = len(ids) * jobs_per_device
    if threads_per_job == "auto":
        threads = max(1, usable_cpus() // n_slots)
    elif isinstance(threads_per_job, int) and not isinstance(threads_per_job, bool) and threads_per_job >= 1:
        threads = threads_per_job
    else:
        raise LauncherConfigError(
            f"hydra.launcher.threads_per_job={threads_per_job!r} is not allowed: expected 'auto' or an integer >= 1"
        )
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
    """``completed``, ``interrupted`` or ``failed`` (the run's own status when it wrote one)."""
    error: str | None = None
    traceback: str | None = None
    record: dict[str, Any] = field(default_factory=dict)


class RemoteTraceback(Exception):
    """Carries a worker's traceback text as the ``__cause__`` of a job's error."""

    def __str__(self) -> str:
        return self.args[0]


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


def record_job(output_dir: Path, record: dict[str, Any], status: str, error: str | None, objective: Any = None) -> str:
    """Merge the launcher's ``record`` into ``<output_dir>/summary.json`` and return the job status.

    A run that wrote its own summary keeps it (and its status); otherwise a
    minimal one is written with ``status``, ``error`` and ``objective``.
    """
    from rlchain.checkpoint import atomic_write_json

    path = output_dir / "summary.json"
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads(path.read_text())
    if not summary:
        summary = {"status": status, "error": error, "objective": objective if isinstance(objective, (int, float)) else None}
    summary["launcher"] = record
    atomic_write_json(path, summary)
    return str(summary.get("status", status))


# ------------------------------------------------------------- the worker
def _init_worker(environ: dict[str, str], num_threads: int) -> None:
    """Worker initializer: pin the device and threads before any job imports CUDA."""
    os.environ.update(environ)
    os.setpgrp()  # Ctrl-C at the terminal reaches the launcher only; it forwards to busy workers
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(num_threads)


def _describe(err: BaseException) -> str:
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    text = str(err)
    if isinstance(err, CompactHydraException):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def execute(job: Job, context: Context, slot: Slot) -> Outcome:
    """Run one job in this worker with Hydra's ``run_job``; never raises.

    The job's error (if any) comes back picklable with its traceback text, and
    the launcher's record (slot, device, threads, start and end times) is
    merged into the job's ``summary.json``.
    """
    setup_globals()
    from omegaconf.basecontainer import BaseContainer

    Singleton.set_state({**context.singleton_state, "omegaconf_resolvers": dict(BaseContainer._resolvers)})
    HydraConfig.instance().set_config(job.config)
    start = time.time()
    try:
        task = context.task.resolve() if isinstance(context.task, TaskRef) else context.task
        ret = run_job(
            hydra_context=context.hydra_context, config=job.config, task_function=task,
            job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir",
        )  # fmt: skip
    except BaseException as err:  # a forwarded Ctrl-C outside the trainer, or an error in Hydra itself
        ret = JobReturn(overrides=job.overrides, status=JobStatus.FAILED, _return_value=err)
    end = time.time()
    error = tb = None
    status = "completed"
    if ret.status is JobStatus.FAILED:
        err = ret._return_value
        status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
        error, tb = _describe(err), "".join(traceback.format_exception(err))
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
    status = record_job(job.output_dir, record, status, error, objective)
    ret.cfg = ret.hydra_cfg = None  # may hold classes of the worker's own imports; the launcher restores them
    if ret.status is JobStatus.COMPLETED:
        try:
            pickle.dumps(objective)
        except Exception:  # a return value that cannot travel back: send its repr
            ret._return_value = repr(objective)
    _release_cuda_memory()
    return Outcome(ret, status, error, tb, record)


def _release_cuda_memory() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# --------------------------------------------------------------- the pool
class _Worker:
    """One slot's worker process (a single-process ``ProcessPoolExecutor``)."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.executor = ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker, initargs=(slot.environ(), slot.num_threads),
        )  # fmt: skip
        self._pid: Future = self.executor.submit(os.getpid)
        self.job: Job | None = None
        self.broken = False

    def send(self, signum: int) -> None:
        """Send ``signum`` to the worker process when it has started."""
        if self._pid.done() and self._pid.exception() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid.result(), signum)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class DevicePool:
    """Runs batches of jobs over :class:`Slot` workers, one job per slot at a time.

    Args:
        slots: from :func:`make_slots`.
        stagger_s: minimum seconds between two job starts.
    """

    def __init__(self, slots: list[Slot], stagger_s: float = 0.0) -> None:
        self.slots = slots
        self.stagger_s = stagger_s
        self.workers: list[_Worker | None] = [None] * len(slots)
        self._last_start = 0.0
        self._stop = 0  # 0: running; 1: stop requested (Ctrl-C); 2: terminate workers

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
        if signum == signal.SIGINT and self._stop == 0:
            self._stop = 1
            print(
                "\nrlchain: stopping the sweep: running jobs save and stop after their iteration, no new job starts; "
                "Ctrl-C again to terminate them",
                file=sys.stderr, flush=True,
            )  # fmt: skip
            for worker in self._busy():
                worker.send(signal.SIGINT)
        else:
            self._stop = 2
            for worker in self._busy():
                worker.send(signal.SIGTERM)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def run(self, jobs: list[Job], context: Context) -> tuple[list[JobReturn], bool]:
        """Run ``jobs``, at most one per slot at a time; return their results in order.

        Returns:
            ``(job_returns, stopped)``: ``stopped`` is True when Ctrl-C or
            SIGTERM ended the batch early; jobs that never started are left
            out of ``job_returns`` then.
        """
        pending = deque(jobs)
        running: dict[Future, _Worker] = {}
        results: dict[int, JobReturn] = {}
        with self._signals():
            while pending or running:
                while pending and self._stop == 0:
                    worker = self._idle_worker()
                    if worker is None:
                        break
                    if self.stagger_s > 0:
                        time.sleep(max(0.0, self._last_start + self.stagger_s - time.time()))
                    job = pending.popleft()
                    worker.job = job
                    self._last_start = time.time()
                    log.info(f"job {job.idx} started on {worker.slot.label} (slot {worker.slot.index}): {' '.join(job.overrides)}")
                    running[worker.executor.submit(execute, job, context, worker.slot)] = worker
                if not running:
                    break
                done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    worker = running.pop(future)
                    job, worker.job = worker.job, None
                    results[job.idx] = self._finish(future, job, worker)
        return [results[job.idx] for job in jobs if job.idx in results], self._stop > 0

    def _finish(self, future: Future, job: Job, worker: _Worker) -> JobReturn:
        slot = worker.slot
        try:
            outcome: Outcome = future.result()
        except Exception as err:
            if isinstance(err, BrokenProcessPool):  # the worker died: killed, out of memory, segfault
                worker.broken = True
                error = ("the job was terminated" if self._stop == 2
                         else "the worker process died (killed, out of memory or crashed)")  # fmt: skip
            else:  # e.g. a result that could not travel back
                error = f"the job's result could not be returned: {type(err).__name__}: {err}"
            now = time.time()
            record = {"slot": slot.index, "device": slot.label, "num_threads": slot.num_threads, "end_time": now}
            status = record_job(job.output_dir, record, "failed", error)
            ret = JobReturn(overrides=job.overrides, status=JobStatus.FAILED, _return_value=RuntimeError(error))
            outcome = Outcome(ret, status, error, None, record)
        ret = outcome.job_return
        ret.hydra_cfg = OmegaConf.masked_copy(job.config, "hydra")
        ret.cfg = copy.deepcopy(job.config)
        with open_dict(ret.cfg):
            del ret.cfg["hydra"]
        if outcome.traceback is not None and isinstance(ret._return_value, BaseException):
            ret._return_value.__cause__ = RemoteTraceback(outcome.traceback)
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


def launch(
    pool: DevicePool, config: DictConfig, hydra_context: HydraContext, task_function: Callable,
    job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
) -> Sequence[JobReturn]:  # fmt: skip
    """The body of :meth:`DevicesLauncher.launch`: compose, run, summarise.

    Raises:
        SystemExit: code 130 after Ctrl-C (or 143 after SIGTERM) once every
            job that was running has stopped and the summary is written.
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
    context = Context(hydra_context, TaskRef.of(task_function), portable_singleton_state())
    jobs = [prepare_job(config, hydra_context, initial_job_idx + i, o) for i, o in enumerate(job_overrides)]
    results, stopped = pool.run(jobs, context)
    from rlchain.report import write_summary

    with contextlib.suppress(Exception):  # the jobs' own files are what matters; never lose them to a table
        write_summary(sweep_dir, plot=False)
    if stopped:
        code = 130 if pool._stop == 1 else 143
        log.warning(
            f"sweep stopped: {len(results)} of {len(jobs)} job(s) ran in this batch; finished jobs and "
            f"checkpoints are in {sweep_dir}"
        )
        pool.shutdown()
        raise SystemExit(code)
    return results
