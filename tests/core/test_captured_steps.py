"""The collection step and the minibatch update compiled whole (``fullgraph=True``) and replayed as CUDA graphs:
the same rollout and the same first update as eager, fixed addresses, and the refusals where capture cannot apply.

The CPU tests compile with ``backend="aot_eager"`` (dynamo's whole graph, functionalisation and autograd, with
eager kernels, so the random draws are eager's too): inductor's code generation of push_cube's step takes minutes
on a 2-core machine; ``tests/run/test_compile.py`` runs inductor on the update, and the last test here on a small
function compiled as the collection step is (``compile_step``).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlchain.core.algorithms import GRPO, PPO
from rlchain.core.algorithms.update import update_step
from rlchain.core.collector import SyncCollector
from rlchain.core.compiling import compile_step
from rlchain.core.envs import CartPoleEnv, PushCubeEnv
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.run.trainer import Trainer
from rlchain.settings import SettingError
from tests.helpers.toy_env import LineEnv

CASES = {
    "push_cube_ppo": (lambda: PushCubeEnv(num_envs=16, seed=0), ActorCritic, PPO, {}),
    "push_cube_grpo": (
        lambda: PushCubeEnv(num_envs=16, seed=0, max_episode_steps=8),
        ActorOnly,
        GRPO,
        {"group_size": 4},
    ),
    "cart_pole_ppo": (lambda: CartPoleEnv(num_envs=16, seed=0), ActorCritic, PPO, {}),
}


def _build(case: str, compiled: bool, steps: int = 8):
    make_env, make_policy, make_algorithm, settings = CASES[case]
    torch.manual_seed(0)
    env = make_env()
    policy = make_policy(env.single_observation_space, env.single_action_space, hidden_sizes=[32, 32])
    algorithm = make_algorithm(policy, batch_size=32, n_epochs=2, **settings)
    policy.seed_actions(0)  # as rlchain-train does: the warm-up's draws of the action stream must not stay drawn
    collector = SyncCollector(env, policy, steps, reset_options=algorithm.reset_options)
    if compiled:  # as trainer.compile compiles them (warm-ups included), with eager kernels
        for step in (collector.step, update_step(algorithm, collector.buffer.data)):
            step.compile(backend="aot_eager")
            assert step.mode == "compiled"
    return env, policy, algorithm, collector


@pytest.mark.parametrize("case", list(CASES))
def test_the_compiled_collection_step_and_update_give_eagers_rollouts_and_updates(case):
    """A rollout and an update compiled whole against eager from the same seed: the same rollout, the same first
    update's terms (1e-5 relative) and parameters after it. Later iterations start from parameters that rounding
    moved, and push_cube's contacts let the trajectories part: compared as learning curves, not here."""
    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        env, policy, algorithm, collector = _build(case, compiled)
        rollout = collector.collect()
        data, terms, episodes = rollout.data.clone(), rollout.term_means, rollout.episodes
        stats = algorithm.update(rollout.data)
        collector.collect()  # the compiled step once more, from the updated policy
        results.append((data, terms, episodes, stats, [p.detach().clone() for p in policy.parameters()]))
    (data_e, terms_e, episodes_e, stats_e, params_e), (data_c, terms_c, episodes_c, stats_c, params_c) = results
    for key in ("obs", "action", "sample_log_prob", "value", "reward", "done", "next_value", "episode_return"):
        torch.testing.assert_close(data_c[key], data_e[key], rtol=1e-5, atol=1e-6, msg=key)
    assert terms_c == pytest.approx(terms_e, rel=1e-5, abs=1e-7)
    assert episodes_c.returns == pytest.approx(episodes_e.returns, rel=1e-5, abs=1e-6)
    assert (episodes_c.lengths, episodes_c.successes) == (episodes_e.lengths, episodes_e.successes)
    assert stats_c == pytest.approx(stats_e, rel=1e-5, abs=1e-6)
    for c, e in zip(params_c, params_e):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6)


def test_the_collection_step_and_the_update_keep_their_tensors_addresses():
    """What a CUDA graph replays must stay where it was captured: the storage, the stepper's buffers, the step
    counter, the term sums, the env's state, the parameters, Adam's state, the rate, the staged samples and the
    minibatch order keep their addresses through rollouts with group resets, updates and a checkpoint load."""
    env, policy, algorithm, collector = _build("push_cube_grpo", compiled=False)

    def addresses():
        tensors = {f"data.{k}": v for k, v in collector.buffer.data.items(True, True)}
        tensors.update({f"obs.{k}": v for k, v in collector.stepper.obs.items()} if collector._groups else {})
        tensors.update(
            step=collector._t,
            episode_return=collector.stepper.episode_return,
            episode_length=collector.stepper.episode_length,
            lr=algorithm.updater.lr,
            order=algorithm.updater._order_buffer,
            position=algorithm.updater._position,
        )
        tensors.update({f"sums.{g}": v for g, v in collector._term_sums.items()})
        tensors.update({f"env.{k}": v for k, v in env.get_state().items()})
        tensors.update({f"param.{k}": v for k, v in policy.state_dict().items()})
        updater = algorithm.updater
        adam = [updater._exp_avg_flat, updater._exp_avg_sq_flat, updater._adam_steps]
        adam += [t for state in updater.optimizer.state.values() for t in state.values()]  # the checkpoint's views
        tensors.update({f"adam.{i}": t for i, t in enumerate(adam)})
        tensors.update({f"staged.{k}": v for k, v in updater._staged.items(True, True)})
        return {k: v.data_ptr() for k, v in tensors.items()}

    algorithm.update(collector.collect().data)
    first = addresses()
    for _ in range(2):
        algorithm.update(collector.collect().data)
    algorithm.load_state_dict(algorithm.state_dict())
    collector.load_state_dict(collector.state_dict())
    env.load_state_dict(env.state_dict())
    assert addresses() == first


def test_a_compiled_update_moves_the_adaptive_minibatch_rate_as_the_eager_update_does():
    """Under ``lr_schedule=adaptive_minibatch`` every minibatch step sets the rate in the compiled step. The rate was
    a 0-d float64 tensor, whose in-place writes torch 2.13's ``torch.compile`` drops on the CPU: the compiled
    update kept its starting rate (1e-3 against the eager update's 5.9e-5 here) and stepped with it."""
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        torch._dynamo.reset()
        env = CartPoleEnv(num_envs=16, seed=0)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[32, 32])
        settings = dict(learning_rate=1e-3, lr_schedule="adaptive_minibatch", target_kl=1e-6)
        algorithm = PPO(policy, batch_size=32, n_epochs=2, **settings)
        policy.seed_actions(0)
        collector = SyncCollector(env, policy, 8)
        if compiled:
            for step in (collector.step, update_step(algorithm, collector.buffer.data)):
                step.compile(backend="aot_eager")
        results.append(algorithm.update(collector.collect().data))
    eager, compiled = results
    assert eager["learning_rate"] < 1e-4  # the rule lowered it (a KL far above the tiny target)
    assert compiled == pytest.approx(eager, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    "case, settings",
    [("push_cube_ppo", {}), ("push_cube_grpo", {}), ("push_cube_grpo", {"kl_coef": 0.1})],
    ids=["ppo", "grpo", "grpo_kl"],
)
def test_the_update_compiled_before_the_first_step_is_the_one_the_updates_run(case, settings):
    """The update's step is warmed up by one real update of the collector's storage: the first update runs that
    compiled step (no second compile, which on a GPU would cost a second inductor compile inside the first update)
    and stages its samples where the warm-up did (the addresses a CUDA graph replays); the warm-up leaves the
    policy, the optimiser and the schedule as they were."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    make_env, make_policy, make_algorithm, defaults = CASES[case]
    torch.manual_seed(0)
    env = make_env()
    policy = make_policy(env.single_observation_space, env.single_action_space, hidden_sizes=[32, 32])
    algorithm = make_algorithm(policy, batch_size=32, n_epochs=2, **{**defaults, **settings})
    collector = SyncCollector(env, policy, 8, reset_options=algorithm.reset_options)
    before = copy.deepcopy((policy.state_dict(), algorithm.state_dict()))
    step = update_step(algorithm, collector.buffer.data)
    step.compile(backend="aot_eager")
    assert step.mode == "compiled" and counters["stats"]["unique_graphs"] == 1
    for (name, a), b in zip(before[0].items(), policy.state_dict().values()):
        assert torch.equal(a, b), name
    assert algorithm.iteration == 0 and algorithm.current_lr == algorithm.cfg.learning_rate
    assert torch.equal(algorithm.updater.generator.get_state(), before[1]["generator"])
    staged = {k: v.data_ptr() for k, v in algorithm.updater._staged.items(True, True)}
    algorithm.update(collector.collect().data)
    assert counters["stats"]["unique_graphs"] == 1
    assert {k: v.data_ptr() for k, v in algorithm.updater._staged.items(True, True)} == staged


def test_trainer_compile_compiles_the_whole_steps_of_a_compiling_env_and_the_acting_pass_of_another(tmp_path):
    """``trainer.compile=true`` compiles push_cube's collection step whole and a host-style env's acting pass."""
    torch._dynamo.reset()
    for env, whole in ((PushCubeEnv(num_envs=8, seed=0), True), (LineEnv(num_envs=8), False)):
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        collector = SyncCollector(env, policy, 4)
        assert (collector.step.blocker is None) == whole
        stepped, step = [], env.step
        env.step = lambda action, step=step, stepped=stepped: stepped.append(1) or step(action)
        collector.step.compile(backend="aot_eager")
        assert collector.step.mode == ("compiled" if whole else "part")
        assert len(stepped) == (1 if whole else 0)  # a host env is not stepped (nor reset) to warm up its acting pass
        assert collector.collect().data["done"].shape == (4, 8)


@pytest.mark.parametrize(
    "overrides, why",
    [
        ({"compile": False}, "it replays the compiled steps: expected trainer.compile=true with it"),
        ({"compile": True}, "CUDA graphs need a CUDA device, and the run's is cpu"),
    ],
)
def test_cudagraphs_where_they_cannot_apply_are_refused_before_any_step(tmp_path, overrides, why):
    env = PushCubeEnv(num_envs=8, seed=0)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(
        env, policy, PPO(policy), iterations=1, rollout_steps=4, output_dir=str(tmp_path), progress=False,
        fresh_eval=False, cudagraphs=True, **overrides,
    )  # fmt: skip
    with pytest.raises(SettingError) as err:
        trainer.start()
    assert str(err.value) == f"cudagraphs=True cannot apply here: {why}; expected false"
    assert not trainer.state.started


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["push_cube_ppo", "push_cube_grpo"])
def test_captured_steps_replay_the_compiled_ones_on_cuda(case):
    """On CUDA, the collection step and the minibatch update compiled and captured as CUDA graphs against the same
    compiled without capture, from the same state: the same rollouts and updates to float rounding (the random
    draws of a compiled step are the same with and without a graph)."""

    make_env, make_policy, make_algorithm, settings = CASES[case]
    results = []
    for cudagraphs in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        env = make_env().__class__(num_envs=1024, seed=0, device="cuda", max_episode_steps=16)
        policy = make_policy(env.single_observation_space, env.single_action_space, hidden_sizes=[64, 64]).cuda()
        algorithm = make_algorithm(policy, batch_size=2048, n_epochs=2, **settings)
        collector = SyncCollector(env, policy, 16, reset_options=algorithm.reset_options)
        for step in (collector.step, update_step(algorithm, collector.buffer.data)):
            step.compile()
            if cudagraphs:
                step.capture()
        torch.manual_seed(1)
        torch.cuda.manual_seed(1)
        out = []
        for _ in range(4):  # past the warm-up and capture calls
            rollout = collector.collect()
            out.append((rollout.data.clone(), algorithm.update(rollout.data)))
        results.append(out)
    for (data_a, stats_a), (data_b, stats_b) in zip(*results):
        for key in ("obs", "action", "reward", "done", "episode_return"):
            torch.testing.assert_close(data_b[key], data_a[key], rtol=1e-4, atol=1e-5, msg=key)
        assert stats_b == pytest.approx(stats_a, rel=1e-3, abs=1e-6)


def test_compile_step_traces_whole_and_vectorises_a_steps_strided_outputs_with_eagers_results():
    # An env step's shape: per-env values computed elementwise and written into [N, K] outputs (stride K), the
    # loop that inductor's tiling heuristics leave scalar and compile_step's options vectorise.
    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = torch.hypot(x, y)
        a = torch.atan2(y, x)
        terms = (torch.tanh(r), torch.exp(-r), torch.cos(a), torch.sin(a), r * a, x - y)
        return torch.stack(terms, dim=-1), torch.stack((r, a), dim=-1)

    from torch._inductor.cpu_vec_isa import pick_vec_isa
    from torch._inductor.utils import run_and_get_code

    if not pick_vec_isa():
        pytest.skip("this CPU has no vector instruction set that inductor generates code for")
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(1003, generator=gen), torch.randn(1003, generator=gen)  # a tail past the vector width
    outputs, sources = run_and_get_code(compile_step(step), x, y)
    for got, want in zip(outputs, step(x, y)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert "at::vec::Vectorized<float>" in "\n".join(sources)  # inductor's defaults leave this loop scalar

    def breaks(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x * 2

    with pytest.raises(torch._dynamo.exc.Unsupported):
        compile_step(breaks)(x)
