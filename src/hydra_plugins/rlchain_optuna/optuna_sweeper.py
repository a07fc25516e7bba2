"""``hydra/sweeper=rlchain_optuna``: an Optuna search on Optuna's ask/tell API, with a persistent study and pruning.

Usage::

    rlchain-train -m hparams_search=ppo_push_cube_optuna                      # the preset (it selects this sweeper)
    rlchain-train -m hparams_search=ppo_push_cube_optuna hydra.sweeper.storage=sqlite:///ppo.db   # resumable
    rlchain-train -m hydra/sweeper=rlchain_optuna 'algorithm.learning_rate=tag(log, interval(1e-4, 1e-2))'

Each trial is one job, a plain job of the app: its overrides are the
trial's parameters, and the sweeper adds nothing to its config. The job's
Hydra config names its trial (``hydra.sweeper.trial={storage, study_name,
number, pruner, pruner_options}``), so that any task function can report
intermediate values to it (:func:`rlchain.run.tuning.report`; rlchain-train
reports its objective at every evaluation). As a job ends, the sweeper tells
the study: ``pruned`` when the study's pruner pruned the trial (whatever the
job then did), ``completed`` with the objective the job returned, or failed
(any other end: an error, a stop signal); for rlchain-train it reads the
run's ``summary.json``.

With the devices launcher (``hydra/launcher=devices``, rlchain-train's
default) a trial starts whenever a slot frees, asked of the sampler after
every result so far (TPE's ``constant_liar`` keeps parallel trials apart).
Other launchers (``basic``, ``submitit``) get batches of ``n_jobs`` trials.

The study lives in ``storage``; rerunning the same command resumes it:
trials that finished or were pruned count toward ``n_trials`` and are not
rerun, trials a killed sweep left running are marked failed, and failed
trials do not count (the search replaces them; it gives up after
``n_trials`` failures in one sweep). A seeded sampler draws each trial from
a stream of its own, so a resumed search continues rather than replays; a
grid search runs the grid points that have no finished trial yet. When the
search ends, or is stopped, the sweep directory gets
``optimization_results.yaml`` and Optuna's plots.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.rlchain_optuna.config import OptunaSweeperConf

__all__ = ["OptunaSweeper"]

log = logging.getLogger(__name__)


class OptunaSweeper(Sweeper):
    """A Hydra sweeper that runs an Optuna study (Akiba et al. 2019) on Optuna's ask/tell API.

    Args:
        settings: the fields of :class:`~.config.OptunaSweeperConf` (``self.settings``).

    Raises:
        SweeperError: (:meth:`sweep`, before any trial) a setting out of
            range, an unknown sampler or pruner or option, a malformed search
            space, a storage that cannot be opened, or a stored study whose
            direction differs; one line naming the field and the value.
    """

    def __init__(self, **settings: Any) -> None:
        settings = {
            k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v for k, v in settings.items()
        }
        self.settings = OptunaSweeperConf(**settings)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep the primary config and instantiate the launcher."""
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]) -> None:
        """Run the study until it has ``n_trials`` trials that finished or were pruned.

        Raises:
            SweeperError: see the class; also when ``n_trials`` trials of this
                sweep failed (the search gives up).
            SystemExit: a stop signal ended the sweep (the devices launcher's
                exit status), after the results were written.
        """
        from hydra_plugins.rlchain_optuna._study import Search

        assert self.config is not None and self.launcher is not None
        search = Search(self.settings, self.config, arguments)
        try:
            if hasattr(self.launcher, "launch_as_completed"):
                for number, ret in self.launcher.launch_as_completed(search.next_trial):
                    search.tell(number, ret)
            else:
                self._batches(search)
        finally:
            search.finish()

    def _batches(self, search: Any) -> None:
        """Run the trials in batches of ``n_jobs`` through a launcher's ``launch`` (basic, submitit)."""
        while True:
            batch = [job for job in (search.next_trial() for _ in range(self.settings.n_jobs)) if job is not None]
            if not batch:
                return
            returns = self.launcher.launch([overrides for _, overrides in batch], initial_job_idx=batch[0][0])
            for (number, _), ret in zip(batch, returns):
                search.tell(number, ret)
