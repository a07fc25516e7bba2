"""What rlchain 0.1.0 wrote still works: its run directory evaluates, exports and resumes, and the names its
configs and its users import still name the same classes and modules.

``tests/fixtures/run_0.1.0`` is a run directory written by rlchain 0.1.0 (PPO on push_cube, 512 steps, a policy of
one hidden layer of 8), with its ``.hydra`` config, both checkpoints, ``summary.json`` and ``metrics.jsonl``. Its
config names the classes by the paths of that release (``rlchain.envs.push_cube.PushCubeEnv``,
``rlchain.trainer.Trainer``, ...).
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from tests.helpers.runs import TINY, run_cli, summary_of

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "run_0.1.0"

#: The modules and names a user of rlchain 0.1.0 imported, with the name each has now.
PUBLIC_NAMES = {
    "rlchain.trainer.Trainer": "rlchain.run.trainer.Trainer",
    "rlchain.trainer.TrainerConfig": "rlchain.run.trainer.TrainerConfig",
    "rlchain.algorithms.PPO": "rlchain.core.algorithms.ppo.PPO",
    "rlchain.algorithms.GRPO": "rlchain.core.algorithms.grpo.GRPO",
    "rlchain.algorithms.Algorithm": "rlchain.core.algorithms.base.Algorithm",
    "rlchain.algorithms.base.AlgorithmConfig": "rlchain.core.algorithms.base.AlgorithmConfig",
    "rlchain.algorithms.functional.compute_gae": "rlchain.core.algorithms.functional.compute_gae",
    "rlchain.policies.ActorCritic": "rlchain.core.policies.ActorCritic",
    "rlchain.policies.Policy": "rlchain.core.policies.Policy",
    "rlchain.envs.VecEnv": "rlchain.core.envs.base.VecEnv",
    "rlchain.envs.VecEnvConfig": "rlchain.core.envs.base.VecEnvConfig",
    "rlchain.envs.check_vec_env": "rlchain.core.envs.checker.check_vec_env",
    "rlchain.envs.push_cube.PushCubeEnv": "rlchain.core.envs.push_cube.PushCubeEnv",
    "rlchain.envs.cart_pole.CartPoleEnv": "rlchain.core.envs.cart_pole.CartPoleEnv",
    "rlchain.envs.gym_adapter.GymVecEnv": "rlchain.core.envs.gym_adapter.GymVecEnv",
    "rlchain.buffer.RolloutBuffer": "rlchain.core.buffer.RolloutBuffer",
    "rlchain.collector.SyncCollector": "rlchain.core.collector.SyncCollector",
    "rlchain.evaluation.evaluate": "rlchain.core.evaluation.evaluate",
    "rlchain.config.register_schema": "rlchain.commands.config.register_schema",
    "rlchain.summary.RunSummary": "rlchain.run.summary.RunSummary",
    "rlchain.checkpoint.load_checkpoint": "rlchain.run.checkpoint.load_checkpoint",
    "rlchain.tuning.report": "rlchain.run.tuning.report",
    "rlchain.report.load_jobs": "rlchain.commands.report.load_jobs",
    "rlchain.saved_run.open_run": "rlchain.commands.saved_run.open_run",
    "rlchain.export.ExportedPolicy": "rlchain.commands.export.ExportedPolicy",
    "rlchain.eval_cli.run_eval": "rlchain.commands.eval.run_eval",
    "rlchain.train.main": "rlchain.commands.train.main",
}


def _get(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.fixture
def old_run(tmp_path) -> Path:
    """A copy of the fixture run directory (commands write next to its checkpoints)."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "run"))


@pytest.mark.parametrize("old", sorted(PUBLIC_NAMES))
def test_a_name_of_0_1_0_is_the_object_of_today(old):
    assert _get(old) is _get(PUBLIC_NAMES[old])


def test_the_targets_of_a_0_1_0_config_name_todays_classes():
    config = OmegaConf.load(FIXTURE / ".hydra" / "config.yaml")
    targets = {group: config[group]["_target_"] for group in ("env", "policy", "algorithm", "trainer")}
    assert targets == {
        "env": "rlchain.envs.push_cube.PushCubeEnv",
        "policy": "rlchain.policies.ActorCritic",
        "algorithm": "rlchain.algorithms.PPO",
        "trainer": "rlchain.trainer.Trainer",
    }
    for target in targets.values():
        assert get_class(target) is _get(PUBLIC_NAMES[target])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "launch", "world_size"),
    [
        ("rlchain.train", [], 1),
        ("torch.distributed.run", ["--standalone", "--nproc_per_node=2", "-m", "rlchain.train"], 2),
    ],
    ids=["python -m rlchain.train", "torchrun -m rlchain.train"],
)
def test_the_0_1_0_module_name_trains(tmp_path, module, launch, world_size):
    # Both forms crashed before composing: runpy gave the old name's module no file, so sys.argv[0] was None and
    # Hydra's argparse raised a TypeError.
    proc = run_cli([*launch, *TINY, "device=cpu", "hydra.run.dir=run"], tmp_path, module=module, OMP_NUM_THREADS="1")
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(tmp_path / "run")
    assert (summary.status, summary.world_size, summary.global_step) == ("completed", world_size, world_size * 256)


def test_a_moved_module_keeps_its_own_name_and_spec():
    """The old name is another key of the same module: the module's ``__name__`` and ``__spec__`` stay its own."""
    old, new = importlib.import_module("rlchain.envs.push_cube"), importlib.import_module("rlchain.core.envs.push_cube")
    assert old is new and new.__name__ == new.__spec__.name == "rlchain.core.envs.push_cube"


@pytest.mark.slow
def test_a_0_1_0_run_evaluates(old_run, tmp_path):
    proc = run_cli([str(old_run), "num_episodes=4"], tmp_path, module="rlchain.eval_cli")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((old_run / "checkpoints" / "eval.json").read_text())
    assert record["episodes"] == 4 and record["global_step"] == 256  # best.pt, written at the first evaluation


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [["format=torchscript", "checkpoint=latest"], ["--format", "torchscript", "--checkpoint", "latest"]],
    ids=["options", "the flags of 0.1.0"],
)
def test_a_0_1_0_run_exports(old_run, tmp_path, args):
    out = tmp_path / "policy.pt"
    proc = run_cli([str(old_run), *args, f"output={out}"], tmp_path, module="rlchain.export")
    assert proc.returncode == 0, proc.stderr
    files = {"rlchain.json": ""}
    exported = torch.jit.load(str(out), _extra_files=files)
    metadata = json.loads(files["rlchain.json"])
    assert metadata["global_step"] == 512 and get_class(metadata["env"]) is _get("rlchain.envs.push_cube.PushCubeEnv")
    obs_dim = metadata["observation_space"]["shape"][0]
    assert exported(torch.zeros(3, obs_dim)).shape == (3, 2)


@pytest.mark.slow
def test_a_0_1_0_run_resumes_in_its_directory(old_run, tmp_path):
    proc = run_cli([f"trainer.resume_from={old_run}", "trainer.iterations=6"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(old_run)
    assert summary.status == "completed" and summary.global_step == 6 * 8 * 16
    state = torch.load(old_run / "checkpoints" / "latest.pt", weights_only=True)
    assert state["global_step"] == 768 and state["iteration"] == 6
    steps = [json.loads(line).get("global_step") for line in (old_run / "metrics.jsonl").read_text().splitlines()]
    assert max(s for s in steps if s is not None) == 768
