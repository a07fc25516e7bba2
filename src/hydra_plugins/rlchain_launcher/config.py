"""Config schema of the ``devices`` launcher, registered as ``hydra/launcher=devices``.

No ``from __future__ import annotations`` here: Hydra's plugin scan executes
this module outside ``sys.modules``, where dataclasses cannot resolve string
annotations.
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class DevicesLauncherConf:
    """Settings of :class:`~hydra_plugins.rlchain_launcher.devices_launcher.DevicesLauncher`."""

    _target_: str = "hydra_plugins.rlchain_launcher.devices_launcher.DevicesLauncher"
    devices: Any = "auto"
    """``auto`` (every visible CUDA device, or the CPU when there is none), or a
    list of CUDA device ids as ``nvidia-smi`` numbers them (``[0,1,3]``; UUIDs
    and MIG ids are written through), or ``[cpu]``."""
    jobs_per_device: int = 1
    """Jobs that may run at once on one device; slots = devices x jobs_per_device."""
    threads_per_job: Any = "auto"
    """Torch/OpenMP CPU threads of each job: ``auto`` = usable cores // slots (at
    least 1), or an integer."""
    stagger_s: float = 0.0
    """Seconds to wait between two job starts (spreads start-up load)."""
    kill_after_s: float = 30.0
    """Seconds the running jobs get to end after a second Ctrl-C or SIGTERM
    (the trainer aborts at once) before the launcher kills their workers."""


ConfigStore.instance().store(group="hydra/launcher", name="devices", node=DevicesLauncherConf, provider="rlchain")
