"""rlchain: Hydra-composed reinforcement-learning experiments.

Importing :mod:`rlchain.envs` registers the built-in tasks with gymnasium
(``rlchain/PushCube-v0``).
"""

__version__ = "0.1.0"
