"""A researcher's own small Hydra app, as rlchain's Optuna sweeper must run it: its ``trainer`` node is a
structured config that it instantiates (a ``_target_`` and no ``trial`` key), and it reports its loss at every
step with :func:`rlchain.run.tuning.report`, ending early when the study's pruner prunes its trial.

    python -m tests.helpers.user_app -m hydra/sweeper=rlchain_optuna 'trainer.lr=interval(0, 1)'

The trainer descends ``(w - 1) ** 2`` from ``w = 0`` with step size ``lr``: after step ``t`` (from 0) the loss
is ``(1 - 2 lr) ** (2 (t + 1))``. Starts without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate

from rlchain import tuning


class Trainer:
    """Gradient descent on ``(w - 1) ** 2``, ``steps`` steps of size ``lr`` from ``w = 0``."""

    def __init__(self, lr: float, steps: int) -> None:
        self.lr, self.steps = lr, steps

    def fit(self) -> float:
        """The loss after the last step, or after the step at which the trial was pruned."""
        w, loss = 0.0, 1.0
        for step in range(self.steps):
            w -= self.lr * 2 * (w - 1)
            loss = (w - 1) ** 2
            if tuning.report(loss, step):
                break
        return loss


@dataclass
class TrainerConf:
    _target_: str = "tests.helpers.user_app.Trainer"
    lr: float = 0.25
    steps: int = 5


@dataclass
class UserConfig:
    trainer: TrainerConf = field(default_factory=TrainerConf)


ConfigStore.instance().store(name="user_app", node=UserConfig)


@hydra.main(version_base="1.3", config_path=None, config_name="user_app")
def main(cfg: Any) -> float:
    return instantiate(cfg.trainer).fit()


if __name__ == "__main__":
    main()
