"""Registration of rlchain's built-in tasks with gymnasium, done by ``import rlchain``.

* ``rlchain/PushCube-v0``: ``gymnasium.make`` gives one numpy
  :class:`rlchain.envs.PushCubeGymEnv`, ``gymnasium.make_vec(...,
  vectorization_mode="vector_entry_point")`` a batched :class:`rlchain.envs.PushCubeEnv`;
* ``rlchain/CartPole-v1``: one numpy :class:`rlchain.envs.cart_pole.CartPoleGymEnv`
  (time limit 500 by gymnasium's ``TimeLimit``, as ``CartPole-v1``), or a
  batched :class:`rlchain.envs.CartPoleEnv` (``max_episode_steps=500``).

Entry points are strings, so registering imports neither torch nor the env
modules; those load on the first ``make``. ``import rlchain`` must stay cheap
(it imports nothing heavy, and ``rlchain-report`` needs no gymnasium), so
gymnasium itself is not imported for the registration either: if gymnasium is
already imported, the ids are registered at once; otherwise a one-shot import
hook registers them right after gymnasium's own ``__init__`` has run, before
``import gymnasium`` returns. Registering is idempotent: an id already in
gymnasium's registry is left as it is (no "Overriding environment" warning).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

__all__ = ["register_envs", "register_envs_with_gymnasium"]

#: ``id -> keyword arguments of gymnasium.register``.
ENVS: dict[str, dict[str, Any]] = {
    "rlchain/PushCube-v0": {
        "entry_point": "rlchain.envs.push_cube:PushCubeGymEnv",
        "vector_entry_point": "rlchain.envs.push_cube:PushCubeEnv",
    },
    # The limit and threshold of gymnasium's CartPole-v1. gymnasium.make wraps
    # the single env in TimeLimit(500); make_vec passes max_episode_steps=500.
    "rlchain/CartPole-v1": {
        "entry_point": "rlchain.envs.cart_pole:CartPoleGymEnv",
        "vector_entry_point": "rlchain.envs.cart_pole:CartPoleEnv",
        "max_episode_steps": 500,
        "reward_threshold": 475.0,
    },
}


def register_envs() -> None:
    """Register every id of :data:`ENVS` with gymnasium (imports gymnasium); ids already registered are skipped."""
    import gymnasium

    for env_id, kwargs in ENVS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, **kwargs)


class _RegisteringLoader(importlib.abc.Loader):
    """Runs gymnasium's own loader, then :func:`register_envs` and removes the import hook.

    Every other attribute (``get_resource_reader``, ``is_package``, ...) is the wrapped loader's.
    """

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader  # leave no trace of the wrapper
        sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _GymnasiumImportHook)]
        register_envs()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _GymnasiumImportHook(importlib.abc.MetaPathFinder):
    """Finds ``gymnasium`` with the other finders and hands back its spec with a :class:`_RegisteringLoader`.

    It stays installed until gymnasium has been executed (a mere
    ``importlib.util.find_spec("gymnasium")`` does not use it up), and does
    nothing for any other module.
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "gymnasium":
            return None
        for finder in sys.meta_path:  # what the import system would do without this hook
            find = getattr(finder, "find_spec", None)
            if finder is self or isinstance(finder, _GymnasiumImportHook) or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _RegisteringLoader):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def register_envs_with_gymnasium() -> None:
    """Register the built-in tasks now if gymnasium is imported, else as soon as it is.

    Safe to call more than once: at most one hook is installed, and
    :func:`register_envs` skips registered ids.
    """
    if "gymnasium" in sys.modules:
        register_envs()
    elif not any(isinstance(finder, _GymnasiumImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _GymnasiumImportHook())
