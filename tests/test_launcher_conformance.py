"""Hydra's own launcher test suites, run on the devices launcher as Hydra's joblib launcher plugin runs them.

``LauncherTestSuite`` sweeps Hydra's test app in this process; the jobs run
in the launcher's spawned workers. ``IntegrationTestSuite`` writes a small
``@hydra.main`` app and runs it as a subprocess; that process finds the
launcher by Hydra's own plugin scan of the ``hydra_plugins`` namespace, with
the directory that holds it on ``PYTHONPATH`` (an editable install hides it
from the scan, so this file's process registers it with ``rlchain.config``).

Each of Hydra's tests starts worker processes, and each integration test an
app as well, a few seconds apiece: by default the tests in :data:`LEFT_OUT`,
whose ground another one covers, are skipped; ``RLCHAIN_HYDRA_SUITES=all``
runs them too.
"""

from __future__ import annotations

import copy
import gc
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from hydra.core.plugins import Plugins
from hydra.core.singleton import Singleton
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from hydra.test_utils.test_utils import TSweepRunner
from hydra.version import VersionBase
from omegaconf import DictConfig, OmegaConf
from omegaconf.basecontainer import BaseContainer

import hydra_plugins.rlchain_launcher
import rlchain.config  # noqa: F401  (registers hydra/launcher=devices in this process)

#: The directory that holds ``hydra_plugins/rlchain_launcher`` (``src/`` of the checkout, or site-packages).
PLUGIN_ROOT = Path(hydra_plugins.rlchain_launcher.__file__).resolve().parents[2]
#: Two CPU slots, so that the suites' two-job sweeps run their jobs at once.
DEVICES = ["hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2"]
#: Hydra's tests skipped unless ``RLCHAIN_HYDRA_SUITES=all`` (test name prefix: the test that covers its ground).
LEFT_OUT = {
    "test_sweep_1_job_strict[": "test_sweep_1_job, whose body it repeats in hydra-core 1.3",
    "test_custom_task_name[no_config-": "test_sweep_1_job (job name from the calling module)",
    "test_custom_task_name[different_filename-": "test_custom_task_name with a config file and a command-line name",
    "test_custom_task_name[different_filename_and_config_file_name_override-":
        "test_custom_task_name with a config file and a command-line name",
    "test_custom_sweeper_run_workdir[sweep_dir_config_override-":
        "test_custom_sweeper_run_workdir[sweep_dir_cli_overridding_config]",
    "test_custom_sweeper_run_workdir[sweep_dir_cli_override-":
        "test_custom_sweeper_run_workdir[sweep_dir_cli_overridding_config]",
    "test_custom_sweeper_run_workdir[subdir:override_dirname-":
        "test_custom_sweeper_run_workdir[subdir:custom_override_dirname]",
    "test_to_absolute_path_multirun[": "test_get_orig_dir_multirun and test_custom_sweeper_run_workdir (chdir)",
}  # fmt: skip


def return_100(cfg: DictConfig) -> Any:
    """The suite's task function at module level: the workers are started with ``spawn`` and import it."""
    return 100


def return_x(cfg: DictConfig) -> Any:
    """``cfg.x``, resolved in the worker (``custom_resolver.yaml``: ``x: ${my_custom_resolver:}``)."""
    return cfg.x


# At import, as an app registers its resolvers: a worker imports this module to find its task function,
# and so has the resolver too (the launcher does not send its own: OmegaConf keeps them as closures).
OmegaConf.register_new_resolver("my_custom_resolver", lambda: "foo", replace=True)


@pytest.fixture(autouse=True)
def representative_subset(request: pytest.FixtureRequest) -> None:
    """Skip the tests of :data:`LEFT_OUT` unless ``RLCHAIN_HYDRA_SUITES=all``."""
    if os.environ.get("RLCHAIN_HYDRA_SUITES") != "all":
        for prefix, covered_by in LEFT_OUT.items():
            if request.node.name.startswith(prefix):
                pytest.skip(f"left out for time (RLCHAIN_HYDRA_SUITES=all runs it); covered by {covered_by}")


@pytest.fixture
def hydra_restore_singletons() -> Iterator[None]:
    """Hydra's fixture of this name (which the suites use), less its second scan of the plugins.

    Hydra's own restores with ``Singleton.set_state``, which builds a new
    plugin registry by scanning again. That scan executes Hydra's
    config-source modules anew, while Hydra's ``SourcesRegistry`` keeps the
    classes of the first scan: the next sweep's config loader, which the
    launcher sends to its workers, then holds objects whose class is no longer
    its module's attribute, and the standard pickle refuses them (joblib's
    cloudpickle sends such classes by value). The new registry would also
    miss this launcher, which the scan cannot see in an editable install.
    This one restores the rest as Hydra's does and keeps the plugin registry.

    It also starts each test with Hydra's version base unset, as in a fresh
    process: the suites expect the default of ``version_base=None``
    (``hydra.job.chdir`` on), and rlchain's tests that ran before in this
    session composed with ``version_base="1.3"``.
    """
    state = copy.deepcopy(Singleton.get_state())
    plugins = Singleton._instances[Plugins]
    Singleton._instances.pop(VersionBase, None)
    yield
    Singleton._instances = {**state["instances"], Plugins: plugins}
    BaseContainer._resolvers = state["omegaconf_resolvers"]


@pytest.fixture
def plugin_on_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let subprocess apps find the launcher by Hydra's plugin scan."""
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
    """Hydra's launcher test suite on ``hydra/launcher=devices``."""

    def get_task_function(self) -> Any:
        """A module-level task (the suite's own is defined inside this method, and a worker cannot import it)."""
        return return_100

    def test_sweep_2_jobs(
        self, hydra_sweep_runner: TSweepRunner, launcher_name: str, overrides: list[str], tmpdir: Path
    ) -> None:
        """The suite's test; then the sweep's workers exit once Hydra has let go of the launcher.

        A program that runs several multiruns (these suites, a notebook, a
        driver script) must not pile up idle workers, each holding torch and
        perhaps a CUDA context, until it exits.
        """
        before = set(multiprocessing.active_children())
        super().test_sweep_2_jobs(hydra_sweep_runner, launcher_name, overrides, tmpdir)
        gc.collect()
        deadline = time.monotonic() + 30
        while set(multiprocessing.active_children()) - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not set(multiprocessing.active_children()) - before

    def test_sweep_with_custom_resolver(
        self, hydra_sweep_runner: TSweepRunner, launcher_name: str, overrides: list[str], tmpdir: Path
    ) -> None:
        """The suite's test with its task function and resolver where a worker finds them.

        Hydra's version defines both inside the test and registers the
        resolver in the launcher's process only; this launcher's workers
        import the task function and register resolvers by importing, so
        both are defined at the top of this module.
        """
        sweep = hydra_sweep_runner(
            calling_file=None, calling_module="hydra.test_utils.a_module", task_function=return_x,
            config_path="configs", config_name="custom_resolver",
            overrides=[f"hydra/launcher={launcher_name}", *overrides], temp_dir=tmpdir,
        )  # fmt: skip
        with sweep:
            assert sweep.returns is not None
            (job_ret,) = sweep.returns[0]
            assert job_ret.return_value == "foo"


@pytest.mark.usefixtures("plugin_on_pythonpath")
@pytest.mark.parametrize(
    "task_launcher_cfg, extra_flags", [({}, ["-m", "hydra/job_logging=disabled", "hydra/launcher=devices", *DEVICES])]
)
class TestDevicesLauncherIntegration(IntegrationTestSuite):
    """Hydra's integration test suite: apps run as subprocesses with ``hydra/launcher=devices``."""
