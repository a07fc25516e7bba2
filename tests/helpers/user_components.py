"""A user's own policy and algorithm, reachable by _target_ without touching rlchain."""

import torch

from rlchain.core.algorithms import PPO
from rlchain.core.policies import ActorCritic


class WidePolicy(ActorCritic):
    """An ActorCritic with one fixed wide hidden layer."""

    def __init__(self, observation_space, action_space, width: int = 48):
        super().__init__(observation_space, action_space, hidden_sizes=[width])
        self.width = width


class CountingPPO(PPO):
    """PPO that counts its updates."""

    def __init__(self, policy, updates_seen: int = 0, **kwargs):
        super().__init__(policy, **kwargs)
        self.updates_seen = updates_seen

    def update(self, rollout):
        self.updates_seen += 1
        return {**super().update(rollout), "updates_seen": float(self.updates_seen)}


class EnvCheckCountingPPO(PPO):
    """PPO that counts how often it is asked to check its env."""

    checks = 0

    def check_env(self, env):
        type(self).checks += 1
        super().check_env(env)


def process_killing_env(**kwargs):
    """An env ``_target_`` whose construction kills its process, as the kernel's OOM killer would."""
    import os

    os._exit(9)


class FailingPPO(PPO):
    """PPO whose update raises at its ``fail_at``-th call, as a CUDA out-of-memory error would."""

    def __init__(self, policy, fail_at: int | None = None, **kwargs):
        super().__init__(policy, **kwargs)
        self.calls, self.fail_at = 0, fail_at

    def update(self, rollout):
        self.calls += 1
        if self.calls == self.fail_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().update(rollout)


def warning_push_cube(**kwargs):
    """An env ``_target_`` that warns as it builds a PushCubeEnv, as a simulator's own warning would."""
    import warnings

    from rlchain.core.envs import PushCubeEnv

    warnings.warn("the simulator's contact model is deprecated", UserWarning, stacklevel=1)
    return PushCubeEnv(**kwargs)
