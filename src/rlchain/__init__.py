"""rlchain: Hydra-composed reinforcement-learning experiments.

Importing :mod:`rlchain` registers the built-in tasks with gymnasium
(``rlchain/PushCube-v0``, ``rlchain/CartPole-v1``, with vector entry points;
see :mod:`rlchain._registration`) without importing torch or gymnasium: the
ids are added when gymnasium is imported, or at once if it already is.
"""

from rlchain._registration import register_envs_with_gymnasium as _register_envs_with_gymnasium

__version__ = "0.1.0"

_register_envs_with_gymnasium()
