"""rlchain: Hydra-composed reinforcement-learning experiments.

Importing :mod:`rlchain` registers the built-in tasks with gymnasium
(``rlchain/PushCube-v0``, ``rlchain/CartPole-v1``, with vector entry points;
see :mod:`rlchain._registration`). It imports gymnasium, not torch: the task
modules load on the first ``gymnasium.make``.
"""

from rlchain._moved import install as _install_moved_names
from rlchain._registration import register_envs as _register_envs

__version__ = "0.1.0"

_register_envs()
_install_moved_names()
