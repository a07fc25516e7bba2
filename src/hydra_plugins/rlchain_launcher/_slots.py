"""Device slots of the devices launcher: which devices a sweep uses and how many threads each job gets.

A slot is one device (a CUDA id, or the CPU) and a thread budget; the pool
(:mod:`._pool`) gives each slot one worker process. ``hydra.launcher.devices``
is checked here when the first batch launches: a CUDA id the launcher cannot
see (:func:`resolve_devices`) raises :class:`~.config.LauncherConfigError`,
which Hydra prints in one line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import ListConfig, OmegaConf


class LauncherConfigError(CompactHydraException):
    """A ``hydra.launcher.*`` value the devices launcher rejects (printed without traceback)."""


#: The environment variable a worker reads the number of slots sharing its device from.
SHARING = "RLCHAIN_SLOTS_ON_DEVICE"


@dataclass(frozen=True)
class Slot:
    """One place a job can run: a device and a thread budget.

    Attributes:
        index: slot number, 0 .. devices // devices_per_job * jobs_per_device - 1.
        device: ``"cpu"``, or the CUDA id(s) written to ``CUDA_VISIBLE_DEVICES`` (``"0,1"`` for a job of two).
        num_threads: torch intra-op / OpenMP / MKL threads of each of the job's processes.
        ranks: processes of each job (``devices_per_job``): one multi-process run.
        sharing: the slots on its device (``jobs_per_device``): a population plans at most its share of the
            device's memory (its worker reads :data:`SHARING`; :func:`rlchain.run.population.free_memory`).
    """

    index: int
    device: str
    num_threads: int
    ranks: int = 1
    sharing: int = 1

    @property
    def label(self) -> str:
        """``"cpu"`` or ``"cuda:<id>"`` with the id as the machine numbers it."""
        return "cpu" if self.device == "cpu" else f"cuda:{self.device}"

    def environ(self) -> dict[str, str]:
        """The environment a worker of this slot runs its jobs in: its GPU, its CPU threads (read by torch,
        OpenMP and MKL when they start) and the slots sharing its device."""
        threads = str(self.num_threads)
        return {
            "CUDA_VISIBLE_DEVICES": "" if self.device == "cpu" else self.device,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            SHARING: str(self.sharing),
        }


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def exported_threads() -> int | None:
    """The ``OMP_NUM_THREADS`` exported to the launcher's process, or None where it is unset or empty.

    Raises:
        LauncherConfigError: a value that is not an integer >= 1 (naming it and
            ``hydra.launcher.threads_per_job``, which would use it).
    """
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise LauncherConfigError(
            f"OMP_NUM_THREADS={value!r}, exported to the launcher, is not allowed with "
            "hydra.launcher.threads_per_job='auto', which gives it to every job: expected an "
            "integer >= 1 (or unset it, or set threads_per_job)"
        )
    return int(value)


def visible_cuda_devices() -> list[str]:
    """The CUDA devices this process can hand to a worker, named as ``CUDA_VISIBLE_DEVICES`` takes them.

    With ``CUDA_VISIBLE_DEVICES`` set in the launcher's environment, its
    entries (as many as CUDA accepts); otherwise ``"0" .. "<count - 1>"`` as
    ``nvidia-smi`` numbers the devices; ``[]`` without CUDA. Asks
    ``torch.cuda.device_count()``, which counts through NVML where it can and
    does not initialise CUDA in torch either way (workers are started with
    ``spawn``, so a worker's own ``CUDA_VISIBLE_DEVICES`` decides what it sees).
    """
    import torch

    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


def resolve_devices(devices: Any, visible: Sequence[str] | None = None) -> list[str]:
    """Turn ``hydra.launcher.devices`` into a list of device ids.

    Args:
        devices: ``"auto"``: every visible CUDA device, or ``["cpu"]`` when
            there is none; or a list of entries: ``cpu``, CUDA ids as
            ``nvidia-smi`` numbers them (integers), UUIDs or MIG ids.
        visible: the CUDA devices the launcher can hand out (see
            :func:`visible_cuda_devices`, asked when None). An integer id
            must be one of them: with ``CUDA_VISIBLE_DEVICES=2,3`` in the
            launcher's environment, ``[2]`` is allowed and ``[0]`` is not. A
            UUID or MIG id is written through unchecked while any CUDA device
            is visible.

    Raises:
        LauncherConfigError: not ``auto`` nor a non-empty list of distinct ids
            (non-negative integers, id strings or ``cpu``), or a CUDA id that
            is not visible, naming the visible devices.
    """
    allowed = "expected 'auto' or a list of CUDA device ids such as [0,1,3] (or [cpu])"
    if isinstance(devices, str) and devices.strip() == "auto":
        ids = list(visible_cuda_devices() if visible is None else visible)
        return ids or ["cpu"]
    if isinstance(devices, ListConfig):
        devices = OmegaConf.to_container(devices)
    if isinstance(devices, int) and not isinstance(devices, bool):
        devices = [devices]
    if not isinstance(devices, (list, tuple)) or not devices:
        raise LauncherConfigError(f"hydra.launcher.devices={devices!r} is not allowed: {allowed}")
    ids = []
    for entry in devices:
        if isinstance(entry, bool) or not isinstance(entry, (int, str)) or (isinstance(entry, int) and entry < 0):
            raise LauncherConfigError(f"hydra.launcher.devices={devices!r} is not allowed: entry {entry!r}; {allowed}")
        text = str(entry).strip()
        if not text or "," in text:
            raise LauncherConfigError(f"hydra.launcher.devices={devices!r} is not allowed: entry {entry!r}; {allowed}")
        ids.append(str(int(text)) if text.isdigit() else "cpu" if text.lower() == "cpu" else text)
    if len(set(ids)) != len(ids):
        raise LauncherConfigError(
            f"hydra.launcher.devices={devices!r} is not allowed: a device is listed twice; "
            "use hydra.launcher.jobs_per_device to run several jobs on one device"
        )
    cuda = [i for i in ids if i != "cpu"]
    if cuda:
        visible = list(visible_cuda_devices() if visible is None else visible)
        missing = [i for i in cuda if (i.isdigit() and i not in visible) or not visible]
        if missing:
            what = f"CUDA device {missing[0]} is" if len(missing) == 1 else f"CUDA devices {', '.join(missing)} are"
            if not visible:
                seen = "none (use [cpu] or auto)"
            elif "CUDA_VISIBLE_DEVICES" in os.environ:
                seen = f"{', '.join(visible)} (the launcher's CUDA_VISIBLE_DEVICES)"
            else:
                seen = f"{', '.join(visible)} (as nvidia-smi numbers them)"
            raise LauncherConfigError(
                f"hydra.launcher.devices={devices!r} is not allowed: {what} not visible; visible CUDA devices: {seen}"
            )
    return ids


def make_slots(
    devices: Any,
    jobs_per_device: int,
    threads_per_job: Any,
    devices_per_job: int = 1,
    visible: Sequence[str] | None = None,
) -> list[Slot]:
    """Slots for ``devices`` x ``jobs_per_device``, ordered round-robin over the devices.

    The round-robin order makes the first jobs of a sweep land on distinct
    devices. With ``devices_per_job`` > 1 the CUDA devices go to jobs in
    consecutive groups of that many (``[0,1,2,3]`` by 2: ``0,1`` and
    ``2,3``), and a CPU slot runs that many processes. ``threads_per_job="auto"``
    gives every process the ``OMP_NUM_THREADS`` exported to the launcher
    (:func:`exported_threads`), else shares the usable cores evenly over every
    process (at least one thread each). The other settings are checked already
    (:class:`~.config.DevicesLauncherConf`). ``visible``: see :func:`resolve_devices`.

    Raises:
        LauncherConfigError: see :func:`resolve_devices` and :func:`exported_threads`;
            fewer CUDA devices than ``devices_per_job``, or a count it does not divide.
    """
    ids = resolve_devices(devices, visible)
    if devices_per_job > 1 and ids != ["cpu"]:
        if "cpu" in ids or len(ids) % devices_per_job:
            raise LauncherConfigError(
                f"hydra.launcher.devices_per_job={devices_per_job} is not allowed with devices {ids}: expected a "
                "number of CUDA devices that it divides (or devices=[cpu])"
            )
        ids = [",".join(ids[i : i + devices_per_job]) for i in range(0, len(ids), devices_per_job)]
    n_slots = len(ids) * jobs_per_device
    if threads_per_job != "auto":
        threads = threads_per_job
    else:
        threads = exported_threads() or max(1, usable_cpus() // (n_slots * devices_per_job))
    return [Slot(i, ids[i % len(ids)], threads, devices_per_job, jobs_per_device) for i in range(n_slots)]
