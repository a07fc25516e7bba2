"""Faults of a single run, tried as a user meets them: real processes, real signals, real files.

Every wait is for a condition (a metrics row, a marker file, a line on
stderr), bounded by a generous deadline; nothing depends on how fast the
machine is.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

import rlchain.config  # noqa: F401  (registers the schemas compose() needs)
from rlchain.envs import PushCubeEnv
from rlchain.algorithms import PPO
from rlchain.policies import ActorCritic
from rlchain.trainer import Trainer
from rlchain.summary import RunSummary

from conftest import TESTS, TINY, rows, run_cli

#: tests/fault_env.py's FaultLineEnv (marker-file switches), with the tests' small settings.
USER = ["--config-dir", str(TESTS / "user_conf"), "env=fault_line", *TINY]
#: A run that goes on until it is stopped.
ENDLESS = [*USER, "trainer.iterations=100000", "trainer.save_freq=100000", "trainer.eval_freq=100000"]


def _sigint_as_in_a_terminal() -> None:
    # A test suite started in the background of a script inherits SIGINT ignored, and Python then installs
    # no KeyboardInterrupt handler in the child; a command typed at a terminal has the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: list[str], cwd: Path, **popen) -> tuple[subprocess.Popen, Path]:
    """Start ``python -m rlchain.train *args`` in ``cwd`` as from a terminal; stderr goes to a file the test can read."""
    env = {**os.environ, "PYTHONPATH": str(TESTS), "WANDB_MODE": "disabled"}
    env.pop("HYDRA_FULL_ERROR", None)
    err = cwd / "stderr.txt"
    proc = subprocess.Popen([sys.executable, "-m", "rlchain.train", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=err.open("w"), preexec_fn=_sigint_as_in_a_terminal,
                            **popen)  # fmt: skip
    return proc, err


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_dir(cwd: Path) -> Path:
    (path,) = list((cwd / "outputs").glob("*/*"))
    return path


def summary_of(path: Path) -> RunSummary:
    return RunSummary.read(path)


# ------------------------------------------------------------------ signals
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
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
    assert last.startswith(f"rlchain: interrupted by {name} at ") and "resume with trainer.resume_from=" in last


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


# ------------------------------------------------------------- failures
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


def test_a_diverging_ppo_stops_at_the_first_non_finite_value(tmp_path):
    # The case: algorithm.learning_rate=2e4 "completed" with grad_norm = inf in every row.
    proc = run_cli(["algorithm.learning_rate=2e4", "device=cpu", "trainer.progress=false"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "rlchain: failed: non-finite grad_norm at iteration 1 (inf); last good checkpoint: none written yet" in proc.stderr
    assert summary_of(run_dir(tmp_path)).status == "failed"
    assert not list(run_dir(tmp_path).rglob("*.pt"))


# ------------------------------------------------------------- file system
def test_a_run_directory_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    proc = run_cli([*USER, f"hydra.run.dir={tmp_path / 'a_file' / 'run'}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"rlchain: cannot create the run directory {tmp_path / 'a_file' / 'run'}: Not a directory" in proc.stderr


def test_a_checkpoint_directory_that_cannot_be_written_fails_the_run_in_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("a file where the checkpoint directory should be")
    proc = run_cli([*USER, f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "rlchain: failed: FileExistsError: " in proc.stderr and str(run / "checkpoints") in proc.stderr
    assert summary_of(run).status == "failed"


def test_a_full_disk_keeps_the_last_good_checkpoint_and_fails_in_one_line(tmp_path):
    run = tmp_path / "run"
    first = run_cli([*USER, f"hydra.run.dir={run}"], tmp_path)
    assert first.returncode == 0, first.stderr
    good = (run / "checkpoints" / "latest.pt").read_bytes()
    assert len(good) > 64 * 1024  # larger than the limit below: the next save cannot fit

    def small_files() -> None:  # every file this process writes stays under 64 KiB, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    env = {**os.environ, "PYTHONPATH": str(TESTS), "WANDB_MODE": "disabled"}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run([sys.executable, "-m", "rlchain.train", *USER, "trainer.iterations=4",
                           f"hydra.run.dir={run}", "trainer.resume_from=auto"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=small_files)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"rlchain: failed: OSError: [Errno 27] cannot write the checkpoint {run / 'checkpoints'}" in proc.stderr
    assert "File too large" in proc.stderr
    assert (run / "checkpoints" / "latest.pt").read_bytes() == good
    assert not list((run / "checkpoints").glob(".*.tmp"))
    assert summary_of(run).status == "failed"


# ------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("content, reason", [(b"\x00\x9f random bytes \xff" * 10, "unreadable as a torch checkpoint"),
                                             (b"a text file\n", "unreadable as a torch checkpoint"),
                                             (b"", "an empty file")])  # fmt: skip
def test_resuming_from_a_file_that_is_not_a_checkpoint_names_it(tmp_path, content, reason):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(content)
    proc = run_cli([*USER, f"trainer.resume_from={bad}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "weights_only" not in proc.stderr
    assert f"Invalid config: trainer.resume_from='{bad}' is not an rlchain checkpoint: {reason}" in proc.stderr


def test_resuming_with_a_policy_that_does_not_match_names_the_shapes(tmp_path):
    run = tmp_path / "run"
    assert run_cli([*USER, "policy.hidden_sizes=[16]", f"hydra.run.dir={run}"], tmp_path).returncode == 0
    proc = run_cli([*USER, f"trainer.resume_from={run / 'checkpoints' / 'latest.pt'}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Error in call to target" not in proc.stderr
    assert "the checkpoint's policy does not match this run's: actor.0.weight is (16, 2) there, (128, 2) here" in proc.stderr


def test_resuming_a_finished_run_keeps_its_final_metrics_and_objective(tmp_path):
    run = tmp_path / "run"
    assert run_cli([*USER, f"hydra.run.dir={run}"], tmp_path).returncode == 0
    before = summary_of(run)
    (run / "checkpoints" / ".latest.pt.k9x2.tmp").write_bytes(b"torn")  # a save cut short by kill -9
    proc = run_cli([*USER, f"hydra.run.dir={run}", "trainer.resume_from=auto"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "already reached trainer.iterations=2" in proc.stderr
    after = summary_of(run)
    assert after.objective is not None and after.objective == before.objective
    assert after.final["eval/success_rate"] == before.final["eval/success_rate"]
    assert not list((run / "checkpoints").glob(".*.tmp"))


# ------------------------------------------------------------- run directories
def test_every_run_gets_its_own_directory(tmp_path):
    dirs = []
    for _ in range(2):  # two runs started in the same second: their names still differ
        GlobalHydra.instance().clear()
        with initialize_config_module("rlchain.conf", version_base="1.3"):
            cfg = compose("train", return_hydra_config=True)
        dirs.append(str(cfg.hydra.run.dir))
    GlobalHydra.instance().clear()
    assert dirs[0] != dirs[1]
    assert all(re.fullmatch(r"outputs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d_[0-9a-f]{6}", d) for d in dirs), dirs


def test_a_fresh_run_refuses_a_directory_that_holds_a_run_and_a_resume_is_let_in(tmp_path):
    run = tmp_path / "run"
    assert run_cli([*USER, "seed=1", f"hydra.run.dir={run}"], tmp_path).returncode == 0
    config = (run / ".hydra" / "config.yaml").read_text()
    proc = run_cli([*USER, "seed=2", f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"rlchain: {run} already holds a run (summary.json)" in proc.stderr
    assert (run / ".hydra" / "config.yaml").read_text() == config  # seed 1's config is not lost
    resumed = run_cli([*USER, "seed=1", f"hydra.run.dir={run}", "trainer.resume_from=auto", "trainer.iterations=3"],
                      tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr


def test_a_run_resumed_into_its_directory_does_not_repeat_logged_rows(tmp_path):
    # The run logged iterations 3 and 4 after its last checkpoint (iteration 2), then died.
    def make(iterations, resume_from=None):
        torch.manual_seed(0)
        env = PushCubeEnv(num_envs=8, seed=0)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(env, policy, PPO(policy, batch_size=32), iterations=iterations, rollout_steps=4,
                       output_dir=str(tmp_path), progress=False, resume_from=resume_from)  # fmt: skip

    first = make(2)
    first.train()
    (tmp_path / "at_2.pt").write_bytes((tmp_path / "checkpoints" / "latest.pt").read_bytes())
    first.cfg.iterations = 4
    first.train()
    assert [r["global_step"] for r in rows(tmp_path)] == [32, 64, 96, 128]
    make(4, resume_from=str(tmp_path / "at_2.pt")).train()
    assert [r["global_step"] for r in rows(tmp_path)] == [32, 64, 96, 128]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("charts/SPS")] == [32, 64, 96, 128]


# ------------------------------------------------------------- last bad inputs
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.objective=eval/sucess_rate"],
         "rlchain: failed: trainer.objective='eval/sucess_rate' is not a metric this run logs "
         "(did you mean 'eval/success_rate'?): expected one of "),
        (["trainer.wandb_mode=bogus"],
         "Invalid config: trainer.wandb_mode='bogus' is not allowed: expected one of None, 'online', 'offline', 'disabled'"),
        (["seed=99999999999999999999999"],
         "Invalid config: seed=99999999999999999999999 is not allowed: expected an integer in [0, 4294967295]"),
    ],
)  # fmt: skip
def test_the_last_bad_inputs_are_one_clear_line(tmp_path, overrides, message):
    proc = run_cli([*USER, *overrides], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_a_refused_run_leaves_the_summary_of_the_run_it_found(compose_cfg, tmp_path):
    # Inside a sweep the trainer itself refuses the directory (the run-dir check of a
    # single run comes earlier); the run it found keeps its summary.json.
    from rlchain.train import ConfigError, train

    assert train(compose_cfg(TINY)).status == "completed"
    before = (tmp_path / "summary.json").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):
        train(compose_cfg([*TINY, "seed=5"]))
    assert (tmp_path / "summary.json").read_text() == before


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
