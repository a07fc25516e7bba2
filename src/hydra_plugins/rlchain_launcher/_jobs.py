"""What travels between the launcher and a worker: a job, what its batch shares, how it ended.

The launcher composes each job's config (:func:`prepare_job`) and sends it to
a worker started with ``spawn``, so everything here pickles with the standard
library: a task function that ``@hydra.main`` hides from pickle goes as a
:class:`TaskRef`, and Hydra's singletons go without OmegaConf's resolvers
(:func:`portable_singleton_state`).

Failures. A job that fails is logged in one line as it ends, and again with
the other failed jobs of its batch at the end of the batch (job number, the
overrides that vary, the one-line error); its traceback goes to the job's own
``summary.json`` (``traceback``, :func:`record_job`) and Hydra job log
(``<job dir>/<job name>.log``), not to the console. Its sweeper gets a
:class:`JobFailed`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import sys
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn
from hydra.errors import CompactHydraException
from hydra.types import HydraContext
from omegaconf import DictConfig, open_dict

from hydra_plugins.rlchain_launcher._devices import LauncherConfigError
from hydra_plugins.rlchain_launcher._signals import JobInterrupted
from rlchain.utils import one_line


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
                ``__wrapped__`` of a module-level attribute (e.g. a lambda, a
                function defined inside another, or a callable object holding
                one), naming it and why pickle refused it.
        """
        try:
            pickle.dumps(task_function)
            return task_function
        except Exception as err:
            why = one_line(err)
        module, qualname = getattr(task_function, "__module__", None), getattr(task_function, "__qualname__", "")
        owner: Any = sys.modules.get(module or "")
        for part in qualname.split("."):
            owner = getattr(owner, part, None)
        if owner is not None and getattr(owner, "__wrapped__", None) is task_function:
            return TaskRef(module, qualname)
        what = f"{module}.{qualname}" if qualname else repr(task_function)  # a callable object has no qualname
        raise LauncherConfigError(
            f"hydra/launcher=devices runs each job in a fresh process and cannot send the task function "
            f"{what} there ({why}): define it at the top level of an importable module"
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


def describe_error(err: BaseException) -> str:
    """``err`` in one line: its type and message, or how a stop signal interrupted the job."""
    if isinstance(err, JobInterrupted):
        return f"interrupted by {err.signal_name}"
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    text = one_line(err)
    if isinstance(err, CompactHydraException):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
