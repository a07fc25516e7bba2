"""Checkpoints: atomic writes, a full disk, a directory that cannot be written."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys

import pytest
import torch

from rlchain.run.checkpoint import Checkpoints, save_checkpoint
from tests.helpers.runs import USER, run_cli, subprocess_env, summary_of


@pytest.mark.slow
def test_a_checkpoint_directory_that_cannot_be_written_fails_the_run_in_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("a file where the checkpoint directory should be")
    proc = run_cli([*USER, f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "rlchain: failed: FileExistsError: " in proc.stderr and str(run / "checkpoints") in proc.stderr
    assert summary_of(run).status == "failed"


@pytest.mark.slow
def test_a_full_disk_keeps_the_last_good_checkpoint_and_fails_in_one_line(tmp_path):
    run = tmp_path / "run"
    first = run_cli([*USER, f"hydra.run.dir={run}"], tmp_path)
    assert first.returncode == 0, first.stderr
    good = (run / "checkpoints" / "latest.pt").read_bytes()
    assert len(good) > 64 * 1024  # larger than the limit below: the next save cannot fit

    def small_files() -> None:  # every file this process writes stays under 64 KiB, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlchain",
            *USER,
            "trainer.iterations=4",
            f"hydra.run.dir={run}",
            "trainer.resume_from=auto",
        ],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=small_files,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"rlchain: failed: OSError: [Errno 27] cannot write the checkpoint {run / 'checkpoints'}" in proc.stderr
    assert "File too large" in proc.stderr
    assert (run / "checkpoints" / "latest.pt").read_bytes() == good
    assert not list((run / "checkpoints").glob(".*.tmp"))
    assert summary_of(run).status == "failed"


def _state(step: int, best_step: int | None, best: float | None, best_id: str | None = None) -> dict:
    """The keys of a trainer checkpoint that ``Checkpoints.align_best`` reads, and a marker tensor."""
    return {
        "global_step": step,
        "best_objective_step": best_step,
        "best_objective": best,
        "best_objective_id": best_id,
        "mark": torch.tensor(step),
    }


def _step_of(path) -> int:
    return torch.load(path, weights_only=True)["global_step"]


def test_best_is_written_with_latest_so_it_is_never_ahead_of_it(tmp_path):
    checkpoints = Checkpoints(tmp_path / "checkpoints")
    checkpoints.save_best(_state(64, 64, 1.0))
    assert _step_of(checkpoints.latest) == _step_of(checkpoints.best) == 64
    assert checkpoints.files() == {"latest": str(checkpoints.latest), "best": str(checkpoints.best)}


def test_a_resume_makes_best_the_checkpoint_its_state_names(tmp_path):
    run = Checkpoints(tmp_path / "run" / "checkpoints")
    other = Checkpoints(tmp_path / "other" / "checkpoints")
    # best.pt of a branch the resume discards (step 96) while the resumed state's best is its own step (64)
    save_checkpoint(run.best, _state(96, 96, 3.0))
    state = _state(64, 64, 2.0)
    save_checkpoint(run.latest, state)
    assert run.align_best(state, run.latest) and _step_of(run.best) == 64
    # the state's best is an earlier evaluation whose best.pt lies beside the source, in another run directory
    save_checkpoint(other.best, _state(32, 32, 1.5))
    save_checkpoint(other.latest, _state(48, 32, 1.5))
    assert run.align_best(_state(48, 32, 1.5), other.latest) and _step_of(run.best) == 32
    # a best.pt that already is the one: kept as it is
    before = run.best.read_bytes()
    assert run.align_best(_state(48, 32, 1.5), run.latest) and run.best.read_bytes() == before
    # nowhere to be found: best.pt goes, and the caller forgets that best
    assert not run.align_best(_state(48, 16, 0.5), run.latest) and not run.best.exists()
    # a state without a best evaluation: a best.pt would be of a discarded branch
    save_checkpoint(run.best, _state(96, 96, 3.0))
    assert run.align_best(_state(8, None, None), run.latest) and not run.best.exists()


def test_a_later_checkpoint_that_carries_the_bests_id_is_not_taken_for_the_best(tmp_path):
    # latest.pt of step 48 names its best (step 32, id "b") and no best.pt lies anywhere: latest.pt is not it.
    run = Checkpoints(tmp_path / "run" / "checkpoints")
    state = _state(48, 32, 1.5, "b")
    save_checkpoint(run.latest, state)
    assert not run.align_best(state, run.latest) and not run.best.exists()
    # the same state read from the best's own checkpoint (written at step 32) is taken
    save_checkpoint(tmp_path / "best-of-b.pt", _state(32, 32, 1.5, "b"))
    assert run.align_best(_state(32, 32, 1.5, "b"), tmp_path / "best-of-b.pt") and _step_of(run.best) == 32


def test_creating_the_checkpoints_removes_the_temporary_files_of_a_torn_save(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / ".latest.pt.k9x2.tmp").write_bytes(b"torn")
    Checkpoints(directory)
    assert not list(directory.glob(".*.tmp"))


def test_a_best_of_another_run_with_the_same_step_and_value_is_not_taken_for_the_resumed_ones(tmp_path):
    # Evaluations fall on the same steps in every run and success rates take few values: the id tells them apart.
    run = Checkpoints(tmp_path / "run" / "checkpoints")
    save_checkpoint(run.best, _state(1024, 1024, 1.0, "of-this-directory"))
    source = tmp_path / "other" / "checkpoints" / "latest.pt"
    save_checkpoint(source, _state(1024, 1024, 1.0, "of-the-resumed-run"))
    assert run.align_best(_state(1024, 1024, 1.0, "of-the-resumed-run"), source)
    assert torch.load(run.best, weights_only=True)["best_objective_id"] == "of-the-resumed-run"


def test_written_files_get_the_mode_open_would_give_them(tmp_path):
    # Atomic writes go through mkstemp, whose files are 0o600: a run's checkpoints, summary and exported
    # policies were unreadable to the rest of a team sharing the run directory.
    from rlchain.files import write_json

    save_checkpoint(tmp_path / "ckpt.pt", {"x": torch.zeros(1)})
    write_json(tmp_path / "summary.json", {"status": "completed"})
    with open(tmp_path / "plain.txt", "w"):
        pass
    plain = (tmp_path / "plain.txt").stat().st_mode & 0o777
    if plain == 0o600:
        pytest.skip("this process's umask (0o077) gives every file 0o600: nothing to tell apart")
    assert {(tmp_path / name).stat().st_mode & 0o777 for name in ("ckpt.pt", "summary.json")} == {plain}
