"""Tests of the devices launcher (hydra_plugins.rlchain_launcher), with Hydra's own suites."""
