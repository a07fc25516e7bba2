"""Env ``_target_``\\ s that make a sweep's job fail or refuse to stop, for the launcher's fault tests (:mod:`tests.launcher.test_devices_launcher`).

* :class:`FailingPushCube` raises from its third step: a training failure (the
  config is valid), with a traceback that belongs in the job's own files.
* :class:`StubbornPushCube` ignores SIGINT and SIGTERM from its first step on,
  as a job stuck where no signal handler runs would: only SIGKILL ends it.
* :class:`GatedPushCube` holds its first step at a closed gate: the job is in
  the middle of an iteration for as long as a test needs (a first stop signal
  cannot end that iteration; a second one, which aborts, can).
* :func:`killing_an_idle_worker` kills the worker of job 0 while it waits for its next job.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig

from rlchain.core.envs import PushCubeEnv

GATE_DIR_ENV = "RLCHAIN_TEST_GATE"
#: Seconds a job waits at the gate before it fails instead of hanging the test.
GATE_TIMEOUT_S = 120.0

#: The message of :class:`FailingPushCube`'s error.
FAILURE = "the env broke at step 3"


class FailingPushCube(PushCubeEnv):
    """``PushCubeEnv`` whose third ``step`` raises ``RuntimeError(FAILURE)``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.steps_taken = 0

    def step(self, action: torch.Tensor):
        self.steps_taken += 1
        if self.steps_taken >= 3:
            raise RuntimeError(FAILURE)
        return super().step(action)


class StubbornPushCube(PushCubeEnv):
    """``PushCubeEnv`` whose every ``step`` sets SIGINT and SIGTERM to be ignored (the trainer's handlers included)."""

    def step(self, action: torch.Tensor):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return super().step(action)


def gate_env(directory: Path) -> dict[str, str]:
    """The environment variable that puts :class:`GatedPushCube`'s gate in ``directory``."""
    return {GATE_DIR_ENV: str(directory)}


class GatedPushCube(PushCubeEnv):
    """``PushCubeEnv`` whose first ``step`` writes ``<gate>/<job number>.waiting`` and waits for ``<gate>/open``.

    Raises:
        RuntimeError: the gate was still closed after :data:`GATE_TIMEOUT_S` seconds.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.passed_gate = False

    def step(self, action: torch.Tensor):
        if not self.passed_gate:
            gate = Path(os.environ[GATE_DIR_ENV])
            gate.mkdir(parents=True, exist_ok=True)
            (gate / f"{HydraConfig.get().job.num}.waiting").touch()
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not (gate / "open").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the gate {gate} stayed closed for {GATE_TIMEOUT_S:.0f} s")
                time.sleep(0.05)
            self.passed_gate = True
        return super().step(action)


def killing_an_idle_worker(**kwargs) -> PushCubeEnv:
    """``PushCubeEnv(**kwargs)``; job 0 notes its worker's pid, and job 1 kills that worker while it is idle.

    Job 1 waits until the launcher has recorded job 0 (``launcher.jsonl``: its worker has handed the result
    back and waits for work), SIGKILLs that worker, as the OOM killer would, and waits until it is gone.
    A job of the next batch then finds the slot's worker dead. Idempotent per job (the eval env passes).

    Raises:
        RuntimeError: job 0 was not recorded within :data:`GATE_TIMEOUT_S` seconds.
    """
    sweep = Path(str(HydraConfig.get().sweep.dir))
    num, pid_file, done = (
        int(HydraConfig.get().job.num),
        sweep / "worker_of_job_0.pid",
        sweep / "worker_of_job_0.killed",
    )
    if num == 0:
        pid_file.write_text(str(os.getpid()))
    elif num == 1 and not done.exists():
        records, deadline = sweep / "launcher.jsonl", time.monotonic() + GATE_TIMEOUT_S
        while not (records.exists() and any(json.loads(line)["job"] == 0 for line in records.read_text().splitlines())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"job 0 was not recorded in {records} within {GATE_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGKILL)
        while not _gone(pid):
            time.sleep(0.05)
        done.touch()
    return PushCubeEnv(**kwargs)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
