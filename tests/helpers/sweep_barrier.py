"""An env ``_target_`` that makes the jobs of a sweep meet, so a test can prove they ran together.

Each job, as it builds its env, writes a marker named after its job number (holding the
job's torch CPU thread count) into the
directory named by ``$RLCHAIN_TEST_BARRIER`` and waits until every job of its round has
written one: with ``P = $RLCHAIN_TEST_BARRIER_PARTIES``, jobs ``r*P .. r*P + P - 1``
form round ``r``. A job therefore completes only if the other jobs of its round were
running at the same time, which a test can assert from the jobs' status alone, whatever
the machine's load. A round whose jobs never all arrive fails its jobs after
:data:`TIMEOUT_S` instead of hanging the sweep.

The sweep's job count must be a multiple of ``P``, and a launcher that runs jobs in
order of their number gets through the rounds with ``P`` slots (round ``r + 1`` starts
in the slots round ``r`` frees).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig

from rlchain.core.envs import PushCubeEnv

BARRIER_DIR_ENV = "RLCHAIN_TEST_BARRIER"
PARTIES_ENV = "RLCHAIN_TEST_BARRIER_PARTIES"
#: Seconds a job waits for the rest of its round; far more than starting a worker takes.
TIMEOUT_S = 120.0


def barrier_env(parties: int, directory: Path) -> dict[str, str]:
    """The environment variables that make a sweep's jobs meet in rounds of ``parties``."""
    return {BARRIER_DIR_ENV: str(directory), PARTIES_ENV: str(parties)}


def meet() -> None:
    """Mark this job as running and wait for the other jobs of its round (idempotent per job).

    Raises:
        RuntimeError: the round was not complete after :data:`TIMEOUT_S` seconds.
    """
    directory = Path(os.environ[BARRIER_DIR_ENV])
    parties = int(os.environ[PARTIES_ENV])
    num = int(HydraConfig.get().job.num)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / str(num)).write_text(str(torch.get_num_threads()))
    first = num - num % parties
    round_ = [directory / str(n) for n in range(first, first + parties)]
    deadline = time.monotonic() + TIMEOUT_S
    while not all(marker.exists() for marker in round_):
        if time.monotonic() > deadline:
            missing = [marker.name for marker in round_ if not marker.exists()]
            raise RuntimeError(f"job {num} waited {TIMEOUT_S:.0f} s for job(s) {', '.join(missing)} to start")
        time.sleep(0.05)


def meeting_push_cube(**kwargs) -> PushCubeEnv:
    """``PushCubeEnv(**kwargs)``, built once the job's round has met (the eval env's build passes at once)."""
    meet()
    return PushCubeEnv(**kwargs)
