"""A population's member p is the solo run with the same settings: the same rollout, the same update, to float
rounding; what stops one member leaves the others going; settings that change shapes are refused."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from rlchain.core.algorithms import GRPO, PPO
from rlchain.core.collector import SyncCollector
from rlchain.core.envs.cart_pole import CartPoleEnv
from rlchain.core.envs.push_cube import PushCubeEnv
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.core.population import Population
from rlchain.settings import SettingError

ENVS = {
    "push_cube": PushCubeEnv,
    "cart_pole": CartPoleEnv,
    # Observation groups: the actor's noisy features and the critic's exact ones (asymmetric actor-critic).
    "push_cube_privileged": functools.partial(PushCubeEnv, privileged_critic=True, obs_noise_std=0.01),
    # A camera's image and the state (a CNN encoder and an MLP), the critic the exact state.
    "push_cube_pixels": functools.partial(PushCubeEnv, obs_mode="pixels_state", privileged_critic=True, image_size=16),
    # The camera's image alone: one uint8 tensor, not a group.
    "push_cube_camera": functools.partial(PushCubeEnv, obs_mode="pixels", image_size=16),
}
#: A small CNN for push_cube_pixels' 16 x 16 image (the other envs' policies ignore it).
SMALL_CNN = {"cnn_channels": [4, 8], "cnn_kernel_sizes": [4, 3], "cnn_strides": [2, 2], "cnn_features": 8}
N, T = 8, 16
SEEDS = [3, 1, 4, 15]
RATES = [1e-3, 3e-4, 2e-3, 5e-4]
#: Shared by every member (shapes); each member adds its seed and learning rate.
SETTINGS = {
    "ppo": {"batch_size": 32, "n_epochs": 2},
    "grpo": {"batch_size": 32, "n_epochs": 2, "group_size": 4},
}


def member(env_name: str, algo: str, seed: int, num_envs: int = N, **settings):
    """A run's parts built as ``rlchain-train`` builds them: torch seeded with the run's seed, env, policy,
    algorithm, then the policy's action stream."""
    torch.manual_seed(seed)
    env = ENVS[env_name](num_envs=num_envs, seed=seed, max_episode_steps=T)
    policy_cls = ActorCritic if algo == "ppo" else ActorOnly
    policy = policy_cls(env.single_observation_space, env.single_action_space, hidden_sizes=[16, 16], **SMALL_CNN)
    algorithm = (PPO if algo == "ppo" else GRPO)(policy, **{**SETTINGS[algo], **settings})
    policy.seed_actions(seed)
    return env, policy, algorithm


def population(env_name: str, algo: str, rates=RATES, seeds=SEEDS, own=None, **settings):
    """The population of the members (seeds, rates; ``own[p]``: member p's own settings besides) and its collector
    on one task of ``P * N`` envs."""
    own = own or [{}] * len(seeds)
    algorithms = [
        member(env_name, algo, s, learning_rate=lr, **settings, **o)[2] for s, lr, o in zip(seeds, rates, own)
    ]
    engine = Population(algorithms, seeds, N)
    env = ENVS[env_name](num_envs=N * len(seeds), seed=0, max_episode_steps=T)
    env.split_into_members(seeds)
    return engine, SyncCollector(env, engine.policy, T, reset_options=algorithms[0].reset_options)


#: The first update's loss terms match to 1e-5 relative; a KL (a difference of nearly equal numbers) and the
#: gradient norm to 1e-4.
TOLERANCE = {"policy_loss": 1e-5, "value_loss": 1e-5, "entropy": 1e-5}


#: Members' own settings that a population takes besides the seed and rate: PPO's reward scaling (each member's
#: statistics, with its own gamma), GRPO's reference KL (a member of kl_coef 0 among them has no reference).
OWN = {
    "reward_norm": [{"reward_norm": True, "gamma": g} for g in (0.99, 0.9, 0.95, 0.99)],
    "reference_kl": [{"kl_coef": k} for k in (0.1, 0.0, 0.05, 0.2)],
    # One std pooled over each member's own rollout (its own eps).
    "rollout_std": [{"advantage_norm": "rollout_std", "eps": e} for e in (1e-8, 1e-6, 1e-8, 1e-4)],
    # Each member's rate from the KL its update caused, to its own target (update_kl reported, as a solo run's).
    "adaptive": [{"lr_schedule": "adaptive", "target_kl": k} for k in (0.01, 0.002, 0.005, 0.02)],
}


@pytest.mark.parametrize(
    "env_name, algo, own",
    [
        ("push_cube", "ppo", None),
        ("cart_pole", "ppo", None),
        ("push_cube", "grpo", None),
        ("cart_pole", "grpo", None),
        ("cart_pole", "grpo", "rollout_std"),
        ("cart_pole", "ppo", "adaptive"),
        ("push_cube", "ppo", "reward_norm"),
        ("push_cube", "grpo", "reference_kl"),
        ("push_cube_privileged", "ppo", None),
        ("push_cube_privileged", "grpo", "reference_kl"),
        ("push_cube_pixels", "ppo", None),
        ("push_cube_pixels", "grpo", "reference_kl"),
        ("push_cube_camera", "ppo", None),
    ],
)
def test_member_p_is_solo_run_p_rollout_for_rollout_and_update_for_update(env_name, algo, own):
    own = OWN[own] if own else [{}] * len(SEEDS)
    engine, collector = population(env_name, algo, own=own)
    rollouts = [collector.collect().data.clone()]  # the storage is reused: keep a copy
    first = engine.update(rollouts[0])
    rollouts.append(collector.collect().data.clone())
    second = engine.update(rollouts[1])
    for p, (seed, lr) in enumerate(zip(SEEDS, RATES)):
        env, policy, algorithm = member(env_name, algo, seed, learning_rate=lr, **own[p])
        solo = SyncCollector(env, policy, T, reset_options=algorithm.reset_options)
        block = slice(p * N, (p + 1) * N)
        for rollout, stats in ((rollouts[0], first[p]), (rollouts[1], second[p])):
            data = solo.collect().data
            # The episodes' starts are the same draws, bit for bit; after, a batched matrix product rounds as it
            # will (a member's mean action may differ from its solo run's in the last bit), and the second rollout
            # acts with weights that went through both ways of updating.
            assert (rollout["obs"][0, block] == data["obs"][0]).all(), p  # a tensor's, or every group's
            tol = 1e-5 if rollout is rollouts[0] else 1e-3
            for key in ("obs", "action", "reward", "sample_log_prob"):
                mine, solo_values = rollout[key][:, block], data[key]
                for group in [None] if isinstance(mine, torch.Tensor) else list(mine.keys()):
                    a, b = (mine, solo_values) if group is None else (mine[group], solo_values[group])
                    torch.testing.assert_close(a, b, rtol=tol, atol=tol / 10, msg=f"{key} {group}")
            assert torch.equal(rollout["done"][:, block], data["done"]), p
            want = algorithm.update(data)
            assert set(stats) == set(want)
            for name, value in want.items():
                # A policy loss is a mean of unit-scale advantages times ratios near 1 whose sum cancels to ~1e-4:
                # its rounding is measured against that unit scale (abs), the other terms' relative to themselves.
                first_update = rollout is rollouts[0]
                tol = TOLERANCE.get(name, 1e-4) if first_update else 1e-3
                near = 1e-6 if first_update else 1e-5
                assert stats[name] == pytest.approx(value, rel=tol, abs=near), (p, name, stats[name], value)
        # The member's weights, written back into its own policy, are the solo run's (an ordinary state_dict).
        mine = engine.write_back(p).state_dict()
        for name, value in policy.state_dict().items():
            torch.testing.assert_close(mine[name], value, rtol=1e-3, atol=1e-5)


def test_a_kl_stop_a_fault_and_a_prune_stop_one_member_and_the_others_go_on():
    # Member 1's KL target is tiny: its epochs stop after the first, as its solo run's do (CleanRL's rule).
    targets = [1.0, 1e-9, 1.0, 1.0]
    algorithms = [
        member("push_cube", "ppo", s, stop_at_target_kl=True, target_kl=k, n_epochs=3)[2]
        for s, k in zip(SEEDS, targets)
    ]
    engine = Population(algorithms, SEEDS, N)
    env = PushCubeEnv(num_envs=N * 4, seed=0, max_episode_steps=T)
    env.split_into_members(SEEDS)
    collector = SyncCollector(env, engine.policy, T)
    stats = engine.update(collector.collect().data)
    assert [s["epochs"] for s in stats] == [3.0, 1.0, 3.0, 3.0]
    _, _, solo = member("push_cube", "ppo", SEEDS[1], stop_at_target_kl=True, target_kl=1e-9, n_epochs=3)
    solo_env = PushCubeEnv(num_envs=N, seed=SEEDS[1], max_episode_steps=T)
    want = solo.update(SyncCollector(solo_env, solo.policy, T).collect().data)
    assert want["epochs"] == 1.0 and stats[1]["policy_loss"] == pytest.approx(want["policy_loss"], rel=1e-5, abs=1e-6)

    # A non-finite reward in member 2's envs makes its loss NaN: it stops alone, its weights as they were.
    kept = {name: t[0].clone() for name, t in engine.policy.params.items()}
    frozen = {name: t[2].clone() for name, t in engine.policy.params.items()}
    rollout = collector.collect().data
    rollout["reward"][3, 2 * N + 1] = float("nan")
    stats = engine.update(rollout)
    assert stats[2] == {} and "loss is nan" in str(engine.faults[2])
    assert all(stats[p] for p in (0, 1, 3))
    assert all(torch.equal(t[2], frozen[name]) for name, t in engine.policy.params.items())
    assert any(not torch.equal(t[0], kept[name]) for name, t in engine.policy.params.items())

    # A pruned member (Optuna) stops the same way: masked, no rebuild.
    engine.stop(3, "pruned at step 512")
    before = {name: t[3].clone() for name, t in engine.policy.params.items()}
    stats = engine.update(collector.collect().data)
    assert stats[3] == {} and stats[0] and stats[1]
    assert all(torch.equal(t[3], before[name]) for name, t in engine.policy.params.items())


def test_settings_that_change_shapes_are_refused_naming_the_key():
    algorithms = [member("push_cube", "ppo", s, batch_size=b)[2] for s, b in zip(SEEDS[:2], (32, 64))]
    with pytest.raises(SettingError, match=r"^algorithm\.batch_size=\[32, 64\] differs between the members"):
        Population(algorithms, SEEDS[:2], N)


@pytest.mark.parametrize(
    "algo, own",
    [
        # Member 1 stops its epochs at its KL target; each member's reward scaling has its own gamma.
        ("ppo", [{"target_kl": k, "gamma": g} for k, g in zip((1.0, 1e-9, 1.0, 1.0), (0.99, 0.9, 0.95, 0.99))]),
        ("grpo", [{"kl_coef": k} for k in (0.1, 0.0, 0.05, 0.2)]),
    ],
)
def test_the_compiled_steps_of_a_population_collect_and_update_as_its_eager_steps(algo, own):
    """``trainer.compile``'s two steps of a population (its collection step and its minibatch update, compiled
    whole as trainer.compile compiles them, warm-ups included; dynamo's graph with eager kernels, as
    tests/core/test_captured_steps.py does for a solo run) against the eager steps, over three iterations: the
    same rollouts and updates; a member's KL stop and a member's non-finite loss (a NaN observation in its
    envs, second iteration) masked on the device alike."""
    settings = {"n_epochs": 3, **({"reward_norm": True, "stop_at_target_kl": True} if algo == "ppo" else {})}
    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        engine, collector = population("push_cube", algo, own=own, **settings)
        if compiled:
            for step in (collector.step, engine.update_step(collector.buffer.data)):
                step.compile(backend="aot_eager")
                assert step.mode == "compiled"
        runs = []
        for i in range(3):
            rollout = collector.collect().data
            if i == 1:
                rollout["obs"][3, 2 * N + 1] = float("nan")
            runs.append((rollout.clone(), engine.update(rollout)))
        results.append((runs, [t.detach().clone() for t in engine._updated_tensors()], dict(engine.faults)))
    (eager, eager_after, eager_faults), (compiled, compiled_after, compiled_faults) = results
    for (data_e, stats_e), (data_c, stats_c) in zip(eager, compiled):
        for key in ("obs", "action", "sample_log_prob", "reward", "done"):
            torch.testing.assert_close(data_c[key], data_e[key], rtol=1e-6, atol=1e-7, equal_nan=True, msg=key)
        assert [set(s) for s in stats_c] == [set(s) for s in stats_e]
        for p, (c, e) in enumerate(zip(stats_c, stats_e)):
            assert c == pytest.approx(e, rel=1e-6, abs=1e-7), p
    assert eager[0][1][1].get("epochs", 3.0) == (1.0 if algo == "ppo" else 3.0)
    assert set(compiled_faults) == set(eager_faults) == {2}
    for c, e in zip(compiled_after, eager_after):
        torch.testing.assert_close(c, e, rtol=1e-6, atol=1e-7)


def test_one_evaluation_of_a_population_is_each_members_solo_evaluation():
    """The population's policy evaluated once on every member's evaluation envs (one task split into members,
    each reset with its own seed), split by member, against each member's own evaluation of its own policy: the
    same episodes, in the same order, to float rounding."""
    from rlchain.core.evaluation import evaluate

    engine, _ = population("push_cube", "ppo")
    seeds = [s + 1 for s in SEEDS]  # a run's evaluation seed: its seed + 1
    env = PushCubeEnv(num_envs=4 * len(SEEDS), seed=0, max_episode_steps=T)
    env.split_into_members(seeds)
    results = evaluate(env, engine.policy, 8 * len(SEEDS), seed=seeds).split_into_members(len(SEEDS), seeds)
    assert env.take_invalid_members()[0] == []
    for seed, result in zip(SEEDS, results):
        _, policy, _ = member("push_cube", "ppo", seed)
        want = evaluate(PushCubeEnv(num_envs=4, seed=seed + 1, max_episode_steps=T), policy, 8, seed=seed + 1)
        assert (
            (result.episodes, result.seed, result.env_count)
            == (want.episodes, want.seed, want.env_count)
            == (8, seed + 1, 4)
        )
        np.testing.assert_allclose(result.returns, want.returns, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(result.lengths, want.lengths)
        np.testing.assert_array_equal(result.successes, want.successes)
        for name, values in want.metrics.items():
            np.testing.assert_allclose(result.metrics[name], values, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_members_rate_is_its_configured_rate_to_the_last_bit():
    """Each member's rate is its own ``learning_rate`` exactly (float64, as its solo run holds it), so that its
    checkpoint records it and a solo resume finds the configured rate (in float32, 3e-4 came back as
    3.0000001e-4, and the resume said that the config replaced the checkpoint's rate)."""
    engine, collector = population("cart_pole", "ppo")
    engine.update(collector.collect().data)
    assert engine.lr.tolist() == RATES
