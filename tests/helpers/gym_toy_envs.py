"""Small single gymnasium envs for the env=gym adapter tests, registered under ``rlchain_test/``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class DictObsEnv(gym.Env):
    """Dict observation (``target`` Box(2), ``mode`` Discrete(3, start=1), ``position`` Box(2, 2));
    terminates after 3 steps with ``info["is_success"]`` true when the summed action is positive."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "target": gym.spaces.Box(-1, 1, (2,), np.float32),
                "mode": gym.spaces.Discrete(3, start=1),
                "position": gym.spaces.Box(-5, 5, (2, 2), np.float32),
            }
        )
        self.action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        self.t, self.total = 0, 0.0

    def _obs(self):
        return {
            "target": self.np_random.uniform(-1, 1, 2).astype(np.float32),
            "mode": int(self.np_random.integers(1, 4)),
            "position": np.full((2, 2), self.t, dtype=np.float32),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.total = 0, 0.0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.total += float(action[0])
        done = self.t >= 3
        info = {"is_success": self.total > 0} if done else {}
        return self._obs(), 1.0, done, False, info


class MultiDiscreteActionEnv(gym.Env):
    """An env with a MultiDiscrete action space, which env=gym does not support."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.MultiDiscrete([2, 3])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


class EchoActionEnv(gym.Env):
    """Observes the action it was given (float64 Box(low, high, (2,)) actions) and keeps its dtype in ``action_dtype``."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)

    def __init__(self, low=-1.0, high=1.0):
        self.action_space = gym.spaces.Box(
            *(np.broadcast_to(b, (2,)).astype(np.float64) for b in (low, high)), (2,), np.float64
        )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2), {}

    def step(self, action):
        self.action_dtype = action.dtype
        return np.array(action, dtype=np.float64), 0.0, False, False, {}


_ENVS = {
    "rlchain_test/DictObs-v0": DictObsEnv,
    "rlchain_test/MultiDiscrete-v0": MultiDiscreteActionEnv,
    "rlchain_test/EchoAction-v0": EchoActionEnv,
}
for _id, _entry in _ENVS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry, max_episode_steps=10)
