"""What a run shows on its console as it trains: a progress bar, or plain lines."""

from __future__ import annotations

import time

__all__ = ["Progress"]


class Progress:
    """A rich progress bar on a terminal, else one plain line per iteration (flushed)."""

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        from rich.console import Console

        self.total, self.enabled = total, enabled
        self.start, self.start_done = time.perf_counter(), done
        self._rich = None
        if enabled and Console().is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._rich = Progress(
                TextColumn("iter"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
                TextColumn("ETA"), TimeRemainingColumn(),
            )  # fmt: skip
            self._task = self._rich.add_task("train", total=total, completed=done, info="")
            self._rich.start()

    def update(self, iteration: int, global_step: int, row: dict[str, float]) -> None:
        if not self.enabled:
            return
        info = f"step {global_step:,} | SPS {row['charts/SPS']:,.0f}"
        if "charts/episodic_return" in row:
            info += f" | return {row['charts/episodic_return']:.2f}"
        if "charts/success_rate" in row:
            info += f" | success {row['charts/success_rate']:.2f}"
        if "eval/success_rate" in row:
            info += f" | eval success {row['eval/success_rate']:.2f}"
        elif "eval/avg_reward" in row:
            info += f" | eval return {row['eval/avg_reward']:.2f}"
        if self._rich is not None:
            self._rich.update(self._task, completed=iteration, info=info)
            return
        rate = (time.perf_counter() - self.start) / max(1, iteration - self.start_done)
        eta = rate * (self.total - iteration)
        print(f"iter {iteration}/{self.total} | {info} | ETA {eta:.0f}s", flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
