"""The module names of rlchain 0.1.0, kept as second names of the modules that moved into the wings.

rlchain 0.1.0 had one flat package (``rlchain.trainer``, ``rlchain.envs.push_cube``, ``rlchain.eval_cli``, ...);
its modules now live in ``rlchain.commands``, ``rlchain.run`` and ``rlchain.core``. The run directories and
configs that release wrote name their classes by the old paths (``_target_: rlchain.envs.push_cube.PushCubeEnv``,
``rlchain.trainer.Trainer``), and users import them, so ``import rlchain`` installs a finder that answers an old
name, or a name below one, with the module of the new name: the same module object, under a second key of
``sys.modules`` (its ``__name__`` and ``__spec__`` stay its own, so pickling, ``python -m`` and tracebacks
name the new path). ``python -m rlchain.train`` (and ``torchrun -m rlchain.train``) runs ``rlchain.commands.train``
as ``__main__``, as ``python -m rlchain.commands.train`` does.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

__all__ = ["MOVED", "install"]

#: Old module name of rlchain 0.1.0 -> its name now. A name below an old one (``rlchain.envs.push_cube``) moved
#: with it (``rlchain.core.envs.push_cube``).
MOVED: dict[str, str] = {
    **{
        f"rlchain.{m}": f"rlchain.core.{m}"
        for m in ("envs", "algorithms", "policies", "buffer", "collector", "evaluation")
    },
    **{
        f"rlchain.{m}": f"rlchain.run.{m}"
        for m in (
            "trainer",
            "starting",
            "checkpoint",
            "objective",
            "stopping",
            "summary",
            "writer",
            "run_dir",
            "video",
            "tuning",
            "evaluator",
        )
    },
    **{
        f"rlchain.{m}": f"rlchain.commands.{m}"
        for m in ("train", "export", "report", "saved_run", "command_line", "config")
    },
    "rlchain.eval_cli": "rlchain.commands.eval",
}


def new_name(name: str) -> str | None:
    """The name now of the module ``name`` of rlchain 0.1.0, or None when ``name`` did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module of its new name (see the module's docstring)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)
        if real is None:
            return None
        # The new module's file as the origin: ``python -m <old name>`` (runpy) makes it ``sys.argv[0]`` and the
        # ``__file__`` of ``__main__``, which argparse and Hydra read.
        return importlib.machinery.ModuleSpec(
            fullname, self, origin=real.origin, is_package=real.submodule_search_locations is not None
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(new_name(spec.name))  # type: ignore[arg-type]
        spec.loader_state = module.__spec__  # the import system sets __spec__ to the alias's; exec_module puts it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state  # type: ignore[union-attr]

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code, for ``python -m <old name>`` (runpy)."""
        new = new_name(fullname)
        return importlib.util.find_spec(new).loader.get_code(new)  # type: ignore[union-attr]


def install() -> None:
    """Put the finder of old names first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
