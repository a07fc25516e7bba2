"""rlchain's Hydra launcher plugins: ``hydra/launcher=devices`` (see :mod:`.devices_launcher`) and
``hydra/launcher=population`` (see :mod:`.population_launcher`), which share the device slots.

The devices launcher depends on Hydra, the standard library, cloudpickle and
one module of rlchain's, :mod:`rlchain.run.summary` (stop signals, exit codes
and the job record it writes); the population launcher also builds and trains
rlchain's runs (:mod:`rlchain.commands.train`, :mod:`rlchain.run.population`),
in its workers. Modules, in the order a sweep meets them:

- :mod:`.config`: the settings (``hydra.launcher.*``), their defaults and checks.
- :mod:`.devices_launcher`: the plugin class Hydra instantiates; a batch of jobs, or jobs as a sweeper offers them.
- :mod:`.population_launcher`: a batch's jobs of one shape as populations, one per slot at a time.
- :mod:`._slots`: device slots: which devices, how many threads.
- :mod:`._pool`: the scheduling loop, one worker process per slot.
- :mod:`._worker`: what runs inside a worker process (start, job, exit when orphaned).
- :mod:`._signals`: Ctrl-C and SIGTERM during a sweep.

Hydra's plugin scan, which runs at every start of every Hydra app, executes
each module of ``hydra_plugins`` whose name does not start with ``_``,
outside ``sys.modules`` (where a dataclass with string annotations fails to
build); the ``_`` modules are imported lazily, when a batch launches.
"""
