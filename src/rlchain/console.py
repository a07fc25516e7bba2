"""What a run shows on its console: one-line notices and the progress of its iterations; and its log file.

The lines a run shows (its notices, Python's warnings, its result or error
line) are also written to its log file, ``train.log`` in the run directory
(``<job>.log`` in a sweep's job directory): the file handlers of the root
logger, which Hydra's job logging sets up, receive them through
:data:`RUN_LOG`, which reaches no console handler, so the console shows each
line once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import TextIO

__all__ = ["RUN_LOG", "Progress", "error_line", "logged_warnings", "notice", "progress_info", "show"]


class _RootFiles(logging.Handler):
    """Hands each record to the file handlers of the root logger as they are at that moment (Hydra's job
    logging replaces them for each job of a sweep)."""

    def emit(self, record: logging.LogRecord) -> None:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
                handler.handle(record)


#: The run's log file, for the lines its console shows already: records go to the root logger's file handlers
#: alone (none: nowhere), never to a console.
RUN_LOG = logging.getLogger("rlchain.console")
RUN_LOG.propagate = False
RUN_LOG.setLevel(logging.INFO)
if not RUN_LOG.handlers:
    RUN_LOG.addHandler(_RootFiles())


def show(line: str, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Print ``line`` on ``stream`` (stdout by default; flushed) and write it to the run's log file at ``level``."""
    print(line, file=sys.stdout if stream is None else stream, flush=True)
    RUN_LOG.log(level, line)


def notice(text: str) -> None:
    """Show ``rlchain: <text>`` as one line on stderr (flushed), and in the run's log file: what a user must know,
    that is no failure.

    Rank 0 alone speaks for a multi-process run (torchrun's ``RANK`` and ``WORLD_SIZE``).
    """
    if os.environ.get("RANK", "0") != "0" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return
    show(f"rlchain: {text}", sys.stderr)


@contextlib.contextmanager
def logged_warnings() -> Iterator[None]:
    """Within it, each Python warning shown (on stderr, as before) is also written to the run's log file."""
    shown = warnings.showwarning

    def show_and_log(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        shown(message, category, filename, lineno, file, line)
        RUN_LOG.warning(warnings.formatwarning(message, category, filename, lineno, line).rstrip())

    warnings.showwarning = show_and_log
    try:
        yield
    finally:
        warnings.showwarning = shown


#: The terminal width (columns) from which the progress line has a bar as well as its numbers, and the bar's width.
_BAR_WIDTH, _BAR = 120, 20


def progress_info(global_step: int, row: dict[str, float], width: int | None = None) -> str:
    """The numbers of a progress line: env steps, SPS, and of the logged ``row`` the return, success rate and the
    evaluation's success rate (or return), most important last kept: where ``width`` (characters) is given, the
    parts that do not fit are left out, the training return first, then the env steps, then the training success
    rate, so that the evaluation and the SPS stay readable on an 80-column terminal."""
    parts = {"steps": f"{_short(global_step)} steps", "SPS": f"{_short(row['charts/SPS'])} SPS"}
    if "charts/episodic_return" in row:
        parts["return"] = f"return {row['charts/episodic_return']:.2f}"
    if "charts/success_rate" in row:
        parts["success"] = f"success {row['charts/success_rate']:.2f}"
    if "eval/success_rate" in row:
        parts["eval"] = f"eval success {row['eval/success_rate']:.2f}"
    elif "eval/avg_reward" in row:
        parts["eval"] = f"eval return {row['eval/avg_reward']:.2f}"
    text = " | ".join(parts.values())
    for dropped in ("return", "steps", "success"):
        if width is None or len(text) <= width:
            break
        parts.pop(dropped, None)
        text = " | ".join(parts.values())
    return text


def _short(value: float) -> str:
    """``value`` in three significant digits with a k or M suffix: 5,120,000 -> 5.12M, 45,616 -> 45.6k."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.0f}"


def _in_foreground(stream) -> bool:
    """Whether this process's group owns the terminal ``stream`` is (a shell's foreground job)."""
    try:
        return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
    except (AttributeError, OSError, ValueError):  # not a terminal, or no job control
        return True


class Progress:
    """The progress of a run's iterations: a rich bar on a terminal, else one plain line per iteration (flushed).

    On a terminal that another process group owns (a parallel job of a
    launcher, which shares the launcher's terminal; a shell's background job)
    it shows nothing: bars of several processes would garble each other.

    Args:
        total: the run's iterations.
        done: those already done (a resumed run).
        enabled: ``trainer.progress``; False shows nothing.
    """

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        from rich.console import Console

        self.total = total
        self.start, self.start_done = time.perf_counter(), done
        self._rich = None
        console = Console()
        terminal = console.is_terminal
        self.enabled = enabled and (not terminal or _in_foreground(sys.stdout))
        self._width = console.width
        if self.enabled and terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            # The counter and the numbers first, the bar only where the terminal has room to spare for it.
            bar = [BarColumn(bar_width=_BAR)] if self._width >= _BAR_WIDTH else []
            self._rich = Progress(
                TextColumn("iter"),
                MofNCompleteColumn(),
                *bar,
                TextColumn("{task.fields[info]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            self._task = self._rich.add_task("train", total=total, completed=done, info="")
            self._rich.start()

    def update(self, iteration: int, global_step: int, row: dict[str, float]) -> None:
        """Show the iteration just done, its ``global_step`` and the headline metrics of its logged ``row``."""
        if not self.enabled:
            return
        if self._rich is not None:
            room = (
                self._width
                - len(f"iter {self.total}/{self.total}  ETA 0:00:00 ")
                - (_BAR + 2 if self._width >= _BAR_WIDTH else 0)  # the bar and the spaces beside it
            )
            self._rich.update(self._task, completed=iteration, info=progress_info(global_step, row, room))
            return
        rate = (time.perf_counter() - self.start) / max(1, iteration - self.start_done)
        eta = rate * (self.total - iteration)
        print(f"iter {iteration}/{self.total} | {progress_info(global_step, row)} | ETA {eta:.0f}s", flush=True)

    def close(self) -> None:
        """Stop the bar (a no-op for plain lines)."""
        if self._rich is not None:
            self._rich.stop()


def error_line(err: BaseException | str) -> str:
    """``err`` on one line: ``<type>: <message>`` with the message's lines joined (the type alone without a
    message); a string: its lines joined."""
    text = " ".join(str(err).split())
    if isinstance(err, str):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
