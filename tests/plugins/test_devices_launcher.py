"""The devices launcher: slots, parallel jobs, failures, stop signals, orphans, other sweepers."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hydra_plugins.rlchain_launcher._slots import make_slots, visible_cuda_devices
from hydra_plugins.rlchain_launcher.config import DevicesLauncherConf, LauncherConfigError
from tests.helpers.runs import MEET, TINY, run_cli, subprocess_env, summaries, sweep_dir_of, wait_for
from tests.helpers.sweep_barrier import barrier_env
from tests.helpers.sweep_faults import FAILURE, gate_env


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


def test_slots_spread_over_devices_and_share_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
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


def test_devices_per_job_gives_each_job_a_group_of_devices_and_shares_the_cores_over_its_processes(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    slots = make_slots([0, 1, 2, 3], 2, "auto", devices_per_job=2, visible=["0", "1", "2", "3"])
    assert [s.environ()["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0,1", "2,3", "0,1", "2,3"]
    assert [s.label for s in slots] == ["cuda:0,1", "cuda:2,3", "cuda:0,1", "cuda:2,3"] and {
        s.ranks for s in slots
    } == {2}
    assert {s.num_threads for s in slots} == {max(1, len(os.sched_getaffinity(0)) // 8)}
    assert [(s.device, s.ranks) for s in make_slots(["cpu"], 1, 1, devices_per_job=2)] == [("cpu", 2)]
    with pytest.raises(LauncherConfigError, match=r"devices_per_job=2 is not allowed with devices \['0', '1', '2'\]"):
        make_slots([0, 1, 2], 1, "auto", devices_per_job=2, visible=["0", "1", "2"])
    with pytest.raises(LauncherConfigError, match="devices_per_job=0 is not allowed: expected an integer >= 1"):
        DevicesLauncherConf(devices_per_job=0)


@pytest.mark.slow
def test_a_sweep_of_two_jobs_of_two_processes_each(tmp_path):
    """devices_per_job=2 on the CPU: each job is one run trained by two ranks; only rank 0 wrote its files."""
    proc = run_cli(
        [
            "-m",
            "seed=0,1",
            "hydra.launcher.devices=[cpu]",
            "hydra.launcher.devices_per_job=2",
            "hydra.launcher.threads_per_job=1",
            *TINY,
            "device=cpu",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 slot(s) (cpu; 2 processes of 1 thread(s) each)" in proc.stdout
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert sorted(runs) == [0, 1]
    for job in runs.values():
        assert (job.status, job.summary.world_size, job.summary.global_step) == ("completed", 2, 2 * 2 * 8 * 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["multirun"]
    assert proc.stdout.count("rlchain: completed") == 2


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


@pytest.mark.slow
def test_an_exported_omp_num_threads_is_each_jobs_thread_count(tmp_path):
    # the launcher set every job's OMP_NUM_THREADS to cores // slots, over the one the user had exported
    exported = max(1, len(os.sched_getaffinity(0)) // 2) + 1  # not what auto would share out
    proc = run_cli(
        [
            "-m",
            "seed=0,1",
            "hydra.launcher.devices=[cpu]",
            "hydra.launcher.jobs_per_device=2",
            *TINY,
            "env.max_episode_steps=8",
            MEET,
        ],
        tmp_path,
        OMP_NUM_THREADS=str(exported),
        **barrier_env(1, tmp_path / "barrier"),
    )
    assert proc.returncode == 0, proc.stderr
    runs = summaries(sweep_dir_of(tmp_path))
    assert sorted(runs) == [0, 1] and {r.record.num_threads for r in runs.values()} == {exported}
    assert {int((tmp_path / "barrier" / str(n)).read_text()) for n in runs} == {exported}  # torch's threads in the job
    assert f"2 slot(s) (cpu; {exported} thread(s) each, as exported in OMP_NUM_THREADS)" in proc.stdout


def test_threads_per_job_wins_over_an_exported_omp_num_threads_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert {s.environ()["OMP_NUM_THREADS"] for s in make_slots(["cpu"], 2, "auto")} == {"3"}
    assert {s.environ()["OMP_NUM_THREADS"] for s in make_slots(["cpu"], 2, 2)} == {"2"}
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")
    with pytest.raises(
        LauncherConfigError,
        match=r"^OMP_NUM_THREADS='4,2', exported to the launcher, is not allowed "
        r"with hydra.launcher.threads_per_job='auto'",
    ):
        make_slots(["cpu"], 2, "auto")
    assert make_slots(["cpu"], 2, 1)[0].num_threads == 1


@pytest.mark.parametrize("name", ["stagger_s", "kill_after_s"])
def test_launcher_durations_are_numbers_of_seconds(name):
    with pytest.raises(
        LauncherConfigError, match=rf"^hydra.launcher.{name}=-1 is not allowed: expected a number >= 0$"
    ):
        DevicesLauncherConf(**{name: -1})


def test_bad_launcher_setting_on_the_command_line(tmp_path):
    proc = run_cli(["-m", "hydra.launcher.jobs_per_device=0", *TINY], tmp_path)
    assert proc.returncode != 0
    assert "hydra.launcher.jobs_per_device=0 is not allowed: expected an integer >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
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
    assert {c.algorithm._target_ for c in configs} == {"rlchain.core.algorithms.GRPO"}
    assert sorted((c.algorithm.learning_rate, c.seed) for c in configs) == [(3e-4, 0), (3e-4, 1), (1e-3, 0), (1e-3, 1)]
    for n in runs:  # a line as each job starts and ends
        assert f"job {n} started on cpu (slot " in proc.stdout and f"job {n} completed after " in proc.stdout


@pytest.mark.skipif(_cuda_count() < 2, reason="needs two visible CUDA devices")
def test_pinned_devices_give_concurrent_jobs_distinct_gpus(tmp_path):
    """devices=[0,1]: jobs that run together see distinct CUDA_VISIBLE_DEVICES, each as cuda:0."""
    ids = visible_cuda_devices()[:2]
    proc = run_cli(
        [
            "-m",
            f"hydra.launcher.devices=[{ids[0]},{ids[1]}]",
            "seed=0,1,2,3",
            MEET,
            *TINY,
            "device=auto",
        ],
        tmp_path,
        **barrier_env(2, tmp_path / "barrier"),
    )
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
    with pytest.raises(
        LauncherConfigError, match=r"devices 1, 2 are not visible; visible CUDA devices: 0 \(as nvidia-smi"
    ):
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
    assert (
        f"hydra.launcher.devices=[{missing}] is not allowed: CUDA device {missing} is not visible; "
        "visible CUDA devices: "
    ) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "started on" not in proc.stdout and not list(tmp_path.glob("multirun/*/*/*/summary.json"))


@pytest.mark.slow
def test_failed_jobs_are_listed_in_one_line_each_and_keep_their_tracebacks(tmp_path):
    """A config error (env.num_envs=0) and a training failure (the env raises): one line each at the end of
    the sweep, the completed job goes on, the tracebacks are in the jobs' own summary.json and log."""
    proc = run_cli(
        [
            "-m",
            "hydra.launcher.devices=[cpu]",
            "hydra.launcher.jobs_per_device=2",
            "env._target_=rlchain.core.envs.PushCubeEnv,tests.helpers.sweep_faults.FailingPushCube",
            "env.num_envs=16,0",
            *TINY,
        ],
        tmp_path,
    )
    assert proc.returncode != 0
    console = proc.stdout + proc.stderr
    assert "Traceback" not in console
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert [runs[n].status for n in range(4)] == ["completed", "failed", "failed", "failed"]
    config_error = "Invalid config: env.num_envs=0 is not allowed: expected an integer > 0"
    expected = {
        1: f"job 1 (env._target_=rlchain.core.envs.PushCubeEnv env.num_envs=0): {config_error}",
        2: f"job 2 (env._target_=tests.helpers.sweep_faults.FailingPushCube env.num_envs=16): RuntimeError: {FAILURE}",
        3: f"job 3 (env._target_=tests.helpers.sweep_faults.FailingPushCube env.num_envs=0): {config_error}",
    }
    # at the end of the sweep: one line per failed job, after every job's own start and end lines
    lines = [line.strip() for line in console.splitlines()]
    header = max(i for i, line in enumerate(lines) if "3 job(s) failed" in line)
    assert all("started on" not in line and "completed after" not in line for line in lines[header:])
    for line in expected.values():
        assert any(shown.endswith(line) for shown in lines[header + 1 : header + 4]), (line, lines[header:])
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


@pytest.mark.slow
def test_a_killed_worker_fails_its_job_and_the_sweep_goes_on(tmp_path):
    proc = run_cli(
        [
            "-m",
            "env._target_=rlchain.core.envs.push_cube.PushCubeEnv,tests.helpers.user_components.process_killing_env",
            "seed=0,1",
            *TINY,
        ],
        tmp_path,
    )
    assert proc.returncode != 0
    runs = summaries(sweep_dir_of(tmp_path))
    assert [runs[n].status for n in range(4)] == ["completed", "completed", "failed", "failed"]
    assert "the worker process died" in runs[2].error
    assert runs[3].record.slot == 0  # a fresh worker took the slot after the first died


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
@pytest.mark.slow
def test_a_worker_that_died_while_idle_is_replaced_for_the_next_job(tmp_path):
    # batches of 2 on 2 slots: in the first, job 1 kills job 0's worker once it is idle; the second batch's
    # job must run on a fresh worker in that slot, not end the sweep with the dead pool's error
    proc = run_cli(
        [
            "-m",
            "hydra.launcher.devices=[cpu]",
            "hydra.launcher.jobs_per_device=2",
            "hydra.sweeper.max_batch_size=2",
            "env._target_=tests.helpers.sweep_faults.killing_an_idle_worker",
            "seed=0,1,2",
            *TINY,
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    runs = summaries(sweep_dir_of(tmp_path))
    assert [runs[n].status for n in range(3)] == ["completed"] * 3
    assert runs[2].record.pid != runs[0].record.pid and (sweep_dir_of(tmp_path) / "worker_of_job_0.killed").exists()


#: Jobs that run until a signal stops them, saving often.
ENDLESS = [*TINY, "trainer.iterations=100000", "trainer.eval_freq=1000", "trainer.save_freq=10"]


def start_sweep(args: list[str], cwd: Path, **env_extra: str) -> subprocess.Popen:
    """``python -m rlchain -m *args`` in the background; its stdout and stderr go to files in ``cwd``."""
    with open(cwd / "stdout.txt", "w") as out, open(cwd / "stderr.txt", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "rlchain", "-m", *args],
            cwd=cwd,
            env=subprocess_env(**env_extra),
            stdout=out,
            stderr=err,
        )


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


def jobs_with_metrics(cwd: Path) -> int:
    """How many jobs of the sweep in ``cwd`` have logged an iteration."""
    return sum(1 for p in cwd.glob("multirun/*/*/*/metrics.jsonl") if p.stat().st_size > 0)


def stderr_of(cwd: Path) -> str:
    return (cwd / "stderr.txt").read_text()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
@pytest.mark.slow
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


@pytest.mark.slow
def test_a_second_ctrl_c_aborts_the_jobs_and_the_sweep_exits_130(tmp_path):
    """The jobs are held inside their first iteration: the first Ctrl-C cannot end it, the second aborts them."""
    args = [
        "hydra.launcher.devices=[cpu]",
        "hydra.launcher.jobs_per_device=2",
        "seed=0,1",
        *ENDLESS,
        "env._target_=tests.helpers.sweep_faults.GatedPushCube",
    ]
    with running_sweep(args, tmp_path, **gate_env(tmp_path / "gate")) as proc:
        wait_for(lambda: len(list((tmp_path / "gate").glob("*.waiting"))) == 2, "both jobs reached the gate", proc)
        proc.send_signal(signal.SIGINT)
        # the launcher has forwarded it, and each job's trainer has taken it as its first stop signal (and said so)
        wait_for(
            lambda: stderr_of(tmp_path).count("stopping after this iteration") == 2,
            "the first Ctrl-C to reach both jobs",
            proc,
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, stderr_of(tmp_path)
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    for n in (0, 1):
        assert runs[n].status == "aborted" and runs[n].signal == "SIGINT"
        assert not (sweep / str(n) / "checkpoints" / "latest.pt").exists()
    with open(sweep / "summary.csv") as f:
        assert [r["status"] for r in csv.DictReader(f)] == ["aborted", "aborted"]


@pytest.mark.slow
def test_workers_that_do_not_stop_are_killed_after_kill_after_s(tmp_path):
    """Jobs that ignore SIGINT and SIGTERM: after the second SIGTERM and kill_after_s, the launcher kills them."""
    args = [
        "hydra.launcher.devices=[cpu]",
        "hydra.launcher.jobs_per_device=2",
        "hydra.launcher.kill_after_s=1",
        "seed=0,1",
        *ENDLESS,
        "env._target_=tests.helpers.sweep_faults.StubbornPushCube",
    ]
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
@pytest.mark.slow
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


@pytest.mark.slow
def test_optuna_search_runs_trials_in_parallel_and_reports_the_best(tmp_path):
    """The preset's search on 2 slots: trials run side by side (pairs meet at a barrier, so on distinct slots),
    each a trial of the study, and optimization_results.yaml names the best."""
    proc = run_cli(
        [
            "-m",
            "hparams_search=ppo_push_cube_optuna",
            "hydra.sweeper.n_trials=4",
            "hydra.launcher.devices=[cpu]",
            "hydra.launcher.jobs_per_device=2",
            *TINY,
            MEET,
        ],
        tmp_path,
        **barrier_env(2, tmp_path / "barrier"),
    )
    assert proc.returncode == 0, proc.stderr
    sweep = sweep_dir_of(tmp_path)
    runs = summaries(sweep)
    assert sorted(runs) == [0, 1, 2, 3] and all(s.status == "completed" for s in runs.values())
    results = OmegaConf.load(sweep / "optimization_results.yaml")
    assert set(results.best_params) == {
        "algorithm.learning_rate",
        "algorithm.clip_coef",
        "algorithm.ent_coef",
        "algorithm.n_epochs",
    }
    assert results.best_value == max(s.summary.objective for s in runs.values())
    assert results.trials == {"complete": 4} and results.study_name == "ppo_push_cube"
    # each job's return names its directory (hydra.runtime.output_dir), as Hydra's own launchers' do
    assert results.best_job_dir == str(sweep.resolve() / str(results.best_trial))
    assert "optimization_results.yaml: 4 complete; best" in proc.stdout + proc.stderr
    a, b = (runs[n].record for n in (0, 1))
    assert a.slot != b.slot
    assert (sweep / "summary.csv").is_file() and (sweep / "optimization_history.png").is_file()


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_submitit_job_of_two_tasks_trains_one_run_over_both(tmp_path):
    """tasks_per_node=2 (slurm.yaml's recipe for several GPUs or nodes per job): one run of world size 2."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = run_cli(
        ["-m", "hydra/launcher=slurm_local", "hydra.launcher.tasks_per_node=2", "seed=0", *TINY, "device=cpu"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    (job,) = summaries(sweep_dir_of(tmp_path)).values()
    assert (job.status, job.summary.world_size, job.summary.global_step) == ("completed", 2, 2 * 2 * 8 * 16)


@pytest.mark.slow
def test_ctrl_c_stops_an_optuna_search_and_the_same_command_resumes_it(tmp_path):
    """Ctrl-C while two trials train: both stop after their iteration and are failed in the study as interrupted
    (not counted), the results are written, the sweep exits 130; the same command then runs the whole budget."""
    import optuna
    from optuna.trial import TrialState

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    search = [
        "hparams_search=ppo_push_cube_optuna",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.n_trials=2",
        "hydra.launcher.devices=[cpu]",
        "hydra.launcher.jobs_per_device=2",
    ]
    with running_sweep([*search, *ENDLESS], tmp_path) as proc:
        wait_for(lambda: jobs_with_metrics(tmp_path) == 2, "two trials logged an iteration", proc)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, stderr_of(tmp_path)
    study = optuna.load_study(study_name="ppo_push_cube", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    assert {t.user_attrs["status"] for t in study.trials} == {"interrupted"}
    sweep = sweep_dir_of(tmp_path)
    assert "fail: 2" in (sweep / "optimization_results.yaml").read_text()
    assert {n: r.status for n, r in summaries(sweep).items()} == {0: "interrupted", 1: "interrupted"}

    again = run_cli(["-m", *search, *TINY, "hydra.sweep.dir=resumed"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    study = optuna.load_study(study_name="ppo_push_cube", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 2 + [TrialState.COMPLETE] * 2
