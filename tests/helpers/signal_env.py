"""An env ``_target_`` that sends a stop signal at one chosen env step, or as the n-th of its kind is built (no timing
involved): to its own process, or to its parent (a launcher, which forwards it to the process that trains) and
then waits for it to come back."""

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
    worker trains this env) and waits until a signal reaches this process (the launcher forwards it).
    ``signal_at_build=n`` signals instead as the ``n``-th env of this kind is built (counted in ``<marker>.builds``,
    over every process that builds one)."""

    def __init__(
        self,
        signal_at_step: int,
        marker: str,
        signal_name: str = "TERM",
        signal_to: str = "self",
        signal_at_build: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.signal_at_step, self.marker, self.signal_name = int(signal_at_step), Path(marker), signal_name
        self.signal_to = signal_to
        self.steps_taken = 0
        if signal_at_build is not None:
            builds = self.marker.with_suffix(".builds")
            with builds.open("a") as f:
                f.write("x")
            if len(builds.read_text()) == int(signal_at_build):
                self._signal()

    def _signal(self) -> None:
        if self.marker.exists():
            return
        self.marker.touch()
        signum = signal.Signals["SIG" + self.signal_name]
        if self.signal_to == "parent":
            os.kill(os.getppid(), signum)
            signal.pause()  # until the forwarded signal's handler has run here
        else:
            signal.raise_signal(signum)

    def step(self, action: torch.Tensor):
        self.steps_taken += 1
        if self.steps_taken == self.signal_at_step:
            self._signal()
        return super().step(action)
