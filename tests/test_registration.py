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
from rlchain.envs import CartPoleEnv, PushCubeEnv

assert isinstance(push_cube, PushCubeEnv) and push_cube.num_envs == 8
assert isinstance(cart_pole, CartPoleEnv) and cart_pole.num_envs == 8 and cart_pole.max_episode_steps == 500
cart_pole.reset(seed=0)
cart_pole.step(torch.ones(8, dtype=torch.int64))
"""


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that imports this checkout's rlchain."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(SRC), str(REPO)))}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_import_rlchain_registers_every_task_without_importing_torch():
    # Before: gymnasium.make("rlchain/PushCube-v0") after `import rlchain` raised NamespaceNotFound
    # (only `import rlchain.envs` registered it) and rlchain/CartPole-v1 was registered nowhere.
    proc = run_python(
        textwrap.dedent(
            """
            import sys
            import rlchain
            heavy = sorted({"torch", "rlchain.envs"} & set(sys.modules))
            assert not heavy, f"import rlchain imported {heavy}"
            """
        )
        + MAKE_EVERY_TASK
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("first", ["rlchain", "gymnasium"])
def test_registration_is_idempotent_and_never_overrides(first):
    # Whichever is imported first, rlchain/... is registered once: importing rlchain again,
    # reloading it or importing rlchain.envs warns nothing.
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
        import rlchain.envs
        ids = sorted(env_id for env_id in gymnasium.registry if env_id.startswith("rlchain/"))
        assert ids == ["rlchain/CartPole-v1", "rlchain/PushCube-v0"], ids
        """
    )
    assert proc.returncode == 0, proc.stderr


def test_starting_the_command_loads_neither_tensordict_nor_torchs_compiler():
    # Half of the start-up of --help, --cfg and a rejected config (see rlchain.config).
    proc = run_python("""
    import sys
    import rlchain.train
    print(sorted(m for m in ("tensordict", "torch._dynamo", "torch._inductor") if m in sys.modules))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
