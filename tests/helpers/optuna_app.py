"""A small ``@hydra.main`` app for rlchain's Optuna sweeper: each job returns ``(x - 0.3) ** 2`` at once, or
waits, releases or raises as its config says (by the number of its trial, :func:`rlchain.run.tuning.trial`).

    python -m tests.helpers.optuna_app -m hydra/sweeper=rlchain_optuna 'x=interval(0, 1)' [hold=0 release=2 ...]

``hold``: the trial that waits until ``<hydra.sweep.dir>/released`` exists (at most ``hold_s`` seconds);
``release``: the trial that creates that file; ``crash``: the trial that raises; ``crash_y``: every trial with that
``y`` raises. Starts without torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig

from rlchain import tuning


@dataclass
class AppConfig:
    x: float = 0.0
    y: int = 0
    hold: int | None = None
    hold_s: float = 60.0
    release: int | None = None
    crash: int | None = None
    crash_y: int | None = None


ConfigStore.instance().store(name="optuna_app", node=AppConfig)


@hydra.main(version_base="1.3", config_path=None, config_name="optuna_app")
def main(cfg: Any) -> float:
    trial = tuning.trial()
    number = trial.number if trial is not None else None
    released = Path(HydraConfig.get().sweep.dir) / "released"
    if number is not None and number == cfg.crash:
        raise RuntimeError(f"trial {number} crashed on purpose")
    if cfg.y == cfg.crash_y:
        raise RuntimeError(f"y={cfg.y} crashes on purpose")
    if number is not None and number == cfg.release:
        released.touch()
    if number is not None and number == cfg.hold:
        deadline = time.monotonic() + cfg.hold_s
        while not released.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return (cfg.x - 0.3) ** 2 + cfg.y


if __name__ == "__main__":
    main()
