"""``hydra/launcher=devices``: run a multirun's jobs in parallel, each pinned to a device slot.

Usage::

    rlchain-train -m hydra/launcher=devices algorithm.learning_rate=3e-4,1e-3 seed=0,1,2
    rlchain-train -m hydra.launcher.devices=[0,1] hydra.launcher.jobs_per_device=4 ...

(rlchain-train selects this launcher by default.) The launcher creates
``len(devices) * jobs_per_device`` slots; a job takes a free slot, runs in
that slot's worker process with ``CUDA_VISIBLE_DEVICES`` set to the slot's
device (so ``device=auto`` resolves to ``cuda:0`` inside the job) and with
``threads_per_job`` CPU threads, and the slot takes the next job when it ends.
On a machine without CUDA, ``devices=auto`` gives ``jobs_per_device`` CPU slots.

Each job's ``summary.json`` gets a ``launcher`` record: slot, device,
``CUDA_VISIBLE_DEVICES``, threads, start and end (Unix seconds). A job that
raises is logged and recorded as failed (its traceback in its own
``summary.json`` and log) while the others go on; at the end of the batch
each failed job is listed in one line, and Hydra's sweeper then stops the
multirun with a non-zero exit status. After each batch the sweep directory's
``summary.csv`` and ``summary.md`` are rewritten (see :mod:`rlchain.report`).

Ctrl-C or SIGTERM stops the sweep: running jobs save and stop after their
iteration, no new job starts, and the multirun exits with 130 (Ctrl-C) or 143
(SIGTERM); a second signal aborts the jobs, and workers still running
``kill_after_s`` later are killed. Workers exit when the launcher dies. How
the parts fit: :mod:`hydra_plugins.rlchain_launcher`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import DictConfig


class DevicesLauncher(Launcher):
    """A Hydra launcher that runs jobs in parallel on device slots.

    Args:
        devices: ``"auto"`` or a list of CUDA ids (``[0,1,3]``) or ``[cpu]``.
        jobs_per_device: jobs that may share one device at a time (>= 1).
        threads_per_job: CPU threads of each job, ``"auto"`` or an integer >= 1.
        stagger_s: seconds between two job starts (>= 0).
        kill_after_s: seconds the running jobs get to end after a second
            Ctrl-C or SIGTERM before their workers are killed (>= 0).

    Raises:
        LauncherConfigError: a setting out of range, naming the
            ``hydra.launcher`` field, the value and what is allowed
            (devices, and whether their CUDA ids are visible, are checked at
            the first launch).
    """

    def __init__(
        self, devices: Any = "auto", jobs_per_device: int = 1, threads_per_job: Any = "auto", stagger_s: float = 0.0,
        kill_after_s: float = 30.0,
    ) -> None:  # fmt: skip
        from hydra_plugins.rlchain_launcher._devices import LauncherConfigError

        for name, value in (("stagger_s", stagger_s), ("kill_after_s", kill_after_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise LauncherConfigError(f"hydra.launcher.{name}={value!r} is not allowed: expected a number >= 0")
        self.devices, self.jobs_per_device = devices, jobs_per_device
        self.threads_per_job, self.stagger_s, self.kill_after_s = threads_per_job, float(stagger_s), float(kill_after_s)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: Callable | None = None
        self.pool = None

    def setup(self, *, hydra_context: HydraContext, task_function: Callable, config: DictConfig) -> None:
        """Keep Hydra's context, the task function and the primary config for :meth:`launch`."""
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Run one batch of jobs (numbered from ``initial_job_idx``) and return their results in order.

        The slots' worker processes start with the first batch and serve the
        later ones; they exit when Hydra lets go of this launcher (the
        multirun has ended) or at the latest when the program exits.
        """
        import weakref

        from hydra_plugins.rlchain_launcher._devices import make_slots
        from hydra_plugins.rlchain_launcher._launch import launch
        from hydra_plugins.rlchain_launcher._pool import DevicePool

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        if self.pool is None:
            slots = make_slots(self.devices, self.jobs_per_device, self.threads_per_job)
            self.pool = DevicePool(slots, self.stagger_s, self.kill_after_s)
            weakref.finalize(self, self.pool.shutdown)  # also runs at exit; atexit alone kept them to the end
        return launch(self.pool, self.config, self.hydra_context, self.task_function, job_overrides, initial_job_idx)
