"""``hydra/launcher=population``: train a multirun's jobs of one shape as one batched process.

Usage::

    rlchain-train -m seed=range(8) hydra/launcher=population
    rlchain-train -m env=push_cube algorithm.learning_rate=3e-4,1e-3 algorithm.ent_coef=0,0.01 hydra/launcher=population

Each batch of jobs (all of a grid; ``n_jobs`` trials of the Optuna sweeper) is composed, then split into
populations: jobs whose configs differ only in numbers that a population varies (the seed, and the algorithm's
numeric settings but those that change shapes: :data:`rlchain.core.population.SHAPE_SETTINGS`) form one; a batch
that splits into several says in one line which keys split it. Each job is built in its own run directory as
Hydra runs a job (its ``.hydra/`` config, its log), exactly as a solo job of the same sweep would be, and each
population then trains its members side by side (:class:`rlchain.run.population.PopulationRun`), one population
after another, in this process, on the jobs' ``device``. A job refused before its first step fails alone; a
member whose training fails ends alone; Ctrl-C or SIGTERM stops every member after its iteration (each saves its
``latest.pt``), runs the multirun-end callbacks and exits with 130 or 143.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)

#: Top-level keys whose values may differ between the members of one population (besides the algorithm's numbers).
MEMBER_KEYS = ("seed", "env.seed", "exp_name")


class PopulationLauncher(Launcher):
    """A Hydra launcher that trains each batch's jobs of one shape as one population (module docstring)."""

    def __init__(self, **settings: Any) -> None:
        from hydra_plugins.rlchain_launcher.config import PopulationLauncherConf

        self.settings = PopulationLauncherConf(**settings)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: Callable | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: Callable, config: DictConfig) -> None:
        """Keep Hydra's context and the primary config for :meth:`launch`."""
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Build every job of the batch, train them as populations and return their results in order.

        Raises:
            SystemExit: 130 (Ctrl-C) or 143 (SIGTERM) when a stop signal ended the members, after the
                multirun-end callbacks ran.
        """
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.utils import JobStatus, configure_log, run_job, setup_globals

        from rlchain.commands.train import build_member, train_population
        from rlchain.console import error_line
        from rlchain.run.summary import STOPPED

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        configs = []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(config):
                config.hydra.job.id = f"{config.hydra.job.name}_{idx}"
                config.hydra.job.num = idx
            configs.append(config)
        groups, split_by = populations(configs, self.settings.max_members)
        if len(groups) > 1:
            why = [f"split by {', '.join(split_by)} (which change shapes or code)"] if split_by else []
            if self.settings.max_members is not None:
                why.append(f"at most hydra.launcher.max_members={self.settings.max_members} each")
            log.info(f"population launcher: {len(configs)} jobs as {len(groups)} populations, {'; '.join(why)}")
        results: list[JobReturn | None] = [None] * len(configs)
        stopped = None
        for group in groups:
            built = []
            for i in group:
                HydraConfig.instance().set_config(configs[i])
                refused = _not_taken(configs[i])
                ret = run_job(
                    hydra_context=self.hydra_context,
                    task_function=build_member if refused is None else _refuse(refused),
                    config=configs[i],
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
                results[i] = ret
                if ret.status == JobStatus.COMPLETED:
                    built.append(i)
                else:
                    log.error(f"job {i + initial_job_idx} failed: {error_line(ret._return_value)}")
            if not built:
                continue
            log.info(f"population launcher: {len(built)} member(s) train as one population in {sweep_dir}")
            try:
                outcome = train_population([results[i].return_value for i in built])
            except Exception as err:  # noqa: BLE001 - members that cannot form one population: each job fails so
                for i in built:
                    results[i].status, results[i]._return_value = JobStatus.FAILED, err
                log.error(f"population of jobs {[i + initial_job_idx for i in built]} refused: {error_line(err)}")
                continue
            for i, (summary, failure) in zip(built, outcome):
                ret = results[i]
                if failure is not None:
                    ret.status, ret._return_value = JobStatus.FAILED, failure
                else:
                    ret.return_value = summary.objective
                    if summary.status in STOPPED:
                        stopped = stopped or summary
                self.hydra_context.callbacks.on_job_end(config=configs[i], job_return=ret)
            if stopped is not None:
                break
        if stopped is not None:
            try:
                self.hydra_context.callbacks.on_multirun_end(config=self.config)
            except Exception as err:  # noqa: BLE001 - a stopped sweep exits with its signal's code whatever a callback says
                log.warning(f"a multirun-end callback failed: {error_line(err)}")
            raise SystemExit(stopped.exit_code)
        return [r for r in results if r is not None]


def _not_taken(config: DictConfig) -> str | None:
    """What a population does not take yet in this job's config, as its one line, before anything is built (a
    member that compiled its own steps would have compiled them for nothing); None when it takes it."""
    for name in ("compile", "cudagraphs"):
        if OmegaConf.select(config, f"trainer.{name}", default=False) is True:
            return f"trainer.{name}=true is not taken by a population yet: expected false (hydra/launcher=population)"
    return None


def _refuse(message: str) -> Callable[[DictConfig], Any]:
    """A job's task that refuses it with ``message`` (a ``ConfigError``: one line, its ``summary.json`` written)."""

    def refuse(cfg: DictConfig) -> Any:
        from rlchain.commands.train import refuse_member

        return refuse_member(cfg, message)

    return refuse


def populations(configs: Sequence[DictConfig], max_members: int | None = None) -> tuple[list[list[int]], list[str]]:
    """The jobs ``configs`` grouped into populations: those whose composed configs differ only in
    :data:`MEMBER_KEYS` and the algorithm's numbers (but :data:`~rlchain.core.population.SHAPE_SETTINGS`) form
    one, in job order, of at most ``max_members`` members (None: no limit). Returns the groups (job positions) and
    the keys that split them."""
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
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(flat):
        groups.setdefault(tuple(repr(f.get(k)) for k in splitting), []).append(i)
    size = max_members or len(configs)
    return [g[i : i + size] for g in groups.values() for i in range(0, len(g), size)], splitting


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}
