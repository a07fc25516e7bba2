"""``import rlchain`` registers every built-in task with gymnasium, cheaply and once.

Each test runs in a fresh interpreter: what a module import does is only
visible before anything else has imported torch or gymnasium."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.runs import REPO

SRC = REPO / "src"


MAKE_EVERY_TASK = """
import gymnasium as gym
import numpy as np

single = gym.make("rlchain/PushCube-v0")
obs, _ = single.reset(seed=0)
assert obs.shape == (15,) and obs.dtype == np.float32
single.step(single.action_space.sample())
push_cube = gym.make_vec("rlchain/PushCube-v0", num_envs=8, vectorization_mode="vector_entry_point")

single = gym.make("rlchain/CartPole-v1")
assert single.spec.max_episode_steps == 500
obs, _ = single.reset(seed=0)
assert obs.shape == (4,) and obs.dtype == np.float32
single.step(1)
cart_pole = gym.make_vec("rlchain/CartPole-v1", num_envs=8, vectorization_mode="vector_entry_point")

import torch  # only now: the makes above must not depend on anything imported before them
from rlchain.core.envs import CartPoleEnv, PushCubeEnv

assert isinstance(push_cube, PushCubeEnv) and push_cube.num_envs == 8
assert isinstance(cart_pole, CartPoleEnv) and cart_pole.num_envs == 8 and cart_pole.max_episode_steps == 500
cart_pole.reset(seed=0)
cart_pole.step(torch.ones(8, dtype=torch.int64))
"""


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that imports this checkout's rlchain."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(SRC), str(REPO)))}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


def test_import_rlchain_registers_every_task_without_importing_torch():
    # Before: gymnasium.make("rlchain/PushCube-v0") after `import rlchain` raised NamespaceNotFound
    # (only `import rlchain.core.envs` registered it) and rlchain/CartPole-v1 was registered nowhere.
    proc = run_python(
        textwrap.dedent(
            """
            import sys
            import rlchain
            heavy = sorted({"torch", "rlchain.core.envs"} & set(sys.modules))
            assert not heavy, f"import rlchain imported {heavy}"
            """
        )
        + MAKE_EVERY_TASK
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("first", ["rlchain", "gymnasium"])
def test_registration_is_idempotent_and_never_overrides(first):
    # Whichever is imported first, rlchain/... is registered once: importing rlchain again,
    # reloading it or importing rlchain.core.envs warns nothing.
    proc = run_python(
        f"""
        import importlib
        import warnings

        warnings.simplefilter("error")  # an "Overriding environment" warning fails the run
        import {first}
        import gymnasium
        import rlchain
        import rlchain
        importlib.reload(rlchain)
        import rlchain.core.envs
        ids = sorted(env_id for env_id in gymnasium.registry if env_id.startswith("rlchain/"))
        assert ids == ["rlchain/CartPole-v1", "rlchain/PushCube-v0"], ids
        """
    )
    assert proc.returncode == 0, proc.stderr


def test_starting_the_command_loads_neither_tensordict_nor_torchs_compiler():
    # Half of the start-up of --help, --cfg and a rejected config (see rlchain.commands.config).
    proc = run_python("""
    import sys
    import rlchain.commands.train
    print(sorted(m for m in ("tensordict", "torch._dynamo", "torch._inductor") if m in sys.modules))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _truncation_step(env, action, limit: int) -> int:
    """The step (1-based) at which ``env`` (reset with seed 0; one env or a batch) first reports ``truncated``,
    stepping ``action``; fails on a termination, a batch whose envs truncate apart, or none within ``limit`` steps."""
    import numpy as np

    env.reset(seed=0)
    for t in range(1, limit + 1):
        _, _, terminated, truncated, _ = env.step(action)
        assert not np.asarray(terminated).any()
        if np.asarray(truncated).any():
            assert np.asarray(truncated).all()
            return t
    raise AssertionError(f"no truncation within {limit} steps")


def test_rlchain_ids_are_registered_with_their_time_limits_and_truncate_once():
    # Before: gymnasium.spec("rlchain/PushCube-v0").max_episode_steps was None though the env truncates at 100, so
    # env=gym env.id=rlchain/PushCube-v0 asked for env.max_episode_steps, and make(max_episode_steps=150) still
    # truncated at 100 (the env's own limit inside gymnasium's TimeLimit).
    import gymnasium as gym
    import numpy as np
    import torch

    from rlchain.core.envs import CartPoleConfig, GymVecEnv, PushCubeConfig, PushCubeEnv

    assert gym.spec("rlchain/PushCube-v0").max_episode_steps == PushCubeConfig().max_episode_steps == 100
    assert gym.spec("rlchain/CartPole-v1").max_episode_steps == CartPoleConfig().max_episode_steps == 500
    still = np.zeros(2, np.float32)  # the pusher stays where it is: no success, no fall
    single = gym.make("rlchain/PushCube-v0")
    wrappers = []
    while isinstance(single, gym.Wrapper):
        wrappers.append(type(single).__name__)
        single = single.env
    assert wrappers.count("TimeLimit") == 1, wrappers
    assert _truncation_step(gym.make("rlchain/PushCube-v0"), still, 300) == 100
    assert _truncation_step(gym.make("rlchain/PushCube-v0", max_episode_steps=150), still, 300) == 150  # one limit
    for kwargs, limit in [({}, 100), ({"max_episode_steps": 7}, 7)]:
        vec = gym.make_vec("rlchain/PushCube-v0", num_envs=2, vectorization_mode="vector_entry_point", **kwargs)
        assert isinstance(vec, PushCubeEnv) and vec.max_episode_steps == limit
        assert _truncation_step(vec, torch.zeros(2, 2), 300) == limit
    # through env=gym: the registered limit, or env.max_episode_steps, and nothing else
    for settings, limit in [({}, 100), ({"max_episode_steps": 150}, 150)]:
        env = GymVecEnv("rlchain/PushCube-v0", num_envs=2, **settings)
        assert env.max_episode_steps == limit and _truncation_step(env, torch.zeros(2, 2), 300) == limit
