"""Settings of rlchain's Optuna sweeper, registered as ``hydra/sweeper=rlchain_optuna``: their one home.

No ``from __future__ import annotations`` here: Hydra's plugin scan executes
this module outside ``sys.modules``, where dataclasses cannot resolve string
annotations.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class OptunaSweeperConf:
    """Settings of :class:`~hydra_plugins.rlchain_optuna.optuna_sweeper.OptunaSweeper` (``hydra.sweeper.*``).

    The sweeper checks them when the sweep starts, before any trial, and
    names the field, the value and what is allowed.
    """

    _target_: str = "hydra_plugins.rlchain_optuna.optuna_sweeper.OptunaSweeper"
    params: dict[str, Any] = field(default_factory=dict)
    """The search space, in the syntax of Hydra's Optuna plugin: ``interval(a, b)`` (float; ``int(interval(a, b))``
    for integers), ``tag(log, interval(a, b))`` (log scale), ``range(a, b[, step])`` (b included; float steps when
    any is a float), ``choice(...)`` and ``shuffle(range(...))`` (categorical), or a fixed value. Sweep overrides
    on the command line (``key=choice(...)``) are added to it."""
    n_trials: int = 20
    """Trials the study should end with, counting those that finished or were pruned (failed ones do not count);
    a study that already has some (a rerun of the same command) runs only the rest."""
    direction: str | None = None
    """``maximize`` or ``minimize``. A task whose config has ``trainer.objective_direction`` (rlchain-train) sets the
    study's direction there, and a different value here is refused; null elsewhere: minimize."""
    metric_name: str | None = None
    """The objective's name in the study (Optuna's metric name, which optuna-dashboard shows). A task whose config has
    ``trainer.objective`` (rlchain-train) names it there (``auto``: the name its first finished trial resolved, e.g.
    ``eval/success_rate``), and a different value here is refused; null elsewhere: the study has no name for it."""
    study_name: str | None = None
    """The study's name in its storage; null: the task's job name (``train`` for rlchain-train)."""
    storage: str | None = None
    """Where the study lives: an SQLAlchemy URL (``sqlite:///study.db``) or the path of an Optuna journal file
    (``study.log``; safe on a shared file system, for SLURM); rerunning the command resumes the study stored there.
    null: ``optuna_journal.log`` in the sweep directory."""
    seed: int | None = None
    """The sampler's seed (null: random). Each trial draws from a stream of its own, seeded with a hash of this seed
    and the trial's number (NumPy's ``SeedSequence([seed, number])``): trial ``k``'s parameters depend only on the
    seed, ``k`` and the trials the study held when it was asked for, so a seeded study is reproduced from the same
    storage, and a resumed study continues with new draws instead of replaying its first sweep's. (Parallel trials,
    with the devices launcher, see each other's results in the order they end.)"""
    sampler: str = "tpe"
    """``tpe``, ``random``, ``cmaes`` or ``grid``: every combination of ``choice``/``range`` values once; a point whose
    trial failed runs again (before any point fails twice), and a search that gives up names the points not run."""
    sampler_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the sampler's Optuna class (``n_startup_trials``, ``multivariate``, ...)."""
    pruner: str = "median"
    """``median``, ``successive_halving``, ``hyperband`` or ``none``. Each trial's run reports its objective at every
    evaluation, at step = its iteration, and stops after that iteration when pruned (``status: pruned``)."""
    pruner_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the pruner's Optuna class (``n_startup_trials``, ``n_warmup_steps``, ``min_resource``, ...;
    steps are trainer iterations)."""
    n_jobs: int = 1
    """Trials per batch with a launcher that runs whole batches (basic, submitit); the devices launcher starts a trial
    whenever one of its slots frees instead."""
    trial: dict[str, Any] = field(default_factory=dict)
    """Set by the sweeper in each job's Hydra config, never by hand: the trial the job runs for, ``{storage,
    study_name, number, pruner, pruner_options}`` (:class:`rlchain.run.tuning.TrialLink`; ``{}`` in the sweep itself). A
    task function reports to it with ``rlchain.run.tuning.report(value, step)``; the task's own config gets nothing."""


ConfigStore.instance().store(group="hydra/sweeper", name="rlchain_optuna", node=OptunaSweeperConf, provider="rlchain")
