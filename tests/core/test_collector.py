"""The collector: storage, bootstrapping, episode statistics, no host sync per step."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlchain.core.algorithms import GRPO
from rlchain.core.algorithms.functional import (
    compute_gae,
)
from rlchain.core.collector import EpisodeWindow, SyncCollector
from rlchain.core.envs.base import NON_FINITE_ACTION
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.run.trainer import Trainer
from tests.helpers.references import reference_gae
from tests.helpers.runs import rows
from tests.helpers.toy_env import LineEnv


class SyncCounter(TorchDispatchMode):
    """Counts aten ops that read a device value on the host (a host-device sync on CUDA)."""

    SYNC_OPS = {
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.nonzero.default,
        torch.ops.aten.is_nonzero.default,
        torch.ops.aten.equal.default,
        torch.ops.aten.masked_select.default,
        torch.ops.aten.unique_consecutive.default,
    }

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.SYNC_OPS or (
            func.overloadpacket is torch.ops.aten.index
            and args[1]
            and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])
        ):
            self.count += 1
        return func(*args, **(kwargs or {}))


def syncs_per_collect(rollout_steps: int) -> int:
    env = LineEnv(num_envs=8, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    collector = SyncCollector(env, policy, rollout_steps)
    collector.collect()  # first call resets; count a steady-state one
    with SyncCounter() as counter:
        collector.collect()
    return counter.count


def test_collector_has_no_host_sync_per_step():
    # The rollout-end statistics read a fixed number of values; the step loop none.
    assert syncs_per_collect(4) == syncs_per_collect(32)
    assert syncs_per_collect(4) > 0  # the counter does see the end-of-rollout reads


def test_collector_bootstraps_truncations_from_final_obs_only():
    torch.manual_seed(0)
    env = LineEnv(num_envs=16, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    rollout = SyncCollector(env, policy, rollout_steps=12).collect().data
    truncated, done = rollout["truncated"], rollout["done"]
    assert truncated.any() and rollout["terminated"].any()
    with torch.no_grad():
        v_final = policy.critic(rollout["final_obs"]).squeeze(-1)
    torch.testing.assert_close(rollout["next_value"], v_final)
    # Where the env reset, the stored next state is the final one, not the reset one.
    reset_obs = rollout["obs"][1:][done[:-1]]
    assert not torch.allclose(rollout["final_obs"][:-1][done[:-1]], reset_obs)
    # GAE: a truncated step's target uses next_value, a terminated one does not.
    adv, _ = compute_gae(
        rollout["reward"], rollout["value"], rollout["next_value"], rollout["terminated"], done, 0.9, 1.0
    )
    t, n = torch.nonzero(truncated)[0].tolist()
    expected = rollout["reward"][t, n] + 0.9 * v_final[t, n] - rollout["value"][t, n]
    assert adv[t, n].item() == pytest.approx(expected.item(), abs=1e-6)


def test_collector_reads_final_obs_only_on_done_rows():
    # An env that follows the contract to the letter: final_obs carries
    # meaning on done rows only (here zeros elsewhere, as a user converting
    # gymnasium's None entries would write). Running episodes must bootstrap
    # from the next observation, not from those zeros.
    class FinalObsOnDoneRowsOnly(LineEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            info["final_obs"] = torch.where((terminated | truncated)[:, None], info["final_obs"], 0.0)
            return obs, reward, terminated, truncated, info

    torch.manual_seed(0)
    env = FinalObsOnDoneRowsOnly(num_envs=16, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    collector = SyncCollector(env, policy, rollout_steps=12)
    rollout = collector.collect().data
    done = rollout["done"]
    assert done.any() and (~done).any()
    next_obs = torch.cat((rollout["obs"][1:], collector.stepper.obs[None]))  # the state each transition moved to
    s_prime = torch.where(done[..., None], rollout["final_obs"], next_obs)
    with torch.no_grad():
        expected = policy.critic(s_prime).squeeze(-1)
    torch.testing.assert_close(rollout["next_value"], expected)
    # and so GAE equals the reference loop on the true next states
    adv, _ = compute_gae(
        rollout["reward"], rollout["value"], rollout["next_value"], rollout["terminated"], done, 0.9, 0.8
    )
    ref = reference_gae(
        rollout["reward"], rollout["value"], expected, rollout["terminated"], rollout["truncated"], 0.9, 0.8
    )
    torch.testing.assert_close(adv.double(), ref, atol=1e-5, rtol=1e-5)


def test_collector_stores_each_step_and_counts_episodes_across_rollouts():
    # Step the env by hand next to the collector (same seed, same actions) and
    # keep the episode sums the plain way; episodes span rollout boundaries.
    torch.manual_seed(0)
    env, twin = LineEnv(num_envs=6, max_episode_steps=3), LineEnv(num_envs=6, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    collector = SyncCollector(env, policy, rollout_steps=5)
    window = EpisodeWindow(min_episodes=4)
    twin_obs, _ = twin.reset()
    ret, length, finished = torch.zeros(6, dtype=torch.float64), torch.zeros(6, dtype=torch.int64), []
    for _ in range(3):
        result = collector.collect()
        rollout = result.data.clone()
        window.add(result.episodes)
        from_here = len(finished)
        for t in range(5):
            assert torch.equal(rollout["obs"][t], twin_obs)
            twin_obs, reward, terminated, truncated, info = twin.step(rollout["action"][t])
            done = terminated | truncated
            ret, length = ret + reward, length + 1
            for key, value in (
                ("reward", reward),
                ("terminated", terminated),
                ("truncated", truncated),
                ("done", done),
                ("final_obs", info["final_obs"]),
                ("success", info["success"]),
                ("episode_return", ret),
                ("episode_length", length),
            ):
                torch.testing.assert_close(rollout[key][t], value, msg=f"{key} at step {t}")
            finished += ret[done].tolist()
            ret, length = ret.masked_fill(done, 0.0), length.masked_fill(done, 0)
        assert result.episodes.returns == pytest.approx(finished[from_here:])
        # the window: this rollout's episodes, topped up with earlier ones to at least 4
        assert window.returns == pytest.approx(finished[-max(4, len(finished) - from_here) :])
    assert len(finished) > 6


def test_collector_copies_each_step_so_an_env_may_reuse_its_buffers():
    # An env that returns the same obs/reward/flag tensors every step, overwritten
    # in place (as simulators with preallocated buffers do): the rollout must hold
    # each step's values, as stepping a twin env that returns fresh tensors shows.
    class ReusesItsBuffers(LineEnv):
        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed, options=options)
            self.obs_buf = obs.clone()
            return self.obs_buf, info

        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            if not hasattr(self, "step_bufs"):
                self.step_bufs = (reward.clone(), terminated.clone(), truncated.clone())
            self.obs_buf.copy_(obs)
            for buf, value in zip(self.step_bufs, (reward, terminated, truncated)):
                buf.copy_(value)
            return self.obs_buf, *self.step_bufs, info

    torch.manual_seed(0)
    env, twin = ReusesItsBuffers(num_envs=6, max_episode_steps=3), LineEnv(num_envs=6, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    rollout = SyncCollector(env, policy, rollout_steps=7).collect().data
    twin_obs, _ = twin.reset()
    for t in range(7):
        assert torch.equal(rollout["obs"][t], twin_obs), t
        twin_obs, reward, terminated, truncated, _ = twin.step(rollout["action"][t])
        assert torch.equal(rollout["reward"][t], reward) and torch.equal(rollout["terminated"][t], terminated)
        assert torch.equal(rollout["truncated"][t], truncated), t


def test_collector_rejects_reward_terms_that_come_and_go():
    class FlakyTerms(LineEnv):
        def step(self, action):
            out = super().step(action)
            if int(self.t[0]) % 2 == 0:
                out[4]["rewards"] = {}
            return out

    env = FlakyTerms(num_envs=4, max_episode_steps=50)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    with pytest.raises(ValueError, match=r"info\['rewards'\]\['progress'\] is missing at some step"):
        SyncCollector(env, policy, rollout_steps=4).collect()


def test_collector_group_reset_and_episode_stats():
    env = LineEnv(num_envs=8, max_episode_steps=4)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    collector = SyncCollector(env, policy, rollout_steps=4, reset_options={"group_size": 4})
    for _ in range(2):  # every rollout starts from a group reset
        result = collector.collect()
        rollout = result.data
        first = rollout["obs"][0, :, 0].view(2, 4)
        assert torch.equal(first, first[:, :1].expand(2, 4)) and first[0, 0] != first[1, 0]
        assert torch.equal(rollout["episode_length"][0], torch.ones(8, dtype=torch.int64))
    window = EpisodeWindow(min_episodes=100)
    window.add(result.episodes)
    stats = window.means(success=True)
    assert 0.0 <= stats["charts/success_rate"] <= 1.0 and 1 <= stats["charts/episodic_length"] <= 4
    assert "rewards/progress" in result.term_means and "metrics/distance" in result.term_means


def test_spread_episode_starts_puts_each_env_at_a_random_step_of_its_first_episode_once():
    # Without it every env of CartPole reaches its time limit at the same step; rsl_rl's init_at_random_ep_len.
    from rlchain.core.envs import CartPoleEnv

    def truncation_steps(spread: bool, seed: int = 0) -> list[int]:
        env = CartPoleEnv(num_envs=32, max_episode_steps=8, seed=seed)  # too short for the pole to fall
        policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        collector = SyncCollector(env, policy, rollout_steps=8, spread_episode_starts=spread)
        data = collector.collect().data
        assert not data["terminated"].any()
        first = data["truncated"].float().argmax(0)  # each env's first time-out, in [0, 8)
        second = collector.collect().data["truncated"].float().argmax(0)
        assert torch.equal(second, first)  # spread once: later episodes keep their full 8 steps
        return first.tolist()

    assert set(truncation_steps(spread=False)) == {7}
    spread = truncation_steps(spread=True)
    assert len(set(spread)) > 4 and spread == truncation_steps(spread=True)  # drawn from the env's seeded stream
    assert spread != truncation_steps(spread=True, seed=1)


def test_spread_episode_starts_is_refused_with_grpo_and_with_an_env_that_cannot():
    from rlchain.core.envs import GymVecEnv

    env = LineEnv(num_envs=8, max_episode_steps=4)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    with pytest.raises(ValueError, match=r"^spread_episode_starts=True is not allowed with an algorithm that resets"):
        SyncCollector(env, policy, 4, reset_options={"group_size": 4}, spread_episode_starts=True)
    gym_env = GymVecEnv("Pendulum-v1", num_envs=2)
    policy = ActorOnly(gym_env.single_observation_space, gym_env.single_action_space, hidden_sizes=[8])
    with pytest.raises(ValueError, match=r"^spread_episode_starts=True is not allowed with GymVecEnv, which cannot"):
        SyncCollector(gym_env, policy, 4, spread_episode_starts=True)


# 1. GRPO's charts count only the episodes that started at the rollout's reset.
def test_grpo_charts_count_each_envs_first_episode_whatever_its_length(tmp_path):
    torch.manual_seed(0)
    env = LineEnv(num_envs=32, max_episode_steps=5, seed=1)
    policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(
        env,
        policy,
        GRPO(policy, group_size=4, batch_size=64),
        iterations=1,
        rollout_steps=12,
        stats_min_episodes=1,
        output_dir=str(tmp_path),
        progress=False,
    )
    trainer.train()
    data = trainer.collector.buffer.data
    done, length, ret = data["done"], data["episode_length"], data["episode_return"]
    first = done & (done.cumsum(0) == 1)
    assert bool(first.any(0).all()), "every env ends its first episode within the rollout"
    assert int(done.sum()) > int(first.sum()), "some env ends a second, shorter episode: the case at stake"
    (row,) = rows(tmp_path)
    assert row["charts/episodic_length"] == pytest.approx(length[first].double().mean().item())
    assert row["charts/episodic_return"] == pytest.approx(ret[first].double().mean().item())
    assert row["charts/success_rate"] == pytest.approx(data["success"][first].double().mean().item())


class NaNObservations(LineEnv):
    """Its observations turn NaN after two steps (a diverged simulation); it rejects
    non-finite actions, as the built-in envs and env=gym do."""

    def _obs(self):
        obs = super()._obs()
        return torch.where(self.t[:, None] >= 2, float("nan"), obs)

    def step(self, action):
        if not bool(torch.isfinite(action).all()):
            raise ValueError(NON_FINITE_ACTION)
        return super().step(action)


class DeferredNaNObservations(NaNObservations):
    """As NaNObservations, but it keeps its action check on the device, as a torch-native task does when its step
    is compiled or runs on CUDA: only ``check_actions`` raises."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.bad = torch.zeros((), dtype=torch.bool)

    def step(self, action):
        self.bad |= ~torch.isfinite(action).all()
        return LineEnv.step(self, action.nan_to_num())

    def check_actions(self):
        if bool(self.bad):
            raise ValueError(NON_FINITE_ACTION)


@pytest.mark.parametrize("env_cls", [NaNObservations, DeferredNaNObservations])
def test_nan_observations_are_reported_as_observations(env_cls):
    # Whether the env rejects the NaN action in its step or at the rollout's check_actions, the report names the
    # observation the policy acted on.
    env = env_cls(num_envs=4, max_episode_steps=50)
    policy = ActorCritic(
        env.single_observation_space, env.single_action_space, hidden_sizes=[8], obs_normalization=False
    )
    with pytest.raises(
        ValueError, match=rf"^observation contains NaN or inf: {env_cls.__name__} returned a non-finite obs"
    ):
        SyncCollector(env, policy, rollout_steps=8).collect()


class DeferredLine(LineEnv):
    """A LineEnv that checks its actions on the device, as a torch-native task does when compiled or on CUDA: a NaN
    action goes into its state (NaN observations from the next step on), and only ``check_actions`` raises."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.bad = torch.zeros((), dtype=torch.bool)

    def step(self, action):
        self.bad |= ~torch.isfinite(action).all()
        return super().step(action)

    def check_actions(self):
        if bool(self.bad):
            raise ValueError(NON_FINITE_ACTION)


def test_a_deferred_check_blames_the_policys_nan_action_not_the_observations_it_made_nan():
    # The policy's own NaN action (its output bias NaN, from finite observations) made the state, and so every
    # later observation, NaN before the rollout's one check: the error is the action's, as eager on the CPU says.
    # It had named "DeferredLine returned a non-finite observation".
    env = DeferredLine(num_envs=4, max_episode_steps=50)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    with torch.no_grad():
        policy.actor[-1].bias.fill_(float("nan"))
    collector = SyncCollector(env, policy, rollout_steps=8)
    with pytest.raises(ValueError) as err:
        collector.collect()
    assert str(err.value) == NON_FINITE_ACTION
    assert bool((~torch.isfinite(collector.buffer.data["obs"][1:])).any(-1).all())  # the observations it made NaN
