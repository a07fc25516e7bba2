"""rlchain's Optuna sweeper plugin: ``hydra/sweeper=rlchain_optuna`` (see :mod:`.optuna_sweeper`).

It runs an Optuna (>= 4) study on the ask/tell API with any Hydra launcher:
a persistent, resumable study (SQLAlchemy URL or journal file), samplers and
pruners chosen by config, and, with rlchain's devices launcher, a new trial
whenever a slot frees. Modules, in the order a sweep meets them:

- :mod:`.config`: the settings (``hydra.sweeper.*``), their defaults.
- :mod:`.optuna_sweeper`: the plugin class Hydra instantiates.
- :mod:`._space`: the search space (Hydra's sweep syntax as Optuna distributions).
- :mod:`._study`: one search: the study, the trials it asks for and tells, its results.

The storage, pruner and trial link shared with the jobs are in
:mod:`rlchain.run.tuning`. Hydra's plugin scan executes every module of
``hydra_plugins`` whose name does not start with ``_`` at each start of every
Hydra app; Optuna is imported only when a sweep starts.
"""
