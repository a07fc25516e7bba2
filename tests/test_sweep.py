"""Sweeps: the devices launcher, sweep presets, summary tables, rlchain-report, Optuna and submitit."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from hydra_plugins.rlchain_launcher._core import LauncherConfigError, TaskRef, make_slots
from rlchain.report import learning_curves, load_jobs

from conftest import TESTS, TINY, run_cli
from sweep_barrier import barrier_env

#: A tiny job with eight evaluations, for the summary tables and learning curves.
SHORT = [*TINY, "trainer.iterations=8"]
#: Build each job's env with the barrier of :mod:`sweep_barrier` (give its variables with ``barrier_env``).
MEET = "env._target_=sweep_barrier.meeting_push_cube"


def sweep_dir_of(cwd: Path) -> Path:
    (sweep,) = list((cwd / "multirun").glob("*/*"))
    return sweep


def summaries(sweep: Path) -> dict[int, dict]:
    return {j.num: j.summary for j in load_jobs(sweep)}


def one_job_at_a_time_per_slot(records) -> bool:
    """Whether each slot's jobs, in start order, each ended before the next one started.

    A slot is one worker process that runs its jobs one after another, and both times
    come from that process's clock: this holds by construction, however loaded the machine.
    """
    by_slot: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        by_slot.setdefault(r["slot"], []).append((r["start_time"], r["end_time"]))
    spans = [sorted(s) for s in by_slot.values()]
    return all(end <= start for s in spans for (_, end), (start, _) in zip(s, s[1:]))


# ------------------------------------------------------------------ slots
def test_slots_spread_over_devices_and_share_the_cores():
    slots = make_slots([0, 1], jobs_per_device=2, threads_per_job="auto")
    assert [s.device for s in slots] == ["0", "1", "0", "1"]
    assert [s.environ()["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0", "1", "0", "1"]
    assert [s.label for s in slots] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    cores = len(os.sched_getaffinity(0))
    assert all(s.num_threads == max(1, cores // 4) for s in slots)
    cpu = make_slots(["cpu"], jobs_per_device=3, threads_per_job=2)
    assert [s.environ()["CUDA_VISIBLE_DEVICES"] for s in cpu] == ["", "", ""]  # GPUs hidden from CPU jobs
    assert [s.environ()["OMP_NUM_THREADS"] for s in cpu] == ["2", "2", "2"]
    assert make_slots("auto", 1, "auto")[0].device == ("0" if _cuda_count() else "cpu")


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


@pytest.mark.parametrize(
    "devices, jobs_per_device, threads, message",
    [
        ("all", 1, "auto", "hydra.launcher.devices='all' is not allowed: expected 'auto' or a list of CUDA device ids"),
        ([], 1, "auto", "hydra.launcher.devices=[] is not allowed"),
        ([0, 0], 1, "auto", "a device is listed twice; use hydra.launcher.jobs_per_device"),
        ([-1], 1, "auto", "entry -1"),
        ([0], 0, "auto", "hydra.launcher.jobs_per_device=0 is not allowed: expected an integer >= 1"),
        ([0], 1, 0, "hydra.launcher.threads_per_job=0 is not allowed: expected 'auto' or an integer >= 1"),
    ],
)
def test_bad_launcher_settings_name_the_field(devices, jobs_per_device, threads, message):
    with pytest.raises(LauncherConfigError) as info:
        make_slots(devices, jobs_per_device, threads)
    assert message in str(info.value)


def test_bad_launcher_setting_on_the_command_line(tmp_path):
    proc = run_cli(["-m", "hydra.launcher.jobs_per_device=0", *TINY], tmp_path)
    assert proc.returncode != 0
    assert "hydra.launcher.jobs_per_device=0 is not allowed: expected an integer >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_task_reference_unwraps_hydra_main_and_refuses_what_cannot_travel():
    import rlchain.train

    ref = TaskRef.of(rlchain.train.main.__wrapped__)  # what @hydra.main hands the launcher
    assert ref == TaskRef("rlchain.train", "main") and ref.resolve() is rlchain.train.main.__wrapped__
    assert TaskRef.of(rlchain.train.train) is rlchain.train.train  # plain functions pickle as they are
    with pytest.raises(LauncherConfigError, match="define it at the top level of an importable module"):
        TaskRef.of(lambda cfg: 0.0)


# ------------------------------------------------- a 4-job sweep on 2 slots
@pytest.fixture(scope="module")
def cpu_sweep(tmp_path_factory):
    """The GRPO preset cut to 2 learning rates x 2 seeds, on 2 CPU slots; jobs 0 and 1, then 2 and 3, meet."""
    cwd = tmp_path_factory.mktemp("cpu_sweep")
    proc = run_cli([
        "-m", "+sweep=grpo_push_cube", "hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2",
        # command-line values replace the preset's for the same key
        "algorithm.group_size=8", "algorithm.kl_coef=0.0", "algorithm.learning_rate=1e-3,3e-4", "seed=0,1", *SHORT, MEET,
    ], cwd, **barrier_env(2, cwd / "barrier"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return sweep_dir_of(cwd), proc


def test_two_slots_run_exactly_two_jobs_at_a_time(cpu_sweep):
    sweep, proc = cpu_sweep
    runs = summaries(sweep)
    assert sorted(runs) == [0, 1, 2, 3]
    assert all(s["status"] == "completed" and s["exp_name"] == "grpo_push_cube" for s in runs.values())
    records = [s["launcher"] for s in runs.values()]
    assert {r["slot"] for r in records} == {0, 1}
    assert all(r["device"] == "cpu" and r["cuda_visible_devices"] == "" for r in records)
    # every job completed, so each met the other job of its pair at the barrier: two jobs ran at a time;
    # two slots, each running its jobs one after another: never more than two
    assert one_job_at_a_time_per_slot(records)
    # the preset's grid, cut down on the command line, reached the jobs
    configs = [OmegaConf.load(sweep / str(n) / ".hydra" / "config.yaml") for n in runs]
    assert {c.algorithm._target_ for c in configs} == {"rlchain.algorithms.GRPO"}
    assert sorted((c.algorithm.learning_rate, c.seed) for c in configs) == [(3e-4, 0), (3e-4, 1), (1e-3, 0), (1e-3, 1)]
    for n in runs:  # a line as each job starts and ends
        assert f"job {n} started on cpu (slot " in proc.stdout and f"job {n} completed after " in proc.stdout


def test_summary_tables_rank_jobs_and_group_seeds(cpu_sweep):
    sweep, _ = cpu_sweep
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    runs = summaries(sweep)
    objectives = [float(r["objective"]) for r in rows]
    assert objectives == sorted(objectives, reverse=True)
    for row in rows:
        s = runs[int(row["job"])]
        assert row["status"] == "completed" and row["device"] == "cpu"
        assert int(row["global_step"]) == s["global_step"] == 8 * 16 * 8
        assert float(row["final eval success rate"]) == pytest.approx(s["final"]["eval/success_rate"])
        assert float(row["best eval success rate"]) == pytest.approx(s["best_eval_success_rate"])
        assert float(row["final eval return"]) == pytest.approx(s["final"]["eval/avg_reward"])
        assert float(row["wall_s"]) == pytest.approx(s["launcher"]["wall_s"])
        assert {"seed", "algorithm.learning_rate"} <= set(row)  # the overrides that vary, one column each
    md = (sweep / "summary.md").read_text()
    assert "## Configurations over seeds (mean ± std)" in md and "![" in md
    for lr in ("0.001", "0.0003"):
        line = next(line for line in md.splitlines() if line.startswith(f"| algorithm.learning_rate={lr} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:3] == ["2", "2"]  # two seeds, both completed


def test_seed_group_statistics_are_mean_and_sample_std(cpu_sweep):
    import statistics

    sweep, _ = cpu_sweep
    jobs = load_jobs(sweep)
    by_lr: dict[str, list[float]] = {}
    for job in jobs:
        by_lr.setdefault(job.params()["algorithm.learning_rate"], []).append(job.summary["final"]["eval/avg_reward"])
    md = (sweep / "summary.md").read_text()
    for lr, values in by_lr.items():
        line = next(line for line in md.splitlines() if line.startswith(f"| algorithm.learning_rate={lr} |"))
        cell = [c.strip() for c in line.strip("|").split("|")][5]  # final eval return
        mean, std = (float(x) for x in cell.split(" ± "))
        assert mean == pytest.approx(statistics.fmean(values), rel=1e-3, abs=1e-4)
        assert std == pytest.approx(statistics.stdev(values), rel=0.05, abs=1e-2)


def test_rlchain_report_regenerates_tables_and_draws_curves(cpu_sweep, tmp_path):
    sweep, _ = cpu_sweep
    for name in ("summary.csv", "summary.md", "learning_curves.png"):
        (sweep / name).unlink(missing_ok=True)
    proc = run_cli([str(sweep)], tmp_path, module="rlchain.report")
    assert proc.returncode == 0, proc.stderr
    assert "| configuration | jobs | completed |" in proc.stdout
    assert (sweep / "summary.csv").is_file() and (sweep / "summary.md").is_file()
    png = sweep / "learning_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    height, width, _ = imread(png).shape
    assert (width, height) == (960, 576)
    # the plotted data: per learning rate, the mean over both seeds at each eval step
    curves = learning_curves(load_jobs(sweep))
    assert set(curves) == {"learning_rate=0.001", "learning_rate=0.0003"}
    jobs = load_jobs(sweep)
    for label, (steps, mean, std, n) in curves.items():
        lr = label.split("=")[1]
        seeds = [j.curve("eval/success_rate") for j in jobs if float(j.params()["algorithm.learning_rate"]) == float(lr)]
        assert n == 2 and steps == seeds[0][0] == [128.0 * i for i in range(1, 9)]
        assert mean == pytest.approx([(a + b) / 2 for a, b in zip(seeds[0][1], seeds[1][1])])
        assert std is not None and len(std) == len(steps)
    bad = run_cli([str(tmp_path / "nowhere")], tmp_path, module="rlchain.report")
    assert bad.returncode == 2 and "does not exist" in bad.stderr


# ------------------------------------------ pinning, failures, crashes
def test_pinned_devices_and_a_failing_job(tmp_path):
    """devices=[0,1] on a CPU machine: concurrent jobs get distinct CUDA_VISIBLE_DEVICES; failures are recorded."""
    proc = run_cli(["-m", "hydra.launcher.devices=[0,1]", "algorithm.clip_coef=0.2,-1", "seed=0,1", *TINY, MEET],
                   tmp_path, **barrier_env(2, tmp_path / "barrier"))  # fmt: skip
    assert proc.returncode != 0
    assert "algorithm.clip_coef=-1.0 is not allowed: expected a number > 0" in proc.stderr
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert [runs[n]["status"] for n in range(4)] == ["completed", "completed", "failed", "failed"]
    assert "clip_coef=-1.0 is not allowed" in runs[2]["error"]
    records = {n: s["launcher"] for n, s in runs.items()}
    assert all(s["cuda_visible_devices"] == records[n]["cuda_visible_devices"] for n, s in runs.items())
    assert {r["cuda_visible_devices"] for r in records.values()} == {"0", "1"}
    assert all(r["device"] == f"cuda:{r['cuda_visible_devices']}" for r in records.values())
    # each slot is one device, the two slots two devices, and a slot runs one job at a time:
    # jobs that run together see distinct devices, as jobs 0 and 1 did (they met at the barrier)
    assert len({(r["slot"], r["cuda_visible_devices"]) for r in records.values()}) == 2
    assert one_job_at_a_time_per_slot(records.values())
    assert records[0]["cuda_visible_devices"] != records[1]["cuda_visible_devices"]
    with open(sweep / "summary.csv") as f:
        rows = {int(r["job"]): r for r in csv.DictReader(f)}
    assert [rows[n]["status"] for n in range(4)] == ["completed", "completed", "failed", "failed"]
    assert "clip_coef=-1.0 is not allowed" in rows[3]["error"]
    assert list(rows)[:2] in ([0, 1], [1, 0])  # failed jobs (no objective) rank last
    assert "## Failed jobs" in (sweep / "summary.md").read_text()


def test_a_killed_worker_fails_its_job_and_the_sweep_goes_on(tmp_path):
    proc = run_cli(["-m", "env._target_=rlchain.envs.push_cube.PushCubeEnv,user_components.process_killing_env",
                    "seed=0,1", *TINY], tmp_path)  # fmt: skip
    assert proc.returncode != 0
    runs = summaries(sweep_dir_of(tmp_path))
    assert [runs[n]["status"] for n in range(4)] == ["completed", "completed", "failed", "failed"]
    assert "the worker process died" in runs[2]["error"]
    assert runs[3]["launcher"]["slot"] == 0  # a fresh worker took the slot after the first died


def test_ctrl_c_stops_the_workers_and_keeps_finished_work(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(TESTS), "WANDB_MODE": "disabled"}
    args = ["-m", "hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2", "seed=0,1,2,3", *TINY,
            "trainer.iterations=100000", "trainer.eval_freq=1000", "trainer.save_freq=10"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "rlchain.train", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.time() + 120
        while len(list(tmp_path.glob("multirun/*/*/*/metrics.jsonl"))) < 2:
            assert time.time() < deadline and proc.poll() is None, "two jobs never started"
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert sorted(n for n, s in runs.items() if s) == [0, 1]  # jobs 2 and 3 never started
    for n in (0, 1):
        assert runs[n]["status"] == "interrupted" and 0 < runs[n]["iteration"] < 100000
        assert (sweep / str(n) / "checkpoints" / "latest.pt").is_file()
    assert (sweep / "summary.csv").is_file()
    assert "stopping the sweep" in err


# ------------------------------------------------------------- presets
@pytest.mark.parametrize("preset, n_jobs", [("ppo_push_cube", 48), ("grpo_push_cube", 36)])
def test_sweep_presets_compose(preset, n_jobs):
    GlobalHydra.instance().clear()
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"+sweep={preset}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    params = cfg.hydra.sweeper.params
    assert "seed" in params and len(str(params.seed).split(",")) == 3
    total = 1
    for value in params.values():
        total *= len(str(value).split(","))
    assert total == n_jobs
    assert cfg.algorithm._target_.endswith(preset.split("_")[0].upper())
    assert cfg.hydra.launcher._target_ == "hydra_plugins.rlchain_launcher.devices_launcher.DevicesLauncher"


def test_slurm_launcher_option_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    GlobalHydra.instance().clear()
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.partition) == (1, 1, "gpu")


# -------------------------------------------------- Optuna and submitit
def test_optuna_search_runs_batches_in_parallel_and_reports_the_best(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    proc = run_cli(["-m", "+hparams_search=ppo_push_cube_optuna", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2",
                    "hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2", *TINY, MEET],
                   tmp_path, **barrier_env(2, tmp_path / "barrier"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert sorted(runs) == [0, 1, 2, 3] and all(s["status"] == "completed" for s in runs.values())
    results = OmegaConf.load(sweep / "optimization_results.yaml")
    assert set(results.best_params) == {"algorithm.learning_rate", "algorithm.clip_coef", "algorithm.ent_coef",
                                        "algorithm.n_epochs"}  # fmt: skip
    assert results.best_value == max(s["objective"] for s in runs.values())
    assert "Best parameters:" in proc.stdout
    # each batch of n_jobs trials ran side by side: its jobs met at the barrier, so on distinct slots
    for batch in ((0, 1), (2, 3)):
        a, b = (runs[n]["launcher"] for n in batch)
        assert a["slot"] != b["slot"]
    assert (sweep / "summary.csv").is_file()


def test_submitit_local_runs_a_two_job_sweep(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = run_cli(["-m", "hydra/launcher=slurm_local", "seed=0,1", *TINY], tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert sorted(runs) == [0, 1] and all(s["status"] == "completed" for s in runs.values())
    assert all("launcher" not in s and s["device"] == "cpu" for s in runs.values())
    assert list((sweep / ".submitit").iterdir())
    with open(sweep / "summary.csv") as f:
        assert len(list(csv.DictReader(f))) == 2
