"""Settings of the ``devices`` launcher, registered as ``hydra/launcher=devices``: their one home.

No ``from __future__ import annotations`` here: Hydra's plugin scan executes
this module outside ``sys.modules``, where dataclasses cannot resolve string
annotations.
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

# Defined in a module the plugin scan does not execute, so that it stays one class (see the package docstring).
from hydra_plugins.rlchain_launcher._slots import LauncherConfigError


def _not_allowed(name: str, value: Any, expected: str) -> LauncherConfigError:
    return LauncherConfigError(f"hydra.launcher.{name}={value!r} is not allowed: expected {expected}")


@dataclass
class DevicesLauncherConf:
    """Settings of :class:`~hydra_plugins.rlchain_launcher.devices_launcher.DevicesLauncher`.

    Creating one checks every value but ``devices`` (whose CUDA ids are
    checked against the visible devices when the first batch launches).

    Raises:
        LauncherConfigError: naming the ``hydra.launcher`` field, the value and what is allowed.
    """

    _target_: str = "hydra_plugins.rlchain_launcher.devices_launcher.DevicesLauncher"
    devices: Any = "auto"
    """``auto`` (every visible CUDA device, or the CPU when there is none), or a
    list of CUDA device ids as ``nvidia-smi`` numbers them (``[0,1,3]``; UUIDs
    and MIG ids are written through), or ``[cpu]``."""
    jobs_per_device: int = 1
    """Jobs that may run at once on one device (an integer >= 1); slots = devices x jobs_per_device."""
    devices_per_job: int = 1
    """Processes of each job (an integer >= 1): a job with more than one trains one run over that many ranks, as
    ``torchrun --nproc_per_node`` would start them, each on a device of its own (CUDA: consecutive groups of
    ``devices``, slots = devices // devices_per_job x jobs_per_device) or, on the CPU, sharing the slot."""
    threads_per_job: Any = "auto"
    """Torch/OpenMP/MKL CPU threads of each job's process(es), set as its ``OMP_NUM_THREADS`` and
    ``MKL_NUM_THREADS``: ``auto`` = the ``OMP_NUM_THREADS`` exported to the launcher where there is one, else
    usable cores // (slots x devices_per_job) (at least 1); or an integer >= 1 (it wins over an exported one)."""
    stagger_s: float = 0.0
    """Seconds to wait between two job starts (>= 0; spreads start-up load)."""
    kill_after_s: float = 30.0
    """Seconds the running jobs get to end after a second Ctrl-C or SIGTERM
    (the trainer aborts at once) before the launcher kills their workers (>= 0)."""

    def __post_init__(self) -> None:
        def integer(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= 1

        for name in ("jobs_per_device", "devices_per_job"):
            if not integer(getattr(self, name)):
                raise _not_allowed(name, getattr(self, name), "an integer >= 1")
        if self.threads_per_job != "auto" and not integer(self.threads_per_job):
            raise _not_allowed("threads_per_job", self.threads_per_job, "'auto' or an integer >= 1")
        for name in ("stagger_s", "kill_after_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise _not_allowed(name, value, "a number >= 0")


ConfigStore.instance().store(group="hydra/launcher", name="devices", node=DevicesLauncherConf, provider="rlchain")


@dataclass
class PopulationLauncherConf(DevicesLauncherConf):
    """Settings of :class:`~hydra_plugins.rlchain_launcher.population_launcher.PopulationLauncher`
    (``hydra/launcher=population``): the devices launcher's slots, each training one population at a time in its
    worker process, and ``max_members``.

    Raises:
        LauncherConfigError: a devices launcher setting out of range; ``devices_per_job`` other than 1 (a
            population trains in one process); ``max_members`` not None or an integer >= 1.
    """

    _target_: str = "hydra_plugins.rlchain_launcher.population_launcher.PopulationLauncher"
    max_members: Any = None
    """The most members of one population (an integer >= 1): more jobs of one shape form several populations, in
    job order; None: no cap (refused before its first step, naming the largest that fits, where the device's
    memory does not hold it). Either way a batch's jobs of one shape are split evenly into as many populations as
    keep every slot busy."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.devices_per_job != 1:
            raise _not_allowed("devices_per_job", self.devices_per_job, "1 (a population trains in one process)")
        value = self.max_members
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise _not_allowed("max_members", value, "None or an integer >= 1")


ConfigStore.instance().store(group="hydra/launcher", name="population", node=PopulationLauncherConf, provider="rlchain")
