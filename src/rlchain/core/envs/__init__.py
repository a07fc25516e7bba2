"""Built-in batched tasks, the gymnasium adapter, and the VecEnv contract checker.

* :class:`PushCubeEnv` (``env=push_cube``), :class:`CartPoleEnv`
  (``env=cart_pole``): torch-native, batched on one device. PushCube's
  physics are pure functions in :mod:`rlchain.core.envs.push_cube_physics`, its
  scripted controller is in :mod:`rlchain.core.envs.push_cube_controller`.
* :class:`GymVecEnv` (``env=gym env.id=...``): any registered gymnasium id
  through ``gymnasium.make_vec``.
* :class:`MjlabEnv` (``env=mjlab env.task=...``): any registered mjlab task
  (``pip install "rlchain[mjlab]"``).
* :class:`ManiSkillEnv` (``env=maniskill env.id=...``): any registered ManiSkill3 task, in worker
  processes on the CPU, or batched on CUDA (:class:`ManiSkillBatchedEnv`; ``pip install "rlchain[maniskill]"``).
* :func:`check_vec_env`: checks a user's env against the VecEnv contract;
  :class:`VecEnvConfig` holds the settings every env has (a user's env schema extends it).

Every env takes ``render_mode`` (None or ``"rgb_array"``); built with
``"rgb_array"``, ``env.render(env_ids=None)`` returns uint8 RGB frames
``[K, H, W, 3]`` of the envs asked for (see :class:`VecEnv`). The built-in
tasks draw headless with torch on their device (:mod:`rlchain.core.envs.rendering`);
:class:`GymVecEnv` asks gymnasium's envs for theirs.

Each env's settings are the fields of its config dataclass
(:class:`PushCubeConfig`, :class:`CartPoleConfig`, :class:`GymEnvConfig`; see
:mod:`rlchain.settings`); the env takes them as keyword arguments and keeps
them as ``env.cfg``.

``import rlchain`` registers the tasks with gymnasium:
``gymnasium.make_vec("rlchain/PushCube-v0", num_envs=N,
vectorization_mode="vector_entry_point")`` returns a batched
:class:`PushCubeEnv`, ``gymnasium.make("rlchain/PushCube-v0")`` a single
numpy :class:`PushCubeGymEnv`; ``rlchain/CartPole-v1`` likewise gives
:class:`CartPoleEnv` and :class:`CartPoleGymEnv`.
"""

from rlchain.core.envs.base import TorchRngStream, TorchVecEnv, VecEnv, VecEnvConfig, check_group_size, reset_group_size
from rlchain.core.envs.cart_pole import CartPoleConfig, CartPoleEnv, CartPoleGymEnv
from rlchain.core.envs.checker import VecEnvContractError, check_vec_env
from rlchain.core.envs.gym_adapter import GymEnvConfig, GymVecEnv
from rlchain.core.envs.maniskill_adapter import ManiSkillBatchedEnv, ManiSkillEnv, ManiSkillEnvConfig
from rlchain.core.envs.mjlab_adapter import MjlabEnv, MjlabEnvConfig
from rlchain.core.envs.push_cube import PushCubeConfig, PushCubeEnv, PushCubeGymEnv
from rlchain.core.envs.rng import CounterRng

__all__ = [
    "CartPoleConfig",
    "CartPoleEnv",
    "CartPoleGymEnv",
    "CounterRng",
    "GymEnvConfig",
    "GymVecEnv",
    "ManiSkillBatchedEnv",
    "ManiSkillEnv",
    "ManiSkillEnvConfig",
    "MjlabEnv",
    "MjlabEnvConfig",
    "PushCubeConfig",
    "PushCubeEnv",
    "PushCubeGymEnv",
    "TorchRngStream",
    "TorchVecEnv",
    "VecEnv",
    "VecEnvConfig",
    "VecEnvContractError",
    "check_group_size",
    "reset_group_size",
    "check_vec_env",
]

# The gymnasium ids rlchain/PushCube-v0 and rlchain/CartPole-v1 are registered
# by `import rlchain` (rlchain._registration), which importing this package implies.
