"""A small ``@hydra.main`` app for rlchain's Optuna sweeper: each job returns ``(x - 0.3) ** 2`` at once, or
waits, releases or raises as its config says (by the number of the trial the sweeper linked it to).

    python -m tests.helpers.optuna_app -m hydra/sweeper=rlchain_optuna 'x=interval(0, 1)' [hold=0 release=2 ...]

``hold``: the trial that waits until ``<hydra.sweep.dir>/released`` exists (at most ``hold_s`` seconds);
``release``: the trial that creates that file; ``crash``: the trial that raises. Starts without torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig


@dataclass
class Trainer:
    trial: Dict[str, Any] = field(default_factory=dict)


@dataclass
class AppConfig:
    x: float = 0.0
    y: int = 0
    hold: Optional[int] = None
    hold_s: float = 60.0
    release: Optional[int] = None
    crash: Optional[int] = None
    trainer: Trainer = field(default_factory=Trainer)


ConfigStore.instance().store(name="optuna_app", node=AppConfig)


@hydra.main(version_base="1.3", config_path=None, config_name="optuna_app")
def main(cfg: Any) -> float:
    number = cfg.trainer.trial.get("number")
    released = Path(HydraConfig.get().sweep.dir) / "released"
    if number is not None and number == cfg.crash:
        raise RuntimeError(f"trial {number} crashed on purpose")
    if number is not None and number == cfg.release:
        released.touch()
    if number is not None and number == cfg.hold:
        deadline = time.monotonic() + cfg.hold_s
        while not released.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return (cfg.x - 0.3) ** 2 + cfg.y


if __name__ == "__main__":
    main()
