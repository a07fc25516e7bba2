"""Preemption and requeueing: a job that SLURM stops goes on, when requeued, from its own ``latest.pt``.

The requeue tests run the real path, without a cluster: ``hydra/launcher=slurm_local``
submits the job through Hydra's submitit launcher to submitit's local executor,
and the env of the job (:mod:`preempt_env`) sends its process submitit's
preemption signal (SIGUSR2) at a chosen step, as SLURM does before a time limit
or at a preemption. submitit's handler then requeues the job: the local
executor starts it again in a new process, as ``scontrol requeue`` does on a
cluster. No test depends on timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

import rlchain.config  # noqa: F401  (registers the config schemas that compose needs)
from rlchain.summary import RunSummary

from conftest import TINY, run_cli

#: TINY's runs on cart_pole, evaluated only after the last iteration (so the env that signals is the training env).
BASE = [*TINY, "env=cart_pole", "trainer.eval_freq=100"]
FOUR_ITERATIONS = [*BASE, "trainer.iterations=4"]
STEPS_PER_ITERATION = 8 * 16  # rollout_steps x num_envs of TINY
#: Step 19 of the env: in the third iteration's rollout (steps 17 to 24).
PREEMPT_IN_ITERATION_3 = ["env._target_=preempt_env.PreemptedCartPole", "+env.preempt_at_step=19"]


def logged_iterations(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [int(row["charts/iteration"]) for row in rows]


def run_preempted_sweep(tmp_path: Path, *overrides: str) -> tuple[Path, str]:
    """Run a one-job ``slurm_local`` sweep whose job is preempted once in iteration 3.

    Returns the job's run directory and its stderr (all attempts, as submitit keeps it).
    """
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    marker = tmp_path / "preempted"
    proc = run_cli(["-m", "hydra/launcher=slurm_local", *FOUR_ITERATIONS, *PREEMPT_IN_ITERATION_3,
                    f"+env.marker={marker}", *overrides], tmp_path)  # fmt: skip
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


def test_a_requeued_slurm_job_goes_on_from_its_own_latest_checkpoint(tmp_path):
    # latest.pt after every iteration: the signal in iteration 3 finds at least the one of iteration 2
    run_dir, job_log = run_preempted_sweep(tmp_path, "trainer.save_freq=1")
    assert f"rlchain: resumed from {run_dir / 'checkpoints' / 'latest.pt'} at iteration " in job_log
    assert logged_iterations(run_dir) == [1, 2, 3, 4]  # not 1, 2 and then 1, 2, 3, 4 again


def test_a_preempted_slurm_job_finishes_its_iteration_and_saves_before_it_is_requeued(tmp_path):
    # The default save_freq (50) wrote no latest.pt by iteration 3: only the
    # trainer's own save after the signal keeps iterations 1 to 3.
    run_dir, job_log = run_preempted_sweep(tmp_path)
    assert "rlchain: SIGUSR2: stopping after this iteration" in job_log
    assert f"rlchain: resumed from {run_dir / 'checkpoints' / 'latest.pt'} at iteration 3" in job_log
    assert logged_iterations(run_dir) == [1, 2, 3, 4]


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
    from rlchain.envs import CartPoleEnv
    from rlchain.algorithms import PPO
    from rlchain.policies import ActorCritic
    from rlchain.trainer import Trainer

    def make():
        env = CartPoleEnv(num_envs=4, max_episode_steps=8)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(env, policy, PPO(policy, batch_size=16), iterations=2, rollout_steps=4,
                       output_dir=str(tmp_path), progress=False)  # fmt: skip

    make().train()
    with pytest.raises(ValueError, match="already holds a run"):
        make()  # resume_from=None outside a submitit job: a fresh start, refused here
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")  # what submitit sets in its jobs
    assert make().global_step == 2 * 4 * 4
