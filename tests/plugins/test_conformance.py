"""Hydra's own launcher test suites, run unmodified on the devices launcher, as Hydra's joblib plugin runs them.

``LauncherTestSuite`` sweeps Hydra's test app in this process; the jobs run
in the launcher's spawned workers, which get the task function (defined
inside the suite's tests, too) and Hydra's state, resolvers included, with
cloudpickle. ``IntegrationTestSuite`` writes a small ``@hydra.main`` app and
runs it as a subprocess; that process finds the launcher by Hydra's own
plugin scan of the ``hydra_plugins`` namespace, as any user's app does.

Each of Hydra's tests starts worker processes, and each integration test an
app as well, one to three seconds apiece: every one of them runs."""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra.core.singleton import Singleton
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.test_utils.test_utils import TSweepRunner
from hydra.version import VersionBase

import hydra_plugins.rlchain_launcher

#: The directory that holds ``hydra_plugins/rlchain_launcher`` (``src/`` of the checkout, or site-packages).
PLUGIN_ROOT = Path(hydra_plugins.rlchain_launcher.__file__).resolve().parents[2]


#: Two CPU slots, so that the suites' two-job sweeps run their jobs at once.
DEVICES = ["hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2"]


@pytest.fixture(autouse=True)
def fresh_version_base() -> Iterator[None]:
    """Hydra's version base unset, as in the fresh process the suites expect (``version_base=None``: chdir on).

    Importing ``rlchain.commands.train``, as other test modules do, runs its ``@hydra.main(version_base="1.3")``,
    which sets the version base for the whole process.
    """
    saved = Singleton._instances.pop(VersionBase, None)
    yield
    Singleton._instances.pop(VersionBase, None)
    if saved is not None:
        Singleton._instances[VersionBase] = saved


@pytest.fixture
def plugin_on_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let subprocess apps find the launcher by Hydra's plugin scan, also from a checkout that is not installed."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PLUGIN_ROOT), os.environ.get("PYTHONPATH")])))


def test_hydra_plugin_scan_finds_the_launcher_without_importing_torch():
    """As from a regular install; the scan executes every module of the plugin not named ``_*`` at each start."""
    code = (
        "import sys; from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; "
        "print([p.__name__ for p in Plugins.instance().discover(Launcher)], 'torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(PLUGIN_ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "'DevicesLauncher'" in out and out.rstrip().endswith("False"), out


@pytest.mark.parametrize("launcher_name, overrides", [("devices", DEVICES)])
class TestDevicesLauncher(LauncherTestSuite):
    """Hydra's launcher test suite on ``hydra/launcher=devices``, as it stands."""


@pytest.mark.slow
def test_idle_workers_exit_once_hydra_lets_go_of_the_launcher(hydra_sweep_runner: TSweepRunner, tmpdir: Path) -> None:
    """A program that runs several multiruns (a notebook, a driver script) must not pile up idle workers,
    each holding torch and perhaps a CUDA context, until it exits."""
    before = set(multiprocessing.active_children())
    sweep = hydra_sweep_runner(
        calling_file=None,
        calling_module="hydra.test_utils.a_module",
        task_function=None,
        config_path="configs",
        config_name="compose.yaml",
        temp_dir=tmpdir,
        overrides=["hydra/launcher=devices", *DEVICES, "foo=1,2"],
    )
    with sweep:
        assert sweep.returns is not None and [r.return_value for r in sweep.returns[0]] == [100, 100]
        assert set(multiprocessing.active_children()) - before  # the slots' workers are up
    gc.collect()
    deadline = time.monotonic() + 30
    while set(multiprocessing.active_children()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(multiprocessing.active_children()) - before


@pytest.mark.usefixtures("plugin_on_pythonpath")
@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags", [({}, ["-m", "hydra/job_logging=disabled", "hydra/launcher=devices", *DEVICES])]
)
class TestDevicesLauncherIntegration(IntegrationTestSuite):
    """Hydra's integration test suite: apps run as subprocesses with ``hydra/launcher=devices``."""
