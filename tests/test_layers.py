"""The layers of ``src/``: the shared ground, then ``rlchain.core``, ``rlchain.run``, ``rlchain.commands``, and the
Hydra plugins on top. A module imports from its own layer and the layers below it, never from above, wherever the
import stands (at the top of the module or inside a function); the README's layout states the rule. A module of
``src/`` imports by the names modules have now, never by the names of rlchain 0.1.0 (:data:`rlchain._moved.MOVED`,
kept for users), which would hide an import's layer: the rule judges an old name by its module's layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlchain._moved import new_name
from tests.helpers.runs import REPO

SRC = REPO / "src"
#: Layer of a module by the start of its dotted name; the ground is what matches nothing else under ``rlchain``.
LAYERS = {"rlchain.core": 1, "rlchain.run": 2, "rlchain.commands": 3, "hydra_plugins": 4, "_rlchain_cli": 4}
NAMES = {0: "the ground", 1: "rlchain.core", 2: "rlchain.run", 3: "rlchain.commands", 4: "the entry points and plugins"}


def _name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    """The layer of the module ``module`` (dotted name; a name of rlchain 0.1.0 is that of its module now)."""
    module = new_name(module) or module
    return next((n for prefix, n in LAYERS.items() if module == prefix or module.startswith(prefix + ".")), 0)


def _imports(path: Path) -> set[str]:
    """The rlchain modules ``path`` imports (``from rlchain import x`` counts as ``rlchain.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "rlchain"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rlchain":
            found |= {
                f"{node.module}.{alias.name}" if node.module == "rlchain" else node.module for alias in node.names
            }
    return found


MODULES = sorted(p for p in SRC.rglob("*.py") if ".egg-info" not in str(p))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_a_module_imports_nothing_from_a_layer_above_its_own(path):
    own = layer(_name(path))
    above = sorted(m for m in _imports(path) if layer(m) > own)
    assert not above, f"{path.relative_to(REPO)} ({NAMES[own]}) imports {above} from above"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_a_module_imports_by_todays_names_not_those_of_0_1_0(path):
    old = sorted(f"{m} (now {new_name(m)})" for m in _imports(path) if new_name(m) is not None)
    assert not old, f"{path.relative_to(REPO)} imports by the names of rlchain 0.1.0: {old}"


def test_the_rule_sees_an_import_from_above_inside_a_function(tmp_path):
    module = tmp_path / "utils.py"
    module.write_text(
        "import rlchain.core.envs\nfrom rlchain import settings\n\ndef f():\n"
        "    from rlchain.run.trainer import Trainer\n"
    )
    assert _imports(module) == {"rlchain.core.envs", "rlchain.settings", "rlchain.run.trainer"}
    assert [layer(m) for m in sorted(_imports(module))] == [1, 2, 0]
    assert layer("rlchain.commands.eval") == 3 and layer("hydra_plugins.rlchain_optuna") == 4


def test_the_rule_sees_a_module_by_its_0_1_0_name(tmp_path):
    module = tmp_path / "files.py"
    module.write_text(
        "from rlchain import tuning\nimport rlchain.envs.push_cube\nfrom rlchain.trainer import Trainer\n"
    )
    assert _imports(module) == {"rlchain.tuning", "rlchain.envs.push_cube", "rlchain.trainer"}
    assert [layer(m) for m in sorted(_imports(module))] == [1, 2, 2]
    assert layer("rlchain.eval_cli") == 3 and layer("rlchain.train") == 3
