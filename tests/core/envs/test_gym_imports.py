"""env=gym with an id that a user's package registers: env.imports and gymnasium's ``module:Name-v0``, in
rlchain-train, and in rlchain-eval and rlchain-export, which import such a package only when it is allowed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlchain.core.envs import GymVecEnv
from tests.helpers.runs import REPO, TINY, run_cli, run_dir

#: A package that registers ``line_envs/Line-v0`` with gymnasium when it is imported, as gymnasium-robotics and
#: Meta-World register theirs; nothing else imports it.
LINE_ENVS = '''
import gymnasium as gym
import numpy as np


class Line(gym.Env):
    """A point on a line that the action moves; the reward is minus its distance to 0."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-1.0, 1.0))
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        self.x += 0.1 * float(action[0])
        return np.array([self.x, 0.0], np.float32), -abs(self.x), abs(self.x) > 5.0, False, {}


gym.register("line_envs/Line-v0", entry_point=Line, max_episode_steps=20)
'''


@pytest.fixture
def line_envs(tmp_path) -> Path:
    """The folder that holds the package ``line_envs`` (put it on ``PYTHONPATH`` to make it importable)."""
    folder = tmp_path / "site"
    (folder / "line_envs").mkdir(parents=True)
    (folder / "line_envs" / "__init__.py").write_text(LINE_ENVS)
    return folder


def _command(module: str, args: list[str], cwd: Path, site: Path) -> subprocess.CompletedProcess:
    """``python -m <module> *args`` with ``site`` (the user's packages) and the checkout on ``PYTHONPATH``."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": os.pathsep.join((str(site), str(REPO)))}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _refused(proc: subprocess.CompletedProcess, prog: str, *fragments: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: ") and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "settings, key, value",
    [
        (["env.id=line_envs/Line-v0", "env.imports=[line_envs]"], "env.imports[0]", "'line_envs'"),
        (["env.id=line_envs:line_envs/Line-v0"], "env.id", "'line_envs:line_envs/Line-v0'"),
    ],
)
@pytest.mark.slow
def test_an_id_a_users_package_registers_trains_and_is_evaluated_and_exported_once_allowed(
    tmp_path, line_envs, settings, key, value
):
    # Before: refused as "env.id='line_envs/Line-v0' is not a registered gymnasium id", as FetchPush-v4 was
    # without `import gymnasium_robotics`, and gymnasium's own module:Name-v0 form too.
    train = _command("rlchain", ["env=gym", *settings, *TINY], tmp_path, line_envs)
    assert train.returncode == 0, train.stderr
    run = run_dir(tmp_path)
    for prog, module, args in [
        ("rlchain-eval", "rlchain.commands.eval", ["num_episodes=2"]),
        ("rlchain-export", "rlchain.commands.export", ["format=torchscript"]),
    ]:
        # a run directory is data: the package is imported only when the user allows it
        line = _refused(
            _command(module, [str(run), *args], tmp_path, line_envs),
            prog,
            f"{key}={value} in the config of",
            "is not allowed",
            "--allow-target line_envs",
        )
        assert "would import" in line
        allowed = _command(module, [str(run), *args, "--allow-target", "line_envs"], tmp_path, line_envs)
        assert allowed.returncode == 0, allowed.stderr
    assert (run / "checkpoints" / "eval.json").is_file() and (run / "checkpoints" / "best.torchscript.pt").is_file()


BROKEN = "raise RuntimeError('this package needs\\na newer simulator')\n"


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"id": "line_envs/Line-v0", "imports": ["no_such_package"]},
            "env.imports=['no_such_package']: module 'no_such_package' cannot be imported (ModuleNotFoundError: No module "
            "named 'no_such_package'): expected an installed module that registers line_envs/Line-v0 with gymnasium",
        ),
        (
            {"id": "no_such_package:line_envs/Line-v0"},
            "env.id='no_such_package:line_envs/Line-v0': module 'no_such_package' cannot be imported (ModuleNotFoundError",
        ),
        (
            {"id": "broken_envs:Broken-v0"},
            "env.id='broken_envs:Broken-v0': module 'broken_envs' cannot be imported (RuntimeError: this package needs a "
            "newer simulator): expected an installed module that registers Broken-v0 with gymnasium",
        ),
        (
            {"id": "line_envs/Line-v0"},  # (close matches between the two parts, where the registry has some)
            "; if a package registers it, import it with env.imports=[<package>] or env.id=<package>:line_envs/Line-v0",
        ),
    ],
)
def test_a_module_that_cannot_be_imported_is_one_line_naming_the_setting(tmp_path, monkeypatch, settings, message):
    (tmp_path / "broken_envs.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as info:
        GymVecEnv(num_envs=2, **settings)
    assert str(info.value).startswith(f"env.{'imports' if 'imports' in settings else 'id'}=")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_import_error_on_the_command_line_is_one_line(tmp_path, line_envs):
    proc = run_cli(["env=gym", "env.id=line_envs/Line-v0", "env.imports=[line_envz]", *TINY], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "env.imports=['line_envz']: module 'line_envz' cannot be imported" in lines[0]
