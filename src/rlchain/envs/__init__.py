"""Built-in batched tasks and their gymnasium registration.

``gymnasium.make_vec("rlchain/PushCube-v0", num_envs=N,
vectorization_mode="vector_entry_point")`` returns a batched
:class:`PushCubeEnv`; ``gymnasium.make("rlchain/PushCube-v0")`` a single
numpy :class:`PushCubeGymEnv`.
"""

import gymnasium as gym

from rlchain.envs.base import VecEnv, check_group_size
from rlchain.envs.push_cube import PushCubeConfig, PushCubeEnv, PushCubeGymEnv

__all__ = ["VecEnv", "check_group_size", "PushCubeConfig", "PushCubeEnv", "PushCubeGymEnv"]

if "rlchain/PushCube-v0" not in gym.registry:
    gym.register(
        id="rlchain/PushCube-v0",
        entry_point="rlchain.envs.push_cube:PushCubeGymEnv",
        vector_entry_point="rlchain.envs.push_cube:PushCubeEnv",
    )
