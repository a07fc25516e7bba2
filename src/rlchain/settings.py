"""One home per setting: a component's settings are the fields of one dataclass.

Each field states its name, type (the annotation), default and allowed range
once, and its doc in the string under it::

    @dataclass
    class PPOConfig(AlgorithmConfig):
        _target_: str = "rlchain.core.algorithms.PPO"
        gae_lambda: float = setting(0.95, ge=0, le=1)
        \"\"\"GAE lambda (Schulman et al. 2016).\"\"\"

The dataclass is the Hydra schema of the component (composition rejects a
misspelt key or a value of the wrong type), and the component is built from
it: ``PPO(policy, **settings)`` creates ``PPOConfig(**settings)``, whose
:meth:`Settings.__post_init__` checks every value against its type and range,
then the rules between fields (:meth:`Settings.check`). A bad value fails
there, before any step, with a message that names the field, the value and
what is allowed. A subclass may change a default (``learning_rate: float =
1e-3``) and keeps the range of the field it overrides.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Sequence
from typing import Any

__all__ = ["RENAMED", "SettingError", "Settings", "refuse_renamed", "rejection", "renamed", "setting"]

_RANGE = "rlchain_range"

#: Settings that earlier releases named otherwise, old name -> new name. A config saved by such a release is read
#: with the new names (:func:`renamed`); given by hand, the old name is refused in one line that names the new one
#: (:func:`refuse_renamed`, and the command line's key check).
RENAMED = {"episode_length": "max_episode_steps"}


class SettingError(ValueError):
    """A value a setting may not take: ``<name>=<value!r><rest>``, e.g. ``num_envs=0 is not allowed: expected ...``.

    The name is kept apart so that the caller that knows the setting's config
    group can name it in full (:meth:`qualified`: ``env.num_envs=0 ...``). A
    name that holds a dot is already in full (``algorithm.group_size``).

    Args:
        name: the setting's name.
        value: the value it got.
        rest: the message after ``name=value``, from its first character
            (``" is not allowed: expected an integer > 0"``, ``": the checkpoint's ..."``).
    """

    def __init__(self, name: str, value: Any, rest: str) -> None:
        self.name, self.value, self.rest = name, value, rest
        super().__init__(self.qualified(""))

    def qualified(self, group: str) -> str:
        """The message with the name prefixed by ``group.`` (unless ``group`` is empty or the name is in full)."""
        name = f"{group}.{self.name}" if group and "." not in self.name else self.name
        return f"{name}={self.value!r}{self.rest}"


def renamed(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` (a saved config's node, e.g. its ``env``) with each old name of :data:`RENAMED` under its new
    name (a new name already there wins)."""
    out = dict(settings)
    for old, new in RENAMED.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out


def refuse_renamed(settings: dict[str, Any]) -> None:
    """Refuse a setting given by an old name of :data:`RENAMED`.

    Raises:
        SettingError: ``<old>=<value> is not a setting any more: it is <new> now``.
    """
    for old, new in RENAMED.items():
        if old in settings:
            raise SettingError(
                old, settings[old], f" is not a setting any more: it is {new} now ({new}={settings[old]!r})"
            )


def rejection(err: BaseException, group: str) -> str | None:
    """The one-line message of a component of config group ``group`` that rejected a value while it was built.

    ``err`` is the ``ValueError`` it raised, or the error that wraps one as
    its ``__cause__`` (Hydra's ``InstantiationException``). A
    :class:`SettingError` names its setting in full (``env.num_envs=0 is not
    allowed: ...``); another ``ValueError`` is prefixed with the group
    (``policy: ...``). None when no ``ValueError`` is behind ``err``.
    """
    cause = err if isinstance(err, ValueError) else err.__cause__
    if isinstance(cause, SettingError):
        return cause.qualified(group)
    if isinstance(cause, ValueError):
        return f"{group}: {cause}" if group else str(cause)
    return None


def setting(
    default: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    choices: Sequence[Any] | None = None,
) -> Any:
    """A dataclass field with ``default`` and the range its values must lie in.

    ``gt``/``ge``/``le`` bound a number (every element of a list); ``choices``
    lists the allowed values. A list or dict default is copied for every
    instance.
    """
    metadata = {_RANGE: {"gt": gt, "ge": ge, "le": le, "choices": tuple(choices) if choices is not None else None}}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _range_of(cls: type, name: str) -> dict[str, Any] | None:
    """The range of field ``name``: from the first class in ``cls``'s MRO that declares one."""
    for klass in cls.__mro__:
        declared = getattr(klass, "__dataclass_fields__", {}).get(name)
        if declared is not None and _RANGE in declared.metadata:
            return declared.metadata[_RANGE]
    return None


def _kinds(annotation: Any) -> tuple[tuple[type, ...], bool, Any]:
    """``(scalar types, None allowed, element annotation of a list or None)`` of a field annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        inner = [a for a in args if a is not type(None)]
        scalars, _, element = _kinds(inner[0]) if len(inner) == 1 else (tuple(inner), False, None)
        return scalars, type(None) in args, element
    if origin in (list, tuple, Sequence):
        return (), False, (typing.get_args(annotation) or (Any,))[0]
    return ((annotation,) if isinstance(annotation, type) else ()), False, None


def _bound(x: float | None) -> str | None:
    """A bound as written in a message: whole numbers in full (4294967295, 0), others as ``:g`` (1e-08)."""
    if x is None:
        return None
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _describe(kind: type | None, bounds: dict[str, Any]) -> str:
    """What is allowed, in words: 'an integer > 0', 'a number in [0, 1]', "one of 'a', 'b'"."""
    if bounds.get("choices") is not None:
        return "one of " + ", ".join(repr(c) for c in bounds["choices"])
    noun = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(kind, "a value")
    gt, ge, le = (_bound(bounds.get(key)) for key in ("gt", "ge", "le"))
    if ge is not None and le is not None:
        return f"{noun} in [{ge}, {le}]"
    parts = [
        f"> {gt}" if gt is not None else "",
        f">= {ge}" if ge is not None else "",
        f"<= {le}" if le is not None else "",
    ]
    return " ".join([noun, *(p for p in parts if p)])


def _check_value(name: str, value: Any, kind: type | None, bounds: dict[str, Any], optional: bool) -> None:
    """Raise :class:`SettingError` naming ``name`` unless ``value`` has type ``kind`` and lies within ``bounds``."""
    if value is None and optional:
        return
    expected = _describe(kind, bounds) + (" or None" if optional else "")
    if bounds.get("choices") is not None:
        if value not in bounds["choices"]:
            raise SettingError(name, value, f" is not allowed: expected {expected}")
        return
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: is_number and math.isfinite(value),
        bool: isinstance(value, bool),
        str: isinstance(value, str),
    }.get(kind, True)
    if ok and is_number:
        gt, ge, le = bounds.get("gt"), bounds.get("ge"), bounds.get("le")
        ok = (gt is None or value > gt) and (ge is None or value >= ge) and (le is None or value <= le)
    if not ok:
        raise SettingError(name, value, f" is not allowed: expected {expected}")


@dataclasses.dataclass
class Settings:
    """Base of every settings dataclass: validates each field, then the rules between fields, on creation.

    Raises:
        SettingError: ``<field>=<value> is not allowed: expected <range>`` for
            the first field whose value has the wrong type or lies outside its
            :func:`setting` range; or the message of :meth:`check`.
    """

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            if f.name.startswith("_"):
                continue
            scalars, optional, element = _kinds(hints[f.name])
            bounds = _range_of(type(self), f.name) or {}
            value = getattr(self, f.name)
            if element is not None and not (value is None and optional):
                if not isinstance(value, (list, tuple)):
                    raise SettingError(f.name, value, " is not allowed: expected a list")
                for i, item in enumerate(value):
                    _check_value(f"{f.name}[{i}]", item, element if isinstance(element, type) else None, bounds, False)
                continue
            kind = scalars[0] if len(scalars) == 1 else None
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
                object.__setattr__(self, f.name, value)
            _check_value(f.name, value, kind, bounds, optional)
        self.check()

    def check(self) -> None:
        """The rules between fields (none here); subclasses raise :class:`SettingError` naming the fields involved."""
