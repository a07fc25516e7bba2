"""The search space: Hydra's sweep syntax (``hydra.sweeper.params`` and sweep overrides) as Optuna distributions.

The mapping is the one of Hydra's Optuna sweeper plugin
(``hydra_plugins.hydra_optuna_sweeper._impl.create_optuna_distribution_from_override``),
on Optuna's current distribution classes:

=================================  ==========================================================
``choice(a, b, ...)``              ``CategoricalDistribution([a, b, ...])``
``shuffle(range(...))``            ``CategoricalDistribution`` of the range's values
``range(a, b)``, ``range(a, b, s)`` ``IntDistribution(a, b, step=s)`` (``b`` included; ``s`` = 1);
                                   ``FloatDistribution(a, b, step=s)`` when any is a float
``interval(a, b)``                 ``FloatDistribution(a, b)`` (Hydra makes both bounds floats);
                                   ``int(interval(a, b))``: ``IntDistribution(a, b)``
``tag(log, interval(a, b))``       the same with ``log=True``
a value                            a fixed value: passed to every trial as it is
=================================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, RangeSweep, Transformer
from hydra.errors import CompactHydraException, OverrideParseException

from rlchain.console import error_line

__all__ = ["SweeperError", "grid_of", "search_space"]


class SweeperError(CompactHydraException):
    """A ``hydra.sweeper`` setting or a study the sweeper cannot use (printed in one line, without traceback)."""


def _distribution(override: Override, name: str) -> Any:
    """The Optuna distribution of a sweep override, or the fixed value (a string) of another."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if not override.is_sweep_override():
        return override.get_value_element_as_str()
    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        choices = list(override.sweep_iterator(transformer=Transformer.encode))
        for choice in choices:
            if not isinstance(choice, (str, int, float, bool, type(None))):
                raise SweeperError(
                    f"{name} is not allowed: a choice is a str, int, float, bool or null, got {choice!r}"
                )
        if not choices:
            raise SweeperError(f"{name} is not allowed: an empty choice")
        return CategoricalDistribution(choices)
    if override.is_range_sweep():
        assert isinstance(value, RangeSweep)
        if any(isinstance(x, float) for x in (value.start, value.stop, value.step)):
            return FloatDistribution(value.start, value.stop, step=value.step)
        return IntDistribution(int(value.start), int(value.stop), step=int(value.step))
    if override.is_interval_sweep():
        assert isinstance(value, IntervalSweep)
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(int(value.start), int(value.end), log=log)
        return FloatDistribution(value.start, value.end, log=log)
    raise SweeperError(f"{name} is not allowed: expected interval, range, choice or a value")


def search_space(params: Mapping[str, Any] | None, arguments: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The distributions and the fixed values of ``hydra.sweeper.params`` plus the command line's ``arguments``.

    A key given in both takes the command line's value (as with Hydra's
    plugin); a key fixed on the command line is fixed for every trial.

    Returns:
        ``({key: optuna distribution}, {key: fixed value as an override string})``.

    Raises:
        SweeperError: an expression that does not parse or that Optuna
            cannot sample (``interval(1, 0)``, an empty ``choice``, a ``step``
            of 0), naming ``hydra.sweeper.params.<key>`` or the argument.
    """
    parser = OverridesParser.create()
    lines = [(f"hydra.sweeper.params.{key}", f"{key}={value}") for key, value in (params or {}).items()]
    lines += [(f"the argument {a!r}", a) for a in arguments]
    distributions: dict[str, Any] = {}
    fixed: dict[str, str] = {}
    for name, line in lines:
        try:
            (override,) = parser.parse_overrides([line])
            key = override.get_key_element()
            value = _distribution(override, name)
        except SweeperError:
            raise
        except (OverrideParseException, ValueError, TypeError) as err:
            raise SweeperError(
                f"{name}={line.partition('=')[2]!r} is not allowed: {error_line(str(err))}; "
                "expected interval(a, b), tag(log, interval(a, b)), range(a, b[, step]), "
                "choice(...) or a value"
            ) from None
        distributions.pop(key, None)
        fixed.pop(key, None)
        if isinstance(value, str):
            fixed[key] = value
        else:
            distributions[key] = value
    return distributions, fixed


def _float_steps(low: float, high: float, step: float) -> list[float]:
    """``low, low + step, ...`` up to ``high`` (included), each in decimal arithmetic on the bounds as written:
    ``0.1, 0.2, 0.3`` for ``(0.1, 0.3, 0.1)``, where float sums give ``0.30000000000000004``, outside the range
    (Optuna warns on such a point). Optuna's ``FloatDistribution`` already cut ``high`` to ``low + k * step`` the
    same way; each point is clamped to ``[low, high]`` all the same."""
    d_low, d_step = Decimal(str(low)), Decimal(str(step))
    count = int((Decimal(str(high)) - d_low) // d_step) + 1
    return [min(high, max(low, float(d_low + i * d_step))) for i in range(count)]


def grid_of(distributions: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Every value of each distribution, for the grid sampler: choices, and each step of a range (its end included;
    a float range's points as written in decimal, ``0.1, 0.2, 0.3``, within its bounds).

    Raises:
        SweeperError: a continuous ``interval`` (no grid), naming it.
    """
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    grid: dict[str, list[Any]] = {}
    for key, dist in distributions.items():
        if isinstance(dist, CategoricalDistribution):
            grid[key] = list(dist.choices)
        elif isinstance(dist, IntDistribution) and not dist.log:
            grid[key] = list(range(dist.low, dist.high + 1, dist.step))
        elif isinstance(dist, FloatDistribution) and dist.step is not None:
            grid[key] = _float_steps(dist.low, dist.high, dist.step)
        else:
            raise SweeperError(
                f"hydra.sweeper.params.{key} is not allowed with hydra.sweeper.sampler=grid: the grid "
                "sampler takes choice(...) and range(...), not an interval"
            )
    return grid
