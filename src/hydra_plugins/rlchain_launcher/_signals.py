"""Ctrl-C and SIGTERM during a sweep: what the launcher does at each.

Workers run in their own process group, so Ctrl-C at the terminal reaches the
launcher only. The first SIGINT or SIGTERM the launcher gets is forwarded to
the busy workers (rlchain's trainer then finishes its iteration, saves
``latest.pt`` and records ``interrupted`` with the signal) and no new job
starts; once the running jobs have stopped the multirun exits with 128 + that
first signal's number (130 for Ctrl-C, 143 for SIGTERM). A second signal is
forwarded too (the trainer aborts at once, ``aborted``); a worker whose job
has not ended ``kill_after_s`` seconds later, or at a third signal, is killed
(SIGKILL) and its job recorded as aborted. :class:`StopSignals` is that policy;
the pool (:mod:`._pool`) carries it out.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from rlchain.run.summary import STOP_SIGNALS, signal_exit_code

#: Stop signals forwarded to a running job: the first (stop after the iteration) and the second (abort).
FORWARDED = 2


class StopSignals:
    """The stop signals the launcher received during a batch, and its answer to each.

    Args:
        kill_after_s: seconds the running jobs get to end after a second
            stop signal before their workers are killed.
    """

    def __init__(self, kill_after_s: float) -> None:
        self.kill_after_s = kill_after_s
        self.received: list[int] = []
        """The stop signals received, in order (the handler only appends: no reentrant writes)."""
        self._announced = 0
        self._kill_at: float | None = None
        self._kill_reason = ""

    @property
    def first(self) -> int | None:
        """The first SIGINT/SIGTERM received (the sweep stops), or None."""
        return self.received[0] if self.received else None

    @property
    def exit_code(self) -> int:
        """128 + the first stop signal's number (130 Ctrl-C, 143 SIGTERM); 0 when none came."""
        return signal_exit_code(self.received[0]) if self.received else 0

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

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received.append(signum)

    def announce(self) -> None:
        """Say in one line what each stop signal received since the last call does, and schedule the kill."""
        while self._announced < len(self.received):
            name = signal.Signals(self.received[self._announced]).name
            self._announced += 1
            if self._announced == 1:
                message = (
                    f"{name}: stopping the sweep: running jobs save and stop after their iteration, "
                    "no new job starts; Ctrl-C (or SIGTERM) again aborts them"
                )
            elif self._announced == 2:
                self._kill_at = time.monotonic() + self.kill_after_s
                self._kill_reason = f"it had not stopped {self.kill_after_s:g} s after the second stop signal ({name})"
                message = (
                    f"{name} again: the running jobs abort now (no new checkpoint); a worker still running "
                    f"in {self.kill_after_s:g} s is killed"
                )
            else:
                self._kill_at = time.monotonic()
                self._kill_reason = f"a third stop signal ({name}) came"
                message = f"{name} a third time: killing the running jobs' workers now"
            print(f"\nrlchain: {message}", file=sys.stderr, flush=True)

    def to_forward(self, sent: int) -> list[int]:
        """The signals still to send to a running job that has been sent ``sent`` of them."""
        return self.received[sent:FORWARDED]

    def kill_reason(self) -> str | None:
        """Why the running jobs' workers are to be killed now, or None while they are not."""
        if self._kill_at is not None and time.monotonic() >= self._kill_at:
            return self._kill_reason
        return None
