"""Stopping a run: Ctrl-C and SIGTERM, a second signal, Ctrl-C at start-up, SLURM's requeue signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from rlchain.core.algorithms import PPO
from rlchain.core.policies import ActorCritic
from rlchain.run.summary import RunSummary
from rlchain.run.trainer import Trainer
from tests.helpers.runs import (
    TINY,
    USER,
    rows,
    run_cli,
    run_dir,
    sigint_as_in_a_terminal,
    subprocess_env,
    summary_of,
    wait_for,
)
from tests.helpers.toy_env import LineEnv

#: A run that goes on until it is stopped.
ENDLESS = [*USER, "trainer.iterations=100000", "trainer.save_freq=100000", "trainer.eval_freq=100000"]


CTRL_C_SCRIPT = """
import torch
from tests.helpers.toy_env import LineEnv
from rlchain.core.policies import ActorCritic
from rlchain.core.algorithms import PPO
from rlchain.run.trainer import Trainer
from rlchain.run.summary import RunSummary
env = LineEnv(num_envs=64)
policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[256, 256])
t = Trainer(env, policy, PPO(policy, batch_size=64, n_epochs=4), iterations=100000, rollout_steps=64,
            save_freq=100000, output_dir={out!r}, progress=True)
print(t.train().status, flush=True)
"""


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_flushes_logs_and_exits_cleanly(tmp_path):
    script = CTRL_C_SCRIPT.format(out=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env()
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == "interrupted"
    assert "stopping after this iteration" in err
    summary = RunSummary.read(tmp_path)
    assert summary.status == "interrupted"
    rows = metrics.read_text().splitlines()
    assert json.loads(rows[-1])["global_step"] == summary.global_step
    assert torch.load(tmp_path / "checkpoints" / "latest.pt", weights_only=True)["global_step"] == summary.global_step


def start(args: list[str], cwd: Path, **popen) -> tuple[subprocess.Popen, Path]:
    """Start ``python -m rlchain *args`` in ``cwd`` as from a terminal; stderr goes to a file the test can read."""
    err = cwd / "stderr.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlchain", *args],
        cwd=cwd,
        env=subprocess_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=err.open("w"),
        preexec_fn=sigint_as_in_a_terminal,
        **popen,
    )
    return proc, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_a_stop_signal_ends_the_run_after_its_iteration_with_a_checkpoint(tmp_path, signum):
    # SIGTERM (scancel, Kubernetes, preemption) used to kill the run at once: no
    # checkpoint at the stop, no summary.json. Ctrl-C exited 0, like a completed run.
    proc, err = start(ENDLESS, tmp_path)
    wait_for(lambda: list((tmp_path / "outputs").glob("*/*")) and len(rows(run_dir(tmp_path))) >= 2, "two rows")
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=120)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err.read_text()
    summary = summary_of(run_dir(tmp_path))
    assert summary.status == "interrupted" and summary.signal == name
    latest = torch.load(run_dir(tmp_path) / "checkpoints" / "latest.pt", weights_only=True)
    assert latest["global_step"] == summary.global_step == rows(run_dir(tmp_path))[-1]["global_step"]
    assert "Traceback" not in err.read_text()
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"rlchain: interrupted by {name} at ")
    assert last.endswith(f"resume with: rlchain-train trainer.resume_from={run_dir(tmp_path)}")


@pytest.mark.slow
def test_the_resume_command_printed_at_a_stop_continues_the_run_in_its_directory(tmp_path):
    # The hint gave a command that, run as printed, started a new run directory.
    proc, _ = start(ENDLESS, tmp_path)
    wait_for(lambda: list((tmp_path / "outputs").glob("*/*")) and len(rows(run_dir(tmp_path))) >= 2, "two rows")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    run, stopped = run_dir(tmp_path), summary_of(run_dir(tmp_path))
    command = out.strip().splitlines()[-1].split("resume with: ")[1].split()
    assert command[0] == "rlchain-train"
    more = subprocess.run(
        [sys.executable, "-m", "rlchain", *command[1:], f"trainer.iterations={stopped.iteration + 1}"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert more.returncode == 0, more.stderr
    assert run_dir(tmp_path) == run  # the one run directory
    summary = summary_of(run)
    assert (summary.status, summary.iteration) == ("completed", stopped.iteration + 1)


@pytest.mark.slow
def test_a_second_signal_aborts_at_once_and_still_writes_the_summary(tmp_path):
    hold = tmp_path / "hold"
    proc, err = start([*ENDLESS, f"env.hold_step={hold}"], tmp_path)
    wait_for(lambda: list((tmp_path / "outputs").glob("*/*")) and rows(run_dir(tmp_path)), "a first row")
    hold.touch()  # the env now stops inside a step: the iteration cannot end
    wait_for(lambda: Path(f"{hold}.waiting").exists(), "the env to hold")
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "stopping after this iteration" in err.read_text(), "the first signal's notice")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130, err.read_text()
    summary = summary_of(run_dir(tmp_path))
    assert summary.status == "aborted" and summary.signal == "SIGINT"
    assert "Traceback" not in err.read_text() and "KeyboardInterrupt" not in err.read_text()


def test_ctrl_c_during_start_up_exits_130_without_a_traceback(tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    proc, err = start([*ENDLESS, f"env.hold_build={hold}"], tmp_path)
    wait_for(lambda: Path(f"{hold}.waiting").exists(), "the env's constructor to hold")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    text = err.read_text()
    assert "Traceback" not in text and "rlchain: interrupted by SIGINT before training started" in text


@pytest.mark.slow
def test_ctrl_c_ends_a_sweep_of_the_basic_launcher_instead_of_starting_its_next_job(tmp_path):
    # hydra/launcher=basic runs the jobs in this process: the first Ctrl-C used to stop
    # only the running job, the next one started, and the multirun exited 0.
    proc, err = start([*ENDLESS[:2], "-m", "hydra/launcher=basic", "seed=0,1", *ENDLESS[2:]], tmp_path)
    job0 = lambda: next(iter((tmp_path / "multirun").glob("*/*/0")), None)  # noqa: E731
    wait_for(lambda: job0() is not None and len(rows(job0())) >= 2, "two rows of job 0")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130, err.read_text()
    assert summary_of(job0()).status == "interrupted"
    assert not (job0().parent / "1").exists()


#: TINY's runs on cart_pole, evaluated only after the last iteration (so the env that signals is the training env).
BASE = [*TINY, "env=cart_pole", "trainer.eval_freq=100"]


FOUR_ITERATIONS = [*BASE, "trainer.iterations=4"]


STEPS_PER_ITERATION = 8 * 16  # rollout_steps x num_envs of TINY


#: Step 19 of the env: in the third iteration's rollout (steps 17 to 24).
PREEMPT_IN_ITERATION_3 = ["env._target_=tests.helpers.preempt_env.PreemptedCartPole", "+env.preempt_at_step=19"]


def logged_iterations(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [int(row["charts/iteration"]) for row in rows]


def run_preempted_sweep(tmp_path: Path, *overrides: str) -> tuple[Path, str]:
    """Run a one-job ``slurm_local`` sweep whose job is preempted once in iteration 3.

    Returns the job's run directory and its stderr (all attempts, as submitit keeps it).
    """
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    marker = tmp_path / "preempted"
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=slurm_local",
            *FOUR_ITERATIONS,
            *PREEMPT_IN_ITERATION_3,
            f"+env.marker={marker}",
            *overrides,
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()  # the signal was sent
    (sweep,) = list((tmp_path / "multirun").glob("*/*"))  # the default sweep dir: one for both attempts
    (job_folder,) = [p for p in (sweep / ".submitit").iterdir() if p.name != "%j"]
    job_log = "".join(p.read_text() for p in sorted(job_folder.glob("*_log.*")))
    assert "Requeued job" in job_log  # submitit's handler requeued it
    run_dir = sweep / "0"
    summary = RunSummary.read(run_dir)
    assert summary.status == "completed" and summary.global_step == 4 * STEPS_PER_ITERATION
    return run_dir, job_log


@pytest.mark.slow
def test_a_requeued_slurm_job_goes_on_from_its_own_latest_checkpoint(tmp_path):
    # latest.pt after every iteration: the signal in iteration 3 finds at least the one of iteration 2
    run_dir, job_log = run_preempted_sweep(tmp_path, "trainer.save_freq=1")
    assert f"rlchain: resumed from {run_dir / 'checkpoints' / 'latest.pt'} at iteration " in job_log
    assert logged_iterations(run_dir) == [1, 2, 3, 4]  # not 1, 2 and then 1, 2, 3, 4 again


@pytest.mark.slow
def test_a_preempted_slurm_job_finishes_its_iteration_and_saves_before_it_is_requeued(tmp_path):
    # The default save_freq (50) wrote no latest.pt by iteration 3: only the
    # trainer's own save after the signal keeps iterations 1 to 3.
    run_dir, job_log = run_preempted_sweep(tmp_path)
    assert "rlchain: SIGUSR2: stopping after this iteration" in job_log
    assert f"rlchain: resumed from {run_dir / 'checkpoints' / 'latest.pt'} at iteration 3" in job_log
    assert logged_iterations(run_dir) == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_run_started_again_in_its_directory_with_resume_from_auto_goes_on(tmp_path):
    # What a requeued job does, by hand: the same run directory, trainer.resume_from=auto.
    run_dir = tmp_path / "run"
    first = run_cli([*BASE, "trainer.iterations=2", f"hydra.run.dir={run_dir}"], tmp_path)
    assert first.returncode == 0, first.stderr
    again = run_cli([*FOUR_ITERATIONS, "trainer.resume_from=auto", f"hydra.run.dir={run_dir}"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"rlchain: resumed from {run_dir / 'checkpoints' / 'latest.pt'} at iteration 2" in again.stderr
    summary = RunSummary.read(run_dir)
    assert summary.status == "completed" and summary.global_step == 4 * STEPS_PER_ITERATION
    assert logged_iterations(run_dir) == [1, 2, 3, 4]


@pytest.mark.parametrize("launcher", ["slurm", "slurm_local"])
def test_the_slurm_presets_requeue_their_jobs(launcher):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    GlobalHydra.instance().clear()
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    assert cfg.trainer.resume_from is None  # which a submitit job reads as auto (see the next test)
    assert "RLCHAIN_RESUME_FROM" not in cfg.hydra.job.env_set  # no variable of rlchain's own reaches the job
    if launcher == "slurm":  # a time limit requeues too (submitit_slurm's default, 0, requeues none)
        assert cfg.hydra.launcher.max_num_timeout > 0


def test_a_submitit_job_goes_on_from_its_own_latest_checkpoint_and_a_plain_run_refuses_it(tmp_path, monkeypatch):
    from rlchain.core.algorithms import PPO
    from rlchain.core.envs import CartPoleEnv
    from rlchain.core.policies import ActorCritic
    from rlchain.run.trainer import Trainer

    def make():
        env = CartPoleEnv(num_envs=4, max_episode_steps=8)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        trainer = Trainer(
            env,
            policy,
            PPO(policy, batch_size=16),
            iterations=2,
            rollout_steps=4,
            output_dir=str(tmp_path),
            progress=False,
        )
        trainer.start()  # as rlchain-train's build does
        return trainer

    make().train()
    with pytest.raises(ValueError, match="already holds a run"):
        make()  # resume_from=None outside a submitit job: a fresh start, refused here
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")  # what submitit sets in its jobs
    assert make().global_step == 2 * 4 * 4


class SignalsItselfAt(LineEnv):
    """LineEnv that sends its own process SIGINT at step ``at_step`` (counted from construction): Ctrl-C, then."""

    def __init__(self, at_step: int, **kwargs):
        super().__init__(**kwargs)
        self.at_step, self.steps = at_step, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at_step:
            os.kill(os.getpid(), signal.SIGINT)
        return super().step(action)


@pytest.mark.parametrize("at_step, status, iterations", [(2, "interrupted", 1), (6, "completed", 2)])
def test_a_stop_signal_in_the_last_iteration_leaves_the_run_completed(tmp_path, at_step, status, iterations):
    # 2 iterations of 4 steps: a signal in the first one stops the run after it; one in the last one stops
    # nothing (every iteration ran), so the run is complete and a requeue would have nothing to do.
    env = SignalsItselfAt(at_step, num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    summary = Trainer(
        env, policy, PPO(policy, batch_size=16), iterations=2, rollout_steps=4, output_dir=str(tmp_path), progress=False
    ).train()
    assert (summary.status, summary.iteration) == (status, iterations)
    assert summary.signal == ("SIGINT" if status == "interrupted" else None)
    assert summary.exit_code == (130 if status == "interrupted" else 0)
