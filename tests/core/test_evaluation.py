"""Evaluation: every episode's outcome against a plain reference, confidence intervals, fresh seeds, the video's frames."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlchain.core.evaluation import FRESH_SEED_OFFSET, Interval, evaluate, fresh_seed
from rlchain.core.policies import ActorCritic
from rlchain.utils import MAX_SEED
from tests.helpers.toy_env import LineEnv


def _reference_episodes(
    policy, num_envs: int, per_env: int, seed: int, limit: int
) -> list[tuple[float, int, bool, float]]:
    """(return, length, success, final distance) of the first ``per_env`` episodes of each env, in the order
    (episode k of env i) -> k * num_envs + i, stepping one env at a time: a plain loop with no batching tricks."""
    env = LineEnv(num_envs=num_envs, max_episode_steps=limit)
    obs, _ = env.reset(seed=seed)
    episodes: dict[tuple[int, int], tuple[float, int, bool, float]] = {}
    ret, length, count = [0.0] * num_envs, [0] * num_envs, [0] * num_envs
    while min(count) < per_env:
        with torch.no_grad():
            action = policy.deterministic_action(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        for i in range(num_envs):
            ret[i] += float(reward[i])
            length[i] += 1
            if bool(terminated[i] | truncated[i]):
                if count[i] < per_env:
                    episodes[(count[i], i)] = (
                        ret[i],
                        length[i],
                        bool(info["success"][i]),
                        float(info["metrics"]["distance"][i]),
                    )
                count[i] += 1
                ret[i], length[i] = 0.0, 0
    return [episodes[(k, i)] for k in range(per_env) for i in range(num_envs)]


def test_every_episode_matches_a_plain_reference_loop():
    torch.manual_seed(0)
    env = LineEnv(num_envs=4, max_episode_steps=6)
    policy = ActorCritic(
        env.single_observation_space, env.single_action_space, hidden_sizes=[], obs_normalization=False
    )
    with torch.no_grad():  # action -10 * position: walks to the origin, so that episodes end at different steps
        policy.actor[-1].weight.copy_(torch.tensor([[-10.0, 0.0]]))
    result = evaluate(env, policy, num_episodes=10, seed=3)  # 3 episodes per env: 12 in all
    reference = _reference_episodes(policy, 4, 3, seed=3, limit=6)
    assert result.episodes == 12
    np.testing.assert_allclose(result.returns, [r[0] for r in reference], rtol=1e-6)
    np.testing.assert_array_equal(result.lengths, [r[1] for r in reference])
    np.testing.assert_array_equal(result.successes, [r[2] for r in reference])
    np.testing.assert_allclose(result.metrics["distance"], [r[3] for r in reference], rtol=1e-6)
    assert len(set(result.lengths.tolist())) > 1  # the edge this test is for: episodes of different lengths
    means = result.means()
    assert means["avg_reward"] == pytest.approx(np.mean([r[0] for r in reference]))
    assert means["success_rate"] == pytest.approx(np.mean([r[2] for r in reference]))
    assert means["episodes"] == 12.0


@pytest.mark.parametrize(
    "values, t975", [([1.0, 2.0, 4.0, 7.0], 3.182446305284263), (list(range(30)), 2.045229642132703)]
)
def test_interval_of_the_mean_is_students_t(values, t975):
    # t(0.975, n - 1) from a table (Student 1908; n = 4 and n = 30), not from the library the code uses
    interval = Interval.of(np.array(values))
    mean, n = float(np.mean(values)), len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975 * std / math.sqrt(n)
    assert (interval.mean, interval.std, interval.n) == (pytest.approx(mean), pytest.approx(std), n)
    assert (interval.ci95_low, interval.ci95_high) == (pytest.approx(mean - half), pytest.approx(mean + half))


def test_identical_values_give_a_zero_width_interval_and_one_episode_none():
    interval = Interval.of(np.full(5, 2.5))
    assert (interval.mean, interval.std, interval.ci95_low, interval.ci95_high) == (2.5, 0.0, 2.5, 2.5)
    single = Interval.of(np.array([2.5]))
    assert (single.mean, single.std, single.ci95_low, single.ci95_high, single.n) == (2.5, 0.0, None, None, 1)


@pytest.mark.parametrize("successes, n", [(0, 8), (8, 8), (3, 10), (128, 256)])
def test_success_rate_interval_is_wilson_and_stays_inside_0_1(successes, n):
    values = np.array([1.0] * successes + [0.0] * (n - successes))
    interval = Interval.of(values, binary=True)
    z, p = 1.959963984540054, successes / n
    # Wilson (1927), as written in Agresti & Coull (1998), eq. 2
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert interval.ci95_low == pytest.approx(max(0.0, centre - half))
    assert interval.ci95_high == pytest.approx(min(1.0, centre + half))
    assert 0.0 <= interval.ci95_low <= p <= interval.ci95_high <= 1.0
    assert interval.ci95_high > interval.ci95_low  # all-failed or all-succeeded still leaves an interval


def test_fresh_seed_is_none_of_the_training_evaluations_seeds():
    for seed, num_eval_envs in ((0, 256), (12345, 4096), (MAX_SEED, 16)):
        used = {(seed + 1 + i) % (MAX_SEED + 1) for i in range(num_eval_envs)}  # env=gym: env i gets seed + 1 + i
        fresh = fresh_seed(seed)
        assert 0 <= fresh <= MAX_SEED
        assert not used & {(fresh + i) % (MAX_SEED + 1) for i in range(num_eval_envs)}
    assert fresh_seed(0) == FRESH_SEED_OFFSET


def test_fresh_start_states_differ_from_the_training_evaluations():
    env = LineEnv(num_envs=64)
    start = lambda s: env.reset(seed=s)[0][:, 0]  # noqa: E731
    assert not torch.isin(start(fresh_seed(0)), start(1)).any()


def test_a_video_longer_than_the_envs_is_refused():
    env = LineEnv(num_envs=2)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    with pytest.raises(ValueError, match="video_episodes=3 is not allowed with 2 evaluation envs"):
        evaluate(env, policy, 2, seed=0, video_episodes=3)
