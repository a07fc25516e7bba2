"""rlchain's Optuna sweeper (hydra/sweeper=rlchain_optuna): search space, resumable studies, idle slots, bad input.

Most sweeps run the small app of :mod:`tests.helpers.optuna_app` (Hydra and Optuna, no torch); the pruning
test runs rlchain-train itself. Every study is a real sqlite database or journal file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.rlchain_optuna._space import SweeperError, grid_of, search_space
from rlchain.report import load_jobs
from rlchain.summary import JobRecord, RunSummary
from rlchain.tuning import open_storage
from tests.helpers.runs import run_cli, subprocess_env

APP = "tests.helpers.optuna_app"
SWEEP = ["-m", "hydra/sweeper=rlchain_optuna"]


def app(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the app's multirun in ``tmp_path`` with ``args`` (its sweep dir: ``tmp_path/sweep``)."""
    return run_cli([*SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}", *args], tmp_path, module=APP, timeout=timeout)


def load(storage: str, name: str = "optuna_app") -> optuna.Study:
    if "://" not in storage:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(storage))
    return optuna.load_study(study_name=name, storage=storage)


def _trials(storage: str, where: Path) -> list | None:
    """The study's trials, or None while the sweep is still creating its storage or the study in it."""
    if not ((where / "study.db").exists() or (where / "study.log").exists()):
        return None  # nothing is opened (and so created) before the sweep has created its file
    try:
        return load(storage).trials
    except Exception:  # noqa: BLE001 - the study not there yet (KeyError), its tables half made (SQLAlchemy's errors)
        return None


# ------------------------------------------------------------------ search space
# The expressions of the Hydra Optuna sweeper plugin's documentation (its "Search space configuration"
# section and the 1.1 -> 1.2 migration page), with the distribution that plugin builds for each (on Optuna's
# current classes: IntUniform -> Int, DiscreteUniform -> Float(step), LogUniform -> Float(log), ...).
DOCUMENTED = {
    "int(interval(-5.0, 5.0))": IntDistribution(-5, 5),
    "tag(log, interval(1, 10))": FloatDistribution(1.0, 10.0, log=True),  # interval's bounds are floats ...
    "tag(log, int(interval(1, 10)))": IntDistribution(1, 10, log=True),  # ... unless cast
    "tag(log, interval(1e-4, 3e-3))": FloatDistribution(1e-4, 3e-3, log=True),
    "interval(-5.0, 5.0)": FloatDistribution(-5.0, 5.0),
    "range(-5.0, 5.0)": FloatDistribution(-5.0, 5.0, step=1.0),
    "range(-5.5, 5.5, step=0.5)": FloatDistribution(-5.5, 5.5, step=0.5),
    "range(3, 10)": IntDistribution(3, 10),
    "range(1, 10, 3)": IntDistribution(1, 10, step=3),
    "choice(-5.0, 0.0, 5.0)": CategoricalDistribution([-5.0, 0.0, 5.0]),
    "choice(0, 1, 2, 3, 4, 5)": CategoricalDistribution([0, 1, 2, 3, 4, 5]),
    "choice(-5, 0, 5)": CategoricalDistribution([-5, 0, 5]),
    "choice(adam, sgd)": CategoricalDistribution(["adam", "sgd"]),
}


@pytest.mark.parametrize("expression", list(DOCUMENTED))
def test_search_space_matches_hydra_plugin(expression):
    distributions, fixed = search_space({"x": expression}, [])
    assert fixed == {} and distributions == {"x": DOCUMENTED[expression]}


def test_search_space_shuffle_fixed_values_and_command_line():
    distributions, fixed = search_space({"y": "shuffle(range(-5, 5))", "z": 7, "w": "relu", "x": "interval(0, 1)"},
                                        ["x=choice(1, 2)", "seed=3"])  # fmt: skip
    assert isinstance(distributions["y"], CategoricalDistribution)
    assert sorted(distributions["y"].choices) == list(range(-5, 5))  # shuffle(range): its values, range end excluded
    assert distributions["x"] == CategoricalDistribution([1, 2])  # the command line wins over params
    assert fixed == {"z": "7", "w": "relu", "seed": "3"}
    assert grid_of({"a": IntDistribution(3, 9, step=3), "b": FloatDistribution(0.0, 1.0, step=0.5),
                    "c": CategoricalDistribution(["p", "q"])}) == {"a": [3, 6, 9], "b": [0.0, 0.5, 1.0], "c": ["p", "q"]}  # fmt: skip
    with pytest.raises(SweeperError, match="sampler=grid"):
        grid_of({"x": FloatDistribution(0, 1)})


@pytest.mark.parametrize("expression", ["interval(1)", "interval(1, 0)", "choice()", "range(1, 5, 0)", "tag(log, interval(-1, 1))"])
def test_malformed_search_space_names_the_key(expression):
    with pytest.raises(SweeperError, match=r"hydra\.sweeper\.params\.lr="):
        search_space({"lr": expression}, [])


# ------------------------------------------------------------------ resume
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_killed_sweep_resumes_its_study(tmp_path, kind):
    """Stop a sweep (SIGKILL) while trial 2 runs; the same command then ends the study with exactly n_trials
    finished trials: the first two kept as they were, trial 2 marked failed, no number twice."""
    storage = f"sqlite:///{tmp_path / 'study.db'}" if kind == "sqlite" else str(tmp_path / "study.log")
    command = [sys.executable, "-m", APP, *SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra/launcher=basic",
               f"hydra.sweeper.storage={storage}", "hydra.sweeper.n_trials=4", "hydra.sweeper.seed=0",
               "x=interval(0, 1)", "hold=2", "hold_s=300"]  # fmt: skip
    first = subprocess.Popen(command, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None:  # until trial 2 runs (and waits)
            trials = _trials(storage, tmp_path)
            if trials is not None and len(trials) == 3 and trials[2].state == TrialState.RUNNING:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the first sweep did not reach trial 2: {first.stderr.read() if first.poll() is not None else ''}")
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # also when the test fails: no sweep is left waiting
        first.wait(timeout=30)
    before = load(storage).trials
    assert [t.state for t in before] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]

    again = subprocess.run([*command[:-2], "hold=null"], cwd=tmp_path, env=subprocess_env(), capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "trial 2 was left running by a sweep that ended before it: marked failed" in again.stdout + again.stderr
    trials = load(storage).trials
    numbers = [t.number for t in trials]
    assert numbers == sorted(set(numbers)) == list(range(len(trials)))
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 4 and len(trials) == 5
    assert trials[2].state == TrialState.FAIL and trials[2].user_attrs["status"] == "abandoned"
    for old, new in zip(before[:2], trials[:2]):  # the first trials' results are intact, not rerun
        assert (new.params, new.value, new.datetime_complete) == (old.params, old.value, old.datetime_complete)
    results = (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    assert "complete: 4" in results and "fail: 1" in results and "best_params:" in results


def test_processes_that_create_one_sqlite_study_at_the_same_moment_all_open_it(tmp_path):
    """Optuna creates a new database's tables without a lock: of six openers at once, all but one failed with
    "table studies already exists" or a duplicate schema version (every time, before open_storage retried)."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    start, errors = threading.Barrier(6), []

    def open_it() -> None:
        start.wait()
        try:
            open_storage(url, "hydra.sweeper.storage")
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    openers = [threading.Thread(target=open_it) for _ in range(6)]
    for t in openers:
        t.start()
    for t in openers:
        t.join()
    assert errors == []
    optuna.create_study(storage=url, study_name="s")  # the tables are whole


# ------------------------------------------------------------------ no idle slots
def test_a_trial_starts_while_a_long_one_runs(tmp_path):
    """Two slots: trial 0 waits until trial 2 releases it, so the search only ends well if trial 2 starts (on
    the slot trial 1 freed) while trial 0 still runs; asserted on the launcher's recorded timeline."""
    done = app(tmp_path, "hydra/launcher=devices", "hydra.launcher.jobs_per_device=2", "hydra.launcher.devices=[cpu]", "x=interval(0, 1)",
               "hydra.sweeper.n_trials=4", "hold=0", "release=2", "hold_s=120", timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = JobRecord.read_all(tmp_path / "sweep")
    assert sorted(records) == [0, 1, 2, 3]
    assert records[2].start_time < records[0].end_time  # trial 2 started while trial 0 still ran ...
    assert records[1].end_time <= records[2].start_time and records[2].slot == records[1].slot  # ... on trial 1's slot
    assert {r.status for r in records.values()} == {"completed"}


# ------------------------------------------------------------------ failures and bad input
def test_a_crashed_trial_is_failed_and_the_search_goes_on(tmp_path):
    done = app(tmp_path, "hydra/launcher=basic", "x=interval(0, 1)", "hydra.sweeper.n_trials=3", "crash=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trial 1 failed: RuntimeError: trial 1 crashed on purpose (it does not count toward n_trials)" in done.stdout
    study = load(str(tmp_path / "sweep" / "optuna_journal.log"))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, *[TrialState.COMPLETE] * 2]
    assert study.trials[1].user_attrs["error"] == "RuntimeError: trial 1 crashed on purpose"


def test_a_search_whose_trials_all_fail_gives_up(tmp_path):
    crash = app(tmp_path, "hydra/launcher=basic", "x=interval(0, 1)", "hydra.sweeper.n_trials=1", "crash=0")
    assert crash.returncode == 1
    assert "the search stopped: 1 trial(s) of this sweep failed, 0 of 1 finished" in crash.stderr
    assert "Traceback" not in crash.stderr


def test_a_grid_search_runs_each_point_once_and_ends_cleanly(tmp_path):
    """Optuna's grid sampler stops its study once the grid is covered, which raises outside Study.optimize;
    the sweeper ends the search itself, at the grid's size."""
    done = app(tmp_path, "hydra/launcher=basic", "hydra.sweeper.sampler=grid", "x=choice(0.1, 0.5)", "y=range(0, 1)",
               "hydra.sweeper.n_trials=10")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    study = load(str(tmp_path / "sweep" / "optuna_journal.log"))
    assert sorted((t.params["x"], t.params["y"]) for t in study.trials) == [(0.1, 0), (0.1, 1), (0.5, 0), (0.5, 1)]
    assert {t.state for t in study.trials} == {TrialState.COMPLETE}
    assert "n_trials: 4" in (tmp_path / "sweep" / "optimization_results.yaml").read_text()


def test_a_key_the_config_does_not_have_is_one_line(tmp_path):
    done = app(tmp_path, "hydra/launcher=devices", "hydra.launcher.devices=[cpu]", "nothere=interval(0, 1)")
    assert done.returncode == 1 and "Could not override 'nothere'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_direction_has_one_home_in_a_run_config(tmp_path):
    from omegaconf import OmegaConf

    from hydra_plugins.rlchain_optuna._study import Search
    from hydra_plugins.rlchain_optuna.config import OptunaSweeperConf

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}, "job": {"name": "train"}},
                               "trainer": {"objective_direction": "maximize"}})  # fmt: skip
    space = {"params": {"x": "interval(0, 1)"}}
    assert Search(OptunaSweeperConf(**space), config, []).direction == "maximize"
    with pytest.raises(SweeperError, match="hydra.sweeper.direction='minimize' is not allowed with "
                                           "trainer.objective_direction='maximize'"):  # fmt: skip
        Search(OptunaSweeperConf(direction="minimize", **space), config, [])


def _direction_mismatch(tmp_path: Path) -> list[str]:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="optuna_app", storage=storage, direction="minimize")
    return ["x=interval(0, 1)", f"hydra.sweeper.storage={storage}", "hydra.sweeper.direction=maximize"]


CLI_BAD = {
    "space": (lambda _: ["x=interval(1, 0)"], "the argument 'x=interval(1, 0)'="),
    "storage": (lambda tmp: ["x=interval(0, 1)", f"hydra.sweeper.storage=sqlite:///{tmp / 'afile' / 'study.db'}"],
                "hydra.sweeper.storage='sqlite:///"),
    "direction": (_direction_mismatch, "hydra.sweeper.direction='maximize' is not allowed for study 'optuna_app'"),
}


@pytest.mark.parametrize("case", list(CLI_BAD))
def test_bad_input_is_one_line_before_any_trial(tmp_path, case):
    (tmp_path / "afile").write_text("a file, not a directory")
    make_args, message = CLI_BAD[case]
    done = app(tmp_path, "hydra/launcher=basic", *make_args(tmp_path))
    assert done.returncode == 1, done.stderr
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not list((tmp_path / "sweep").glob("*/.hydra"))  # no trial ran


SETTINGS_BAD = {
    "params": ({"params": {"x": "range(1, 5, 0)"}}, "hydra.sweeper.params.x='range(1, 5, 0)' is not allowed"),
    "sampler": ({"sampler": "bayes"}, "hydra.sweeper.sampler='bayes' is not allowed: expected one of tpe, random, "
                                      "cmaes, grid"),
    "sampler_option": ({"sampler_options": {"seed": 3}}, "hydra.sweeper.sampler_options.seed=3 is not allowed: "
                                                         "the sampler's seed is hydra.sweeper.seed"),
    "grid": ({"sampler": "grid"}, "hydra.sweeper.params.x is not allowed with hydra.sweeper.sampler=grid"),
    "pruner": ({"pruner": "asha"}, "hydra.sweeper.pruner='asha' is not allowed: expected one of median, "
                                   "successive_halving, hyperband, none"),
    "pruner_option": ({"pruner_options": {"warmup": 3}}, "hydra.sweeper.pruner_options.warmup=3 is not allowed: "
                                                         "MedianPruner takes n_startup_trials, n_warmup_steps"),
    "pruner_value": ({"pruner_options": {"n_startup_trials": -1}},
                     "hydra.sweeper.pruner_options={'n_startup_trials': -1} is not allowed for median"),
    "n_trials": ({"n_trials": 0}, "hydra.sweeper.n_trials=0 is not allowed: expected an integer >= 1"),
    "direction": ({"direction": "up"}, "hydra.sweeper.direction='up' is not allowed: expected maximize or minimize"),
    "journal": ({"storage": "{tmp}/afile/study.log"}, "hydra.sweeper.storage='{tmp}/afile/study.log' cannot be opened"),
}


@pytest.mark.parametrize("case", list(SETTINGS_BAD))
def test_bad_settings_name_the_field_and_value(tmp_path, case):
    from omegaconf import OmegaConf

    from hydra_plugins.rlchain_optuna._study import Search
    from hydra_plugins.rlchain_optuna.config import OptunaSweeperConf

    (tmp_path / "afile").write_text("a file, not a directory")
    settings, message = SETTINGS_BAD[case]
    settings = {k: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v for k, v in settings.items()}
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}, "job": {"name": "app"}}})
    with pytest.raises(SweeperError) as err:
        Search(OptunaSweeperConf(**{"params": {"x": "interval(0, 1)"}, **settings}), config, [])
    assert message.replace("{tmp}", str(tmp_path)) in str(err.value)


# ------------------------------------------------------------------ pruning, in rlchain-train
def test_a_hopeless_trial_is_pruned_and_its_files_say_so(tmp_path):
    """cart_pole PPO: trial 0 (learning_rate 3e-3; eval return 76 then 167) runs to its end; trial 1 (1e-9:
    nothing is learned, 9) is worse at its first report (iteration 2 of 4), where the median pruner stops it:
    its run keeps latest.pt and records status pruned."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="hopeless", storage=storage, direction="maximize")
    study.enqueue_trial({"algorithm.learning_rate": 3e-3})
    study.enqueue_trial({"algorithm.learning_rate": 1e-9})
    done = run_cli(["-m", "hydra/sweeper=rlchain_optuna", "hydra/launcher=basic", "experiment=cart_pole_ppo",
                    "device=cpu", "trainer.iterations=4", "trainer.num_eval_envs=32", "trainer.num_eval_episodes=32",
                    "trainer.progress=false", "trainer.fresh_eval=false", "hydra.sweeper.study_name=hopeless",
                    f"hydra.sweeper.storage={storage}", "hydra.sweeper.n_trials=2",
                    "+hydra.sweeper.pruner_options={n_startup_trials:1,n_warmup_steps:0}",
                    "algorithm.learning_rate=tag(log, interval(1e-9, 1e-2))", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                   tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    trials = load(storage, "hopeless").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    assert trials[1].last_step == 2 and trials[1].value < trials[0].intermediate_values[2]  # its first report
    job = tmp_path / "sweep" / "1"
    summary = RunSummary.read(job)
    assert summary.status == "pruned" and summary.iteration == 2 and summary.exit_code == 0
    assert (job / "checkpoints" / "latest.pt").is_file()
    assert RunSummary.read(tmp_path / "sweep" / "0").status == "completed"
    assert "pruned by the study's pruner after iteration 2 (trial 1)" in done.stdout + done.stderr
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["charts/iteration"] == 2
    md = (tmp_path / "sweep" / "summary.md").read_text()
    assert "2 jobs: 1 completed, 1 pruned," in md and "| pruned |" in md
    assert [j.status for j in load_jobs(tmp_path / "sweep")] == ["completed", "pruned"]
    assert "trainer.trial" not in md  # the trial link is no column: the job number is the trial number
    results = (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    assert "pruned: 1" in results and "complete: 1" in results
    for plot in ("optimization_history.png", "trial_timeline.png", "learning_curves.png"):
        assert (tmp_path / "sweep" / plot).read_bytes()[:4] == b"\x89PNG"
