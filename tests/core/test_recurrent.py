"""Recurrent policies: collection, sequence replay, bootstrapping, updates and evaluation against a plain
step-by-step reference (episode ends inside sequences included)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlchain.core.algorithms import GRPO, PPO
from rlchain.core.algorithms.base import Algorithm, AlgorithmConfig
from rlchain.core.buffer import sequence_minibatches
from rlchain.core.collector import SyncCollector
from rlchain.core.envs import CartPoleEnv
from rlchain.core.evaluation import evaluate
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.run.trainer import Trainer
from rlchain.settings import SettingError
from tests.helpers.recurrent import masked, recurrent, step_by_step

#: actor and critic recurrent, only the actor, only the critic.
NETWORKS = [dict(), dict(rnn_critic=False), dict(rnn_actor=False)]


def no_velocities(num_envs: int = 6, seed: int = 0, **settings) -> CartPoleEnv:
    """CartPole without its velocities; a 10-step limit, so that rollouts hold truncations as well as falls."""
    return CartPoleEnv(num_envs=num_envs, seed=seed, hide_velocities=True, max_episode_steps=10, **settings)


def magnitude(state: TensorDict) -> float:
    return float(sum(v.abs().sum() for v in state.values()))


def collected(rnn_type="gru", steps=24, **settings):
    env = no_velocities()
    policy = recurrent(env, rnn_type, **settings)
    collector = SyncCollector(env, policy, steps)
    collector.collect()  # the second rollout starts from carried states
    return policy, collector, collector.collect().data


@pytest.mark.parametrize("networks", NETWORKS, ids=["both", "actor", "critic"])
@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_collection_stores_the_state_each_step_acted_from_fresh_after_an_episode_ended(rnn_type, networks):
    policy, collector, data = collected(rnn_type, **networks)
    # The state after each step is kept only for a critic that bootstraps from it.
    assert ("final_hidden" in data.keys()) == networks.get("rnn_critic", True)
    assert data["done"][:-1].any() and magnitude(data["hidden"][0]) > 0  # episodes end inside; states carried over
    log_probs, values, states, _ = step_by_step(policy, data)
    torch.testing.assert_close(data["hidden"], states)
    torch.testing.assert_close(data["sample_log_prob"], log_probs)
    torch.testing.assert_close(data["value"], values)
    t, n = data["done"][:-1].nonzero(as_tuple=True)
    for key in data["hidden"].keys():
        assert (data["hidden"][key][t + 1, n] == 0).all()


def test_a_policy_says_whether_its_critic_reads_the_state():
    env = no_velocities()
    spaces = (env.single_observation_space, env.single_action_space)
    for settings, reads in zip(NETWORKS, (True, False, True)):
        assert recurrent(env, **settings).recurrent_critic is reads
    assert recurrent(env, cls=ActorOnly).recurrent_critic is False  # no critic
    assert ActorCritic(*spaces).recurrent_critic is False  # feed-forward


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_sequences_replay_like_the_step_by_step_reference_across_episode_ends(rnn_type):
    policy, _, data = collected(rnn_type)
    with torch.no_grad():  # an updated policy: replay recomputes every state inside a sequence
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    seq_len = 8
    replayed = {}
    for batch in sequence_minibatches(data, seq_len, batch_size=3 * seq_len, generator=None):
        out = policy.evaluate_actions(batch)
        for key in ("sample_log_prob", "value"):
            replayed.setdefault(key, []).append(out[key].detach())
    crossed = 0
    for c in range(data.batch_size[0] // seq_len):
        chunk = data[c * seq_len : (c + 1) * seq_len]
        crossed += int(chunk["done"][:-1].any())
        log_probs, values, _, _ = step_by_step(policy, chunk)
        # In order: the sequences of chunk c are env 0..N-1, minibatches of three.
        got = {key: torch.cat(parts, dim=1)[:, c * 6 : (c + 1) * 6] for key, parts in replayed.items()}
        torch.testing.assert_close(got["sample_log_prob"], log_probs)
        torch.testing.assert_close(got["value"], values)
    assert crossed >= 1  # a chunk with an episode end inside its sequences


@pytest.mark.parametrize("networks", NETWORKS, ids=["both", "actor", "critic"])
@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_a_done_rows_bootstrap_value_reads_the_critics_state_after_that_step(rnn_type, networks):
    policy, _, data = collected(rnn_type, **networks)
    _, _, _, after = step_by_step(policy, data)
    truncated = data["truncated"] & ~data["terminated"]
    t, n = truncated.nonzero(as_tuple=True)
    assert t.numel() > 0
    with torch.no_grad():
        final = TensorDict({"obs": data["final_obs"][t, n], "hidden": after[t, n]}, [t.numel()])
        expected = policy.get_value(final)["value"]
        fresh = policy.get_value(final.set("hidden", after[t, n].clone().zero_()))["value"]
    torch.testing.assert_close(data["next_value"][t, n], expected)
    if networks.get("rnn_critic", True):  # the state matters: a zero one gives other values
        assert not torch.allclose(expected, fresh)
    else:  # a feed-forward critic reads no state: none is stored for it
        torch.testing.assert_close(expected, fresh)


def test_ppos_first_minibatch_replays_the_rollout_policy_exactly():
    """One minibatch of every sequence and one epoch: the replayed log-probabilities equal those of collection, so
    the KL and the clipped share before the step are 0."""
    policy, collector, data = collected("lstm")
    ppo = PPO(policy, batch_size=24 * 6, n_epochs=1, seq_len=24)
    stats = ppo.update(data)
    assert abs(stats["approx_kl"]) < 1e-6 and stats["clipfrac"] == 0.0


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_ppo_and_grpo_update_a_recurrent_policy_from_whole_sequences(rnn_type):
    policy, _, data = collected(rnn_type)
    before = [p.detach().clone() for p in policy.parameters()]
    ppo = PPO(policy, batch_size=16, n_epochs=2, seq_len=8, lr_schedule="adaptive", target_kl=0.01)
    stats = ppo.update(data)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if k != "explained_variance")
    assert stats["update_kl"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))

    env = no_velocities(num_envs=8)
    actor = recurrent(env, rnn_type, cls=ActorOnly)
    grpo = GRPO(actor, batch_size=40, n_epochs=2, group_size=4, kl_coef=0.1)
    rollout = SyncCollector(env, actor, 20, reset_options=grpo.reset_options).collect().data
    assert "final_hidden" not in rollout.keys()  # no critic, no bootstrap state
    stats = grpo.update(rollout)
    assert 0 < stats["live_fraction"] < 1 and stats["approx_ref_kl"] >= 0


def test_a_reset_of_every_env_starts_every_state_afresh():
    env = no_velocities(num_envs=4)
    policy = recurrent(env, cls=ActorOnly)
    collector = SyncCollector(env, policy, 12, reset_options={"group_size": 2})
    collector.collect()
    assert magnitude(collector.stepper.hidden) > 0  # noqa: SLF001 - carried to the next rollout's reset
    data = collector.collect().data
    assert magnitude(data["hidden"][0]) == 0


def test_the_collectors_state_round_trips_through_its_state_dict():
    policy, collector, _ = collected()
    saved = collector.state_dict()
    env = no_velocities()
    other = SyncCollector(env, policy, 24)
    other.load_state_dict(saved)
    torch.testing.assert_close(other.stepper.hidden, collector.stepper.hidden)  # noqa: SLF001
    feed_forward = SyncCollector(env, ActorCritic(env.single_observation_space, env.single_action_space), 24)
    with pytest.raises(ValueError, match="saved with another policy"):
        other.load_state_dict(feed_forward.state_dict())


def test_evaluation_acts_from_each_envs_state_and_starts_it_afresh_every_episode():
    def env_():  # episodes that end by falls, whose lengths the actions decide
        return CartPoleEnv(num_envs=3, seed=0, hide_velocities=True, action_mode="continuous")

    env = env_()
    policy = recurrent(env, "lstm").eval()
    with torch.no_grad():  # actions that the state moves (the head's initial gain is 0.01)
        policy.actor[-1].weight.mul_(100.0)
    result = evaluate(env, policy, num_episodes=6, seed=5)
    # The plain reference: the same episodes stepped one at a time, each state zeroed where its episode ended.
    ref = env_()
    obs, _ = ref.reset(seed=5)
    hidden, ret = policy.initial_state(3), torch.zeros(3)
    returns: list[list[float]] = [[], [], []]
    with torch.no_grad():
        while min(len(r) for r in returns) < 2:
            step = policy.get_action(TensorDict({"obs": obs, "hidden": hidden}, [3]), deterministic=True)
            obs, reward, terminated, truncated, _ = ref.step(step["action"])
            done = terminated | truncated
            ret += reward
            for i in done.nonzero().flatten().tolist():
                returns[i].append(float(ret[i]))
            ret[done] = 0
            hidden = masked(step["next_hidden"], done)
    expected = [returns[i][k] for k in range(2) for i in range(3)]  # episode k of env i is row k * n + i
    assert result.returns.tolist() == pytest.approx(expected)
    assert len(set(expected)) > 2


def test_a_resumed_recurrent_run_continues_exactly_like_an_uninterrupted_one(tmp_path):
    def make(out, iterations, resume_from=None):
        env = no_velocities(num_envs=8, seed=3)
        policy = recurrent(env)
        algo = PPO(policy, batch_size=32, n_epochs=2, seq_len=8, seed=3)
        trainer = Trainer(
            env, policy, algo, iterations=iterations, rollout_steps=16, save_freq=100, output_dir=str(out),
            seed=3, progress=False, resume_from=resume_from, eval_freq=100,
        )  # fmt: skip
        trainer.start()
        return trainer

    straight = make(tmp_path / "a", 3)
    straight.train()
    make(tmp_path / "b", 2).train()
    resumed = make(tmp_path / "c", 3, resume_from=str(tmp_path / "b" / "checkpoints" / "latest.pt"))
    assert magnitude(resumed.collector.stepper.hidden) > 0  # noqa: SLF001 - the saved run's states, not zeros
    resumed.train()
    for (name, a), b in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b), name


class SingleSteps(Algorithm):
    """A user's algorithm that does not declare whole-sequence training."""

    def __init__(self, policy, **settings):
        super().__init__(policy, AlgorithmConfig(**settings))


def test_what_cannot_keep_sequences_whole_is_refused_naming_it():
    env = no_velocities()
    gru, mlp = recurrent(env), ActorCritic(env.single_observation_space, env.single_action_space)
    with pytest.raises(SettingError, match=r"policy.rnn_type='gru' is not allowed with SingleSteps"):
        SingleSteps(gru)
    with pytest.raises(SettingError, match=r"seq_len=8 is not allowed with a feed-forward policy"):
        PPO(mlp, seq_len=8)
    with pytest.raises(SettingError, match=r"algorithm.seq_len=7 does not divide trainer.rollout_steps=24"):
        PPO(gru, seq_len=7).check_rollout(24)
    with pytest.raises(SettingError, match=r"algorithm.batch_size=16 is smaller than one sequence \(seq_len 24\)"):
        PPO(gru, batch_size=16).check_rollout(24)
    with pytest.raises(SettingError, match=r"rnn_actor=False is not allowed with rnn_type='gru': ActorOnly has no"):
        recurrent(env, cls=ActorOnly, rnn_actor=False)
    with pytest.raises(SettingError, match=r"rnn_type='lstm' is not allowed with rnn_actor=False and rnn_critic"):
        recurrent(env, "lstm", rnn_actor=False, rnn_critic=False)


def test_a_recurrent_camera_actor_with_a_privileged_critic_replays_its_sequences():
    """Groups and images: the actor's image encoder and vector group feed its LSTM, the privileged critic's state
    feeds its own; collection and sequence replay agree."""
    from rlchain.core.envs import PushCubeEnv

    env = PushCubeEnv(num_envs=4, obs_mode="pixels_state", privileged_critic=True, image_size=32, max_episode_steps=6)
    cnn = dict(cnn_channels=[8, 8], cnn_kernel_sizes=[4, 3], cnn_strides=[2, 2], cnn_features=16)
    policy = recurrent(env, "lstm", actor_obs=["image", "state"], **cnn)
    assert set(policy.actor_encoders) == {"image"} and policy.critic_groups == ["critic"]
    collector = SyncCollector(env, policy, 12)
    data = collector.collect().data
    assert data["obs"]["image"].dtype == torch.uint8 and data["done"][:-1].any()
    (batch,) = sequence_minibatches(data, 12, 48, generator=None)
    replayed = policy.evaluate_actions(batch)
    torch.testing.assert_close(replayed["sample_log_prob"], data["sample_log_prob"])
    torch.testing.assert_close(replayed["value"], data["value"])
    PPO(policy, batch_size=24, n_epochs=1, seq_len=6).update(data)
