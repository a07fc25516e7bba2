"""An env ``_target_`` that emulates a scheduler's preemption, for ``test_preemption.py``.

:class:`PreemptedCartPole` sends its own process submitit's preemption signal
(SIGUSR2, or ``SIG$SUBMITIT_PREEMPT_SIGNAL``), as SLURM does ``signal_delay_s``
before a job's time limit or when it preempts the job, at one chosen env step:
no timing is involved. It does so once: it first creates ``marker``, so the
requeued attempt (a new process, which builds the env again) runs undisturbed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch

from rlchain.core.envs import CartPoleEnv


def preemption_signal() -> signal.Signals:
    """The signal submitit's job environment takes for a preemption or an imminent time limit."""
    return signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]


class PreemptedCartPole(CartPoleEnv):
    """``CartPoleEnv`` whose ``preempt_at_step``-th ``step`` (counted from 1) first signals its process.

    Args:
        preempt_at_step: the step that sends :func:`preemption_signal`.
        marker: a file created before the signal; while it exists no env sends one.
        kwargs: the arguments of ``CartPoleEnv``.
    """

    def __init__(self, preempt_at_step: int, marker: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.preempt_at_step, self.marker = int(preempt_at_step), Path(marker)
        self.steps_taken = 0

    def step(self, action: torch.Tensor):
        self.steps_taken += 1
        if self.steps_taken == self.preempt_at_step and not self.marker.exists():
            self.marker.touch()
            signal.raise_signal(preemption_signal())
        return super().step(action)
