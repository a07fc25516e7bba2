"""An env ``_target_`` that sends a stop signal at one chosen env step (no timing involved): to its own process, or
to its parent (a launcher, which forwards it to the process that trains) and then waits for it to come back."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch

from rlchain.core.envs import PushCubeEnv


class SignallingPushCube(PushCubeEnv):
    """``PushCubeEnv`` whose ``signal_at_step``-th ``step`` (counted from 1) first sends its process
    ``SIG<signal_name>``, once: it creates ``marker`` first, and no env signals while it exists (a resumed run
    builds its env again). ``signal_to="parent"`` sends it to the parent process instead (a launcher whose
    worker trains this env) and waits until a signal reaches this process (the launcher forwards it)."""

    def __init__(
        self, signal_at_step: int, marker: str, signal_name: str = "TERM", signal_to: str = "self", **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.signal_at_step, self.marker, self.signal_name = int(signal_at_step), Path(marker), signal_name
        self.signal_to = signal_to
        self.steps_taken = 0

    def step(self, action: torch.Tensor):
        self.steps_taken += 1
        if self.steps_taken == self.signal_at_step and not self.marker.exists():
            self.marker.touch()
            signum = signal.Signals["SIG" + self.signal_name]
            if self.signal_to == "parent":
                os.kill(os.getppid(), signum)
                signal.pause()  # until the forwarded signal's handler has run here
            else:
                signal.raise_signal(signum)
        return super().step(action)
