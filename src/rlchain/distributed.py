"""One run over several processes (``torchrun``): its ranks, their collectives and their faults.

``torchrun --nproc_per_node=N -m rlchain.commands.train ...`` (or the devices
launcher's ``hydra.launcher.devices_per_job``, or a submitit job of several
tasks, :func:`from_environment`) starts one process per rank
with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` set. :func:`setup` joins them into one process group: NCCL
with ``cuda:<LOCAL_RANK>`` on CUDA, gloo on the CPU (or when ranks share one
GPU). Each rank then steps its own envs (:func:`rank_seed` seeds them
apart) into its own rollout; the policy is the same on every rank:
broadcast from rank 0 at the start, and changed only by updates whose
gradients are averaged over the ranks (PyTorch DDP's rule: the mean of
the ranks' minibatch gradients; Li et al. 2020, "PyTorch Distributed"). For
PPO that is the gradient of the ranks' minibatches together; GRPO's masked
losses are means over each rank's live samples, which the average weighs
alike. The algorithms' other statistics (:func:`moments`, sums) are taken
over every rank's samples, so those functions are collectives: every rank
must call them.

Under NCCL a collective only queues work on the GPU; ``setup`` sets
``TORCH_NCCL_BLOCKING_WAIT=1`` (unless set) so that one that does not
complete raises in Python, after ``trainer.dist_timeout_s``, as under gloo.
The fault handling is tested with gloo only.

Every collective rlchain runs goes through :meth:`World.collective`, which
turns a collective that fails into one :class:`CollectiveError` naming the
collective and the rank that caused it: a rank that failed (its own error,
left in the process group's store by :meth:`World.report_failure`), a rank
that ended, or a rank that did not join within ``trainer.dist_timeout_s``
(with where each rank last was, from :meth:`World.at`).

A process that torchrun did not start (no ``WORLD_SIZE``, or 1) is a
single-process run: :func:`world` is then a :class:`World` of one rank, whose
collectives return their input and touch nothing of ``torch.distributed``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rlchain.console import notice
from rlchain.utils import MAX_SEED

__all__ = ["CollectiveError", "World", "from_environment", "rank_seed", "setup", "shutdown", "world"]

#: Added once per rank to a run's seeds (the golden-ratio constant of Knuth's multiplicative hashing): rank r's
#: seeds lie far from rank 0's and from ``seed + 1`` (evaluation) and ``seed + 2**31`` (the fresh evaluation).
RANK_SEED_STRIDE = 0x9E3779B1
_FAILED, _AT = "rlchain/failed/", "rlchain/at/"


class CollectiveError(RuntimeError):
    """A collective of a multi-process run that did not complete; the message names the collective and the rank."""


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank`` for a run seeded ``seed``: ``seed`` itself on rank 0 (a one-process run is unchanged).

    ``(seed + rank * RANK_SEED_STRIDE) mod 2**32``: distinct for up to 2**32 ranks.
    """
    return (int(seed) + int(rank) * RANK_SEED_STRIDE) % (MAX_SEED + 1)


def from_environment() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's variables; ``(0, 1, 0)`` in a process it did not start.

    A task of a submitit job of several tasks (``hydra/launcher=slurm`` with
    ``tasks_per_node`` or ``nodes`` > 1) first sets them, as torchrun would,
    with submitit's ``TorchDistributedEnvironment`` (rank 0's node is the
    rendezvous host; every task sees its node's GPUs).
    """
    if "RANK" not in os.environ and "SUBMITIT_EXECUTOR" in os.environ:
        from submitit import JobEnvironment
        from submitit.helpers import TorchDistributedEnvironment

        if JobEnvironment().num_tasks > 1:
            TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


@dataclass
class World:
    """The ranks of one run, as this process sees them.

    Attributes:
        rank: this process's rank, 0 .. world_size - 1 (rank 0 evaluates, logs and writes every file).
        world_size: processes of the run (1: a single-process run; no collective touches torch.distributed).
        local_rank: rank among the processes of this machine (its CUDA device under NCCL).
        timeout_s: seconds a collective waits for the other ranks (``trainer.dist_timeout_s``).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    timeout_s: float = 600.0
    store: Any = None
    iteration: int = 0
    phase: str = "start"

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the one that evaluates, logs and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether the run has more than one process."""
        return self.world_size > 1

    # ------------------------------------------------------------ faults
    def at(self, iteration: int, phase: str) -> None:
        """Record where this rank is (``iteration``, ``phase``: collect, update, ...) for the timeout's message."""
        self.iteration, self.phase = iteration, phase
        if self.store is not None:
            with contextlib.suppress(
                Exception
            ):  # the store's host (rank 0 or torchrun) is gone: the next collective says so
                self.store.set(f"{_AT}{self.rank}", f"iteration {iteration}, {phase}")

    def report_failure(self, error: str) -> None:
        """Leave this rank's one-line ``error`` where the other ranks' failed collectives will read it."""
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.set(f"{_FAILED}{self.rank}", error)

    def _read(self, prefix: str) -> dict[int, str]:
        """``{rank: value}`` of the store keys ``prefix<rank>`` that are set ({} when the store is gone)."""
        found = {}
        for rank in range(self.world_size):
            key = f"{prefix}{rank}"
            with contextlib.suppress(Exception):
                if rank != self.rank and self.store.check([key]):
                    found[rank] = self.store.get(key).decode()
        return found

    def explain(self, name: str, err: BaseException) -> CollectiveError:
        """The :class:`CollectiveError` for collective ``name`` that failed with ``err`` on this rank."""
        failed = self._read(_FAILED)
        if failed:
            rank, error = min(failed.items())
            return CollectiveError(f"rank {rank} failed: {error}")
        here = f"iteration {self.iteration}, {self.phase}"
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "timed out" in str(err).lower() or "timeout" in str(err).lower():
            behind = {rank: at for rank, at in self._read(_AT).items() if at != here}
            if behind:
                who = "; ".join(f"rank {rank} was last at {at}" for rank, at in sorted(behind.items()))
                ranks = ", ".join(str(rank) for rank in sorted(behind))
                what = f"rank {ranks} did not join it ({who})"
            else:
                what = "another rank did not join it"
            return CollectiveError(
                f"{name} did not complete within trainer.dist_timeout_s={self.timeout_s:g} on "
                f"rank {self.rank} ({here}): {what}"
            )
        return CollectiveError(f"{name} failed on rank {self.rank} ({here}): another rank ended ({text})")

    @contextlib.contextmanager
    def collective(self, name: str) -> Iterator[None]:
        """Run the collective(s) of the block; raise :class:`CollectiveError` naming ``name`` when one fails."""
        try:
            yield
        except CollectiveError:
            raise
        except (RuntimeError, torch.distributed.DistError) as err:
            raise self.explain(name, err) from err

    # ------------------------------------------------------- collectives
    def broadcast_(self, tensors: Iterable[torch.Tensor], name: str) -> None:
        """Overwrite ``tensors`` (same shapes and dtypes on every rank) with rank 0's, in place."""
        if not self.distributed:
            return
        with self.collective(name), torch.no_grad():
            for tensor in tensors:
                torch.distributed.broadcast(tensor, src=0)

    def average_(self, tensors: list[torch.Tensor], name: str) -> None:
        """Replace each of ``tensors`` (floating, same shapes on every rank) by its mean over the ranks, in place.

        One all-reduce of the tensors flattened into one buffer.
        """
        if not self.distributed or not tensors:
            return
        with self.collective(name), torch.no_grad():
            flat = torch.cat([t.reshape(-1) for t in tensors])
            torch.distributed.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for t in tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """The sum of ``tensor`` over the ranks (a new tensor; ``tensor`` itself on one rank)."""
        if not self.distributed:
            return tensor
        total = tensor.detach().clone()
        with self.collective(name):
            torch.distributed.all_reduce(total)
        return total

    def max(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """The elementwise maximum of ``tensor`` over the ranks (a new tensor; ``tensor`` itself on one rank)."""
        if not self.distributed:
            return tensor
        top = tensor.detach().clone()
        with self.collective(name):
            torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX)
        return top

    def mean(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """The mean of ``tensor`` over the ranks (a new tensor; ``tensor`` itself on one rank)."""
        return self.sum(tensor, name) / self.world_size if self.distributed else tensor

    def gather(self, obj: Any, name: str) -> list[Any] | None:
        """Every rank's picklable ``obj`` on rank 0, in rank order (None on the other ranks)."""
        if not self.distributed:
            return [obj]
        gathered = [None] * self.world_size if self.main else None
        with self.collective(name):
            torch.distributed.gather_object(obj, gathered, dst=0)
        return gathered

    def share(self, obj: Any, name: str) -> Any:
        """Rank 0's picklable ``obj`` on every rank (tensors in it arrive on the CPU where rank 0 sent CPU tensors)."""
        if not self.distributed:
            return obj
        box = [obj]
        with self.collective(name):
            torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def moments(x: torch.Tensor, name: str, unbiased: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Mean and variance of the rows of ``x`` ``[B, ...]`` over every rank's rows, and the number of rows.

    Two all-reduces (the mean, then the squared deviations from it: the
    two-pass formula, exact to rounding); on one rank ``x.mean(0)`` and
    ``x.var(0, unbiased=unbiased)`` themselves. ``unbiased`` divides by
    ``count - 1``.
    """
    w = world()
    if not w.distributed:
        return x.mean(0), x.var(0, unbiased=unbiased), x.shape[0]
    count = x.shape[0] * w.world_size  # every rank has as many rows (one config)
    mean = w.sum(x.sum(0), name) / count
    var = w.sum((x - mean).square().sum(0), name) / (count - 1 if unbiased else count)
    return mean, var, count


_world = World()


def world() -> World:
    """The :class:`World` of this process: set by :func:`setup`, else a single-process one."""
    return _world


def setup(device: str, timeout_s: float) -> tuple[World, str]:
    """Join the process group of a run that torchrun started; return the world and this rank's device.

    In a process torchrun did not start, nothing happens: ``(World(), device)``.
    Otherwise ``device`` ``auto`` or ``cuda`` becomes ``cuda:<LOCAL_RANK>``
    with NCCL when this machine has a GPU per local rank; ``cuda:N`` (every
    rank on one device), or fewer GPUs than local ranks, share a GPU over
    gloo; ``cpu`` (or ``auto`` without CUDA) uses gloo.

    Args:
        device: the run's ``device`` setting.
        timeout_s: ``trainer.dist_timeout_s``: how long a collective (this
            join included) waits for the other ranks.

    Raises:
        CollectiveError: the ranks did not all join within ``timeout_s``.
    """
    global _world
    rank, world_size, local_rank = from_environment()
    if world_size <= 1:
        return World(), device
    if torch.distributed.is_initialized():
        return _world, _rank_device(device, local_rank)[0]
    device, backend = _rank_device(device, local_rank)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    if backend == "nccl":
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # a collective that times out raises here
    timeout = datetime.timedelta(seconds=timeout_s)
    joining = World(rank, world_size, local_rank, timeout_s)
    with joining.collective("the start of the process group (torchrun's rendezvous)"):
        store, _, _ = next(torch.distributed.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
        torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    _world = World(rank, world_size, local_rank, timeout_s, store)
    return _world, device


def _rank_device(device: str, local_rank: int) -> tuple[str, str]:
    """This rank's device and the process group's backend (see :func:`setup`)."""
    wants_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if wants_cuda and torch.cuda.device_count() >= local_ranks:
        return f"cuda:{local_rank}", "nccl"
    if wants_cuda:
        if local_rank == 0:
            notice(
                f"{local_ranks} ranks share {torch.cuda.device_count()} GPU(s): every rank runs on cuda:0 and "
                "the ranks talk over gloo (NCCL needs a GPU per rank)"
            )
        return "cuda:0", "gloo"
    if device.startswith("cuda:"):
        return device, "gloo"
    return "cpu", "gloo"


def shutdown(together: bool = False) -> None:
    """Leave the process group (if this process joined one); the world is a single-process one again.

    ``together``: every rank is leaving after the same work (a run that ended
    without an error): wait for the others first, so that none tears the
    group down while another still finishes its last collective.
    """
    global _world
    if torch.distributed.is_initialized():
        with contextlib.suppress(Exception):
            if together:
                torch.distributed.barrier()
            torch.distributed.destroy_process_group()
    _world = World()
