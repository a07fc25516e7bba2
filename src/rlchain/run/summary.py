"""How a run and a sweep's job ended: stop signals, exit codes, errors, ``summary.json`` and the launcher's records.

This module uses the standard library only, so that a launcher plugin can
depend on it alone (importing it runs ``rlchain``'s package ``__init__``,
which registers the built-in tasks with gymnasium; torch is not imported).

* :data:`STOP_SIGNALS` and :func:`signal_exit_code`: the signals that stop a
  run after its iteration, and the exit status of a process they stopped
  (128 + the signal's number: 130 for SIGINT, 143 for SIGTERM). The
  trainer, the ``rlchain-train`` entry and the devices launcher use these.
* :class:`RunSummary`: a run's ``<run dir>/summary.json``, written by the run
  alone (:meth:`RunSummary.write`) and read back by everyone
  (:meth:`RunSummary.read`): the report, the launcher and the tests.
* :class:`JobRecord`: what only a launcher knows of a job of a sweep (its
  slot and device, its wall time, a worker that died or that the launcher
  killed), one JSON line per job in ``<sweep dir>/launcher.jsonl``. A
  launcher never rewrites a run's own files; the report joins the two.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlchain.files import write_json

__all__ = ["JOB_RECORDS", "STOP_SIGNALS", "STOPPED", "JobRecord", "RunSummary", "placement", "signal_exit_code"]

#: Signals that stop a run after its current iteration (a second one aborts it): Ctrl-C, and what
#: ``scancel``, Kubernetes and most preemptions send. A launcher forwards them to its running jobs.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
#: Statuses of a run stopped on request (by a signal), which is no failure of the run.
STOPPED = ("interrupted", "aborted")
#: The launcher's job records in a sweep directory.
JOB_RECORDS = "launcher.jsonl"


def signal_exit_code(sig: int | str) -> int:
    """The exit status of a process stopped by ``sig`` (a number or a name such as ``"SIGINT"``): 128 + its number."""
    number = signal.Signals[sig] if isinstance(sig, str) else signal.Signals(sig)
    return 128 + number.value


def placement(device: Any) -> dict[str, Any]:
    """Where a run runs: its torch device, the host and process, the visible GPUs and the SLURM job.

    Returns ``{"device", "hostname", "pid", "cuda_visible_devices", "slurm_job_id"}``;
    the last two read the environment variables of those names (None when unset).
    """
    return {
        "device": str(device),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def _from_dict(cls: type, data: Any) -> Any:
    """``cls(**data)`` with the keys ``cls`` has (a file of another version may have more or fewer)."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{key: value for key, value in data.items() if key in names})


@dataclass
class RunSummary:
    """``summary.json``: how a run ended and what it reached.

    Written once at the end of every run, whatever ended it (also by a run
    refused before its first step), and returned by
    :meth:`rlchain.run.trainer.Trainer.train`. Steps count env transitions;
    times are seconds (``start_time``/``end_time``: Unix time).
    """

    status: str
    """``completed``, ``pruned`` (its Optuna trial was pruned: it stopped after that iteration and saved ``latest.pt``;
    see :mod:`rlchain.run.tuning`), ``interrupted`` (a stop signal: the iteration ended and ``latest.pt`` was saved),
    ``aborted`` (a second stop signal: the last checkpoint stands), ``failed``, or ``unreadable`` (from :meth:`read`)."""
    error: str | None = None
    """What went wrong, on one line (``failed``)."""
    signal: str | None = None
    """The stop signal's name (``SIGINT``, ``SIGTERM``, ``SIGUSR2``) when one stopped the run."""
    traceback: str | None = None
    """The traceback of a failure."""
    exp_name: str | None = None
    device: str | None = None
    hostname: str | None = None
    pid: int | None = None
    cuda_visible_devices: str | None = None
    slurm_job_id: str | None = None
    world_size: int = 1
    """Processes that trained the run together (torchrun's ranks; device, host and pid are rank 0's)."""
    global_step: int = 0
    """Env transitions trained, over every resume."""
    iteration: int = 0
    elapsed_s: float = 0.0
    """Seconds of this process's training loop (training and evaluation, not start-up)."""
    SPS: float = 0.0
    """Env steps per second of this process's training loop."""
    start_time: float | None = None
    end_time: float | None = None
    init_from: str | None = None
    """The checkpoint the policy was initialised from (``trainer.init_from``)."""
    objective_name: str | None = None
    objective_direction: str = "maximize"
    objective: float | None = None
    """The objective's final value (what the run returns to a sweeper)."""
    best_objective: float | None = None
    """The objective of ``checkpoints/best.pt``, and the step of that evaluation."""
    best_objective_step: int | None = None
    best_eval_success_rate: float | None = None
    """The highest evaluation success rate, and its step (None for a task without success)."""
    best_eval_step: int | None = None
    best_fresh: dict[str, Any] | None = None
    """``best.pt`` evaluated once more when the run completed, on start states no evaluation during training used
    (``trainer.fresh_eval``): ``{"checkpoint", "global_step", "seed", "episodes", "deterministic", "metrics":
    {name: {"mean", "std", "ci95_low", "ci95_high", "n"}}}`` with the names of ``eval/`` (``success_rate``, ...);
    ``{"error": ...}`` when that evaluation failed (the run is still ``completed``)."""
    final: dict[str, float] = field(default_factory=dict)
    """The last logged row of training metrics and of evaluation metrics, merged."""
    checkpoints: dict[str, str] = field(default_factory=dict)
    """``{"latest": path, "best": path}`` of the checkpoints there are."""

    @property
    def best_fresh_objective(self) -> dict[str, float] | None:
        """The objective's entry of ``best_fresh["metrics"]`` (``mean``, ``ci95_low``, ...); None without a fresh
        score or for an objective that is no ``eval/`` metric."""
        if not self.best_fresh or not (self.objective_name or "").startswith("eval/"):
            return None
        return self.best_fresh.get("metrics", {}).get(self.objective_name.removeprefix("eval/"))

    @property
    def exit_code(self) -> int:
        """The process exit status for this run: 0 completed or pruned, 128 + the signal's number when stopped by
        one, else 1."""
        if self.status in STOPPED and self.signal:
            return signal_exit_code(self.signal)
        return 0 if self.status in ("completed", "pruned") else 1

    def write(self, run_dir: str | os.PathLike) -> Path:
        """Write ``<run_dir>/summary.json`` atomically and return its path.

        Raises:
            OSError: it cannot be written.
        """
        return write_json(Path(run_dir) / "summary.json", dataclasses.asdict(self))

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> RunSummary | None:
        """The summary in ``run_dir``; None when there is none, status ``unreadable`` when it cannot be parsed."""
        path = Path(run_dir) / "summary.json"
        if not path.is_file():
            return None
        try:
            return _from_dict(cls, json.loads(path.read_text()))
        except (ValueError, TypeError) as err:
            return cls(status="unreadable", error=f"{path}: {err}")


@dataclass
class JobRecord:
    """What a launcher alone knows of one job of a sweep; one JSON line in ``<sweep dir>/launcher.jsonl``.

    ``status`` and ``error`` say how the job ended as the launcher saw it:
    ``completed``, ``failed`` (the task raised, or its worker process died),
    ``interrupted`` (a forwarded stop signal reached the job before a trainer
    could handle it) or ``aborted`` (the launcher killed its worker). A run's
    own ``summary.json``, where it wrote one, says more.
    """

    job: int
    """Hydra's job number (``hydra.job.num``)."""
    status: str
    error: str | None = None
    signal: str | None = None
    """The stop signal's name when one stopped the job (the sweep's, for a job the launcher killed)."""
    traceback: str | None = None
    slot: int | None = None
    device: str | None = None
    """The slot's device as the machine numbers it (``cuda:3``) or ``cpu``."""
    cuda_visible_devices: str | None = None
    num_threads: int | None = None
    pid: int | None = None
    start_time: float | None = None
    end_time: float | None = None
    wall_s: float | None = None
    """Seconds from the job's start in its worker to its end, start-up included."""

    def append(self, sweep_dir: str | os.PathLike) -> None:
        """Add this record as one line to ``<sweep_dir>/launcher.jsonl`` (flushed and fsynced).

        Raises:
            OSError: the file cannot be written.
        """
        path = Path(sweep_dir) / JOB_RECORDS
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dataclasses.asdict(self)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def read_all(cls, sweep_dir: str | os.PathLike) -> dict[int, JobRecord]:
        """The records of ``sweep_dir`` by job number (the last one of a job wins; a torn line is skipped)."""
        path = Path(sweep_dir) / JOB_RECORDS
        records: dict[int, JobRecord] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = _from_dict(cls, json.loads(line))
                except (ValueError, TypeError):  # a line torn by a kill
                    continue
                records[record.job] = record
        return records
