"""How a run ended: summary.json's one type, the launcher's job records, stop signals and exit codes."""

from __future__ import annotations

import json
import signal

import pytest

import _rlchain_cli
from rlchain.commands.report import load_jobs
from rlchain.run.summary import STOP_SIGNALS, JobRecord, RunSummary, placement, signal_exit_code


def test_a_summary_is_written_once_and_read_back_as_it_was(tmp_path):
    summary = RunSummary(
        status="interrupted",
        signal="SIGTERM",
        global_step=4096,
        final={"eval/success_rate": 0.5},
        checkpoints={"latest": "checkpoints/latest.pt"},
        **placement("cpu"),
    )
    path = summary.write(tmp_path)
    assert path == tmp_path / "summary.json" and not list(tmp_path.glob(".*.tmp"))
    assert RunSummary.read(tmp_path) == summary
    assert json.loads(path.read_text())["status"] == "interrupted"  # plain JSON for any other reader
    assert RunSummary.read(tmp_path / "nowhere") is None


def test_a_summary_of_another_version_or_a_torn_one_is_read_without_failing(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "global_step": 8, "a_field_of_later": 1}))
    assert RunSummary.read(tmp_path) == RunSummary(status="completed", global_step=8)
    (tmp_path / "summary.json").write_text('{"status": "compl')  # cut by a kill, from a writer that was not atomic
    torn = RunSummary.read(tmp_path)
    assert torn.status == "unreadable" and "summary.json" in torn.error


@pytest.mark.parametrize(
    "status, sig, code",
    [
        ("completed", None, 0),
        ("failed", None, 1),
        ("interrupted", "SIGINT", 130),
        ("aborted", "SIGTERM", 143),
        ("interrupted", "SIGUSR2", 140),
    ],
)
def test_the_exit_code_of_a_run_says_how_it_ended(status, sig, code):
    assert RunSummary(status=status, signal=sig).exit_code == code


def test_signal_names_and_exit_codes_have_one_home():
    assert STOP_SIGNALS == (signal.SIGINT, signal.SIGTERM)
    assert signal_exit_code("SIGINT") == signal_exit_code(signal.SIGINT) == 130 and signal_exit_code("SIGTERM") == 143
    assert _rlchain_cli.SIGINT_EXIT == signal_exit_code("SIGINT")  # the command's wrapper cannot import it first


def test_the_launchers_records_are_joined_with_the_runs_own_summaries(tmp_path):
    from omegaconf import OmegaConf

    for num in (0, 1, 2):
        (tmp_path / str(num) / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create([f"seed={num}"]), tmp_path / str(num) / ".hydra" / "overrides.yaml")
        OmegaConf.save(
            OmegaConf.create({"hydra": {"job": {"num": num}}}), tmp_path / str(num) / ".hydra" / "hydra.yaml"
        )
    RunSummary(status="completed", device="cuda:0", elapsed_s=10.0).write(tmp_path / "0")
    RunSummary(status="interrupted", signal="SIGINT", elapsed_s=5.0).write(tmp_path / "1")
    JobRecord(job=0, status="completed", device="cuda:3", wall_s=12.5).append(tmp_path)
    JobRecord(
        job=2,
        status="aborted",
        signal="SIGINT",
        error="killed by the launcher: a third stop signal (SIGINT) came",
        device="cuda:1",
        wall_s=3.0,
    ).append(tmp_path)
    with open(tmp_path / "launcher.jsonl", "a") as f:
        f.write('{"job": 1, "status": "compl')  # a line torn by a kill of the launcher
    jobs = {job.num: job for job in load_jobs(tmp_path)}
    # the run's own word first; the launcher's record for what only it knows (its slot's device, the wall time)
    assert (jobs[0].status, jobs[0].device, jobs[0].wall_s) == ("completed", "cuda:3", 12.5)
    assert (jobs[1].status, jobs[1].signal, jobs[1].record, jobs[1].wall_s) == ("interrupted", "SIGINT", None, 5.0)
    assert (jobs[2].status, jobs[2].signal, jobs[2].summary) == ("aborted", "SIGINT", None)
    assert jobs[2].error.startswith("killed by the launcher") and not jobs[2].failed
    assert JobRecord.read_all(tmp_path).keys() == {0, 2}
