"""rlchain's Hydra launcher plugin: ``hydra/launcher=devices`` (see :mod:`.devices_launcher`)."""
