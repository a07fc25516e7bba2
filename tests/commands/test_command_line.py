"""rlchain-train's command line: a key the config lacks is one line with a close match; --help lists what a user
chooses."""

from __future__ import annotations

import pytest

from rlchain.commands.command_line import unknown_keys
from tests.helpers.runs import HELPERS, TINY, run_cli

USER_CONF = ["--config-dir", str(HELPERS / "user_conf")]


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["trainer.max_iterations=5"],
            "Invalid config: trainer.max_iterations=5: max_iterations is not a setting of trainer=default "
            "(did you mean trainer.iterations=5?): expected one of iterations, rollout_steps, spread_episode_starts, ",
        ),
        (
            ["algoritm.learning_rate=1e-3"],
            "Invalid config: algoritm.learning_rate=1e-3: algoritm is not a setting or config group "
            "(did you mean algorithm.learning_rate=1e-3?): expected one of algorithm, debug, device, env, exp_name, "
            "experiment, hparams_search, policy, seed, study, sweep, trainer",
        ),
        (
            ["env.id=Pendulum-v1"],
            "Invalid config: env.id=Pendulum-v1: id is not a setting of env=push_cube "
            "(did you mean env=gym env.id=Pendulum-v1?): expected one of num_envs, device, seed, ",
        ),
        (
            ["-m", "seed=0,1", "trainer.max_iterations=5,6"],  # a swept key: Hydra composes it only in each job
            "Invalid config: trainer.max_iterations=5,6: max_iterations is not a setting of trainer=default "
            "(did you mean trainer.iterations=5,6?)",
        ),
        (
            [*USER_CONF, "env=line", "env.max_episode_step=4"],  # a user's own option
            "Invalid config: env.max_episode_step=4: max_episode_step is not a setting of env=line "
            "(did you mean env.max_episode_steps=4?): expected one of num_envs, seed, max_episode_steps",
        ),
        (
            ["--cfg", "job", "hydra.launcher.jobs_per_devic=2"],
            "Invalid config: hydra.launcher.jobs_per_devic=2: jobs_per_devic is not a setting of hydra/launcher=devices "
            "(did you mean hydra.launcher.jobs_per_device=2?)",
        ),
    ],
)
@pytest.mark.slow
def test_a_key_the_config_lacks_is_one_line_with_a_close_match(tmp_path, args, line):
    proc = run_cli([*args, *TINY], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr  # one line, without Hydra's "+key" advice
    assert proc.stderr.startswith(line), proc.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


@pytest.mark.parametrize(
    "args, lines",
    [
        (
            ["algorithm=grpoo"],
            [
                "algorithm=grpoo: grpoo is not an option of algorithm (did you mean algorithm=grpo?): expected one of "
                "grpo, ppo"
            ],
        ),
        (
            ["env=pushcube", "env.num_envs=8"],
            [
                "env=pushcube: pushcube is not an option of env (did you mean env=push_cube?): expected one of "
                "cart_pole, gym, maniskill, mjlab, push_cube"
            ],
        ),
        (
            ["-m", "algorithm=ppo,grpoo,xyz"],  # each option of a sweep
            [
                "algorithm=ppo,grpoo,xyz: grpoo is not an option of algorithm (did you mean algorithm=grpo?): "
                "expected one of grpo, ppo",
                "algorithm=ppo,grpoo,xyz: xyz is not an option of algorithm: expected one of grpo, ppo",
            ],
        ),
        (
            [*USER_CONF, "env=lin"],  # a user's own options are options
            [
                "env=lin: lin is not an option of env (did you mean env=line?): expected one of cart_pole, fault_line, "
                "gym, line, maniskill, mjlab, push_cube"
            ],
        ),
    ],
)
def test_an_option_its_group_lacks_is_one_line_with_the_real_options_and_a_close_match(args, lines):
    # Hydra's own message is 13 to 19 lines: the group's options with its *_schema ones, and the search path.
    assert unknown_keys(args) == [f"Invalid config: {line}" for line in lines]


@pytest.mark.slow
def test_a_mistyped_option_on_the_command_line_is_one_line_and_exit_1(tmp_path):
    proc = run_cli(["algorithm=grpoo", *TINY], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "Invalid config: algorithm=grpoo: grpoo is not an option of algorithm (did you mean algorithm=grpo?): "
        "expected one of grpo, ppo"
    ), proc.stderr


def test_each_missing_key_has_its_line():
    lines = unknown_keys(["env.nm_envs=4", "trainer.itrations=3", "seed=1"])
    assert [line.split(" (did you mean ")[1].split("?")[0] for line in lines] == [
        "env.num_envs=4",
        "trainer.iterations=3",
    ]


def test_a_renamed_setting_is_refused_naming_its_new_name():
    (line,) = unknown_keys(["env.episode_length=8", "trainer.iterations=1"])
    assert line.startswith(
        "Invalid config: env.episode_length=8: episode_length is not a setting of env=push_cube "
        "(it is env.max_episode_steps=8 now): expected one of "
    ), line


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["trainer.iterations=3", "algorithm=grpo", "algorithm.group_size=4"],
        ["env=gym", "env.id=Pendulum-v1"],
        ["-m", "algorithm=ppo,grpo", "seed=0,1", "trainer.iterations=2,3"],
        ["-m", "env=gym,cart_pole", "env.id=CartPole-v1,Acrobot-v1"],  # a key of one option: left to each job
        ["-m", "hydra/sweeper=rlchain_optuna", "algorithm.learning_rate=tag(log,interval(1e-4,1e-3))"],
        ["--cfg", "job", "trainer.progress=false"],
        ["--help", "algorithm=grpo"],
        ["+trainer.extra=1", "++seed=3", "~trainer.video"],  # Hydra's to check
        [*USER_CONF, "env=line", "robot=short_line", "env.max_episode_steps=5"],
        [*USER_CONF, "--config-name", "robot_train", "trainer.iterations=2"],
    ],
)
def test_command_lines_that_compose_pass(args):
    assert unknown_keys(args) == []


def test_a_composition_that_fails_otherwise_is_left_to_hydra(tmp_path):
    assert unknown_keys(["hydra/launcher=basik", "trainer.iterations=2"]) == []  # Hydra's own groups
    assert unknown_keys(["seed=0,1"]) == []  # a sweep without -m: Hydra's "Ambiguous value" message
    proc = run_cli(["env.num_envs=many", *TINY], tmp_path)
    assert proc.returncode == 1 and "Value 'many' of type 'str' could not be converted to Integer" in proc.stderr


@pytest.mark.slow
def test_help_lists_the_options_a_user_chooses_and_the_launchers_and_sweepers(tmp_path):
    proc = run_cli(["--help", *USER_CONF], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for line in (
        "algorithm: counting_ppo, grpo, ppo",
        "env: cart_pole, fault_line, gym, line, maniskill, mjlab, push_cube",
        "policy: actor_critic, actor_only, wide",
        "trainer: default",
        "robot: short_line",
        "hydra/launcher: basic, devices, population, slurm, slurm_local",
        "hydra/sweeper: basic, rlchain_optuna",
    ):
        assert f"\n{line}" in proc.stdout, line
    assert "_schema" not in proc.stdout and "algorithm_defaults" not in proc.stdout
    assert "\n  _target_: rlchain.run.trainer.Trainer" in proc.stdout  # the composed config follows
