"""``hydra/launcher=population``: train a multirun's jobs of one shape as one batched process.

Usage::

    rlchain-train -m seed=range(8) hydra/launcher=population
    rlchain-train -m env=push_cube algorithm.learning_rate=3e-4,1e-3 algorithm.ent_coef=0,0.01 hydra/launcher=population
    rlchain-train -m seed=range(64) hydra/launcher=population hydra.launcher.devices=[0,1,2,3]

Each batch of jobs (all of a grid; ``n_jobs`` trials of the Optuna sweeper) is composed, then split into
populations: jobs whose configs differ only in numbers that a population varies (the seed, and the algorithm's
numeric settings but those that change shapes: :data:`rlchain.core.population.SHAPE_SETTINGS`) form one; a batch
that splits into several says in one line which keys split it. The populations spread over the devices
launcher's slots (``hydra.launcher.devices``, ``jobs_per_device``, ``threads_per_job``), one population per slot
at a time: a batch's jobs of one shape are split evenly into as many populations as keep every slot busy (at most
``max_members`` each). In its slot's worker, each job of a population is built in its own run directory as Hydra
runs a job (its ``.hydra/`` config, its log), exactly as a solo job of the same sweep would be, and the members
then train side by side (:class:`rlchain.run.population.PopulationRun`). A job refused before its first step fails
alone; a member whose training fails ends alone; the launcher writes a record of each job into the sweep's
``launcher.jsonl``; Ctrl-C or SIGTERM stops every member after its iteration (each saves its ``latest.pt``), runs
the multirun-end callbacks and exits with 130 or 143, as the devices launcher does.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.rlchain_launcher.config import PopulationLauncherConf
from hydra_plugins.rlchain_launcher.devices_launcher import SlotLauncher, _log_failures

log = logging.getLogger(__name__)

#: Top-level keys whose values may differ between the members of one population (besides the algorithm's numbers).
MEMBER_KEYS = ("seed", "env.seed", "exp_name")


class PopulationLauncher(SlotLauncher):
    """A Hydra launcher that trains each batch's jobs of one shape as populations on device slots (module
    docstring).

    Args:
        settings: fields of :class:`~.config.PopulationLauncherConf` (``self.settings``).

    Raises:
        LauncherConfigError: a setting out of range, naming the ``hydra.launcher`` field, the value and what is
            allowed.
    """

    settings_class = PopulationLauncherConf
    name = "population launcher"

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Compose every job of the batch, train them as populations over the slots and return their results in
        order.

        Raises:
            SystemExit: 130 (Ctrl-C) or 143 (SIGTERM) once a stop signal has ended the members, after the
                multirun-end callbacks ran.
        """
        from hydra_plugins.rlchain_launcher._pool import Batch
        from hydra_plugins.rlchain_launcher._worker import Population

        self._start()
        jobs = [self._prepare(initial_job_idx + i, overrides) for i, overrides in enumerate(job_overrides)]
        groups, split_by = populations([job.config for job in jobs], self.settings.max_members, len(self.pool.slots))
        if len(groups) > 1:
            why = [f"split by {', '.join(split_by)} (which change shapes or code)"] if split_by else []
            if self.settings.max_members is not None:
                why.append(f"at most hydra.launcher.max_members={self.settings.max_members} each")
            if len(self.pool.slots) > 1:
                why.append(f"spread over {len(self.pool.slots)} slots")
            log.info(f"{self.name}: {len(jobs)} jobs as {len(groups)} populations, {'; '.join(why)}")
        work = iter([Population([jobs[i] for i in group], train_members) for group in groups])
        batch = Batch()
        try:
            results = dict(self._run(lambda: next(work, None), batch))
        finally:
            _log_failures([(job.idx, job.overrides) for job in jobs], batch.failed)
        return [results[job.idx] for job in jobs if job.idx in results]


def train_members(jobs: Sequence[Any], hydra_context: HydraContext) -> list[JobReturn]:
    """In a slot's worker: build each of ``jobs`` (:class:`~._worker.Job`) as Hydra runs a job, in its own run
    directory, then train those built as one population; each job's ``JobReturn``, in order.

    A member that trained to its end returns its objective; one that failed, its error; one that a stop signal
    ended, the ``SystemExit`` of its exit status (its ``summary.json`` says how it ended).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobStatus

    from hydra_plugins.rlchain_launcher._slots import SHARING
    from hydra_plugins.rlchain_launcher._worker import job_log_file, run_sweep_job
    from rlchain.commands.train import build_member, train_population
    from rlchain.console import error_line
    from rlchain.run.population import free_memory
    from rlchain.run.summary import STOPPED

    returns, built, log_files = [], [], []
    for i, job in enumerate(jobs):
        HydraConfig.instance().set_config(job.config)
        ret = run_sweep_job(job, build_member, hydra_context)
        returns.append(ret)
        if ret.status == JobStatus.COMPLETED:
            built.append(i)
            handler = job_log_file(job.output_dir)
            log_files.append(None if handler is None else handler.baseFilename)
    if not built:
        return returns
    numbers = [jobs[i].idx for i in built]
    members = [returns[i].return_value for i in built]
    free = free_memory(members[0].env.device, int(os.environ.get(SHARING) or 1))  # this slot's share of its device
    try:
        outcome = train_population(members, log_files, free)
    except Exception as err:  # noqa: BLE001 - members that cannot form one population: each job fails so
        log.error(f"population of jobs {numbers} refused: {error_line(err)}")
        for i in built:
            returns[i].status, returns[i]._return_value = JobStatus.FAILED, err
        return returns
    for i, (summary, failure) in zip(built, outcome):
        ret = returns[i]
        if failure is not None:
            ret.status, ret._return_value = JobStatus.FAILED, failure
        elif summary.status in STOPPED:
            ret.status, ret._return_value = JobStatus.FAILED, SystemExit(summary.exit_code)
        else:
            ret.return_value = summary.objective
    try:
        for i in built:
            hydra_context.callbacks.on_job_end(config=jobs[i].config, job_return=returns[i])
    except KeyboardInterrupt:  # a stop signal forwarded after every member ended: the results stand
        log.warning("a stop signal came while the sweep's tables were written: they are written again at its end")
    return returns


def populations(
    configs: Sequence[DictConfig], max_members: int | None = None, slots: int = 1
) -> tuple[list[list[int]], list[str]]:
    """The jobs ``configs`` grouped into populations: those whose composed configs differ only in
    :data:`MEMBER_KEYS` and the algorithm's numbers (but :data:`~rlchain.core.population.SHAPE_SETTINGS`) are of
    one shape; the jobs of one shape are split, in job order, into near-equal populations (sizes differ by at most
    one): as few as hold at most ``max_members`` each (None: no cap), and at least their share of ``slots``, so that
    every slot has a population to train while jobs last. Returns the populations (job positions) and the keys that
    split the shapes."""
    from rlchain.core.population import SHAPE_SETTINGS

    flat = [_flatten(OmegaConf.to_container(c, resolve=False)) for c in configs]
    keys = sorted({k for f in flat for k in f if not k.startswith("hydra.")})

    def member_key(key: str, values: list[Any]) -> bool:
        if key in MEMBER_KEYS:
            return True
        name = key.removeprefix("algorithm.")
        if name == key or name in SHAPE_SETTINGS:
            return False
        return all(
            isinstance(v, int | float) and not isinstance(v, bool) or isinstance(v, str) and "${" in v for v in values
        )

    splitting = [
        k for k in keys if len({repr(f.get(k)) for f in flat}) > 1 and not member_key(k, [f.get(k) for f in flat])
    ]
    shapes: dict[tuple, list[int]] = {}
    for i, f in enumerate(flat):
        shapes.setdefault(tuple(repr(f.get(k)) for k in splitting), []).append(i)
    groups = []
    for jobs in shapes.values():
        parts = max(
            math.ceil(len(jobs) / (max_members or len(jobs))), min(len(jobs), math.ceil(slots * len(jobs) / len(flat)))
        )
        size, extra = divmod(len(jobs), parts)
        start = 0
        for k in range(parts):
            end = start + size + (k < extra)
            groups.append(jobs[start:end])
            start = end
    return groups, splitting


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}
