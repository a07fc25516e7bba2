"""Ctrl-C and SIGTERM during a sweep: how the launcher stops its jobs, and what a stop signal is in a worker.

Workers run in their own process group, so Ctrl-C at the terminal reaches the
launcher only. The first SIGINT or SIGTERM the launcher gets is forwarded to
the busy workers (rlchain's trainer then finishes its iteration, saves
``latest.pt`` and records ``interrupted`` with the signal) and no new job
starts; once the running jobs have stopped the sweep's tables are written and
the multirun exits with 128 + that first signal's number (130 for Ctrl-C, 143
for SIGTERM). A second signal is forwarded too (the trainer aborts at once,
``aborted``); a worker whose job has not ended ``kill_after_s`` seconds later,
or at a third signal, is killed (SIGKILL) and its job recorded as aborted.
:class:`StopSignals` is that policy; the worker's side is in :mod:`._worker`.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:
    from hydra_plugins.rlchain_launcher._pool import Worker

#: Signals that stop a job: forwarded by the launcher, or sent to itself by an orphaned worker.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class JobInterrupted(KeyboardInterrupt):
    """Raised in a worker by a forwarded SIGINT or SIGTERM while no trainer handles it (e.g. as the env is built).

    Args:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
    """

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


class StopSignals:
    """The stop signals the launcher received during a batch, and its answer to each.

    Args:
        kill_after_s: seconds the running jobs get to end after a second
            stop signal before their workers are killed.
    """

    def __init__(self, kill_after_s: float = 30.0) -> None:
        self.kill_after_s = kill_after_s
        self._received: list[int] = []  # the stop signals received, in order
        self._reported = 0  # of them, those acted on (message printed, kill scheduled)
        self._kill_at: float | None = None
        self._kill_reason = ""

    @property
    def first(self) -> int | None:
        """The first SIGINT/SIGTERM received (the sweep stops), or None."""
        return self._received[0] if self._received else None

    @property
    def exit_code(self) -> int:
        """128 + the first stop signal's number (130 Ctrl-C, 143 SIGTERM); 0 when none came."""
        return 128 + self._received[0] if self._received else 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only note it: the scheduling loop prints, forwards and kills (no reentrant writes, no double sends).
        self._received.append(signum)

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
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

    def react(self, busy: Sequence[Worker]) -> None:
        """Act on the stop signals received: announce them, forward them to the ``busy`` workers, kill when due.

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
        for worker in busy:
            while worker.signals_sent < min(len(self._received), 2):
                if not worker.send(self._received[worker.signals_sent]):
                    break  # not started yet: it gets them on a later look
                worker.signals_sent += 1
            if self._kill_at is not None and time.monotonic() >= self._kill_at and worker.killed is None:
                worker.kill(self._kill_reason)
