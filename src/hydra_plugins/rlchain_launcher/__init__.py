"""rlchain's Hydra launcher plugin: ``hydra/launcher=devices`` (see :mod:`.devices_launcher`).

Modules, in the order a sweep meets them:

- :mod:`.config`: the ``hydra/launcher=devices`` schema (``hydra.launcher.*``).
- :mod:`.devices_launcher`: the plugin class Hydra instantiates; imports the rest lazily.
- :mod:`._launch`: one batch of jobs: compose, run, write the sweep's tables.
- :mod:`._devices`: device slots and the checks of ``hydra.launcher.*``.
- :mod:`._jobs`: what travels between launcher and worker (job, task, outcome) and job records.
- :mod:`._pool`: the scheduling loop, one worker process per slot.
- :mod:`._worker`: what runs inside a worker process (start, job, exit when orphaned).
- :mod:`._signals`: Ctrl-C and SIGTERM during a sweep.

The modules whose names start with ``_`` are the launcher's implementation:
Hydra's plugin scan, which runs at every start of every Hydra app, executes
each module of ``hydra_plugins`` except those, outside ``sys.modules`` (where a
dataclass with string annotations fails to build), and they import torch.
"""
