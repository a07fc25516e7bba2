"""Toy envs for fault tests, driven through marker files so no test depends on timing.

``FaultLineEnv`` is :class:`tests.helpers.toy_env.LineEnv` plus three switches, each a file path:

* ``hold_build``: while this file exists, the constructor waits (start-up is
  still going on); it writes ``<hold_build>.waiting`` first, so a test knows.
* ``hold_step``: while this file exists, ``step`` waits (an iteration that
  cannot end until the test says so); it writes ``<hold_step>.waiting`` first.
* ``fail_at_step``: ``step`` number N (counted from construction) raises, as
  a simulator that crashes would.
* ``fault_rank``: the switches act only in the process of this rank of a
  multi-process run (torchrun's ``RANK``); None: in every process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.helpers.toy_env import LineEnv


def _hold(path: str | None) -> None:
    if path and Path(path).exists():
        Path(f"{path}.waiting").touch()
        while Path(path).exists():
            time.sleep(0.01)


class FaultLineEnv(LineEnv):
    def __init__(
        self,
        hold_build: str | None = None,
        hold_step: str | None = None,
        fail_at_step: int | None = None,
        fault_rank: int | None = None,
        **kwargs,
    ):
        if fault_rank is not None and int(os.environ.get("RANK", 0)) != fault_rank:
            hold_build = hold_step = fail_at_step = None
        _hold(hold_build)
        super().__init__(**kwargs)
        self.hold_step, self.fail_at_step, self.steps = hold_step, fail_at_step, 0

    def step(self, action):
        self.steps += 1
        if self.fail_at_step is not None and self.steps == self.fail_at_step:
            raise RuntimeError("the simulator exploded")
        _hold(self.hold_step)
        return super().step(action)
