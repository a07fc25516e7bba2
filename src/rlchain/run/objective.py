"""The run objective and the best values a run reached (the evaluation ``best.pt`` holds).

``trainer.objective`` names the logged metric a run returns to a sweeper
(``auto``: ``eval/success_rate`` for a task that reports success, else
``eval/avg_reward``), and ``trainer.objective_direction`` which way it is
better. :class:`Objective` resolves and checks the name and tracks the best
value; :class:`Best` tracks one metric in one direction, as PyTorch
Lightning's ``ModelCheckpoint(monitor=..., mode=...)`` does.
"""

from __future__ import annotations

import difflib
import math
import uuid
from typing import Any

__all__ = ["OBJECTIVE_DIRECTIONS", "Best", "Objective", "ObjectiveError"]

OBJECTIVE_DIRECTIONS = ("maximize", "minimize")


class ObjectiveError(ValueError):
    """``trainer.objective`` names a metric the run never logs (found after its first iteration)."""


class Best:
    """The best value of one metric so far, the ``global_step`` it was logged at, and an id of that best.

    Args:
        direction: ``"maximize"`` or ``"minimize"``.
    """

    def __init__(self, direction: str = "maximize") -> None:
        self.direction = direction
        self.value: float | None = None
        self.step: int | None = None
        self.id: str | None = None
        """Random hex, new with every best: tells the checkpoint of this best from one of another run or branch."""

    def improves(self, value: float | None) -> bool:
        """Whether ``value`` is finite and strictly better than the best (ties keep the earlier)."""
        if value is None or not math.isfinite(value):
            return False
        return self.value is None or (value > self.value if self.direction == "maximize" else value < self.value)

    def take(self, value: float, step: int) -> None:
        """Make ``value``, logged at ``step``, the best (see :meth:`improves`), with a new id."""
        self.value, self.step, self.id = float(value), step, uuid.uuid4().hex

    def offer(self, value: float | None, step: int) -> bool:
        """:meth:`take` ``value`` when it :meth:`improves` the best; returns whether it did."""
        better = self.improves(value)
        if better:
            self.take(value, step)
        return better

    def state_dict(self) -> dict[str, Any]:
        """``{"value", "step", "id"}``."""
        return {"value": self.value, "step": self.step, "id": self.id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (keys that are absent: None)."""
        self.value, self.step, self.id = state.get("value"), state.get("step"), state.get("id")


class Objective:
    """The run objective: its metric, its direction, and its best value (:attr:`best`).

    Args:
        name: ``trainer.objective``; ``"auto"`` is resolved by the first
            evaluation (:meth:`resolve`).
        direction: ``trainer.objective_direction``.
    """

    def __init__(self, name: str, direction: str) -> None:
        self.name = name
        self.direction = direction
        self.best = Best(direction)

    def resolve(self, evaluation: dict[str, Any]) -> None:
        """``auto`` becomes ``eval/success_rate`` or ``eval/avg_reward`` once an evaluation's row shows which exists."""
        if self.name == "auto" and evaluation:
            self.name = "eval/success_rate" if "eval/success_rate" in evaluation else "eval/avg_reward"

    def value(self, row: dict[str, Any]) -> float | None:
        """The objective in ``row`` (None when the row lacks it)."""
        return row.get(self.name)

    def check(self, names: set[str]) -> None:
        """Raise :class:`ObjectiveError` unless the objective is one of ``names`` (``auto`` always passes).

        Raises:
            ObjectiveError: naming the objective, a close match and every name of ``names``.
        """
        if self.name == "auto" or self.name in names:
            return
        close = difflib.get_close_matches(self.name, sorted(names), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ObjectiveError(
            f"trainer.objective={self.name!r} is not a metric this run logs{hint}: expected one of {', '.join(sorted(names))}"
        )
