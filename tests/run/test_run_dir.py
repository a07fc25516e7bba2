"""Run directories: one per run, never shared, one line when one cannot be used."""

from __future__ import annotations

import re

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from tests.helpers.runs import TINY, USER, run_cli, summary_of


def test_a_run_directory_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    proc = run_cli([*USER, f"hydra.run.dir={tmp_path / 'a_file' / 'run'}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"rlchain: cannot create the run directory {tmp_path / 'a_file' / 'run'}: Not a directory" in proc.stderr


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


@pytest.mark.slow
def test_a_fresh_run_refuses_a_directory_that_holds_a_run_and_a_resume_is_let_in(tmp_path):
    run = tmp_path / "run"
    assert run_cli([*USER, "seed=1", f"hydra.run.dir={run}"], tmp_path).returncode == 0
    config = (run / ".hydra" / "config.yaml").read_text()
    proc = run_cli([*USER, "seed=2", f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"rlchain: {run} already holds a run (summary.json)" in proc.stderr
    assert (run / ".hydra" / "config.yaml").read_text() == config  # seed 1's config is not lost
    resumed = run_cli(
        [*USER, "seed=1", f"hydra.run.dir={run}", "trainer.resume_from=auto", "trainer.iterations=3"], tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr


def test_a_refused_run_leaves_the_summary_of_the_run_it_found(compose_cfg, tmp_path):
    # Inside a sweep the trainer itself refuses the directory (the run-dir check of a
    # single run comes earlier); the run it found keeps its summary.json.
    from rlchain.commands.train import ConfigError, train

    assert train(compose_cfg(TINY)).status == "completed"
    before = (tmp_path / "summary.json").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):
        train(compose_cfg([*TINY, "seed=5"]))
    assert (tmp_path / "summary.json").read_text() == before


@pytest.mark.slow
def test_a_single_run_refused_before_its_first_step_leaves_no_directory(tmp_path):
    # Each refused command left outputs/<date>/<time>_<id>/ behind (13 in one session).
    proc = run_cli([*USER, "trainer.iterations=0"], tmp_path)
    assert proc.returncode == 1 and "Invalid config: trainer.iterations=0 is not allowed" in proc.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_a_run_refused_before_its_first_step_does_not_block_the_corrected_command(tmp_path):
    # With a fixed run directory the corrected command was refused: the directory "held a run" that never stepped.
    run = tmp_path / "run"
    (tmp_path / "multirun").mkdir()
    sweep = ["-m", *USER, "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path / 'multirun' / 'sweep'}"]
    assert run_cli([*sweep, "trainer.iterations=0"], tmp_path).returncode == 1
    assert summary_of(tmp_path / "multirun" / "sweep" / "0").status == "failed"  # the sweep tables list it
    assert run_cli(sweep, tmp_path).returncode == 0
    assert summary_of(tmp_path / "multirun" / "sweep" / "0").status == "completed"
    assert run_cli([*USER, f"hydra.run.dir={run}", "trainer.iterations=0"], tmp_path).returncode == 1
    proc = run_cli([*USER, f"hydra.run.dir={run}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert summary_of(run).status == "completed"
