"""MkDocs hook: the configuration reference, generated from the settings dataclasses when the site is built.

``docs/configuration.md`` holds the line ``<!-- settings-reference -->``; this hook replaces it with one table per
schema: every field's name, type, default (and the value the YAML option gives it, where that differs), the range
that :func:`rlchain.settings.setting` declares, and the doc string written under the field. The schemas are those
of :data:`rlchain.commands.config.SCHEMAS`, :class:`rlchain.commands.config.RunConfig`, :class:`rlchain.commands.eval.EvalConfig`,
:class:`rlchain.commands.export.ExportConfig` and the
Hydra plugins' config dataclasses; the presets are the YAML files of ``conf/`` with their header comments. Nothing
here repeats what a schema says, so the page cannot go stale: a build reads the code it documents.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import textwrap
import typing
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = "<!-- settings-reference -->"
PAGE = "configuration.md"
ROOT = Path(__file__).resolve().parents[2]
#: The preset groups of ``conf/train.yaml``'s defaults list and the launchers, in the order the page shows them.
PRESET_GROUPS = ("experiment", "study", "sweep", "hparams_search", "debug", "hydra/launcher")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker of the configuration page with the generated reference."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"docs/{PAGE} lost the line {MARKER}: the settings reference has nowhere to go")
    return markdown.replace(MARKER, reference())


def reference() -> str:
    """The whole generated part of the configuration page, in Markdown."""
    from hydra_plugins.rlchain_launcher.config import DevicesLauncherConf
    from hydra_plugins.rlchain_optuna.config import OptunaSweeperConf
    from rlchain.commands.config import SCHEMAS, RunConfig
    from rlchain.commands.eval import EvalConfig
    from rlchain.commands.export import ExportConfig

    out = ["## Top level {#top-level}", "", _doc_paragraph(RunConfig), "", _table(RunConfig, _composed(None, None)), ""]
    groups: dict[str, list[tuple[str, type]]] = {}
    for group, option, schema in SCHEMAS:
        groups.setdefault(group, []).append((option, schema))
    for group, options in groups.items():
        out += [f"## `{group}` {{#{group}}}", ""]
        for option, schema in options:
            yaml = f"conf/{group}/{option}.yaml"
            out += [
                f"### `{group}={option}` {{#{group}-{option}}}",
                "",
                f"Schema `{_path(schema)}`, option `{yaml}`; builds `{schema._target_}`. {_doc_paragraph(schema)}",
                "",
                _table(schema, _composed(group, option), prefix=f"{group}."),
                "",
            ]
    out += [
        "## Presets {#presets}",
        "",
        "The YAML files of these groups set values of the groups above (`# @package _global_`); each one's header "
        "says what it is for.",
        "",
    ]
    for group in PRESET_GROUPS:
        out += [f"### `{group}` {{#{group.replace('/', '-')}}}", "", "| option | what |", "|---|---|"]
        presets = sorted((ROOT / "conf" / group).glob("*.yaml"))
        out += [f"| `{path.stem}` | {_cell(_header(path))} |" for path in presets]
        out.append("")
    out += [
        "## `hydra/launcher=devices` {#hydra-launcher-devices}",
        "",
        f"Schema `{_path(DevicesLauncherConf)}` (`hydra.launcher.*`). {_doc_paragraph(DevicesLauncherConf)} "
        "The ranges are checked when the launcher is created.",
        "",
        _table(DevicesLauncherConf, {}, prefix="hydra.launcher."),
        "",
        "## `hydra/sweeper=rlchain_optuna` {#hydra-sweeper-rlchain_optuna}",
        "",
        f"Schema `{_path(OptunaSweeperConf)}`. {_doc_paragraph(OptunaSweeperConf)}",
        "",
        _table(OptunaSweeperConf, {}, prefix="hydra.sweeper."),
        "",
        "## `rlchain-eval` options {#rlchain-eval}",
        "",
        f"Schema `{_path(EvalConfig)}`. {_doc_paragraph(EvalConfig)}",
        "",
        _table(EvalConfig, {}),
        "",
        "## `rlchain-export` options {#rlchain-export}",
        "",
        f"Schema `{_path(ExportConfig)}`. {_doc_paragraph(ExportConfig)}",
        "",
        _table(ExportConfig, {}),
        "",
    ]
    return "\n".join(out)


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _composed(group: str | None, option: str | None) -> dict[str, Any]:
    """What ``rlchain-train``'s composition gives the fields of ``group`` (with ``group=option``), unresolved;
    the top level with ``group`` None."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("rlchain.conf", version_base="1.3"):
            cfg = compose("train", overrides=[f"{group}={option}"] if group else [])
    finally:
        GlobalHydra.instance().clear()
    node = OmegaConf.to_container(cfg[group] if group else cfg, resolve=False)
    return {key: value for key, value in node.items() if not isinstance(value, dict) or group}


def _field_sources(cls: type) -> dict[str, tuple[str, str]]:
    """``{field: (annotation as written, doc)}``: each from the first class of ``cls``'s MRO that writes one."""
    found: dict[str, list[str]] = {}
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        (node,) = ast.parse(textwrap.dedent(inspect.getsource(klass))).body
        body = node.body
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            annotation, doc = found.setdefault(stmt.target.id, ["", ""])
            if not annotation:
                found[stmt.target.id][0] = ast.unparse(stmt.annotation)
            after = body[i + 1] if i + 1 < len(body) else None
            if (
                not doc
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[stmt.target.id][1] = inspect.cleandoc(after.value.value)
    return {name: (annotation, doc) for name, (annotation, doc) in found.items()}


def _allowed(cls: type, field: dataclasses.Field, hints: dict[str, Any]) -> str:
    """The range of ``field`` in words (as a rejected value's message says it), or '' where it declares none."""
    from rlchain.settings import _describe, _kinds, _range_of

    bounds = _range_of(cls, field.name)
    if not bounds or not any(value is not None for value in bounds.values()):
        return ""
    scalars, optional, element = _kinds(hints[field.name])
    kind = element if element is not None else (scalars[0] if len(scalars) == 1 else None)
    words = _describe(kind if isinstance(kind, type) else None, bounds)
    if element is not None:
        words = f"a list of {words.removeprefix('an ').removeprefix('a ')}s"
    return words + (" or None" if optional and bounds.get("choices") is None else "")


def _value(value: Any) -> str:
    """A value as it is written in YAML or on the command line."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else "`''`"
    if isinstance(value, (list, tuple, dict)):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _table(cls: type, composed: dict[str, Any], prefix: str = "") -> str:
    """One row per field of ``cls`` (not those that start with ``_``): setting, type, default, allowed, doc."""
    sources = _field_sources(cls)
    hints = typing.get_type_hints(cls)
    rows = ["| setting | type | default | allowed | what |", "|---|---|---|---|---|"]
    for field in dataclasses.fields(cls):
        if field.name.startswith("_"):
            continue
        annotation, doc = sources[field.name]
        default = _default(field)
        shown = _value(default)
        if field.name in composed and composed[field.name] != default:
            shown = f"{_value(composed[field.name])} (schema: {shown})"
        allowed = _allowed(cls, field, hints)
        what = _cell(_markdown(doc))
        rows.append(f"| `{prefix}{field.name}` | `{annotation}` | {shown} | {_cell(allowed)} | {what} |")
    return "\n".join(rows)


def _doc_paragraph(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring, in Markdown."""
    return _markdown(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0])


_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):`~?([^`]+)`")


def _markdown(text: str) -> str:
    """reStructuredText roles and double backticks as Markdown code spans, ``<placeholder>`` as text, on one line."""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    text = re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S)
    text = re.sub(r"(`+)(.+?)\1|<([\w .-]+)>", lambda m: m.group(0) if m.group(1) else f"&lt;{m.group(3)}&gt;", text)
    return " ".join(text.split())


def _cell(text: str) -> str:
    """``text`` inside a table cell: a ``|`` does not end the cell."""
    return text.replace("|", "\\|")


def _header(path: Path) -> str:
    """The first paragraph of a preset's header comment, without ``@package``, its example commands and ``Usage``."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#")
        if text.startswith("   "):  # an example command
            continue
        text = text.strip()
        if text.startswith("@package"):
            continue
        if not text or text.startswith("Usage:"):  # the first paragraph only
            break
        lines.append(text)
    return " ".join(" ".join(lines).split())
