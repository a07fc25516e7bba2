"""The command line of ``rlchain-eval`` and ``rlchain-export``: ``SOURCE [key=value ...] [--allow-target MODULE]``.

Both commands read a saved run (a run directory or a checkpoint file) and take their options as ``key=value`` in
Hydra's override syntax, as ``rlchain-train`` does: the options are the fields of a :class:`~rlchain.settings.Settings`
schema (:class:`~rlchain.commands.eval.EvalConfig`, :class:`~rlchain.commands.export.ExportConfig`), each checked
against its type and range; ``env.<key>=<value>`` changes the saved run's env. ``--allow-target`` is a flag, not an
option: it widens what the saved config may import (:mod:`rlchain.commands.saved_run`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rlchain.console import error_line
from rlchain.settings import SettingError, Settings

__all__ = ["SavedRunOptions", "command_parser", "option_names", "read_options"]

S = TypeVar("S", bound="SavedRunOptions")

#: The config groups of a saved run, whose ``<group>.<key>=<value>`` overrides a command passes on.
GROUPS = ("env", "policy", "algorithm", "trainer")


@dataclass
class SavedRunOptions(Settings):
    """The option every command on a saved run has: which of its checkpoints to read."""

    checkpoint: str = "best"
    """'best', 'latest' (of the run directory) or a checkpoint path."""


def option_names(schema: type[SavedRunOptions]) -> list[str]:
    """The options of a command's schema: its fields, in order (the private ``_target_`` style ones left out)."""
    return [f.name for f in dataclasses.fields(schema) if not f.name.startswith("_")]


def read_options(overrides: Sequence[str], schema: type[S]) -> tuple[S, list[str]]:
    """Split ``key=value`` strings into the command's options and the saved config's overrides.

    Args:
        overrides: ``key=value`` strings, Hydra's override syntax.
        schema: the command's options, a :class:`SavedRunOptions` subclass.

    Returns:
        ``(schema(**options), the <group>.<key>=<value> strings in their order)``.

    Raises:
        SavedRunError: a string Hydra's grammar rejects, an unknown option, a
            sweep or ``+``/``~`` on an option, or a value out of its range; one line each.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    from rlchain.commands.saved_run import SavedRunError  # torch and Hydra: not before --help is answered

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as err:
        raise SavedRunError(error_line(str(err))) from None
    names = option_names(schema)
    options: dict[str, Any] = {}
    passed_on = []
    for override in parsed:
        key = override.key_or_group
        if "." in key or key.startswith(GROUPS):
            passed_on.append(override.input_line)
        elif key not in names:
            raise SavedRunError(f"{key}: no such option: expected one of {', '.join(names)} or env.<key>=<value>")
        elif override.is_add() or override.is_force_add() or override.is_delete() or override.is_sweep_override():
            raise SavedRunError(f"{override.input_line}: an option takes one value, as {key}=<value>")
        else:
            options[key] = override.value()
    try:
        return schema(**options), passed_on
    except SettingError as err:
        raise SavedRunError(str(err)) from None


class _OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line (``<prog>: <message>``) and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr, flush=True)
        raise SystemExit(2)


def command_parser(prog: str, doc: str, schema: type[SavedRunOptions]) -> argparse.ArgumentParser:
    """The parser of a command on a saved run: ``SOURCE [key=value ...] [--allow-target MODULE ...]``.

    ``--help`` shows the first paragraph of the command module's docstring ``doc``, its options (the fields of
    ``schema``) and its ``Usage::`` block as examples. Usage errors are one line and exit status 2.
    """
    paragraphs = doc.replace("``", "").split("\n\n")
    examples = next((paragraphs[i + 1] for i, text in enumerate(paragraphs) if text.strip() == "Usage::"), "")
    parser = _OneLineParser(
        prog=prog,
        description=paragraphs[0],
        epilog=f"examples:\n{examples}" if examples else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options = ", ".join(option_names(schema))
    parser.add_argument("source", help="a run directory or a checkpoint file")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help=f"options ({options}) and env.<key>=<value> overrides of the saved config",
    )
    parser.add_argument(
        "--allow-target",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module whose _target_s the saved config may instantiate and that its env may import "
        "(env.imports, an env.id module:Name) besides rlchain's; repeatable",
    )
    return parser
