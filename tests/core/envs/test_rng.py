"""The counter-based stream of the torch-native tasks: SplitMix64's mixing as plain Python integers says what
every draw must be, on every device and under torch.compile."""

import math

import pytest
import torch

from rlchain.core.envs.rng import CounterRng

MASK = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64's finaliser on unsigned 64-bit integers (Steele, Lea & Flood 2014)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_uniform(seed: int, counter: int, rows: int, n: int) -> torch.Tensor:
    key = mix64((seed * GOLDEN + counter) & MASK)
    bits = [mix64((i * GOLDEN + key) & MASK) >> 40 for i in range(rows * n)]
    return torch.tensor(bits, dtype=torch.float64).view(rows, n) / 2**24


def test_uniform_draws_are_splitmix64_of_seed_counter_and_index():
    rng = CounterRng(seed=12345, device=torch.device("cpu"))
    for counter in range(3):
        got = rng.uniform(3, 5)
        assert got.dtype == torch.float32 and got.shape == (3, 5)
        assert torch.equal(got.double(), reference_uniform(12345, counter, 3, 5))
    assert rng.state.tolist() == [12345, 3]


def test_integers_and_normal_follow_from_the_same_bits():
    rng = CounterRng(seed=7, device=torch.device("cpu"))
    ints = rng.integers(10, 1000)
    assert ints.dtype == torch.int64 and 0 <= int(ints.min()) and int(ints.max()) < 10
    assert len(set(ints.tolist())) == 10
    key = mix64(7 * GOLDEN & MASK)
    expected = [((mix64((i * GOLDEN + key) & MASK) >> 32) * 10) >> 32 for i in range(1000)]
    assert ints.tolist() == expected
    u = reference_uniform(7, 1, 2, 4)
    z = rng.normal(1, 4)
    expected_z = torch.sqrt(-2 * torch.log1p(-u[0])) * torch.cos(2 * math.pi * u[1])
    torch.testing.assert_close(z[0].double(), expected_z, rtol=1e-5, atol=1e-6)


def test_the_stream_is_uniform_and_its_state_restores_it():
    rng = CounterRng(seed=0, device=torch.device("cpu"))
    u = rng.uniform(4, 50_000)
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    # Rows of one draw and successive draws are not copies of each other.
    assert float(torch.corrcoef(u[:2])[0, 1]) == pytest.approx(0.0, abs=0.02)
    saved = rng.state_dict()
    first = rng.uniform(2, 8)
    rng.uniform(5, 5)
    rng.load_state_dict(saved)
    assert torch.equal(rng.uniform(2, 8), first)
    rng.seed(0)
    assert torch.equal(rng.uniform(4, 50_000), u)
    with pytest.raises(ValueError, match=r"^env state rng is \(3,\): expected an int64 tensor \[2\]"):
        rng.load_state_dict(torch.zeros(3, dtype=torch.int64))


def test_a_compiled_draw_is_the_eager_draw():
    eager, compiled = CounterRng(3, torch.device("cpu")), CounterRng(3, torch.device("cpu"))
    draw = torch.compile(lambda: (compiled.uniform(27, 64), compiled.normal(2, 15)), fullgraph=True)
    for _ in range(3):
        u, z = draw()
        assert torch.equal(u, eager.uniform(27, 64))
        torch.testing.assert_close(z, eager.normal(2, 15), rtol=1e-6, atol=1e-6)
    assert torch.equal(compiled.state, eager.state)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_stream_is_the_same_on_cuda():
    cpu, cuda = CounterRng(11, torch.device("cpu")), CounterRng(11, torch.device("cuda"))
    for _ in range(3):
        assert torch.equal(cpu.uniform(27, 4096), cuda.uniform(27, 4096).cpu())
