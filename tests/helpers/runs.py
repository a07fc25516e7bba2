"""Running ``rlchain-train`` as a user's shell would, and reading what a run left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from rlchain.commands.report import JobResult, load_jobs
from rlchain.run.summary import RunSummary
from tests.helpers.forkserver import AVAILABLE, ForkServer

#: The checkout's root (its ``tests`` package is importable from there) and this folder.
REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent
#: Shrinks any run to a couple of seconds on the CPU (conf/debug/tiny.yaml), without the final evaluation of
#: best.pt on fresh start states (a tenth of a tiny run's time; FRESH turns it back on where a test reads it).
TINY = ["debug=tiny", "trainer.fresh_eval=false"]
#: The final evaluation of best.pt on fresh start states (summary.json's best_fresh), for a run of TINY.
FRESH = ["trainer.fresh_eval=true"]
#: A tiny run with eight evaluations (summary tables, learning curves).
SHORT = [*TINY, "trainer.iterations=8"]
#: The user's own config directory, and its toy env with marker-file switches (:mod:`tests.helpers.fault_env`).
USER = ["--config-dir", str(HELPERS / "user_conf"), "env=fault_line", *TINY]
#: An Optuna search of cart_pole PPO's learning rate (log scale), 4 iterations with the first report at iteration
#: 2, the median pruner from the first finished trial on: a trial of learning rate 1e-9 learns nothing and is
#: pruned at its first report (the pruning tests).
PRUNABLE_CART_POLE = [
    "hydra/sweeper=rlchain_optuna",
    "experiment=cart_pole_ppo",
    "device=cpu",
    "trainer.iterations=4",
    "trainer.num_eval_envs=32",
    "trainer.num_eval_episodes=32",
    "trainer.progress=false",
    "trainer.fresh_eval=false",
    "+hydra.sweeper.pruner_options={n_startup_trials:1,n_warmup_steps:0}",
    "algorithm.learning_rate=tag(log, interval(1e-9, 1e-2))",
]
#: Build each job's env with the barrier of :mod:`tests.helpers.sweep_barrier` (its variables: ``barrier_env``).
MEET = "env._target_=tests.helpers.sweep_barrier.meeting_push_cube"


def subprocess_env(**extra: str | None) -> dict[str, str]:
    """The environment of an ``rlchain-train`` subprocess: W&B off, no ``HYDRA_FULL_ERROR``, and the checkout's
    root on ``PYTHONPATH`` so that ``_target_: tests.helpers....`` imports; then ``extra`` (None: unset)."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env.pop("HYDRA_FULL_ERROR", None)
    env.update({key: value for key, value in extra.items() if value is not None})
    for key in [key for key, value in extra.items() if value is None]:
        env.pop(key, None)
    return env


def sigint_as_in_a_terminal() -> None:
    """``preexec_fn`` of a command started as from a terminal: SIGINT at its default action.

    A test suite started in the background of a script inherits SIGINT ignored, and Python then installs
    no KeyboardInterrupt handler in the child; a command typed at a terminal has the default.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(
    args: list[str], cwd: Path, module: str = "rlchain", timeout: float = 300, **env_extra: str | None
) -> subprocess.CompletedProcess:
    """Run ``python -m <module> *args`` in ``cwd`` the way a user's shell would (see :func:`subprocess_env`).

    The process is forked from this worker's :class:`~tests.helpers.forkserver.ForkServer`, which has done the
    imports already, unless ``env_extra`` changes what those imports would read; then it starts fresh.
    """
    env = subprocess_env(**env_extra)
    server = fork_server()
    if server is not None and server.serves(env):
        return server.run(module, args, cwd, env, timeout)
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def fork_server() -> ForkServer | None:
    """This process's fork server (None where the OS has no ``fork`` or ``pidfd_open``), started at its first
    command with this process's environment, and again when that has changed since (an env built in a test's
    own process sets ``MUJOCO_GL``) or the server has died: a command is forked only from a live server of its
    own environment."""
    global _server
    if not AVAILABLE:
        return None
    env = subprocess_env()
    if _server is None or not _server.alive or not _server.serves(env):
        if _server is not None:
            _server.close()
        _server = ForkServer(env, REPO)
    return _server


_server: ForkServer | None = None


def python_with_egl(code: str, timeout: float) -> subprocess.CompletedProcess:
    """Run the Python ``code`` (dedented) in a fresh interpreter with ``MUJOCO_GL=egl``: mujoco reads it when it is
    imported, so headless MuJoCo drawing needs a process of its own."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "MUJOCO_GL": "egl"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rows(run_dir: Path) -> list[dict]:
    """The rows of ``<run_dir>/metrics.jsonl`` (none when it does not exist)."""
    metrics = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


def run_dir(cwd: Path) -> Path:
    """The one run directory under ``<cwd>/outputs``."""
    (path,) = list((cwd / "outputs").glob("*/*"))
    return path


def sweep_dir_of(cwd: Path) -> Path:
    """The one sweep directory under ``<cwd>/multirun``."""
    (sweep,) = list((cwd / "multirun").glob("*/*"))
    return sweep


def summary_of(path: Path) -> RunSummary:
    """The run summary in ``path`` (it must have one)."""
    summary = RunSummary.read(path)
    assert summary is not None, f"no summary.json in {path}"
    return summary


def wait_for(condition, what: str, proc: subprocess.Popen | None = None, timeout: float = 120.0) -> None:
    """Poll ``condition()`` until it holds; fail after ``timeout`` s, or at once when ``proc`` has ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process ended (exit status {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def summaries(sweep: Path) -> dict[int, JobResult]:
    """Each job of the sweep, its run's summary and the launcher's record joined, by job number."""
    return {j.num: j for j in load_jobs(sweep)}
