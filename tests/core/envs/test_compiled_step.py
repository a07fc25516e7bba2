"""The torch-native tasks' step compiles whole (torch.compile with fullgraph=True) and gives eager's results; the
state keeps its addresses (what a CUDA graph replay needs); a seeded run reproduces and resumes exactly."""

import pytest
import torch

from rlchain.core.envs import CartPoleEnv, PushCubeEnv

# Traced whole by dynamo and run through AOTAutograd's functionalisation (in-place writes, the stream's counter), as
# inductor would see them; inductor's own code generation of these steps takes minutes on a 2-core CPU, so
# benchmarks/kernel_count.py compiles them with it (the stream alone compiles with inductor in test_rng.py).
BACKEND = "aot_eager"

CASES = {
    "push_cube": lambda: PushCubeEnv(
        num_envs=16, seed=3, max_episode_steps=6, obs_noise_std=0.01, privileged_critic=True
    ),
    "push_cube_pixels": lambda: PushCubeEnv(
        num_envs=8, seed=3, max_episode_steps=5, obs_mode="pixels_state", image_size=16, obs_noise_std=0.01
    ),
    "cart_pole_continuous": lambda: CartPoleEnv(num_envs=16, seed=3, max_episode_steps=7, action_mode="continuous"),
}


def actions(env, steps: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shape = (env.num_envs, *env.single_action_space.shape)
    return [torch.rand(shape, generator=gen) * 2.4 - 1.2 for _ in range(steps)]  # some beyond [-1, 1]: clipped


def leaves(obs) -> list[torch.Tensor]:
    return [obs] if isinstance(obs, torch.Tensor) else [obs[key] for key in sorted(obs.keys())]


def addresses(env) -> list[int]:
    return [t.data_ptr() for t in env.get_state().values()] + [env._rng.state.data_ptr()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_compiled_step_is_the_eager_step(case):
    eager, compiled = CASES[case](), CASES[case]()
    step = torch.compile(compiled.step, fullgraph=True, backend=BACKEND)
    where = addresses(compiled)
    for action in actions(eager, 14):  # two or more episode ends per env: resets inside the step
        want, got = eager.step(action), step(action)
        for a, b in zip(leaves(want[0]) + leaves(want[4]["final_obs"]), leaves(got[0]) + leaves(got[4]["final_obs"])):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
        for i in (2, 3):  # terminated, truncated
            assert torch.equal(got[i], want[i])
        assert torch.equal(got[4]["success"], want[4]["success"])
        for group in ("rewards", "metrics"):  # the declared [N, K] tensors
            torch.testing.assert_close(got[4][group], want[4][group], rtol=1e-5, atol=1e-5)
    assert addresses(compiled) == where  # written in place: a captured graph would read the same memory
    assert torch.equal(compiled._rng.state, eager._rng.state)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_seeded_env_reproduces_and_resumes_exactly(case):
    first, second = CASES[case](), CASES[case]()
    steps = actions(first, 12)
    for action in steps[:5]:
        first.step(action)
    saved = first.state_dict()
    tail = [first.step(action) for action in steps[5:]]
    for action in steps[:5]:
        second.step(action)
    resumed = CASES[case]()
    resumed.load_state_dict(saved)
    for want, action in zip(tail, steps[5:]):
        for env in (second, resumed):
            got = env.step(action)
            for a, b in zip(leaves(want[0]), leaves(got[0])):
                assert torch.equal(a, b)
            assert torch.equal(want[1], got[1]) and torch.equal(want[2], got[2]) and torch.equal(want[3], got[3])


@pytest.mark.slow
def test_a_compiled_push_cube_resumes_to_the_bit():
    """A push_cube compiled as trainer.compile compiles it (inductor), saved and loaded into a fresh compiled env,
    pays the rewards the uninterrupted env pays, bit for bit. It had not: the shaping potentials of the loaded
    state were recomputed eagerly at the load, 1 ulp from the compiled step's, and the first reward after a
    resume differed (7e-7 here). Inductor's own rounding is the point, so this compiles with it (about 30 s)."""
    from rlchain.core.compiling import compile_step

    steps = actions(PushCubeEnv(num_envs=256), 30)
    straight = PushCubeEnv(num_envs=256, seed=0, max_episode_steps=20)
    step = compile_step(straight.step)
    for action in steps[:10]:
        step(action)
    saved = straight.state_dict()
    want = [step(action)[1].clone() for action in steps[10:]]
    resumed = PushCubeEnv(num_envs=256, seed=0, max_episode_steps=20)
    step = compile_step(resumed.step)
    resumed.load_state_dict(saved)
    for expected, action in zip(want, steps[10:]):
        assert torch.equal(step(action)[1], expected)
