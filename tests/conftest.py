"""Shared fixtures: compose rlchain's real Hydra config the way the command does, and one real sweep."""

from __future__ import annotations

import os

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import rlchain.commands.config  # noqa: F401  (registers the schemas that every composition here needs)
from tests.helpers.runs import FRESH, HELPERS, MEET, SHORT, TINY, run_cli, sweep_dir_of
from tests.helpers.sweep_barrier import barrier_env

# make test runs one pytest worker per core (pytest-xdist): each worker, and every process its tests start,
# computes on one thread, as two workers on torch's default of a thread per core would oversubscribe the cores
# (the learning tests took 4x as long). A test or a launcher slot that sets its own thread count still does.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture
def compose_cfg(tmp_path):
    """``compose_cfg(overrides) -> DictConfig`` with ``trainer.output_dir`` in ``tmp_path``."""

    def _compose(overrides: list[str] = ()) -> DictConfig:
        GlobalHydra.instance().clear()
        with initialize_config_module("rlchain.conf", version_base="1.3"):
            cfg = compose("train", overrides=[f"trainer.output_dir={tmp_path}", *overrides], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # ${hydra:...} interpolations resolve as in a real run
        with open_dict(cfg):
            del cfg.hydra
        return cfg

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def cpu_sweep(tmp_path_factory):
    """The GRPO preset cut to 2 learning rates x 2 seeds, on 2 CPU slots; jobs 0 and 1, then 2 and 3, meet.

    Returns the sweep directory and the finished ``rlchain-train -m`` process (the launcher's and the
    report's tests read the same sweep).
    """
    cwd = tmp_path_factory.mktemp("cpu_sweep")
    proc = run_cli(
        [
            "-m",
            "sweep=grpo_push_cube",
            "hydra.launcher.devices=[cpu]",
            "hydra.launcher.jobs_per_device=2",
            # command-line values replace the preset's for the same key
            "algorithm.group_size=8",
            "algorithm.kl_coef=0.0",
            "algorithm.learning_rate=1e-3,3e-4",
            "seed=0,1",
            *SHORT,
            "env.max_episode_steps=8",
            MEET,
            *FRESH,
        ],
        cwd,
        **barrier_env(2, cwd / "barrier"),
        OMP_NUM_THREADS=None,  # the cores shared out: auto
    )
    assert proc.returncode == 0, proc.stderr
    return sweep_dir_of(cwd), proc


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A finished tiny PPO run on push_cube (evaluated after each of its 2 iterations), made by ``rlchain-train``:
    the run directory that rlchain-eval's and rlchain-export's tests read."""
    cwd = tmp_path_factory.mktemp("trained")
    proc = run_cli(["algorithm=ppo", "env=push_cube", *TINY, *FRESH, f"hydra.run.dir={cwd / 'run'}"], cwd)
    assert proc.returncode == 0, proc.stderr
    return cwd / "run"


@pytest.fixture(scope="session")
def user_run(tmp_path_factory):
    """A finished tiny run whose env and policy are a user's own (targets under ``tests.helpers``)."""
    cwd = tmp_path_factory.mktemp("user_run")
    proc = run_cli(
        ["--config-dir", str(HELPERS / "user_conf"), "env=line", "policy=wide", *TINY, f"hydra.run.dir={cwd / 'run'}"],
        cwd,
    )
    assert proc.returncode == 0, proc.stderr
    return cwd / "run"
