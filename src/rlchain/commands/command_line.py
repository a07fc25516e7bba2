"""The overrides of an ``rlchain-train`` command line checked before Hydra runs it: a key that is not in the
config it composes, or an option that its config group lacks (``algorithm=grpoo``), is one line with a close
match, instead of Hydra's advice to add it with ``+`` or its listing of the group's schemas and search path.

Hydra composes the config before rlchain's task function runs, and prints a
misspelt key (``trainer.max_iterations=5``) as several lines that suggest
``+trainer.max_iterations=5``, which would train with the key ignored.
:func:`unknown_keys` composes the command line as Hydra will, through Hydra's
compose API and its config loader (a multirun as a multirun, a
``--config-dir`` as a search path entry in the same place), and only where
that composition fails on a key that is not in the config, composes it again
without the key to name what is there::

    Invalid config: trainer.max_iterations=5: max_iterations is not a setting of trainer=default
    (did you mean trainer.iterations=5?): expected one of iterations, rollout_steps, ...

(one line). Every other outcome, a composition that succeeds or fails for
another reason, is left to Hydra, which composes the command line again and
reports it as before.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from typing import Any

from rlchain.settings import RENAMED

__all__ = ["HIDDEN_GROUPS", "help_groups", "register_help_resolver", "unknown_keys"]

#: Config groups that ``--help`` and the lines of :func:`unknown_keys` leave out: their options are chosen by other
#: options' defaults lists (``algorithm=grpo`` selects ``algorithm_defaults/grpo``), never on the command line.
HIDDEN_GROUPS = ("algorithm_defaults",)

#: Where ``rlchain-train`` finds its primary config (``@hydra.main`` of :func:`rlchain.commands.train.main`).
CONFIG_MODULE, CONFIG_NAME = "rlchain.conf", "train"


def unknown_keys(argv: Sequence[str], config_module: str = CONFIG_MODULE, config_name: str = CONFIG_NAME) -> list[str]:
    """One line for each override of ``argv`` (``rlchain-train``'s arguments) whose key the config lacks.

    Each line names the override, where its key is missing (the selected
    option of the config group: ``trainer=default``), a close match (another
    key of the node, or another option of the group that has the key:
    ``did you mean env=gym env.id=Pendulum-v1?``) and the keys that node
    has. Overrides with ``+``, ``++`` or ``~`` are Hydra's to check.

    Returns:
        the lines; ``[]`` when the command line composes, fails for another
        reason, cannot be checked the way Hydra will compose it (``--config-path``,
        ``hydra.searchpath`` with ``--config-dir``) or does not compose
        (``--help`` is checked, ``--hydra-help``, ``--info`` and ``--shell-completion``
        are not), and with ``HYDRA_FULL_ERROR=1``, which asks for Hydra's own report.
    """
    if not argv or os.environ.get("HYDRA_FULL_ERROR") == "1":
        return []
    from hydra import initialize_config_module
    from hydra._internal.utils import get_args_parser  # the parser of @hydra.main itself
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException
    from hydra.types import RunMode

    import rlchain.commands.config  # noqa: F401  (registers the schemas that rlchain's config options extend)

    args, _ = get_args_parser().parse_known_args(list(argv))
    if (
        args.config_path is not None
        or args.experimental_rerun is not None
        or args.hydra_help
        or args.info
        or args.shell_completion
        or not args.overrides
    ):
        return []
    overrides = list(args.overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return []  # Hydra's one message names the override it cannot parse
    if args.config_dir is not None:  # Hydra puts --config-dir where a hydra.searchpath entry goes
        config_dir = os.path.abspath(args.config_dir)
        if not os.path.isdir(config_dir) or any(o.key_or_group == "hydra.searchpath" for o in parsed):
            return []
        quoted = ("file://" + config_dir).replace("\\", "\\\\").replace("'", "\\'")
        overrides.append(f"hydra.searchpath=['{quoted}']")
    mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
    with initialize_config_module(config_module, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        plain = [o for o in parsed if not (o.is_add() or o.is_force_add() or o.is_delete() or o.package is not None)]
        # the groups and options of the search path this command line composes with (a --config-dir's too)
        _, repo = loader._parse_overrides_and_create_caching_repo(args.config_name or config_name, overrides)
        options = [line for o in plain if repo.group_exists(o.key_or_group) for line in _unknown_options(repo, o)]
        if options:
            return options
        keys = [o for o in plain if not _is_group(loader, o.key_or_group)]
        if not keys:
            return []  # group choices only: nothing Hydra could miss in the config
        check = _Check(loader, args.config_name or config_name, mode)
        # A multirun composes its sweeps (trainer.iterations=5,10) only in each job, from the choices of that job;
        # their keys are looked up in the sweep's config unless a group is swept (a key may be in one option only).
        swept = (
            []
            if any(o.is_sweep_override() for o in plain if o not in keys)
            else [o.input_line for o in keys if o.is_sweep_override()]
        )
        return check.lines(overrides, swept)


def _is_group(loader: Any, key: str) -> bool:
    """Whether ``key`` (``env``, ``hydra/launcher``) is a config group on the loader's search path."""
    parent, _, name = key.rpartition("/")
    return name in loader.list_groups(parent)


def _unknown_options(repo: Any, override: Any) -> list[str]:
    """One line for each option that ``override`` (a choice of a config group, ``algorithm=grpoo``; a sweep's
    ``algorithm=ppo,grpoo`` too) names and the group lacks: the group's real options (not the ``*_schema``
    ones) and a close match, instead of Hydra's listing of the group with its schemas and the search path. Hydra's
    own groups (``hydra/...``) and a choice of no option (``experiment=null``) are Hydra's to check."""
    from hydra.core.object_type import ObjectType
    from hydra.core.override_parser.types import ChoiceSweep

    group = override.key_or_group
    if group.startswith("hydra/") or group in HIDDEN_GROUPS:
        return []
    value = override.value()
    chosen = value.list if isinstance(value, ChoiceSweep) else [value]
    if not all(isinstance(option, str) for option in chosen):
        return []  # null, or a sweep Hydra expands otherwise (range, glob): Hydra's to check
    known = sorted(o for o in repo.get_group_options(group, ObjectType.CONFIG) if not o.endswith("_schema"))
    lines = []
    for option in chosen:
        if option in known:
            continue
        close = difflib.get_close_matches(option, known, n=1)
        hint = f" (did you mean {group}={close[0]}?)" if close else ""
        lines.append(
            f"Invalid config: {override.input_line}: {option} is not an option of {group}{hint}: "
            f"expected one of {', '.join(known)}"
        )
    return lines


def _app_groups(loader: Any, parent: str = "") -> list[str]:
    """Every config group under ``parent`` that holds options, but Hydra's (``hydra/...``) and :data:`HIDDEN_GROUPS`."""
    from hydra.core.object_type import ObjectType

    found = []
    for name in loader.list_groups(parent):
        group = f"{parent}/{name}" if parent else name
        if group in ("hydra", *HIDDEN_GROUPS):
            continue
        if loader.get_group_options(group, ObjectType.CONFIG):
            found.append(group)
        found += _app_groups(loader, group)
    return found


def help_groups(*groups: str) -> str:
    """The ``group: option, option`` lines of ``rlchain-train --help``: ``groups``, or without them every group
    of :func:`_app_groups` (a user's ``--config-dir`` groups included), without the ``<name>_schema`` options
    (the schemas the YAML options extend, see :func:`rlchain.commands.config.register_configs`).

    The ``${rlchain_groups:...}`` resolver of conf/train.yaml's ``hydra.help.template``; empty where Hydra is
    not initialised (a config resolved outside a Hydra app).
    """
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    if not GlobalHydra.instance().is_initialized():
        return ""
    loader = GlobalHydra.instance().config_loader()
    lines = []
    for group in sorted(groups or _app_groups(loader)):
        options = [o for o in sorted(loader.get_group_options(group, ObjectType.CONFIG)) if not o.endswith("_schema")]
        if options:
            lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines) + "\n"


def register_help_resolver() -> None:
    """Register ``${rlchain_groups:...}`` (:func:`help_groups`): the option lists of conf/train.yaml's
    ``hydra.help.template`` (registered by :mod:`rlchain.commands.train`, whose ``--help`` resolves it)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("rlchain_groups"):
        OmegaConf.register_new_resolver("rlchain_groups", help_groups)


def _missing_key(cfg: Any, key: str) -> str | None:
    """The first prefix of the dotted ``key`` that ``cfg`` lacks (``algoritm`` of ``algoritm.learning_rate``),
    or None when it has the key or a part of the path is no dict node (Hydra's to judge)."""
    from omegaconf import OmegaConf

    node = cfg
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not OmegaConf.is_dict(node):
            return None
        if part not in node.keys():
            return ".".join(parts[: i + 1])
        if i < len(parts) - 1:
            node = node[part]
    return None


class _Check:
    """Composes a command line with ``loader`` as Hydra will, and describes the keys it lacks."""

    def __init__(self, loader: Any, config_name: str, mode: Any) -> None:
        self.loader, self.config_name, self.mode = loader, config_name, mode

    def compose(self, overrides: Sequence[str]) -> Any:
        """The config of ``overrides`` (Hydra's node included); raises what Hydra's composition raises."""
        return self.loader.load_configuration(
            config_name=self.config_name, overrides=list(overrides), run_mode=self.mode, from_shell=True
        )

    def missing(self, err: Exception, overrides: Sequence[str]) -> tuple[int, str] | None:
        """``(index in overrides, the missing key)`` of the override that the composition of ``overrides`` failed
        on with ``err`` for a key the config lacks; None when it failed for another reason."""
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import ConfigCompositionException
        from omegaconf.errors import ConfigAttributeError, ConfigKeyError

        if not isinstance(err, ConfigCompositionException):
            return None
        cause = err.__cause__
        if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)) or not cause.full_key:
            return None
        full_key = cause.full_key
        for i, o in enumerate(OverridesParser.create().parse_overrides(list(overrides))):
            plain = not (o.is_add() or o.is_force_add() or o.is_delete())
            if plain and (o.key_or_group == full_key or o.key_or_group.startswith(full_key + ".")):
                return i, full_key
        return None

    def lines(self, overrides: list[str], swept: Sequence[str] = ()) -> list[str]:
        """One line per override whose key the config lacks, the ``swept`` ones (sweeps of a multirun, which
        Hydra composes in each job) looked up in the config of the others; ``[]`` when there is none or the
        rest of the command line does not compose (Hydra then reports it)."""
        bad: list[tuple[str, str]] = []
        rest = list(overrides)
        while True:
            try:
                cfg = self.compose(rest)
                break
            except Exception as err:  # noqa: BLE001 - whatever the composition raises is Hydra's to report, but a missing key
                found = self.missing(err, rest)
                if found is None:
                    return []
                i, full_key = found
                bad.append((rest.pop(i), full_key))
        for line in swept:
            full_key = _missing_key(cfg, line.partition("=")[0])
            if full_key is not None and line in rest:
                rest.remove(line)
                bad.append((line, full_key))
        return [self.describe(cfg, rest, line, full_key) for line, full_key in bad]

    def describe(self, cfg: Any, rest: list[str], line: str, full_key: str) -> str:
        """The line for override ``line`` (``key=value``) whose ``full_key`` (its key or a prefix of it) ``cfg``
        lacks."""
        from omegaconf import OmegaConf

        key, _, value = line.partition("=")
        parent, _, name = full_key.rpartition(".")
        tail = key[len(full_key) :]  # what follows the missing key in the override's key
        if not parent:
            allowed = sorted({str(k) for k in cfg if k != "hydra"} | set(_app_groups(self.loader)))
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f" (did you mean {close[0]}{tail}={value}?)" if close else ""
            return (
                f"Invalid config: {line}: {name} is not a setting or config group{hint}: "
                f"expected one of {', '.join(allowed)}"
            )
        node = OmegaConf.select(cfg, parent)
        keys = [str(k) for k in node if k != "_target_"] if OmegaConf.is_dict(node) else []
        group = parent.replace(".", "/")
        choice = cfg.hydra.runtime.choices.get(group)
        where = f"{group}={choice}" if choice is not None else parent
        close = difflib.get_close_matches(name, keys, n=1)
        if RENAMED.get(name) in keys:
            hint = f" (it is {parent}.{RENAMED[name]}{tail}={value} now)"
        elif close:
            hint = f" (did you mean {parent}.{close[0]}{tail}={value}?)"
        else:
            option = self.option_with(rest, group, choice, full_key) if choice is not None else None
            hint = f" (did you mean {group}={option} {line}?)" if option is not None else ""
        return f"Invalid config: {line}: {name} is not a setting of {where}{hint}: expected one of {', '.join(keys)}"

    def option_with(self, rest: list[str], group: str, choice: str, full_key: str) -> str | None:
        """Another option of ``group`` (not a ``*_schema``) whose config has ``full_key``, or None."""
        from hydra.core.object_type import ObjectType
        from omegaconf import OmegaConf

        parent, _, name = full_key.rpartition(".")
        for option in sorted(self.loader.get_group_options(group, ObjectType.CONFIG)):
            if option == choice or option.endswith("_schema"):
                continue
            try:
                chosen = [o for o in rest if o.partition("=")[0] != group]
                node = OmegaConf.select(self.compose([*chosen, f"{group}={option}"]), parent)
            except Exception:  # noqa: BLE001 - an option that does not compose with the rest has no say
                continue
            if OmegaConf.is_dict(node) and name in node.keys():
                return option
        return None
