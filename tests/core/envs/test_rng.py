"""The counter-based stream of the torch-native tasks: SplitMix64's mixing as plain Python integers says what
every draw must be (two elements from each 64-bit word), on every device and under torch.compile."""

import math

import pytest
import torch

from rlchain.core.envs.rng import _GOLDEN, CounterRng, _halves_by_stack, _halves_by_word

MASK = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64's finaliser on unsigned 64-bit integers (Steele, Lea & Flood 2014)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_halves(seed: int, counter: int, count: int) -> list[int]:
    """The 32-bit halves of one draw of ``count`` elements: element e takes half e % 2 (low first) of word e // 2."""
    key = mix64((seed * GOLDEN + counter) & MASK)
    words = [mix64((j * GOLDEN + key) & MASK) for j in range((count + 1) // 2)]
    return [(words[e // 2] >> (32 * (e % 2))) & 0xFFFFFFFF for e in range(count)]


def reference_uniform(seed: int, counter: int, rows: int, n: int) -> torch.Tensor:
    low = [h & 0xFFFFFF for h in reference_halves(seed, counter, rows * n)]
    return torch.tensor(low, dtype=torch.float64).view(rows, n) / 2**24


def reference_normal(seed: int, counter: int, rows: int, n: int) -> torch.Tensor:
    count = rows * n
    u = reference_uniform(seed, counter, 1, 2 * ((count + 1) // 2))[0]
    z = []
    for k in range(0, len(u), 2):
        radius, angle = math.sqrt(-2 * math.log1p(-float(u[k]))), 2 * math.pi * float(u[k + 1])
        z += [radius * math.cos(angle), radius * math.sin(angle)]
    return torch.tensor(z[:count], dtype=torch.float64).view(rows, n)


def test_uniform_draws_are_splitmix64_halves_of_seed_counter_and_index():
    rng = CounterRng(seed=12345, device=torch.device("cpu"))
    for counter, (rows, n) in enumerate([(3, 5), (2, 4), (1, 1), (4, 7)]):  # odd counts leave a half unused
        got = rng.uniform(rows, n)
        assert got.dtype == torch.float32 and got.shape == (rows, n)
        assert torch.equal(got.double(), reference_uniform(12345, counter, rows, n))
    assert rng.state.tolist() == [12345, 4]
    # A seed whose key words have the sign bit set reads the same (int64 arithmetic wraps as uint64 would).
    rng = CounterRng(seed=2**62 + 3, device=torch.device("cpu"))
    assert torch.equal(rng.uniform(5, 9).double(), reference_uniform(2**62 + 3, 0, 5, 9))


def test_integers_and_normal_follow_from_the_same_halves():
    rng = CounterRng(seed=7, device=torch.device("cpu"))
    ints = rng.integers(10, 1001)
    assert ints.dtype == torch.int64 and ints.shape == (1001,) and 0 <= int(ints.min()) and int(ints.max()) < 10
    assert len(set(ints.tolist())) == 10
    assert ints.tolist() == [(h * 10) >> 32 for h in reference_halves(7, 0, 1001)]
    top = rng.integers(2**31, 6)  # the largest high: products stay below 2**63
    assert top.tolist() == [(h * 2**31) >> 32 for h in reference_halves(7, 1, 6)]
    for counter, (rows, n) in enumerate([(1, 4), (3, 5)], start=2):
        z = rng.normal(rows, n)
        assert z.dtype == torch.float32 and z.shape == (rows, n)
        torch.testing.assert_close(z.double(), reference_normal(7, counter, rows, n), rtol=1e-5, atol=1e-5)
    assert rng.state.tolist() == [7, 4]


def test_the_stream_is_uniform_and_its_state_restores_it():
    rng = CounterRng(seed=0, device=torch.device("cpu"))
    u = rng.uniform(4, 50_000)
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    # Rows of one draw and successive draws are not copies of each other.
    assert float(torch.corrcoef(u[:2])[0, 1]) == pytest.approx(0.0, abs=0.02)
    # Nor are the two halves of one word (even and odd elements).
    assert float(torch.corrcoef(u.view(-1, 2).T)[0, 1]) == pytest.approx(0.0, abs=0.01)
    saved = rng.state_dict()
    first = rng.uniform(2, 8)
    rng.uniform(5, 5)
    rng.load_state_dict(saved)
    assert torch.equal(rng.uniform(2, 8), first)
    rng.seed(0)
    assert torch.equal(rng.uniform(4, 50_000), u)
    z = rng.normal(2, 50_000)  # a Box-Muller pair per word: its cos and sin are uncorrelated
    assert abs(float(z.mean())) < 0.01 and abs(float(z.var()) - 1) < 0.02
    assert float(torch.corrcoef(z.view(-1, 2).T)[0, 1]) == pytest.approx(0.0, abs=0.01)
    with pytest.raises(ValueError, match=r"^env state rng is \(3,\): expected an int64 tensor \[2\]"):
        rng.load_state_dict(torch.zeros(3, dtype=torch.int64))


def test_a_compiled_draw_is_the_eager_draw():
    eager, compiled = CounterRng(3, torch.device("cpu")), CounterRng(3, torch.device("cpu"))
    draw = torch.compile(
        lambda: (compiled.uniform(27, 64), compiled.uniform(3, 5), compiled.normal(3, 15), compiled.integers(9, 15)),
        fullgraph=True,
    )
    for _ in range(3):
        u, odd, z, ints = draw()
        assert torch.equal(u, eager.uniform(27, 64)) and torch.equal(odd, eager.uniform(3, 5))
        torch.testing.assert_close(z, eager.normal(3, 15), rtol=1e-6, atol=1e-6)
        assert torch.equal(ints, eager.integers(9, 15))
    assert torch.equal(compiled.state, eager.state)


@pytest.mark.parametrize("halves", [_halves_by_word, _halves_by_stack])
def test_both_ways_to_the_halves_give_the_mapping_eager_and_compiled(halves):
    # By word: what an eager draw uses; by stack: what a compiled one uses. Both, either way, give the mapping.
    key = mix64((5 * GOLDEN + 2) & MASK)  # draw 2 of seed 5
    key = torch.tensor([key - 2**64 if key >= 2**63 else key], dtype=torch.int64)  # its 64 bits as an int64 [P=1]
    golden = torch.tensor(_GOLDEN)
    compiled = torch.compile(halves, fullgraph=True)
    for count in (1, 14, 15):
        want = reference_halves(5, 2, count)
        for got in (halves(key.clone(), golden, count), compiled(key.clone(), golden, count)):
            assert [h & 0xFFFFFFFF for h in got[0].tolist()] == want


@pytest.mark.parametrize("compiled", [False, True])
def test_members_draw_each_their_own_stream_for_their_block_of_envs(compiled):
    # A population of 3 members, 4 envs each, as one task of 12 envs: member p's block of every draw is what a
    # stream of its seed alone draws for its 4 envs, whichever axis indexes the envs.
    seeds = [5, 0, 2**40 + 1]
    population = CounterRng(seeds, torch.device("cpu"))
    solos = [CounterRng(s, torch.device("cpu")) for s in seeds]

    def draws(rng, envs):
        return rng.uniform(3, envs), rng.normal(envs, 5, env_axis=0), rng.integers(7, envs), rng.normal(2, envs)

    both = torch.compile(draws, fullgraph=True) if compiled else draws
    for _ in range(2):
        u, z_rows, ints, z_cols = both(population, 12)
        for p, solo in enumerate(solos):
            su, sz_rows, sints, sz_cols = draws(solo, 4)
            block = slice(4 * p, 4 * p + 4)
            assert torch.equal(u[:, block], su) and torch.equal(ints[block], sints)
            torch.testing.assert_close(z_rows[block], sz_rows, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(z_cols[:, block], sz_cols, rtol=1e-6, atol=1e-6)
    assert population.state.tolist() == [[s, 8] for s in seeds]
    with pytest.raises(ValueError, match=r"^10 envs do not split among 3 members$"):
        population.uniform(2, 10)
    with pytest.raises(ValueError, match=r"^env state rng is \(2,\): expected an int64 tensor \[3, 2\]"):
        population.load_state_dict(torch.zeros(2, dtype=torch.int64))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_stream_is_the_same_on_cuda():
    cpu, cuda = CounterRng(11, torch.device("cpu")), CounterRng(11, torch.device("cuda"))
    for _ in range(3):
        assert torch.equal(cpu.uniform(27, 4096), cuda.uniform(27, 4096).cpu())
        assert torch.equal(cpu.uniform(3, 5), cuda.uniform(3, 5).cpu())
        assert torch.equal(cpu.integers(1000, 77), cuda.integers(1000, 77).cpu())
        torch.testing.assert_close(cpu.normal(3, 5), cuda.normal(3, 5).cpu(), rtol=1e-5, atol=1e-5)
