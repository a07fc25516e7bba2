"""rlchain-eval end to end on trained runs: the table, eval.json, overrides, the fresh score it reproduces, and
every bad input as one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from rlchain.commands.eval import main
from tests.helpers.runs import run_cli, summary_of

EVAL = "rlchain.commands.eval"


def _one_line_error(proc, *fragments: str) -> str:
    """The one line of a refused ``rlchain-eval`` (a finished process, or ``(exit code, stderr)`` of ``main``)."""
    code, stderr = (proc.returncode, proc.stderr) if hasattr(proc, "returncode") else proc
    assert code == 1, (code, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlchain-eval: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def in_process(capsys):
    """``rlchain-eval`` run in this process: ``(exit code, stderr)`` (its start-up is what the subprocesses test)."""

    def _run(args: list[str]) -> tuple[int, str]:
        code = main([str(a) for a in args])
        return code, capsys.readouterr().err

    return _run


@pytest.mark.slow
def test_defaults_reproduce_the_runs_fresh_score_of_best_pt(trained, tmp_path):
    summary = summary_of(trained)
    assert summary.best_fresh is not None and summary.best_fresh["checkpoint"].endswith("best.pt")
    proc = run_cli([str(trained)], tmp_path, module=EVAL)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((trained / "checkpoints" / "eval.json").read_text())
    assert record["seed"] == summary.best_fresh["seed"] and record["episodes"] == summary.best_fresh["episodes"] == 8
    assert record["metrics"] == summary.best_fresh["metrics"]  # the same code path, the same numbers
    assert record["global_step"] == torch.load(trained / "checkpoints" / "best.pt", weights_only=True)["global_step"]
    for title in ("return", "length", "success rate", "distance_to_goal", "95% CI"):
        assert title in proc.stdout
    assert f"wrote {trained / 'checkpoints' / 'eval.json'}" in proc.stdout


def test_overrides_change_the_evaluation(trained, in_process):
    code, err = in_process(
        [
            trained,
            "checkpoint=latest",
            "env.num_envs=4",
            "num_episodes=6",
            "seed=5",
            "env.success_threshold=0.5",
            "deterministic=false",
        ]
    )
    assert code == 0, err
    record = json.loads((trained / "checkpoints" / "eval.json").read_text())
    assert record["checkpoint"].endswith("latest.pt") and record["seed"] == 5 and not record["deterministic"]
    assert record["episodes"] == 8  # 6 rounded up to whole rounds of 4 envs
    assert record["overrides"][-2:] == ["env.success_threshold=0.5", "deterministic=false"]
    # a success radius of 0.5 m around the goal: most start states are already inside it
    assert record["metrics"]["success_rate"]["mean"] > summary_of(trained).best_fresh["metrics"]["success_rate"]["mean"]


def test_num_episodes_runs_that_many_episodes_and_a_rounding_is_said(trained, in_process):
    # num_episodes=4 ran the run's num_eval_envs=8 episodes without a word
    code, err = in_process([trained, "num_episodes=4"])
    assert code == 0 and err == "", err
    assert json.loads((trained / "checkpoints" / "eval.json").read_text())["episodes"] == 4
    code, err = in_process([trained, "num_episodes=5", "env.num_envs=4"])  # env.num_envs given: it stands
    assert (
        code == 0
        and err
        == "rlchain: 8 episodes: num_episodes=5 rounded up to a multiple of env.num_envs=4 (every env runs as many)\n"
    ), err
    assert json.loads((trained / "checkpoints" / "eval.json").read_text())["episodes"] == 8


def test_a_checkpoint_file_without_its_run_directory_evaluates_from_its_own_config(trained, tmp_path, in_process):
    loose = tmp_path / "elsewhere" / "model.pt"
    loose.parent.mkdir()
    shutil.copy(trained / "checkpoints" / "best.pt", loose)
    code, err = in_process([loose, "num_episodes=4", "env.num_envs=4"])
    assert code == 0, err
    assert json.loads((loose.parent / "eval.json").read_text())["episodes"] == 4


@pytest.mark.slow
def test_a_users_targets_need_their_module_allowed(user_run, in_process):
    line = _one_line_error(
        in_process([user_run]), "env._target_='tests.helpers.toy_env.LineEnv'", "is not allowed", "--allow-target tests"
    )
    assert "only classes under rlchain." in line
    code, err = in_process([user_run, "--allow-target", "tests.helpers"])
    assert code == 0, err
    # allowing the env's module does not allow the policy's
    _one_line_error(
        in_process([user_run, "--allow-target", "tests.helpers.toy_env"]),
        "policy._target_='tests.helpers.user_components.WidePolicy'",
    )


def _forge(trained, tmp_path, **env) -> str:
    """A copy of ``trained``'s best.pt whose saved env config has ``env`` merged in."""
    state = torch.load(trained / "checkpoints" / "best.pt", weights_only=True)
    state["config"]["env"].update(env)
    forged = tmp_path / "forged.pt"
    torch.save(state, forged)
    return str(forged)


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"_target_": "os.system"}, "env._target_='os.system'"),
        # Hydra follows attributes: a dotted name under rlchain. may lead out of it
        ({"_target_": "rlchain.commands.eval.os.system"}, "it is no <module>.<class> that imports"),
        # rlchain's own functions are no env either
        ({"_target_": "rlchain.files.write_text"}, "it names a function, expected a VecEnv class"),
        (
            {"_target_": "rlchain.run.checkpoint.Checkpoints"},
            "it names rlchain.run.checkpoint.Checkpoints, expected a VecEnv",
        ),
        # nothing below the env is instantiated, whoever defines it
        ({"seed": {"_target_": "rlchain.files.write_text", "path": "{marker}", "text": "x"}}, "env.seed._target_="),
        ({"_args_": ["{marker}"]}, "env._args_="),
        ({"_partial_": True}, "env._partial_=True"),
        ({"device": "${oc.env:HOME}"}, "without ${...} interpolations"),
        # a gymnasium id "module:Env-v0" makes gymnasium.make import the module
        ({"_target_": "rlchain.core.envs.GymVecEnv", "id": "evil_module:Pwn-v0"}, "env.id='evil_module:Pwn-v0'"),
        # so does each module of env.imports, before gymnasium looks the id up
        (
            {"_target_": "rlchain.core.envs.GymVecEnv", "id": "CartPole-v1", "imports": ["evil_module"]},
            "env.imports[0]='evil_module'",
        ),
    ],
)
def test_a_saved_config_builds_one_allowed_env_class_and_nothing_else(trained, tmp_path, in_process, env, fragment):
    marker = tmp_path / "written_by_the_config"
    env = json.loads(json.dumps(env).replace("{marker}", str(marker)))
    line = _one_line_error(in_process([_forge(trained, tmp_path, **env), "num_episodes=1"]), fragment, "is not allowed")
    assert "in the config of" in line and not marker.exists()


def test_a_saved_policy_must_be_an_allowed_policy_class(trained, tmp_path, in_process):
    state = torch.load(trained / "checkpoints" / "best.pt", weights_only=True)
    state["config"]["policy"]["_target_"] = "rlchain.core.envs.PushCubeEnv"
    torch.save(state, tmp_path / "forged.pt")
    _one_line_error(
        in_process([tmp_path / "forged.pt"]), "policy._target_='rlchain.core.envs.PushCubeEnv'", "expected a Policy"
    )


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["{tmp}/nowhere"], ["nowhere does not exist: expected a run directory or a checkpoint file"]),
        (["{tmp}"], ["has no checkpoints/best.pt and no other checkpoint"]),
        (["{run}", "checkpoint=oldest"], ["checkpoint oldest does not exist"]),
        (
            ["{run}", "env.succes_threshold=0.05"],
            ["env.succes_threshold=0.05", "has no key 'succes_threshold'", "did you mean env.success_threshold?"],
        ),
        (["{run}", "policy.hidden_sizes=[8]"], ["overrides change the evaluation, not the policy"]),
        (["{run}", "algorithm.learning_rate=1"], ["algorithm settings play no part here"]),
        (["{run}", "episodes=3"], ["episodes: no such option: expected one of checkpoint, num_episodes"]),
        (["{run}", "env.num_envs=0"], ["env.num_envs=0 is not allowed: expected an integer > 0"]),
        (["{run}", "num_episodes=0"], ["num_episodes=0 is not allowed"]),
        (["{run}", "device=cpu:1"], ["device='cpu:1' is not supported: the CPU is one device"]),
        (["{run}", "+env.extra=1"], ["cannot add or delete"]),
        (["{run}", "env.num_envs=["], ["no viable alternative at input"]),
    ],
)
def test_bad_input_is_one_line(trained, tmp_path, in_process, args, fragments):
    _one_line_error(in_process([a.format(tmp=tmp_path, run=trained) for a in args]), *fragments)


def test_bad_input_is_one_line_from_the_command(trained, tmp_path):
    _one_line_error(run_cli([str(trained), "env.succes_threshold=0.05"], tmp_path, module=EVAL), "did you mean")


def test_a_directory_without_a_config(trained, tmp_path, in_process):
    state = torch.load(trained / "checkpoints" / "best.pt", weights_only=True)
    state["config"] = {}  # a Trainer built from Python without run_config, and no .hydra/ beside it
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    torch.save(state, tmp_path / "run" / "checkpoints" / "best.pt")
    _one_line_error(in_process([tmp_path / "run"]), "holds no config nor", ".hydra/config.yaml")


@pytest.mark.slow
def test_a_checkpoint_without_a_config_takes_the_run_directorys_hydra_config(trained, tmp_path, in_process):
    run = tmp_path / "run"
    shutil.copytree(trained / ".hydra", run / ".hydra")
    state = torch.load(trained / "checkpoints" / "best.pt", weights_only=True)
    state["config"] = {}
    (run / "checkpoints").mkdir()
    torch.save(state, run / "checkpoints" / "best.pt")
    code, err = in_process([run])
    assert code == 0, err
    record = json.loads((run / "checkpoints" / "eval.json").read_text())
    assert record["metrics"] == summary_of(trained).best_fresh["metrics"]  # the same env, seed and episodes


def test_a_checkpoint_whose_policy_does_not_fit_its_config(trained, tmp_path, in_process):
    state = torch.load(trained / "checkpoints" / "best.pt", weights_only=True)
    state["config"]["policy"]["hidden_sizes"] = [16]
    torch.save(state, tmp_path / "mismatch.pt")
    _one_line_error(
        in_process([tmp_path / "mismatch.pt"]),
        "the checkpoint's policy does not match",
        "actor.0.weight is (128, 15) there, (16, 15) here",
    )


def test_a_file_that_is_no_checkpoint(tmp_path, in_process):
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    _one_line_error(in_process([tmp_path / "notes.pt"]), "is not an rlchain checkpoint")


@pytest.mark.slow
def test_video_on_an_env_that_cannot_render(user_run, in_process):
    _one_line_error(
        in_process([user_run, "--allow-target", "tests.helpers", "video=true"]), "video=True needs an env that renders"
    )


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    import signal
    import subprocess
    import sys

    from tests.helpers.runs import USER, sigint_as_in_a_terminal, subprocess_env, wait_for

    made = run_cli([*USER, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert made.returncode == 0, made.stderr
    hold = tmp_path / "hold"
    hold.touch()  # the env's constructor waits while this file exists
    script = (
        "import sys; from _rlchain_cli import evaluate; sys.argv[0] = 'rlchain-eval'; evaluate()"  # the console script
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            script,
            str(tmp_path / "run"),
            f"env.hold_build={hold}",
            "--allow-target",
            "tests.helpers",
        ],
        cwd=tmp_path,
        env=subprocess_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_as_in_a_terminal,
    )
    wait_for(lambda: (tmp_path / "hold.waiting").exists(), "the env's constructor to hold", proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines() == ["rlchain-eval: interrupted by SIGINT"], err


def test_a_run_whose_critic_sees_a_privileged_group_evaluates(compose_cfg, tmp_path, in_process):
    """PushCube observed as the groups actor (noisy) and critic (exact), trained and evaluated again."""
    from rlchain.commands.train import build

    cfg = compose_cfg(["env=push_cube", "env.privileged_critic=true", "env.obs_noise_std=0.05", "debug=tiny"])
    trainer = build(cfg)
    assert (trainer.policy.actor_groups, trainer.policy.critic_groups) == (["actor"], ["critic"])
    assert trainer.train().status == "completed"
    code, err = in_process([tmp_path, "num_episodes=4", "checkpoint=latest"])
    assert code == 0, err
    record = json.loads((tmp_path / "checkpoints" / "eval.json").read_text())
    assert record["episodes"] == 4 and "success_rate" in record["metrics"]
