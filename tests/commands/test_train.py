"""The rlchain-train command: a run end to end, bad input in one line, failures, the installed wheel."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

import tests.helpers.gym_toy_envs  # noqa: F401  (registers the toy gymnasium ids)
from rlchain.run.summary import RunSummary
from tests.helpers.runs import HELPERS, REPO, TINY, USER, run_cli, run_dir, summary_of


@pytest.mark.slow
def test_single_run_end_to_end(tmp_path):
    proc = run_cli(["algorithm=grpo", *TINY, "env.max_episode_steps=8"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    for name in (
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
        "metrics.jsonl",
        "summary.json",
        "checkpoints/latest.pt",
        "checkpoints/best.pt",
    ):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").glob("events.*"))
    summary = RunSummary.read(run_dir)
    assert summary.status == "completed" and summary.global_step == 2 * 16 * 8
    assert summary.exp_name == "grpo_push_cube"
    assert f"final eval success rate {summary.final['eval/success_rate']:.3f}" in proc.stdout


@pytest.mark.slow
def test_multirun_runs_four_jobs_each_in_its_own_directory(tmp_path):
    proc = run_cli(["-m", "algorithm=ppo,grpo", "seed=0,1", *TINY, "env.max_episode_steps=8"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    (sweep,) = list((tmp_path / "multirun").glob("*/*"))
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]
    seen = set()
    for job in jobs:
        summary = RunSummary.read(job)
        assert summary.status == "completed" and summary.global_step == 256
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        seen.add((summary.exp_name, "seed=1" in overrides))
        assert (job / "checkpoints" / "latest.pt").is_file()
    assert seen == {
        ("ppo_push_cube", False),
        ("ppo_push_cube", True),
        ("grpo_push_cube", False),
        ("grpo_push_cube", True),
    }


@pytest.mark.slow
def test_users_own_env_policy_and_algorithm_from_their_config_dir(tmp_path):
    proc = run_cli(
        [
            "--config-dir",
            str(HELPERS / "user_conf"),
            "env=line",
            "policy=wide",
            "algorithm=counting_ppo",
            "device=cpu",
            "trainer.iterations=3",
            "trainer.rollout_steps=6",
            "trainer.num_eval_envs=4",
            "trainer.num_eval_episodes=4",
            "trainer.progress=false",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["losses/updates_seen"] for r in rows] == [1.0, 2.0, 3.0]
    assert "metrics/distance" in rows[-1]


@pytest.mark.slow
def test_help_and_cfg_job(tmp_path):
    proc = run_cli(["--help"], tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("rlchain-train is powered by Hydra.")
    for text in (
        "algorithm: grpo, ppo\n",
        "env: cart_pole, gym, maniskill, mjlab, push_cube\n",
        "experiment: cart_pole_grpo, cart_pole_no_vel_ppo, cart_pole_ppo, gym_cart_pole_ppo, gym_half_cheetah_ppo, gym_hopper_ppo, "
        "gym_pendulum_ppo, gym_walker2d_ppo, maniskill_push_cube_ppo, mjlab_cartpole_balance_ppo, "
        "mjlab_cartpole_swingup_ppo, mjlab_go1_flat_ppo, mjlab_lift_cube_ppo, push_cube_grpo, push_cube_grpo_gpu, "
        "push_cube_pixels_ppo, push_cube_ppo, push_cube_ppo_gpu\n",
        "sweep: grpo_push_cube, ppo_push_cube",
        "policy: actor_critic, actor_only\n",
        "hydra/launcher: basic, devices, population, slurm, slurm_local",
    ):
        assert text in proc.stdout
    proc = run_cli(["--cfg", "job", "algorithm=grpo"], tmp_path)
    assert proc.returncode == 0 and "_target_: rlchain.core.algorithms.GRPO" in proc.stdout
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algorithm=ppx"],
            "Invalid config: algorithm=ppx: ppx is not an option of algorithm (did you mean algorithm=ppo?): "
            "expected one of grpo, ppo",
        ),
        (
            ["algorithm.learning_rat=1e-3"],
            "Invalid config: algorithm.learning_rat=1e-3: learning_rat is not a setting of "
            "algorithm=ppo (did you mean algorithm.learning_rate=1e-3?)",
        ),
        (["env.num_envs=many"], "Value 'many' of type 'str' could not be converted to Integer"),
        (["algorithm.clip_coef=-1"], "algorithm.clip_coef=-1.0 is not allowed: expected a number > 0"),
        (["env.num_envs=0"], "env.num_envs=0 is not allowed: expected an integer > 0"),
        (["trainer.iterations=0"], "trainer.iterations=0 is not allowed: expected an integer > 0"),
        (
            ["algorithm=grpo", "algorithm.reset_every_rollout=false"],
            "algorithm.reset_every_rollout=false: reset_every_rollout is not a setting of algorithm=grpo",
        ),
        (
            ["algorithm=grpo", "algorithm.advantage_norm=max"],
            "algorithm.advantage_norm='max' is not allowed: expected one of 'std', 'none', 'rollout_std'",
        ),
        (
            ["algorithm=grpo", "algorithm.group_size=3", "env.num_envs=64"],
            "algorithm.group_size=3 is not allowed with env.num_envs=64: num_envs must be a multiple of group_size",
        ),
        (
            ["policy.rnn_type=gru", "algorithm.seq_len=7", "trainer.rollout_steps=24"],
            "algorithm.seq_len=7 does not divide trainer.rollout_steps=24: a recurrent policy trains on whole sequences",
        ),
        (
            ["algorithm.seq_len=8"],
            "algorithm.seq_len=8 is not allowed with a feed-forward policy: expected None (or policy.rnn_type)",
        ),
        pytest.param(
            ["device=cuda"],
            "device='cuda' is not available: this machine has no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"),
        ),
    ],
)
@pytest.mark.slow
def test_bad_input_gives_one_clear_message_and_no_traceback(tmp_path, overrides, message):
    proc = run_cli([*overrides, "trainer.progress=false"], tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("*.pt")), "no checkpoint may be left behind"


def test_a_cpu_with_an_index_is_refused_before_any_step(tmp_path):
    # device=cpu:1 trained, then called its good best.pt "unreadable as a torch checkpoint" (loaded onto cpu:1)
    proc = run_cli(["device=cpu:1", *TINY, "trainer.fresh_eval=true"], tmp_path)
    assert proc.returncode == 1 and "unreadable" not in proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        "Invalid config: device='cpu:1' is not supported: the CPU is one device, 'cpu' "
        "without an index; expected 'auto', 'cpu', 'cuda' or 'cuda:N'"
    )
    assert not list(tmp_path.rglob("*.pt"))
    assert not (tmp_path / "outputs").exists()  # refused before its first step: no run directory is left


def test_a_job_rejected_at_build_still_records_its_failure_for_the_sweep_tables(tmp_path):
    proc = run_cli(["-m", "env.num_envs=0", "device=cpu", "hydra/launcher=basic"], tmp_path)
    assert proc.returncode != 0
    (run_dir,) = list((tmp_path / "multirun").glob("*/*/0"))
    summary = RunSummary.read(run_dir)
    assert summary.status == "failed" and summary.global_step == 0
    assert summary.error == "Invalid config: env.num_envs=0 is not allowed: expected an integer > 0"
    assert summary.device == "cpu" and summary.end_time >= summary.start_time


def test_hydra_full_error_shows_the_traceback(tmp_path):
    proc = run_cli(["env.num_envs=0"], tmp_path, HYDRA_FULL_ERROR="1")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["trainer.objective=eval/sucess_rate"],
            "rlchain: failed: trainer.objective='eval/sucess_rate' is not a metric this run logs "
            "(did you mean 'eval/success_rate'?): expected one of ",
        ),
        (
            ["trainer.wandb_mode=bogus"],
            "Invalid config: trainer.wandb_mode='bogus' is not allowed: expected one of None, 'online', 'offline', 'disabled'",
        ),
        (
            ["seed=99999999999999999999999"],
            "Invalid config: seed=99999999999999999999999 is not allowed: expected an integer in [0, 4294967295]",
        ),
    ],
)
@pytest.mark.slow
def test_the_last_bad_inputs_are_one_clear_line(tmp_path, overrides, message):
    proc = run_cli([*USER, *overrides], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_failed_training_is_one_line_and_its_traceback_is_in_the_summary(tmp_path):
    failing = [*USER, "trainer.iterations=5", "env.fail_at_step=20"]  # in iteration 3
    proc = run_cli(failing, tmp_path)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1 and lines[0].startswith("rlchain: failed: RuntimeError: the simulator exploded | "), lines
    summary = summary_of(run_dir(tmp_path))
    assert summary.status == "failed" and "the simulator exploded" in summary.traceback
    (tmp_path / "full").mkdir()
    proc = run_cli(failing, tmp_path / "full", HYDRA_FULL_ERROR="1")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


@pytest.mark.slow
def test_a_diverging_ppo_stops_at_the_first_non_finite_value(tmp_path):
    # The case: algorithm.learning_rate=2e4 "completed" with grad_norm = inf in every row.
    proc = run_cli(["algorithm.learning_rate=2e4", "device=cpu", "trainer.progress=false"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (
        "rlchain: failed: non-finite grad_norm at iteration 1 (inf); last good checkpoint: none written yet"
        in proc.stderr
    )
    assert summary_of(run_dir(tmp_path)).status == "failed"
    assert not list(run_dir(tmp_path).rglob("*.pt"))


@pytest.mark.slow
def test_a_task_without_success_shows_and_logs_none(tmp_path):
    # Pendulum has no success signal: no "success 0.00" in the progress lines,
    # the final line or the logs; the objective (eval/avg_reward) instead.
    proc = run_cli(
        [
            "experiment=gym_pendulum_ppo",
            "trainer.iterations=2",
            "trainer.rollout_steps=8",
            "trainer.eval_freq=1",
            "trainer.num_eval_envs=2",
            "trainer.num_eval_episodes=2",
            "device=cpu",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout.replace(str(tmp_path), "<tmp>")  # the test name is in the path
    assert "success" not in shown and "eval/avg_reward" in shown.splitlines()[-1]
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and not [key for row in rows for key in row if "success" in key]
    summary = RunSummary.read(run_dir)
    assert summary.best_eval_success_rate is None and summary.best_objective is not None


@pytest.mark.slow
def test_train_log_holds_the_runs_notices_warnings_and_result_line(tmp_path):
    # train.log was empty: the notices and the result line were printed, never logged
    first = run_cli(
        [*TINY, "env._target_=tests.helpers.user_components.warning_push_cube", "hydra.run.dir=first"], tmp_path
    )
    assert first.returncode == 0, first.stderr
    second = run_cli([*TINY, f"trainer.init_from={tmp_path / 'first'}", "hydra.run.dir=second"], tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stderr.count("rlchain: policy initialised from ") == 1  # shown once
    for proc, name, lines in (
        (first, "first", ["UserWarning: the simulator's contact model is deprecated"]),
        (second, "second", ["rlchain: policy initialised from "]),
    ):
        log = (tmp_path / name / "train.log").read_text()
        result = proc.stdout.strip().splitlines()[-1]
        assert result.startswith("rlchain: completed ") and proc.stdout.count(result) == 1
        assert f"[rlchain.console][INFO] - {result}\n" in log
        for line in lines:  # as often in the log as on the console (stderr), where Python's warnings showed it
            assert (proc.stdout + proc.stderr).count(line) == log.count(line) >= 1, (proc.stderr, log)


def _running_site_dirs() -> list[str]:
    """The site-packages directories of the interpreter running the tests (a venv, conda or the system).

    ``venv.create(system_site_packages=True)`` would link the new venv to the *base*
    interpreter's site-packages, which inside a venv or conda env lacks hydra, torch & co.
    """
    dirs = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


@pytest.mark.slow
def test_wheel_ships_the_configs_and_runs_outside_the_repo(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = list(wheels.glob("rlchain-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    python = env_dir / "bin" / "python"
    # torch & co. come from this interpreter's site-packages, listed in a .pth after the venv's own
    # site-packages (so the wheel installed there wins). Directories named in a .pth are only put on
    # sys.path; their own .pth files are not run, so an editable install of rlchain there (its finder
    # or path .pth) cannot bring the source tree back.
    venv_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(venv_site, "running_interpreter.pth").write_text("".join(f"{d}\n" for d in _running_site_dirs()))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [str(python), "-c", "import rlchain; print(rlchain.__file__)"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    in_venv = lambda file: Path(file.strip()).resolve().is_relative_to(env_dir.resolve())  # noqa: E731
    assert in_venv(where.stdout), "the venv must import the installed wheel, not the source tree"
    # Hydra discovers the devices launcher in the installed hydra_plugins namespace package, once: the wheel's
    discover = (
        "import sys; from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; "
        "[print(c.__name__, sys.modules[c.__module__].__file__) for c in Plugins.instance().discover(Launcher)]"
    )
    found = subprocess.run(
        [str(python), "-c", discover], cwd=outside, env=env, capture_output=True, text=True, check=True
    )
    devices = [line.split(" ", 1)[1] for line in found.stdout.splitlines() if line.startswith("DevicesLauncher ")]
    assert len(devices) == 1 and in_venv(devices[0]), found.stdout
    proc = subprocess.run(
        [str(env_dir / "bin" / "rlchain-train"), "--cfg", "job", "algorithm=grpo"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "_target_: rlchain.core.algorithms.GRPO" in proc.stdout
        and "_target_: rlchain.core.policies.ActorOnly" in proc.stdout
    )


@pytest.mark.slow
def test_a_sweeps_jobs_are_grouped_in_wandb_each_under_its_own_name(tmp_path):
    # Every job of a sweep got the same W&B name, with no group.
    sweep = tmp_path / "multirun" / "day" / "sweep_1"
    proc = run_cli(
        ["-m", *USER, "trainer.use_wandb=true", "seed=0,1", "hydra/launcher=basic", f"hydra.sweep.dir={sweep}"],
        tmp_path,
        WANDB_MODE="offline",
        WANDB_SILENT="true",
    )
    assert proc.returncode == 0, proc.stderr
    for job in (0, 1):
        (record,) = [next(d.glob("*.wandb")).read_bytes() for d in (sweep / str(job) / "wandb").glob("offline-run-*")]
        assert f"ppo_fault_line_{job}".encode() in record and b"day/sweep_1" in record
