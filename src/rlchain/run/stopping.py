"""Stopping a run on request: SIGINT, SIGTERM and, inside a submitit job, its requeue signal.

The first stop signal lets the current iteration end; the trainer then saves
``latest.pt`` and writes ``summary.json`` with ``status="interrupted"``. A
second one aborts at once (:class:`Abort`; the last checkpoint stands).
Inside a job of Hydra's submitit launcher (``hydra/launcher=slurm``), submitit
announces a time limit or a preemption with its own signal, which its handler
answers by requeueing the job and exiting wherever the run is; here that
signal stops the run like SIGTERM, and ``rlchain-train`` hands it back to
submitit's handler once the run has saved (:func:`requeue_signal`). Such a
requeued job runs again in its own job directory and goes on from its own
``latest.pt`` (:func:`in_submitit_job`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from rlchain.console import notice
from rlchain.run.summary import STOP_SIGNALS

__all__ = ["Abort", "StopSignals", "in_submitit_job", "requeue_signal"]


class Abort(BaseException):
    """Raised by a second stop signal: leave the iteration at once (a ``BaseException``, like ``KeyboardInterrupt``)."""


def in_submitit_job() -> bool:
    """Whether this process runs a job of submitit (which sets ``SUBMITIT_EXECUTOR`` in it)."""
    return "SUBMITIT_EXECUTOR" in os.environ


def requeue_signal() -> signal.Signals | None:
    """Inside a submitit job, the signal by which submitit announces a time limit or a preemption; else None.

    SIGUSR2, or ``SIG$SUBMITIT_PREEMPT_SIGNAL`` where submitit sets that variable.
    """
    if not in_submitit_job():
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


class StopSignals:
    """Catches the stop signals while a run trains (``with StopSignals() as stop:``).

    The first sets :attr:`received` (the run ends after its iteration) and
    says so in one line; a second raises :class:`Abort`, unless
    ``abort_on_repeat`` is False: a rank of a multi-process run, whose
    signal may come twice (from SLURM and from torchrun, which forwards
    what it gets and kills its ranks 30 s later), stops after the iteration
    whatever follows. Signals are caught only in the main thread (elsewhere
    this is a no-op); leaving the block restores the previous handlers.
    """

    def __init__(self, abort_on_repeat: bool = True) -> None:
        self.abort_on_repeat = abort_on_repeat
        requeue = requeue_signal()
        self.signals = STOP_SIGNALS if requeue is None else (*STOP_SIGNALS, requeue)
        self.received: str | None = None
        """The name of the first stop signal received (``"SIGINT"``), or None."""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in self.signals}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Ignore the stop signals inside the block (while the run's summary and logs are written)."""
        caught = list(self._previous)
        for s in caught:
            signal.signal(s, signal.SIG_IGN)
        try:
            yield
        finally:
            for s in caught:
                signal.signal(s, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:  # pragma: no cover - exercised via subprocess
        name = signal.Signals(signum).name
        if self.received is not None:
            if not self.abort_on_repeat:
                return
            raise Abort(name)
        self.received = name
        print(file=sys.stderr)  # off the line a progress bar may be drawing
        if self.abort_on_repeat:
            notice(
                f"{name}: stopping after this iteration (checkpoint and logs are kept); send it again to abort at once"
            )
        else:
            notice(f"{name}: every rank stops after this iteration (checkpoint and logs are kept)")
