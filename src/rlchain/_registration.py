"""Registration of rlchain's built-in tasks with gymnasium, done by ``import rlchain``.

* ``rlchain/PushCube-v0``: ``gymnasium.make`` gives one numpy
  :class:`rlchain.core.envs.PushCubeGymEnv` (time limit 100, ``max_episode_steps``'
  default, by gymnasium's ``TimeLimit``), ``gymnasium.make_vec(...,
  vectorization_mode="vector_entry_point")`` a batched :class:`rlchain.core.envs.PushCubeEnv`
  (``max_episode_steps=100``);
* ``rlchain/CartPole-v1``: one numpy :class:`rlchain.core.envs.cart_pole.CartPoleGymEnv`
  (time limit 500 by gymnasium's ``TimeLimit``, as ``CartPole-v1``), or a
  batched :class:`rlchain.core.envs.CartPoleEnv` (``max_episode_steps=500``).

Each id's ``max_episode_steps`` is its env's own time limit, which the single
env leaves to gymnasium's ``TimeLimit`` alone (one limit, never two).
Entry points are strings, so registering imports neither torch nor the env
modules; those load on the first ``make``. Registering is idempotent: an id
already in gymnasium's registry is left as it is (no "Overriding
environment" warning).
"""

from __future__ import annotations

from typing import Any

import gymnasium

__all__ = ["ENVS", "register_envs"]

#: ``id -> keyword arguments of gymnasium.register``.
ENVS: dict[str, dict[str, Any]] = {
    # PushCubeConfig.max_episode_steps' default (a test holds the two together); make_vec passes it on.
    "rlchain/PushCube-v0": {
        "entry_point": "rlchain.core.envs.push_cube:PushCubeGymEnv",
        "vector_entry_point": "rlchain.core.envs.push_cube:PushCubeEnv",
        "max_episode_steps": 100,
    },
    # The limit and threshold of gymnasium's CartPole-v1. gymnasium.make wraps
    # the single env in TimeLimit(500); make_vec passes max_episode_steps=500.
    "rlchain/CartPole-v1": {
        "entry_point": "rlchain.core.envs.cart_pole:CartPoleGymEnv",
        "vector_entry_point": "rlchain.core.envs.cart_pole:CartPoleEnv",
        "max_episode_steps": 500,
        "reward_threshold": 475.0,
    },
}


def register_envs() -> None:
    """Register every id of :data:`ENVS` with gymnasium; ids already registered are skipped."""
    for env_id, kwargs in ENVS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, **kwargs)
