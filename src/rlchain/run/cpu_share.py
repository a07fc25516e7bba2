"""A run on CPUs that other processes share: train on the cores they leave free (``trainer.adapt_threads``).

torch's CPU kernels run on OpenMP threads, one per core by default, that spin a while when they wait for each
other. Beside one other busy process on a 2-core machine that spinning takes the main job from 42k to 11k env
steps/s (26%), where one thread alone keeps 33k (benchmarks/README.md, ``benchmarks/shared_cpu.py``). After each
iteration :class:`CpuShare` reads how busy the run's CPUs were (Linux's ``/proc/stat``, the CPUs of the process's
affinity) less the process's own CPU time, and sets torch's thread count to the CPUs the others left
(:func:`threads_for`), saying so in one line the first time it trains on fewer. Where nothing else runs, the
count stays what it was.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from rlchain.console import notice

__all__ = ["CpuShare", "threads_for"]

_STAT = Path("/proc/stat")


def threads_for(cpus: int, others_busy: float, most: int) -> int:
    """The threads to train on: the ``cpus`` of the process less those ``others_busy`` (cores' worth, rounded
    half up), at least 1 and at most ``most`` (the thread count the run started with)."""
    return max(1, min(most, cpus - int(others_busy + 0.5)))


class CpuShare:
    """Train on the CPUs other processes leave free; see the module docstring.

    Args:
        enabled: ``trainer.adapt_threads``.
        device: the run's device; a CUDA run is left alone (its host threads wait on the GPU).

    Attributes:
        active: whether it adapts: enabled, on the CPU, more than one thread, and ``/proc/stat`` readable.
    """

    def __init__(self, enabled: bool, device: torch.device) -> None:
        self.most = torch.get_num_threads()
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.active = enabled and device.type == "cpu" and self.most > 1 and self.readable()
        self._said = False
        self._last = self._sample() if self.active else None

    @staticmethod
    def readable() -> bool:
        """Whether this machine tells how busy the process's CPUs are (Linux's ``/proc/stat``, two CPUs or more)."""
        return hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) > 1 and _STAT.exists()

    def _sample(self) -> tuple[float, float, float]:
        """``(wall s, busy CPU s of the process's CPUs, the process's own CPU s)`` now."""
        ticks = os.sysconf("SC_CLK_TCK")
        busy = 0
        wanted = {f"cpu{i}" for i in self.cpus}
        for line in _STAT.read_text().splitlines():
            name, *fields = line.split()
            if name in wanted:  # user nice system idle iowait irq softirq steal ...
                values = [int(v) for v in fields[:8]]
                busy += sum(values) - values[3] - values[4]
        return time.perf_counter(), busy / ticks, time.process_time()

    def update(self) -> None:
        """After an iteration: set the thread count for what the other processes kept busy since the last call."""
        if not self.active:
            return
        now = self._sample()
        wall, busy, own = (b - a for a, b in zip(self._last, now))
        self._last = now
        if wall <= 0:
            return
        others = max(0.0, (busy - own) / wall)
        threads = threads_for(len(self.cpus), others, self.most)
        if threads == torch.get_num_threads():
            return
        torch.set_num_threads(threads)
        if threads < self.most and not self._said:
            self._said = True
            notice(
                f"other processes keep {others:.1f} of this run's {len(self.cpus)} CPUs busy: training on {threads} "
                f"of its {self.most} threads while they do (trainer.adapt_threads=false keeps {self.most})"
            )

    def close(self) -> None:
        """Give torch back the thread count the run started with."""
        if self.active and torch.get_num_threads() != self.most:
            torch.set_num_threads(self.most)
