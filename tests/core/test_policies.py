"""Policies: distributions, the tensor core and the TensorDict methods over it (compiled whole too), the critic,
the log-std bound, observation normalisation, the modules the networks live in."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlchain.core import networks, normalization, policies
from rlchain.core.algorithms import PPO
from rlchain.core.collector import SyncCollector
from rlchain.core.evaluation import evaluate
from rlchain.core.networks import bounded
from rlchain.core.policies import (
    ActorCritic,
    ActorOnly,
    Policy,
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
)
from tests.helpers.toy_env import LineEnv


def test_gaussian_policy_matches_torch_distributions():
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-1, 1, (5,), np.float32)
    act_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    policy = ActorCritic(obs_space, act_space, hidden_sizes=[16], init_log_std=-0.3)
    td = TensorDict({"obs": torch.randn(7, 5)}, batch_size=[7])
    out = policy.get_action(td.clone())
    mean = policy.actor(td["obs"])
    dist = torch.distributions.Normal(mean, torch.full_like(mean, math.exp(-0.3)))
    torch.testing.assert_close(out["sample_log_prob"], dist.log_prob(out["action"]).sum(-1))
    ev = policy.evaluate_actions(out)
    torch.testing.assert_close(ev["sample_log_prob"], out["sample_log_prob"])
    torch.testing.assert_close(ev["entropy"], dist.entropy().sum(-1))
    torch.testing.assert_close(ev["value"], policy.critic(td["obs"]).squeeze(-1))
    det = policy.get_action(td.clone(), deterministic=True)
    torch.testing.assert_close(det["action"], mean)


def test_categorical_policy_matches_torch_distributions():
    torch.manual_seed(0)
    policy = ActorCritic(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(5), hidden_sizes=[8])
    td = TensorDict({"obs": torch.randn(9, 4)}, batch_size=[9])
    out = policy.get_action(td.clone())
    assert out["action"].dtype == torch.int64 and out["action"].shape == (9,)
    dist = torch.distributions.Categorical(logits=policy.actor(td["obs"]))
    torch.testing.assert_close(out["sample_log_prob"], dist.log_prob(out["action"]))
    torch.testing.assert_close(policy.evaluate_actions(out)["entropy"], dist.entropy())
    assert torch.equal(policy.get_action(td.clone(), True)["action"], dist.probs.argmax(-1))


def test_get_action_is_the_one_method_collection_and_evaluation_call():
    # A user's policy overrides get_action (or only has it, duck-typed): the
    # collector and the evaluation act through it, and nothing else.
    spaces = (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32))  # LineEnv's

    class Braking(ActorCritic):  # overrides get_action only
        def get_action(self, td, deterministic=False):
            td = super().get_action(td, deterministic)
            td["action"] = torch.zeros_like(td["action"])
            return td

    class TensorDictOnly(torch.nn.Module):  # not a Policy: get_action and get_value only
        has_critic = False

        def get_action(self, td, deterministic=False):
            n = td.batch_size[0]
            return td.update(
                {"action": torch.full((n, 1), 0.5), "sample_log_prob": torch.zeros(n), "value": torch.zeros(n)}
            )

    for policy, expected in ((Braking(*spaces, hidden_sizes=[8]), 0.0), (TensorDictOnly(), 0.5)):
        env = LineEnv(num_envs=4)
        rollout = SyncCollector(env, policy, rollout_steps=3).collect().data
        assert rollout["action"].unique().tolist() == [expected]
        seen = []
        original = policy.get_action
        policy.get_action = lambda td, deterministic=False: seen.append(deterministic) or original(td, deterministic)  # noqa: B023 - called within the iteration
        evaluate(LineEnv(num_envs=4, max_episode_steps=3), policy, num_episodes=4, seed=0)
        assert seen and all(seen)  # evaluation acts deterministically, through get_action


def test_actor_only_has_no_critic_and_zero_value():
    policy = ActorOnly(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32))
    assert policy.critic is None
    out = policy.get_action(TensorDict({"obs": torch.randn(3, 4)}, batch_size=[3]))
    assert torch.equal(out["value"], torch.zeros(3))
    with pytest.raises(ValueError, match="has no critic"):
        PPO(policy)


@pytest.mark.parametrize("ortho_init", [True, False])
def test_mlp_init_is_orthogonal_or_torchs_default(ortho_init):
    # ortho_init=False keeps nn.Linear's own init (rsl_rl's networks): the same seed gives the same weights as
    # plain nn.Linear layers made in the same order; the default is orthogonal (gain sqrt 2, heads 0.01 and 1,
    # zero biases).
    obs_space, act_space = gym.spaces.Box(-1, 1, (5,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)
    torch.manual_seed(3)
    policy = ActorCritic(obs_space, act_space, hidden_sizes=[16, 8], ortho_init=ortho_init, obs_normalization=False)
    torch.manual_seed(3)
    plain = [torch.nn.Linear(i, o) for i, o in ((5, 16), (16, 8), (8, 2), (5, 16), (16, 8), (8, 1))]
    layers = [m for net in (policy.actor, policy.critic) for m in net if isinstance(m, torch.nn.Linear)]
    assert len(layers) == len(plain)
    for layer, reference in zip(layers, plain):
        assert torch.equal(layer.weight, reference.weight) == (not ortho_init)
        assert torch.equal(layer.bias, reference.bias) == (not ortho_init)
    if ortho_init:
        for layer, gain in zip(layers, (math.sqrt(2), math.sqrt(2), 0.01, math.sqrt(2), math.sqrt(2), 1.0)):
            w = layer.weight
            rows_orthonormal = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w  # gain^2 * identity
            torch.testing.assert_close(rows_orthonormal, gain**2 * torch.eye(min(w.shape)))
            assert not layer.bias.any()


def test_log_std_is_clamped():
    policy = ActorCritic(
        gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32), log_std_max=0.5
    )
    with torch.no_grad():
        policy.log_std.fill_(3.0)
    ev = policy.evaluate_actions(TensorDict({"obs": torch.zeros(1, 2), "action": torch.zeros(1, 1)}, batch_size=[1]))
    assert ev["entropy"].item() == pytest.approx(0.5 + 0.5 * math.log(2 * math.pi) + 0.5)


def test_bounded_under_vmap_is_bounded_member_by_member():
    # A population's members run bounded under torch.vmap (and its gradient under torch.func.grad): value and
    # gradient, inside the range and past either bound, each sign of the incoming gradient, are each row's own.
    x = torch.tensor([[-3.0, 0.5, 2.0], [0.0, -1.5, 1.5]])
    sign = torch.tensor([[1.0, -1.0, -1.0], [1.0, -1.0, 1.0]])

    def loss(row: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (bounded(row, -1.0, 1.0) * s).sum()

    values = torch.vmap(lambda row: bounded(row, -1.0, 1.0))(x)
    grads = torch.vmap(torch.func.grad(loss))(x, sign)
    for i in range(2):
        row = x[i].clone().requires_grad_(True)
        loss(row, sign[i]).backward()
        assert torch.equal(values[i], bounded(x[i], -1.0, 1.0)) and torch.equal(grads[i], row.grad)
    assert grads.tolist() == [[0.0, -1.0, 0.0], [1.0, -1.0, 1.0]]  # kept where descent moves x inward


@pytest.mark.parametrize("start", [-3.0, 2.0])
def test_a_log_std_past_its_bound_can_come_back(start):
    # log_std bounded to [-1, 1] but carried past a bound (by an optimiser
    # step, or Adam's momentum): a loss whose optimum is inside the range
    # (log_std = 0) must bring it back; a loss that wants it further out must
    # not move it.
    policy = ActorCritic(
        gym.spaces.Box(-1, 1, (2,), np.float32),
        gym.spaces.Box(-1, 1, (1,), np.float32),
        init_log_std=0.0,
        log_std_min=-1.0,
        log_std_max=1.0,
    )
    td = TensorDict({"obs": torch.zeros(4, 2), "action": torch.zeros(4, 1)}, batch_size=[4])
    entropy_at_0 = 0.5 * math.log(2 * math.pi * math.e)  # Gaussian entropy = log_std + this
    entropy = lambda: policy.evaluate_actions(td)["entropy"].mean()  # noqa: E731
    with torch.no_grad():
        policy.log_std.fill_(start)
    optimizer = torch.optim.Adam([policy.log_std], lr=0.05)
    for _ in range(200):
        optimizer.zero_grad()
        (entropy() - entropy_at_0).square().backward()
        optimizer.step()
    assert abs(policy.log_std.item()) < 0.05
    with torch.no_grad():
        policy.log_std.fill_(start)
    policy.zero_grad()
    (entropy() * (1.0 if start < 0 else -1.0)).backward()  # falls as log_std moves further out
    assert policy.log_std.grad.item() == 0.0


def test_bounded_has_the_plain_gradient_inside_its_range():
    x = torch.tensor([-0.5, 0.0, 0.7], requires_grad=True)
    bounded(x, -1.0, 1.0).exp().sum().backward()
    torch.testing.assert_close(x.grad, x.detach().exp())


def test_obs_normalizer_tracks_mean_and_var_and_is_in_the_state_dict():
    policy = ActorCritic(
        gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32), obs_normalization=True
    )
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(1000, 3, generator=gen) * torch.tensor([1.0, 2.0, 0.5]) + torch.tensor([3.0, -1.0, 0.0])
    for chunk in data.split(100):
        policy.update_obs_normalizer(chunk)
    torch.testing.assert_close(policy.obs_normalizer.mean, data.mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(policy.obs_normalizer.var, data.var(0, unbiased=False), atol=1e-4, rtol=1e-4)
    state = policy.state_dict()
    assert {"obs_normalizer.mean", "obs_normalizer.var", "obs_normalizer.count"} <= set(state)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(activation="swish"), "activation='swish'"),
        (dict(hidden_sizes=[64, 0]), r"hidden_sizes\[1\]=0"),
        (dict(init_log_std=3.0), "init_log_std=3.0"),
    ],
)
def test_bad_policy_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ActorCritic(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32), **kwargs)


# ---------------------------------------------------------------- the distributions, written out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gaussian_functions_are_torch_distributions_normal(dtype):
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(64, 3, generator=gen, dtype=dtype) * 2
    log_std = torch.tensor([-2.0, 0.0, 1.5], dtype=dtype)
    action = mean + torch.randn(64, 3, generator=gen, dtype=dtype) * 3
    normal = torch.distributions.Normal(mean, log_std.exp().expand_as(mean))
    torch.testing.assert_close(
        gaussian_log_prob(action, mean, log_std), normal.log_prob(action).sum(-1), rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(gaussian_entropy(log_std).expand(64), normal.entropy().sum(-1), rtol=1e-6, atol=1e-6)
    torch.manual_seed(5)
    drawn = gaussian_sample(mean, log_std)
    torch.manual_seed(5)
    torch.testing.assert_close(drawn, mean + log_std.exp() * torch.randn_like(mean), rtol=1e-6, atol=1e-6)
    assert drawn.dtype == dtype and drawn.shape == mean.shape


def test_a_gaussian_draw_carries_no_gradient_and_its_log_prob_the_score():
    # The score function: d log p(a) / d mean = (a - mean) / var, d / d log_std = ((a - mean) / std)^2 - 1, the
    # draw held fixed (as torch.distributions.Normal.sample), not reparameterised.
    mean, log_std = torch.zeros(5, 2, requires_grad=True), torch.tensor([0.0, -1.0], requires_grad=True)
    torch.manual_seed(0)
    action = gaussian_sample(mean, log_std)
    assert not action.requires_grad
    gaussian_log_prob(action, mean, log_std).sum().backward()
    var = (2 * log_std.detach()).exp()
    torch.testing.assert_close(mean.grad, action / var)
    torch.testing.assert_close(log_std.grad, (action.square() / var - 1).sum(0))


def test_the_categorical_functions_are_torch_distributions_categorical():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 5, generator=gen) * 3
    action = torch.randint(0, 5, (32,), generator=gen)
    categorical = torch.distributions.Categorical(logits=logits)
    log_probs = torch.log_softmax(logits, -1)
    torch.testing.assert_close(
        categorical_log_prob(log_probs, action), categorical.log_prob(action), rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(categorical_entropy(log_probs), categorical.entropy(), rtol=1e-6, atol=1e-6)
    # The Gumbel-max draw: each category as often as its probability (200,000 draws: a standard error under
    # 0.0011, the tolerance 5 of them), from logits or from log-probabilities alike.
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    logits = probs.log().expand(200_000, 5)
    torch.manual_seed(0)
    drawn = categorical_sample(logits)
    assert drawn.dtype == torch.int64 and drawn.shape == (200_000,)
    torch.testing.assert_close(torch.bincount(drawn, minlength=5) / 200_000, probs, rtol=0, atol=0.0055)
    torch.manual_seed(0)
    assert torch.equal(categorical_sample(logits + 7.0), drawn)


# ---------------------------------------------------------------- the tensor core

SPACES = {
    "flat": gym.spaces.Box(-np.inf, np.inf, (5,), np.float32),
    "grouped": gym.spaces.Dict(
        {
            "policy": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
            "critic": gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float32),
        }
    ),
}
ACTIONS = {"box": gym.spaces.Box(-1, 1, (3,), np.float32), "discrete": gym.spaces.Discrete(4)}


def policy_for(obs: str, action: str, rnn_type: str | None = None, cls=ActorCritic, **settings):
    """A small seeded policy, its normaliser's statistics moved off zero mean and unit variance."""
    torch.manual_seed(0)
    policy = cls(SPACES[obs], ACTIONS[action], hidden_sizes=[16], rnn_type=rnn_type, rnn_hidden_size=8, **settings)
    policy.update_obs_normalizer(observations(obs, 64, seed=9, scale=3.0))
    return policy


def observations(obs: str, *batch: int, seed: int = 1, scale: float = 1.0):
    """Observations of ``SPACES[obs]``, ``[*batch, ...]``: a tensor, or a plain dict of groups."""
    gen = torch.Generator().manual_seed(seed)
    if obs == "flat":
        return torch.randn(*batch, 5, generator=gen) * scale + 1
    return {g: torch.randn(*batch, *space.shape, generator=gen) * scale + 1 for g, space in SPACES[obs].items()}


def as_td(obs, *batch: int):
    return TensorDict({"obs": obs}, batch_size=list(batch))


def random_state(policy, batch: int) -> dict[str, torch.Tensor]:
    """A state of ``batch`` envs, not zeros, as a plain dict of :meth:`initial_state`'s keys."""
    gen = torch.Generator().manual_seed(4)
    return {k: torch.randn(v.shape, generator=gen) for k, v in policy.initial_state(batch).items()}


CORE_CASES = [
    (obs, action, rnn) for obs in ("flat", "grouped") for action in ("box", "discrete") for rnn in (None, "gru", "lstm")
]


@pytest.mark.parametrize("obs, action, rnn_type", CORE_CASES)
def test_act_value_evaluate_equal_the_tensordict_methods(obs, action, rnn_type):
    policy = policy_for(obs, action, rnn_type)
    x = observations(obs, 6)
    state = random_state(policy, 6) if rnn_type else None
    td = as_td(x, 6)
    if rnn_type:
        td["hidden"] = TensorDict(state, batch_size=[6])
    for deterministic in (False, True):
        torch.manual_seed(3)
        got = policy.act(x, state, deterministic)
        torch.manual_seed(3)
        want = policy.get_action(td.clone(), deterministic)
        for a, key in zip(got[:3], ("action", "sample_log_prob", "value")):
            assert torch.equal(a, want[key]), key
        if rnn_type:
            assert got[3].keys() == state.keys() and isinstance(got[3], dict)
            for k, v in got[3].items():
                assert torch.equal(v, want["next_hidden"][k]) and v.shape == state[k].shape
        else:
            assert got[3] is None
    action_shape = (6, 3) if action == "box" else (6,)
    assert got[0].shape == action_shape and got[1].shape == got[2].shape == (6,)
    assert got[0].dtype == (torch.float32 if action == "box" else torch.int64)
    assert torch.equal(policy.value(x, state), policy.get_value(td.clone())["value"])
    # evaluate: [B] feed-forward; [L, S] sequences from the state before step 0, with episode ends inside.
    batch = (5, 6) if rnn_type else (6,)
    seq = observations(obs, *batch, seed=2)
    gen = torch.Generator().manual_seed(5)
    taken = torch.randn(*batch, 3, generator=gen) if action == "box" else torch.randint(0, 4, batch, generator=gen)
    stored = TensorDict({"obs": seq, "action": taken}, batch_size=list(batch))
    done = None
    if rnn_type:
        done = torch.zeros(batch, dtype=torch.bool)
        done[1, 2] = done[3, 0] = True
        stored["done"] = done
        stored["hidden"] = TensorDict(state, batch_size=[6]).unsqueeze(0).expand(*batch)
    got = policy.evaluate(seq, taken, state, done)
    want = policy.evaluate_actions(stored)
    for a, key in zip(got, ("sample_log_prob", "entropy", "value")):
        assert a.shape == batch and torch.equal(a, want[key]), key
        assert a.requires_grad


@pytest.mark.parametrize("obs, action", [(o, a) for o in ("flat", "grouped") for a in ("box", "discrete")])
def test_act_and_evaluate_compile_whole_and_give_eagers_result(obs, action):
    # What a captured collection step and minibatch update need: no graph break (fullgraph), the same draws from
    # the same seed, the same numbers.
    torch._dynamo.reset()
    policy = policy_for(obs, action, actor_obs=["policy"] if obs == "grouped" else None)
    x = observations(obs, 8)
    compiled_act = torch.compile(policy.act, fullgraph=True, backend="aot_eager")
    compiled_value = torch.compile(policy.value, fullgraph=True, backend="aot_eager")
    compiled_evaluate = torch.compile(policy.evaluate, fullgraph=True, backend="aot_eager")
    for deterministic in (False, True):
        torch.manual_seed(7)
        want = policy.act(x, None, deterministic)
        torch.manual_seed(7)
        got = compiled_act(x, None, deterministic)
        assert got[3] is None
        for a, b in zip(got[:3], want[:3]):
            assert a.dtype == b.dtype
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_value(x), policy.value(x), rtol=1e-5, atol=1e-5)
    taken = want[0].detach()  # the deterministic Box action is the mean, differentiable
    for a, b in zip(compiled_evaluate(x, taken), policy.evaluate(x, taken)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # Gradients through the compiled graph (the log-std bound's own backward included) are eager's.
    grads = []
    for fn in (compiled_evaluate, policy.evaluate):
        policy.zero_grad()
        log_prob, entropy, value = fn(x, taken)
        (log_prob.mean() + entropy.mean() + value.square().mean()).backward()
        grads.append([p.grad.clone() for p in policy.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_acting_draws_from_the_policys_distribution():
    # The draws of act follow N(mean, std) per dimension (Box) and the softmax of the logits (Discrete): a sample
    # of 100,000 draws for one observation, means and standard deviations within 5 standard errors.
    policy = policy_for("flat", "box", init_log_std=-0.7)
    x = observations("flat", 1).expand(100_000, 5)
    torch.manual_seed(0)
    with torch.no_grad():
        action, log_prob, _, _ = policy.act(x)
        mean = policy.actor(policy.obs_normalizer.normalize(x[:1]))[0]
    std = math.exp(-0.7)
    torch.testing.assert_close(action.mean(0), mean, rtol=0, atol=5 * std / math.sqrt(100_000))
    torch.testing.assert_close(action.std(0), torch.full((3,), std), rtol=0, atol=5 * std / math.sqrt(2 * 100_000))
    torch.testing.assert_close(log_prob, policy.evaluate(x, action)[0].detach())
    policy = policy_for("flat", "discrete")
    torch.manual_seed(0)
    with torch.no_grad():
        action, log_prob, _, _ = policy.act(x)
        probs = torch.softmax(policy.actor(policy.obs_normalizer.normalize(x[:1]))[0], -1)
    torch.testing.assert_close(torch.bincount(action, minlength=4) / 100_000, probs, rtol=0, atol=0.008)
    torch.testing.assert_close(log_prob, probs.log()[action])


def test_a_recurrent_policy_refuses_acting_without_its_state():
    policy = policy_for("flat", "box", "gru")
    with pytest.raises(
        ValueError,
        match=r"state=None is not allowed: the actor is recurrent; expected a state with "
        r"keys \['actor_h', 'critic_h'\]",
    ):
        policy.act(observations("flat", 2))


class TensorDictOnly(Policy):
    """A user's policy written to the TensorDict contract alone: a linear Gaussian, recurrent with a running sum
    of its observations as its state when ``recurrent``."""

    def __init__(self, observation_space, action_space, recurrent: bool = False) -> None:
        super().__init__()
        self.observation_space, self.action_space = observation_space, action_space
        self.is_recurrent = recurrent
        self.mean = torch.nn.Linear(5, 3)

    def initial_state(self, batch, device=None):
        return TensorDict({"sum": torch.zeros(batch, 5)}, batch_size=[batch]) if self.is_recurrent else None

    def _inputs(self, td):
        return td["obs"] + td["hidden"]["sum"] if self.is_recurrent else td["obs"]

    def get_action(self, td, deterministic=False):
        mean = self.mean(self._inputs(td))
        action = mean if deterministic else mean + torch.randn_like(mean)
        td["action"], td["value"] = action, mean.sum(-1)
        td["sample_log_prob"] = torch.distributions.Normal(mean, 1.0).log_prob(action).sum(-1)
        if self.is_recurrent:
            td["next_hidden"] = TensorDict({"sum": td["hidden"]["sum"] + td["obs"]}, batch_size=td.batch_size)
        return td

    def get_value(self, td):
        td["value"] = self.mean(self._inputs(td)).sum(-1)
        return td

    def evaluate_actions(self, td):
        if self.is_recurrent:  # the state before each sequence's first step, summed along the sequence
            sums = td["hidden"]["sum"][0] + torch.cumsum(td["obs"], 0) - td["obs"]
            mean = self.mean(td["obs"] + sums * (~td["done"]).cumprod(0).unsqueeze(-1))
        else:
            mean = self.mean(td["obs"])
        normal = torch.distributions.Normal(mean, 1.0)
        return TensorDict(
            {
                "sample_log_prob": normal.log_prob(td["action"]).sum(-1),
                "entropy": normal.entropy().sum(-1),
                "value": mean.sum(-1),
            },
            batch_size=td.batch_size,
        )


@pytest.mark.parametrize("recurrent", [False, True])
def test_a_policy_written_to_the_tensordict_contract_acts_through_the_tensor_core(recurrent):
    torch.manual_seed(0)
    policy = TensorDictOnly(SPACES["flat"], ACTIONS["box"], recurrent)
    x = observations("flat", 4)
    state = {"sum": torch.ones(4, 5)} if recurrent else None
    td = as_td(x, 4)
    if recurrent:
        td["hidden"] = TensorDict(state, batch_size=[4])
    torch.manual_seed(1)
    action, log_prob, value, next_state = policy.act(x, state)
    torch.manual_seed(1)
    want = policy.get_action(td)
    for got, key in zip((action, log_prob, value), ("action", "sample_log_prob", "value")):
        assert torch.equal(got, want[key])
    if recurrent:
        assert isinstance(next_state, dict) and torch.equal(next_state["sum"], x + 1)
    else:
        assert next_state is None
    assert torch.equal(policy.value(x, state), want["value"])
    batch = (3, 4) if recurrent else (4,)
    seq = observations("flat", *batch, seed=2)
    taken = torch.randn(*batch, 3)
    got = policy.evaluate(seq, taken, state)  # no episode end inside the sequences
    stored = TensorDict({"obs": seq, "action": taken}, batch_size=list(batch))
    if recurrent:
        stored["done"] = torch.zeros(batch, dtype=torch.bool)
        stored["hidden"] = TensorDict(state, batch_size=[4]).unsqueeze(0).expand(*batch)
    want = policy.evaluate_actions(stored)
    for a, key in zip(got, ("sample_log_prob", "entropy", "value")):
        assert a.shape == batch and torch.equal(a, want[key])


def test_a_subclass_that_overrides_a_tensordict_method_acts_through_it():
    # ActorCritic's tensor core would skip a subclass's get_action: act, value and evaluate go through the
    # TensorDict methods a subclass overrides, and straight to the core otherwise.
    class Braking(ActorCritic):
        def get_action(self, td, deterministic=False):
            td = super().get_action(td, deterministic)
            td["action"] = torch.zeros_like(td["action"])
            return td

    class Valued(ActorCritic):
        def get_value(self, td):
            td["value"] = torch.full(td.batch_size, 2.0)
            return td

        def evaluate_actions(self, td):
            out = super().evaluate_actions(td)
            out["value"] = torch.full(td.batch_size, 3.0)
            return out

    x = observations("flat", 4)
    braking, valued = policy_for("flat", "box", cls=Braking), policy_for("flat", "box", cls=Valued)
    assert not braking.act(x)[0].any() and braking.value(x).abs().sum() > 0
    assert valued.act(x)[0].any() and torch.equal(valued.value(x), torch.full((4,), 2.0))
    log_prob, _, value = valued.evaluate(x, torch.zeros(4, 3))
    assert torch.equal(value, torch.full((4,), 3.0)) and log_prob.requires_grad
    plain = policy_for("flat", "box")
    torch.testing.assert_close(valued.evaluate(x, torch.zeros(4, 3))[0], plain.evaluate(x, torch.zeros(4, 3))[0])


def test_the_networks_and_the_normaliser_have_their_own_modules_and_import_from_policies_too():
    moved = {
        networks: [
            "ACTIVATIONS",
            "CNNEncoder",
            "MAX_CNN_FEATURES",
            "MLP",
            "Memory",
            "RNN_TYPES",
            "SpatialSoftmax",
            "bounded",
        ],
        normalization: ["RunningMeanStd"],
    }
    for module, names in moved.items():
        assert sorted(module.__all__) == sorted(names)
        for name in names:
            assert getattr(policies, name) is getattr(module, name) and name not in policies.__all__
            obj = getattr(module, name)
            assert getattr(obj, "__module__", module.__name__) == module.__name__  # defined there, once
    assert policies._InwardClamp is networks._InwardClamp
    policy = policy_for("grouped", "box", "lstm")
    assert {k for k in policy.state_dict() if "normalizer" in k or "memory" in k} == {
        *(f"obs_normalizer.{g}.{b}" for g in ("policy", "critic") for b in ("mean", "var", "count")),
        *(
            f"{net}_memory.rnn.{w}_l0"
            for net in ("actor", "critic")
            for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        ),
    }
