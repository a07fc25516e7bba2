"""check_vec_env: every built-in env meets the VecEnv contract, and each broken rule is named."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AutoresetMode

import tests.helpers.gym_toy_envs  # noqa: F401  (registers the toy gymnasium ids)
from rlchain.core.envs import CartPoleEnv, GymVecEnv, PushCubeEnv, VecEnvContractError, check_vec_env
from tests.helpers.toy_env import LineEnv


@pytest.mark.parametrize(
    "make",
    [
        lambda: PushCubeEnv(num_envs=8, seed=0),
        lambda: CartPoleEnv(num_envs=8, seed=0),
        lambda: CartPoleEnv(num_envs=6, seed=0, action_mode="continuous"),
        lambda: GymVecEnv("Pendulum-v1", num_envs=4),
        lambda: GymVecEnv("CartPole-v1", num_envs=4, vectorization="async"),
        lambda: LineEnv(num_envs=8, max_episode_steps=5),
        lambda: LineEnv(num_envs=3, max_episode_steps=4, discrete=True),
    ],
    ids=[
        "push_cube",
        "cart_pole",
        "cart_pole_continuous",
        "gym_pendulum",
        "gym_cart_pole_async",
        "line",
        "line_discrete",
    ],
)
def test_every_built_in_env_meets_the_contract(make):
    env = make()
    try:
        check_vec_env(env)
    finally:
        if isinstance(env, GymVecEnv):
            env.close()


class NoTimeLimit(LineEnv):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.max_episode_steps = None


class DiscreteObservations(LineEnv):
    def __init__(self, **kw):
        super().__init__(**kw)
        self._set_spaces(gym.spaces.Discrete(3), self.single_action_space)


class Float64Reset(LineEnv):
    def reset(self, **kw):
        obs, info = super().reset(**kw)
        return obs.double(), info


class Float64Reward(LineEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward.double(), terminated, truncated, info


class NoMetrics(LineEnv):
    def step(self, action):
        out = super().step(action)
        del out[4]["metrics"]
        return out


class ResetObsAsFinalObs(LineEnv):
    """The classic slip: final_obs taken after the auto-reset."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        info["final_obs"] = obs.clone()
        return obs, reward, terminated, truncated, info


class NaNFinalObsOnDoneRows(LineEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        info["final_obs"] = torch.where((terminated | truncated)[:, None], float("nan"), info["final_obs"])
        return obs, reward, terminated, truncated, info


class TermsDoNotSum(LineEnv):
    def step(self, action):
        out = super().step(action)
        out[4]["rewards"] = {"progress": out[1] * 2}
        return out


class TermsComeAndGo(LineEnv):
    def step(self, action):
        out = super().step(action)
        if int(self.t.max()) % 2:
            out[4]["rewards"] = {"progress": out[1] - 1.0, "bonus": torch.ones_like(out[1])}
        return out


class IntegerMetric(LineEnv):
    def step(self, action):
        out = super().step(action)
        out[4]["metrics"] = {"steps": self.t.long()}
        return out


class SuccessWithoutDeclaringIt(LineEnv):
    reports_success = False


class NextStepReset(LineEnv):
    """Resets one step late, as gymnasium's NEXT_STEP autoreset mode does."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.pending = torch.zeros(self.num_envs, dtype=torch.bool)

    def step(self, action):
        pending = self.pending
        self.pos = self.pos + 0.1 * action[:, 0].clamp(-1, 1)
        self.t = self.t + 1
        self._fresh(pending, 1)
        terminated = torch.zeros_like(pending)
        truncated = (self.t >= self.max_episode_steps) & ~pending
        self.pending = truncated
        reward = torch.full((self.num_envs,), -0.01)
        info = {"final_obs": self._obs(), "success": terminated, "rewards": {}, "metrics": {}}
        return self._obs(), reward, terminated, truncated, info


class NeverTruncates(LineEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.t.zero_()
        return obs, reward, terminated, torch.zeros_like(truncated), info


class IgnoresTheSeed(LineEnv):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=None, options=options)


class IgnoresGroupSize(LineEnv):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed, options=None)


class AcceptsAnyGroupSize(LineEnv):
    def reset(self, *, seed=None, options=None):
        if options and options.get("group_size") and self.num_envs % options["group_size"]:
            options = None
        return super().reset(seed=seed, options=options)


class LateAutoresetMode(LineEnv):
    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}


@pytest.mark.parametrize(
    "env_class, rule, detail",
    [
        (NoTimeLimit, "attributes", "max_episode_steps=None"),
        (DiscreteObservations, "spaces", "expected a gymnasium Box"),
        (Float64Reset, "reset", "dtype torch.float64: expected torch.float32"),
        (Float64Reward, "step", "reward has dtype torch.float64"),
        (NoMetrics, "info keys", "info lacks 'metrics'"),
        (ResetObsAsFinalObs, "final_obs", "equals the returned obs"),
        (NaNFinalObsOnDoneRows, "final_obs", "NaN or inf on a done row"),
        (TermsDoNotSum, "reward terms", "terms sum to"),
        (TermsComeAndGo, "reward terms", "report the same names every step"),
        (IntegerMetric, "metrics", "dtype torch.int64"),
        (SuccessWithoutDeclaringIt, "success", "while reports_success is False"),
        (NextStepReset, "same-step reset", "must reset in the same step()"),
        (NeverTruncates, "same-step reset", "episodes must end by max_episode_steps=5"),
        (IgnoresTheSeed, "seeding", "gave different trajectories"),
        (IgnoresGroupSize, "group reset", "start from different observations"),
        (AcceptsAnyGroupSize, "group reset", "did not raise ValueError"),
        (LateAutoresetMode, "same-step reset", "expected AutoresetMode.SAME_STEP"),
    ],
)
def test_each_broken_rule_is_named(env_class, rule, detail):
    env = env_class(num_envs=8, max_episode_steps=5)
    if env_class is SuccessWithoutDeclaringIt:
        env.pos.fill_(0.01)  # every env is at the goal: the first step reports success
    with pytest.raises(VecEnvContractError) as info:
        check_vec_env(env)
    assert info.value.rule == rule
    assert str(info.value).startswith(f"VecEnv contract, rule '{rule}': ")
    assert detail in str(info.value)


def test_the_contract_error_is_a_value_error():
    assert issubclass(VecEnvContractError, ValueError)
    with pytest.raises(ValueError):
        check_vec_env(NoTimeLimit(num_envs=2))
