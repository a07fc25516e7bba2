"""An env ``_target_`` that sends its own process a stop signal at one chosen env step (no timing involved)."""

from __future__ import annotations

import signal
from pathlib import Path

import torch

from rlchain.core.envs import PushCubeEnv


class SignallingPushCube(PushCubeEnv):
    """``PushCubeEnv`` whose ``signal_at_step``-th ``step`` (counted from 1) first sends its process
    ``SIG<signal_name>``, once: it creates ``marker`` first, and no env signals while it exists (a resumed run
    builds its env again)."""

    def __init__(self, signal_at_step: int, marker: str, signal_name: str = "TERM", **kwargs) -> None:
        super().__init__(**kwargs)
        self.signal_at_step, self.marker, self.signal_name = int(signal_at_step), Path(marker), signal_name
        self.steps_taken = 0

    def step(self, action: torch.Tensor):
        self.steps_taken += 1
        if self.steps_taken == self.signal_at_step and not self.marker.exists():
            self.marker.touch()
            signal.raise_signal(signal.Signals["SIG" + self.signal_name])
        return super().step(action)
