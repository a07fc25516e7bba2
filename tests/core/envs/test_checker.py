"""check_vec_env: every built-in env meets the VecEnv contract, and each broken rule is named."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AutoresetMode

import tests.helpers.gym_toy_envs  # noqa: F401  (registers the toy gymnasium ids)
from rlchain.core.envs import CartPoleEnv, GymVecEnv, PushCubeEnv, VecEnvContractError, check_vec_env
from rlchain.core.envs.base import info_terms
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


class TwoTerms(LineEnv):
    """LineEnv with two reward terms and two metrics, declared: ``[N, 2]`` tensors (``TwoTermsAsDicts``: dicts)."""

    reward_terms = ("progress", "time")
    metric_names = ("distance", "elapsed")

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        rewards = {"progress": reward, "time": torch.full_like(reward, -0.001)}
        metrics = {"distance": info["metrics"]["distance"], "elapsed": info["final_obs"][:, 1]}
        info["rewards"] = rewards if self.reward_terms is None else torch.stack(tuple(rewards.values()), -1)
        info["metrics"] = metrics if self.metric_names is None else torch.stack(tuple(metrics.values()), -1)
        return obs, rewards["progress"] + rewards["time"], terminated, truncated, info


class TwoTermsAsDicts(TwoTerms):
    reward_terms = metric_names = None


def test_both_forms_of_reward_terms_and_metrics_meet_the_contract():
    for env in (TwoTerms(num_envs=8), TwoTermsAsDicts(num_envs=8), PushCubeEnv(num_envs=4), CartPoleEnv(num_envs=4)):
        check_vec_env(env)


def test_info_terms_reads_the_declared_and_the_dict_form_alike():
    declared, dicts = TwoTerms(num_envs=6, seed=1), TwoTermsAsDicts(num_envs=6, seed=1)
    actions = torch.rand(12, 6, 1, generator=torch.Generator().manual_seed(0)) * 2 - 1
    declared.reset(seed=1), dicts.reset(seed=1)
    for action in actions:  # episodes of 5 steps: resets inside
        info, info_as_dicts = declared.step(action)[4], dicts.step(action)[4]
        for group, names in (("rewards", ("progress", "time")), ("metrics", ("distance", "elapsed"))):
            got, want = info_terms(declared, info, group), info_terms(dicts, info_as_dicts, group)
            assert got[0] == want[0] == names
            assert got[1] is info[group]  # the declared tensor as it is
            assert got[1].shape == (6, 2) and want[1].dtype == torch.float32 and torch.equal(got[1], want[1])
            assert torch.equal(want[1], torch.stack([info_as_dicts[group][name] for name in names], -1))


def test_info_terms_of_an_empty_dict_is_n_by_0_and_a_group_must_be_rewards_or_metrics():
    env = TwoTermsAsDicts(num_envs=3)
    names, values = info_terms(env, {"rewards": {}}, "rewards")
    assert names == () and values.shape == (3, 0) and values.dtype == torch.float32
    with pytest.raises(ValueError, match=r"^group='reward' is not allowed: expected 'rewards' or 'metrics'$"):
        info_terms(env, {"rewards": {}}, "reward")


class RepeatedTermNames(TwoTerms):
    reward_terms = ("progress", "progress")


class MetricNamesInAList(TwoTerms):
    metric_names = ["distance", "elapsed"]


class DeclaredColumnMissing(TwoTerms):
    def step(self, action):
        out = super().step(action)
        out[4]["rewards"] = out[4]["rewards"][:, :1]
        return out


class DeclaredTermsDoNotSum(TwoTerms):
    def step(self, action):
        out = super().step(action)
        out[4]["rewards"] = out[4]["rewards"] * 2
        return out


class DeclaredButDict(TwoTerms):
    def step(self, action):
        out = super().step(action)
        out[4]["metrics"] = dict(zip(self.metric_names, out[4]["metrics"].unbind(-1)))
        return out


class TensorWithoutNames(TwoTermsAsDicts):
    def step(self, action):
        out = super().step(action)
        out[4]["rewards"] = torch.stack(tuple(out[4]["rewards"].values()), -1)
        return out


class Float64DeclaredMetrics(TwoTerms):
    def step(self, action):
        out = super().step(action)
        out[4]["metrics"] = out[4]["metrics"].double()
        return out


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
        (
            RepeatedTermNames,
            "attributes",
            "reward_terms=('progress', 'progress') repeats 'progress': expected distinct",
        ),
        (MetricNamesInAList, "attributes", "metric_names=['distance', 'elapsed']: expected a tuple of non-empty"),
        (
            DeclaredColumnMissing,
            "reward terms",
            "step 0: info['rewards'] has shape (8, 1): expected (8, 2) = (num_envs, len(reward_terms))",
        ),
        (DeclaredTermsDoNotSum, "reward terms", "terms sum to"),
        (DeclaredButDict, "metrics", "step 0: info['metrics'] is a dict: expected a float32 tensor (8, 2)"),
        (TensorWithoutNames, "reward terms", "or declare its column names in reward_terms"),
        (Float64DeclaredMetrics, "metrics", "info['metrics'] has dtype torch.float64: expected torch.float32"),
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
