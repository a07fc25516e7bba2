"""The extension examples of docs/extending.md (docs/examples/my_rl/ and its YAML options, which the page includes):
the env keeps the VecEnv contract, and the three components train, evaluate and export through rlchain's commands."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.helpers.runs import REPO, run_cli, run_dir, summary_of

EXAMPLES = REPO / "docs" / "examples"
PAGE = REPO / "docs" / "extending.md"
COMMAND = ["--config-dir", str(EXAMPLES / "conf"), "env=line", "policy=linear", "algorithm=vpg"]


@pytest.fixture
def my_rl(monkeypatch):
    """The examples' package ``my_rl`` importable, as a user's installed package is."""
    monkeypatch.syspath_prepend(str(EXAMPLES))


def test_the_page_includes_every_example_file_and_each_exists():
    included = re.findall(r'^--8<-- "([^"]+)"$', PAGE.read_text(), flags=re.M)
    assert included and all((EXAMPLES / path).is_file() for path in included), included
    on_disk = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*") if p.suffix in (".py", ".yaml")}
    assert on_disk - {"my_rl/__init__.py"} == set(included)


def test_the_example_env_keeps_the_vec_env_contract(my_rl):
    from my_rl.line_env import LineEnv

    from rlchain.core.envs import check_vec_env
    from rlchain.settings import SettingError

    check_vec_env(LineEnv(num_envs=8))
    with pytest.raises(SettingError, match=r"^speed=-1.0 is not allowed: expected a number > 0$"):
        LineEnv(speed=-1)


@pytest.mark.slow
def test_the_example_components_train_evaluate_and_export(tmp_path, my_rl):
    from rlchain import export
    from rlchain.commands.eval import run_eval

    path = os.pathsep.join([str(EXAMPLES), str(REPO)])
    args = [*COMMAND, "debug=tiny", "trainer.fresh_eval=false"]
    proc = run_cli(args, tmp_path, module="my_rl.train", PYTHONPATH=path)
    assert proc.returncode == 0, proc.stderr
    run = run_dir(tmp_path)
    summary = summary_of(run)
    assert summary.status == "completed" and summary.global_step == 2 * 8 * 16
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"losses/policy_loss", "losses/value_loss", "losses/entropy", "metrics/distance"} <= set(rows[-1])
    # a run directory is data: the user's package is allowed by name
    record = run_eval(run, ["num_episodes=4"], allowed=["my_rl"])
    assert record["episodes"] == 4 and "success_rate" in record["metrics"]
    assert export.main([str(run), "format=torchscript", "--allow-target", "my_rl"]) == 0
    assert (run / "checkpoints" / "best.torchscript.pt").is_file()


@pytest.mark.slow
def test_the_registered_schemas_check_the_example_options(tmp_path):
    path = os.pathsep.join([str(EXAMPLES), str(REPO)])
    proc = run_cli([*COMMAND, "debug=tiny", "env.sped=0.2"], tmp_path, module="my_rl.train", PYTHONPATH=path)
    assert proc.returncode == 1 and "Key 'sped' not in 'LineEnvConfig'" in proc.stderr, proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_the_page_documents_every_hook_of_the_algorithm_and_policy_base_classes():
    from rlchain.core.algorithms import Algorithm
    from rlchain.core.policies import Policy

    text = PAGE.read_text()
    hooks = {name for name in vars(Algorithm) if not name.startswith("__") and name not in vars(object)}
    documented = {"_minibatch_loss"} | {name for name in hooks if not name.startswith("_")}
    for name in documented:
        assert f"`{name}" in text, f"Algorithm.{name} is not on the page"
    policy_hooks = ("get_action", "get_value", "evaluate_actions", "deterministic_action", "update_obs_normalizer")
    for name in (*policy_hooks, "has_critic"):
        assert name in vars(Policy) and f"`{name}" in text, f"Policy.{name}"
