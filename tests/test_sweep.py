"""Sweeps: the devices launcher, sweep presets, summary tables, rlchain-report, Optuna and submitit."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from hydra_plugins.rlchain_launcher._slots import make_slots, visible_cuda_devices
from hydra_plugins.rlchain_launcher.config import DevicesLauncherConf, LauncherConfigError
import rlchain.config  # noqa: F401  (registers the schemas the compose() tests need)
from rlchain.report import JobResult, learning_curves, load_jobs
from rlchain.train import build

from conftest import TESTS, TINY, run_cli
from sweep_barrier import barrier_env
from sweep_faults import FAILURE, gate_env

#: A tiny job with eight evaluations, for the summary tables and learning curves.
SHORT = [*TINY, "trainer.iterations=8"]
#: Build each job's env with the barrier of :mod:`sweep_barrier` (give its variables with ``barrier_env``).
MEET = "env._target_=sweep_barrier.meeting_push_cube"


def sweep_dir_of(cwd: Path) -> Path:
    (sweep,) = list((cwd / "multirun").glob("*/*"))
    return sweep


def summaries(sweep: Path) -> dict[int, JobResult]:
    """Each job of the sweep, its run's summary and the launcher's record joined, by job number."""
    return {j.num: j for j in load_jobs(sweep)}


def one_job_at_a_time_per_slot(records) -> bool:
    """Whether each slot's jobs, in start order, each ended before the next one started.

    A slot is one worker process that runs its jobs one after another, and both times
    come from that process's clock: this holds by construction, however loaded the machine.
    """
    by_slot: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        by_slot.setdefault(r.slot, []).append((r.start_time, r.end_time))
    spans = [sorted(s) for s in by_slot.values()]
    return all(end <= start for s in spans for (_, end), (start, _) in zip(s, s[1:]))


# ------------------------------------------------------------------ slots
def test_slots_spread_over_devices_and_share_the_cores():
    slots = make_slots([0, 1], jobs_per_device=2, threads_per_job="auto", visible=["0", "1"])
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
        settings = DevicesLauncherConf(devices=devices, jobs_per_device=jobs_per_device, threads_per_job=threads)
        make_slots(settings.devices, settings.jobs_per_device, settings.threads_per_job)
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["stagger_s", "kill_after_s"])
def test_launcher_durations_are_numbers_of_seconds(name):
    with pytest.raises(LauncherConfigError, match=rf"^hydra.launcher.{name}=-1 is not allowed: expected a number >= 0$"):
        DevicesLauncherConf(**{name: -1})


def test_bad_launcher_setting_on_the_command_line(tmp_path):
    proc = run_cli(["-m", "hydra.launcher.jobs_per_device=0", *TINY], tmp_path)
    assert proc.returncode != 0
    assert "hydra.launcher.jobs_per_device=0 is not allowed: expected an integer >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------- a 4-job sweep on 2 slots
@pytest.fixture(scope="module")
def cpu_sweep(tmp_path_factory):
    """The GRPO preset cut to 2 learning rates x 2 seeds, on 2 CPU slots; jobs 0 and 1, then 2 and 3, meet."""
    cwd = tmp_path_factory.mktemp("cpu_sweep")
    proc = run_cli([
        "-m", "sweep=grpo_push_cube", "hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2",
        # command-line values replace the preset's for the same key
        "algorithm.group_size=8", "algorithm.kl_coef=0.0", "algorithm.learning_rate=1e-3,3e-4", "seed=0,1", *SHORT, "env.episode_length=8", MEET,
    ], cwd, **barrier_env(2, cwd / "barrier"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return sweep_dir_of(cwd), proc


def test_two_slots_run_exactly_two_jobs_at_a_time(cpu_sweep):
    sweep, proc = cpu_sweep
    runs = summaries(sweep)
    assert sorted(runs) == [0, 1, 2, 3]
    assert all(s.status == "completed" and s.summary.exp_name == "grpo_push_cube" for s in runs.values())
    records = [s.record for s in runs.values()]
    assert {r.slot for r in records} == {0, 1}
    assert all(r.device == "cpu" and r.cuda_visible_devices == "" for r in records)
    # every job completed, so each met the other job of its pair at the barrier: two jobs ran at a time;
    # two slots, each running its jobs one after another: never more than two
    assert one_job_at_a_time_per_slot(records)
    # each job trained with its slot's threads (the cores shared out), whatever the worker imported first
    threads = {int((sweep.parent.parent.parent / "barrier" / str(n)).read_text()) for n in runs}
    assert threads == {r.num_threads for r in records} == {max(1, len(os.sched_getaffinity(0)) // 2)}
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
        assert int(row["global_step"]) == s.summary.global_step == 8 * 16 * 8
        assert float(row["final eval success rate"]) == pytest.approx(s.summary.final["eval/success_rate"])
        assert float(row["best eval success rate"]) == pytest.approx(s.summary.best_eval_success_rate)
        assert float(row["final eval return"]) == pytest.approx(s.summary.final["eval/avg_reward"])
        assert float(row["wall_s"]) == pytest.approx(s.record.wall_s)
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
        by_lr.setdefault(job.params()["algorithm.learning_rate"], []).append(job.summary.final["eval/avg_reward"])
    md = (sweep / "summary.md").read_text()
    for lr, values in by_lr.items():
        line = next(line for line in md.splitlines() if line.startswith(f"| algorithm.learning_rate={lr} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        walls = [j.wall_s for j in jobs if j.params()["algorithm.learning_rate"] == lr]
        assert float(cells[3].split(" ± ")[0]) == pytest.approx(statistics.fmean(walls), rel=1e-3)  # wall_s
        mean, std = (float(x) for x in cells[6].split(" ± "))  # final eval return
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


def test_value_at_interpolates_between_evaluations_and_never_extrapolates(tmp_path):
    rows = [{"global_step": 100, "eval/x": 0.2}, {"global_step": 150, "losses/y": 5.0}, {"global_step": 300, "eval/x": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    job = JobResult(0, tmp_path, [], {"global_step": 300})
    assert [job.value_at("eval/x", s) for s in (100, 200, 250, 300)] == pytest.approx([0.2, 0.6, 0.8, 1.0])
    assert job.value_at("eval/x", 99) is None and job.value_at("eval/x", 301) is None
    assert job.value_at("eval/absent", 200) is None


def test_report_gives_the_metric_at_env_step_budgets(cpu_sweep, tmp_path):
    # eval every 128 steps up to 1024: a 300-step budget lies between the evals at
    # 256 and 384, 1024 is the last one; 100 and 2000 lie outside (an empty cell, no mean).
    sweep = shutil.copytree(cpu_sweep[0], tmp_path / "sweep")
    proc = run_cli([str(sweep), "--at-steps", "100", "300", "1024", "2000", "--no-plot"], tmp_path,
                   module="rlchain.report")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with open(sweep / "summary.csv") as f:
        rows = {int(r["job"]): r for r in csv.DictReader(f)}
    for job in load_jobs(sweep):
        steps, values = job.curve("eval/success_rate")
        row = rows[job.num]
        v256, v384 = values[steps.index(256.0)], values[steps.index(384.0)]
        assert float(row["eval/success_rate at 300 steps"]) == pytest.approx(v256 + (v384 - v256) * 44 / 128)
        assert float(row["eval/success_rate at 1.024k steps"]) == pytest.approx(values[-1])
        assert row["eval/success_rate at 100 steps"] == row["eval/success_rate at 2k steps"] == ""
    md = (sweep / "summary.md").read_text()
    assert "| eval/success_rate at 100 steps | eval/success_rate at 300 steps | eval/success_rate at 1.024k steps |" in md
    bad = run_cli([str(sweep), "--at-steps", "0"], tmp_path, module="rlchain.report")
    assert bad.returncode == 2 and "at_steps=[0.0]: expected env-step budgets > 0" in bad.stderr


# ------------------------------------------ pinning, failures, crashes
@pytest.mark.skipif(_cuda_count() < 2, reason="needs two visible CUDA devices")
def test_pinned_devices_give_concurrent_jobs_distinct_gpus(tmp_path):
    """devices=[0,1]: jobs that run together see distinct CUDA_VISIBLE_DEVICES, each as cuda:0."""
    ids = visible_cuda_devices()[:2]
    proc = run_cli([
        "-m", f"hydra.launcher.devices=[{ids[0]},{ids[1]}]", "seed=0,1,2,3", MEET,
        *TINY, "device=auto",
    ], tmp_path, **barrier_env(2, tmp_path / "barrier"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    runs = summaries(sweep_dir_of(tmp_path))
    assert all(s.status == "completed" and s.summary.device == "cuda:0" for s in runs.values())
    records = {n: s.record for n, s in runs.items()}
    assert all(s.summary.cuda_visible_devices == records[n].cuda_visible_devices for n, s in runs.items())
    assert {r.cuda_visible_devices for r in records.values()} == set(ids)
    assert all(r.device == f"cuda:{r.cuda_visible_devices}" for r in records.values())
    # each slot is one device, the two slots two devices, and a slot runs one job at a time:
    # jobs that run together see distinct devices, as jobs 0 and 1 did (they met at the barrier)
    assert len({(r.slot, r.cuda_visible_devices) for r in records.values()}) == 2
    assert one_job_at_a_time_per_slot(records.values())
    assert records[0].cuda_visible_devices != records[1].cuda_visible_devices


def test_cuda_ids_must_be_visible(monkeypatch):
    """A CUDA id the launcher cannot see is refused, naming the field, the value and the visible devices."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(LauncherConfigError) as info:
        make_slots([5], 1, "auto", visible=[])
    assert str(info.value) == (
        "hydra.launcher.devices=[5] is not allowed: CUDA device 5 is not visible; "
        "visible CUDA devices: none (use [cpu] or auto)"
    )
    with pytest.raises(LauncherConfigError, match=r"devices 1, 2 are not visible; visible CUDA devices: 0 \(as nvidia-smi"):
        make_slots([0, 1, 2], 1, "auto", visible=["0"])
    with pytest.raises(LauncherConfigError, match="CUDA device GPU-1a2b is not visible; visible CUDA devices: none"):
        make_slots(["GPU-1a2b"], 1, "auto", visible=[])
    assert [s.device for s in make_slots(["GPU-1a2b", "cpu"], 1, "auto", visible=["0"])] == ["GPU-1a2b", "cpu"]
    assert [s.device for s in make_slots(["cpu"], 2, "auto", visible=[])] == ["cpu", "cpu"]
    # ids as nvidia-smi numbers them: with CUDA_VISIBLE_DEVICES=2,3 in the launcher, 2 and 3 are there, 0 is not
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [s.device for s in make_slots([3, 2], 1, "auto", visible=["2", "3"])] == ["3", "2"]
    assert [s.device for s in make_slots("auto", 1, "auto", visible=["2", "3"])] == ["2", "3"]
    expected = r"CUDA device 0 is not visible; visible CUDA devices: 2, 3 \(the launcher's CUDA_VISIBLE_DEVICES\)"
    with pytest.raises(LauncherConfigError, match=expected):
        make_slots([0], 1, "auto", visible=["2", "3"])


def test_a_cuda_device_that_is_not_there_is_refused_before_any_job(tmp_path):
    missing = _cuda_count() + 5
    proc = run_cli(["-m", f"hydra.launcher.devices=[{missing}]", "seed=0,1", *TINY], tmp_path)
    assert proc.returncode != 0
    assert (f"hydra.launcher.devices=[{missing}] is not allowed: CUDA device {missing} is not visible; "
            "visible CUDA devices: ") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "started on" not in proc.stdout and not list(tmp_path.glob("multirun/*/*/*/summary.json"))


def test_failed_jobs_are_listed_in_one_line_each_and_keep_their_tracebacks(tmp_path):
    """A config error (env.num_envs=0) and a training failure (the env raises): one line each at the end of
    the sweep, the completed job goes on, the tracebacks are in the jobs' own summary.json and log."""
    proc = run_cli(["-m", "hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2",
                    "env._target_=rlchain.envs.PushCubeEnv,sweep_faults.FailingPushCube", "env.num_envs=16,0",
                    *TINY],
                   tmp_path)  # fmt: skip
    assert proc.returncode != 0
    console = proc.stdout + proc.stderr
    assert "Traceback" not in console
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert [runs[n].status for n in range(4)] == ["completed", "failed", "failed", "failed"]
    config_error = "Invalid config: env.num_envs=0 is not allowed: expected an integer > 0"
    expected = {
        1: f"job 1 (env._target_=rlchain.envs.PushCubeEnv env.num_envs=0): {config_error}",
        2: f"job 2 (env._target_=sweep_faults.FailingPushCube env.num_envs=16): RuntimeError: {FAILURE}",
        3: f"job 3 (env._target_=sweep_faults.FailingPushCube env.num_envs=0): {config_error}",
    }
    # at the end of the sweep: one line per failed job, after every job's own start and end lines
    lines = [line.strip() for line in console.splitlines()]
    header = max(i for i, line in enumerate(lines) if "3 job(s) failed" in line)
    assert all("started on" not in line and "completed after" not in line for line in lines[header:])
    for n, line in expected.items():
        assert any(shown.endswith(line) for shown in lines[header + 1:header + 4]), (line, lines[header:])
    # the tracebacks are in each failed job's own summary.json and Hydra job log
    for n in (1, 2, 3):
        assert "Traceback (most recent call last)" in runs[n].summary.traceback
    assert f"RuntimeError: {FAILURE}" in runs[2].summary.traceback and "sweep_faults.py" in runs[2].summary.traceback
    log = (sweep / "2" / "train.log").read_text()
    assert "Traceback (most recent call last)" in log and f"RuntimeError: {FAILURE}" in log
    with open(sweep / "summary.csv") as f:
        rows = {int(r["job"]): r for r in csv.DictReader(f)}
    assert [rows[n]["status"] for n in range(4)] == ["completed", "failed", "failed", "failed"]
    assert rows[2]["error"] == f"RuntimeError: {FAILURE}" and rows[3]["error"] == config_error
    assert list(rows)[0] == 0  # failed jobs (no objective) rank last
    md = (sweep / "summary.md").read_text()
    assert all(f"- {line}" in md for line in expected.values())


def test_sweep_summary_lists_each_failed_job_on_its_own_line(tmp_path):
    """The end of a multirun whose sweeper went on past failures: one line per failed job (a stopped job is none)."""
    import json

    from rlchain.report import SweepFailed, SweepSummary

    jobs = {
        0: (["lr=1", "seed=0"], {"status": "completed", "objective": 0.5}),
        1: (["lr=2", "seed=0"], {"status": "failed", "error": "InstantiationException: Error in call to target:\n"
                                                               "RuntimeError('boom')\nfull_key: env"}),
        2: (["lr=3", "seed=0"], {"status": "aborted", "signal": "SIGINT"}),
        3: (["lr=4", "seed=0"], {"status": "failed", "error": "RuntimeError: out of memory"}),
    }  # fmt: skip
    for num, (overrides, summary) in jobs.items():
        (tmp_path / str(num) / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create(overrides), tmp_path / str(num) / ".hydra" / "overrides.yaml")
        OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}}}), tmp_path / str(num) / ".hydra" / "hydra.yaml")
        (tmp_path / str(num) / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SweepFailed) as info:
        SweepSummary(plot=False).on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert str(info.value).splitlines()[1:3] == [
        "  job 1 (lr=2): InstantiationException: Error in call to target: RuntimeError('boom') full_key: env",
        "  job 3 (lr=4): RuntimeError: out of memory",
    ]
    assert str(info.value).startswith("2 of 4 jobs failed")
    md = (tmp_path / "summary.md").read_text()
    assert "1 interrupted" not in md and "1 aborted, 2 failed or missing" in md


def test_a_killed_worker_fails_its_job_and_the_sweep_goes_on(tmp_path):
    proc = run_cli(["-m", "env._target_=rlchain.envs.push_cube.PushCubeEnv,user_components.process_killing_env",
                    "seed=0,1", *TINY], tmp_path)  # fmt: skip
    assert proc.returncode != 0
    runs = summaries(sweep_dir_of(tmp_path))
    assert [runs[n].status for n in range(4)] == ["completed", "completed", "failed", "failed"]
    assert "the worker process died" in runs[2].error
    assert runs[3].record.slot == 0  # a fresh worker took the slot after the first died


# ------------------------------------------------- signals and orphans
#: Jobs that run until a signal stops them, saving often.
ENDLESS = [*TINY, "trainer.iterations=100000", "trainer.eval_freq=1000", "trainer.save_freq=10"]


def start_sweep(args: list[str], cwd: Path, **env_extra: str) -> subprocess.Popen:
    """``python -m rlchain.train -m *args`` in the background; its stdout and stderr go to files in ``cwd``."""
    env = {**os.environ, "WANDB_MODE": "disabled", **env_extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    env.pop("HYDRA_FULL_ERROR", None)
    with open(cwd / "stdout.txt", "w") as out, open(cwd / "stderr.txt", "w") as err:
        return subprocess.Popen([sys.executable, "-m", "rlchain.train", "-m", *args], cwd=cwd, env=env,
                                stdout=out, stderr=err)  # fmt: skip


@contextlib.contextmanager
def running_sweep(args: list[str], cwd: Path, **env_extra: str) -> Iterator[subprocess.Popen]:
    """:func:`start_sweep`; on the way out (a failed assertion included) the launcher, if it still runs, and
    every worker it leaves behind are killed, so no test leaves a job training."""
    proc = start_sweep(args, cwd, **env_extra)
    workers: list[int] = []
    try:
        yield proc
    finally:
        if proc.poll() is None:
            workers = [pid for pid, cmd in _children(proc.pid).items() if "spawn_main" in cmd]
        proc.kill()
        proc.wait()
        _kill_workers(workers)


def _kill_workers(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid) and "spawn_main" in _cmdline(pid):  # still that worker, not a reused pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def wait_for(condition, what: str, proc: subprocess.Popen | None = None, timeout: float = 120.0) -> None:
    """Poll ``condition()`` until it holds; fail after ``timeout`` s, or at once when ``proc`` has ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the sweep ended (exit status {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def jobs_with_metrics(cwd: Path) -> int:
    """How many jobs of the sweep in ``cwd`` have logged an iteration."""
    return sum(1 for p in cwd.glob("multirun/*/*/*/metrics.jsonl") if p.stat().st_size > 0)


def stderr_of(cwd: Path) -> str:
    return (cwd / "stderr.txt").read_text()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_stops_the_jobs_gracefully_and_keeps_finished_work(tmp_path, sig, code):
    """Ctrl-C or SIGTERM to the launcher: running jobs save and stop after their iteration, no new job starts,
    the tables are written, and the multirun exits with 128 + the signal's number."""
    args = ["hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2", "seed=0,1,2,3", *ENDLESS]
    with running_sweep(args, tmp_path) as proc:
        wait_for(lambda: jobs_with_metrics(tmp_path) == 2, "two jobs logged an iteration", proc)
        proc.send_signal(sig)
        assert proc.wait(timeout=120) == code, stderr_of(tmp_path)
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert sorted(n for n, s in runs.items() if s.summary is not None) == [0, 1]  # jobs 2 and 3 never started
    for n in (0, 1):
        assert runs[n].status == "interrupted" and runs[n].signal == sig.name
        assert 0 < runs[n].summary.iteration < 100000
        assert (sweep / str(n) / "checkpoints" / "latest.pt").is_file()
    with open(sweep / "summary.csv") as f:
        assert {r["job"]: r["status"] for r in csv.DictReader(f)} == {"0": "interrupted", "1": "interrupted"}
    assert f"{sig.name}: stopping the sweep" in stderr_of(tmp_path)


def test_a_second_ctrl_c_aborts_the_jobs_and_the_sweep_exits_130(tmp_path):
    """The jobs are held inside their first iteration: the first Ctrl-C cannot end it, the second aborts them."""
    args = ["hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2", "seed=0,1", *ENDLESS,
            "env._target_=sweep_faults.GatedPushCube"]  # fmt: skip
    with running_sweep(args, tmp_path, **gate_env(tmp_path / "gate")) as proc:
        wait_for(lambda: len(list((tmp_path / "gate").glob("*.waiting"))) == 2, "both jobs reached the gate", proc)
        proc.send_signal(signal.SIGINT)
        # the launcher has forwarded it, and each job's trainer has taken it as its first stop signal (and said so)
        wait_for(lambda: stderr_of(tmp_path).count("stopping after this iteration") == 2,
                 "the first Ctrl-C to reach both jobs", proc)  # fmt: skip
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, stderr_of(tmp_path)
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    for n in (0, 1):
        assert runs[n].status == "aborted" and runs[n].signal == "SIGINT"
        assert not (sweep / str(n) / "checkpoints" / "latest.pt").exists()
    with open(sweep / "summary.csv") as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["aborted", "aborted"]


def test_workers_that_do_not_stop_are_killed_after_kill_after_s(tmp_path):
    """Jobs that ignore SIGINT and SIGTERM: after the second SIGTERM and kill_after_s, the launcher kills them."""
    args = ["hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2", "hydra.launcher.kill_after_s=1",
            "seed=0,1", *ENDLESS, "env._target_=sweep_faults.StubbornPushCube"]  # fmt: skip
    with running_sweep(args, tmp_path) as proc:
        wait_for(lambda: jobs_with_metrics(tmp_path) == 2, "two jobs logged an iteration", proc)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "SIGTERM: stopping the sweep" in stderr_of(tmp_path), "the launcher to take the SIGTERM", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, stderr_of(tmp_path)
    runs = summaries(sweep_dir_of(tmp_path))
    for n in (0, 1):
        assert runs[n].status == "aborted" and runs[n].signal == "SIGTERM"
        assert runs[n].error.startswith("killed by the launcher: it had not stopped 1 s after the second stop")


def _children(pid: int) -> dict[int, str]:
    """``{child pid: command line}`` of the processes whose parent is ``pid`` (from /proc)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children[int(stat.parent.name)] = _cmdline(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return children


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_workers_die_with_their_launcher(tmp_path):
    """kill -9 of the launcher: its workers stop their jobs (recorded as interrupted, latest.pt saved) and exit."""
    args = ["hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2", "seed=0,1", *ENDLESS]
    workers: list[int] = []
    try:
        with running_sweep(args, tmp_path) as proc:
            wait_for(lambda: jobs_with_metrics(tmp_path) == 2, "two jobs logged an iteration", proc)
            # the launcher's children: its two workers (and multiprocessing's resource tracker)
            workers = [pid for pid, cmd in _children(proc.pid).items() if "spawn_main" in cmd]
            assert len(workers) == 2, _children(proc.pid)
            proc.kill()  # kill -9
            proc.wait()
        wait_for(lambda: not any(_alive(pid) for pid in workers), "the orphaned workers to exit")
    finally:
        _kill_workers(workers)  # never leave a worker training
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    for n in (0, 1):
        assert runs[n].status == "interrupted" and runs[n].signal == "SIGTERM"
        assert runs[n].summary.pid in workers  # the launcher, killed, wrote no record of its own
        assert (sweep / str(n) / "checkpoints" / "latest.pt").is_file()


# ------------------------------------------------------------- presets
@pytest.mark.parametrize("preset, n_jobs", [("ppo_push_cube", 48), ("grpo_push_cube", 36)])
def test_sweep_presets_compose(preset, n_jobs):
    GlobalHydra.instance().clear()
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"sweep={preset}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    params = cfg.hydra.sweeper.params
    assert "seed" in params and len(str(params.seed).split(",")) == 3
    total = 1
    for value in params.values():
        total *= len(str(value).split(","))
    assert total == n_jobs
    assert cfg.algorithm._target_.endswith(preset.split("_")[0].upper())
    assert cfg.hydra.launcher._target_ == "hydra_plugins.rlchain_launcher.devices_launcher.DevicesLauncher"


@pytest.mark.parametrize("env, budget", [("push_cube", 5.12e6), ("cart_pole", 3.0e5)])
def test_the_study_presets_compare_ppo_and_grpo_arms_at_one_budget(compose_cfg, env, budget):
    GlobalHydra.instance().clear()
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"sweep=ppo_vs_grpo_{env}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    arms = str(params["study"]).split(",")
    assert len(arms) == 7 and str(params.seed) == "0,1,2"
    assert list(cfg.hydra.callbacks.sweep_summary.at_steps)[-1] <= budget
    seen = set()
    for arm in arms:
        arm_cfg = compose_cfg([f"study={arm}"])
        steps = arm_cfg.trainer.iterations * arm_cfg.trainer.rollout_steps * arm_cfg.env.num_envs
        assert steps == pytest.approx(budget, rel=0.02), arm
        algorithm = arm_cfg.algorithm
        seen.add((algorithm._target_.rsplit(".", 1)[1], algorithm.get("group_size"), algorithm.get("advantage_norm")))
        build(arm_cfg)  # every arm is accepted (group sizes divide num_envs, GRPO rollouts hold an episode)
    grpo = {(g, n) for name, g, n in seen if name == "GRPO"}
    assert ("PPO", None, None) in seen and len(seen) == 7
    assert {g for g, n in grpo if n == "std"} == {2, 4, 8, 16} and {n for g, n in grpo if g == 8} == {"std", "none", "rollout_std"}


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
    proc = run_cli(["-m", "hparams_search=ppo_push_cube_optuna", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2",
                    "hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=2", *TINY, MEET],
                   tmp_path, **barrier_env(2, tmp_path / "barrier"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert sorted(runs) == [0, 1, 2, 3] and all(s.status == "completed" for s in runs.values())
    results = OmegaConf.load(sweep / "optimization_results.yaml")
    assert set(results.best_params) == {"algorithm.learning_rate", "algorithm.clip_coef", "algorithm.ent_coef",
                                        "algorithm.n_epochs"}  # fmt: skip
    assert results.best_value == max(s.summary.objective for s in runs.values())
    assert "Best parameters:" in proc.stdout
    # each batch of n_jobs trials ran side by side: its jobs met at the barrier, so on distinct slots
    for batch in ((0, 1), (2, 3)):
        a, b = (runs[n].record for n in batch)
        assert a.slot != b.slot
    assert (sweep / "summary.csv").is_file()


def test_submitit_local_runs_a_two_job_sweep(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = run_cli(["-m", "hydra/launcher=slurm_local", "seed=0,1", *TINY], tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert sorted(runs) == [0, 1] and all(s.status == "completed" for s in runs.values())
    assert all(s.record is None and s.summary.device == "cpu" for s in runs.values())
    assert list((sweep / ".submitit").iterdir())
    with open(sweep / "summary.csv") as f:
        assert len(list(csv.DictReader(f))) == 2
