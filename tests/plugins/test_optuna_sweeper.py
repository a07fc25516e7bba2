"""rlchain's Optuna sweeper (hydra/sweeper=rlchain_optuna): search space, resumable studies, idle slots, bad input.

Most sweeps run the small app of :mod:`tests.helpers.optuna_app` (Hydra and Optuna, no torch); a researcher's own
app (:mod:`tests.helpers.user_app`) and rlchain-train itself report to their trials and get pruned. Every study
is a real sqlite database or journal file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.rlchain_optuna._space import SweeperError, grid_of, search_space
from rlchain.commands.report import load_jobs
from rlchain.run.summary import JobRecord, RunSummary
from rlchain.run.tuning import open_storage
from tests.helpers.runs import PRUNABLE_CART_POLE, run_cli, subprocess_env

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
    distributions, fixed = search_space(
        {"y": "shuffle(range(-5, 5))", "z": 7, "w": "relu", "x": "interval(0, 1)"}, ["x=choice(1, 2)", "seed=3"]
    )
    assert isinstance(distributions["y"], CategoricalDistribution)
    assert sorted(distributions["y"].choices) == list(range(-5, 5))  # shuffle(range): its values, range end excluded
    assert distributions["x"] == CategoricalDistribution([1, 2])  # the command line wins over params
    assert fixed == {"z": "7", "w": "relu", "seed": "3"}
    assert grid_of(
        {
            "a": IntDistribution(3, 9, step=3),
            "b": FloatDistribution(0.0, 1.0, step=0.5),
            "c": CategoricalDistribution(["p", "q"]),
        }
    ) == {"a": [3, 6, 9], "b": [0.0, 0.5, 1.0], "c": ["p", "q"]}
    with pytest.raises(SweeperError, match="sampler=grid"):
        grid_of({"x": FloatDistribution(0, 1)})


@pytest.mark.parametrize(
    "expression, points",
    [
        ("range(0.1, 0.3, 0.1)", [0.1, 0.2, 0.3]),  # float sums: 0.30000000000000004, above the range's end
        ("range(-0.3, 0.3, 0.1)", [-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3]),
        ("range(0.7, 1.0, 0.1)", [0.7, 0.8, 0.9, 1.0]),  # float sums: 0.7999999999999999, 0.8999999999999999
        ("range(0.05, 0.35, 0.05)", [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35]),
        ("range(1e-4, 5e-4, 1e-4)", [1e-4, 2e-4, 3e-4, 4e-4, 5e-4]),
        ("range(0, 1, 0.25)", [0.0, 0.25, 0.5, 0.75, 1.0]),
    ],
)
def test_a_float_grid_holds_the_points_a_user_writes_within_the_range(expression, points):
    (distribution,) = search_space({"x": expression}, [])[0].values()
    grid = grid_of({"x": distribution})["x"]
    assert grid == points and all(distribution.low <= x <= distribution.high for x in grid)
    # Optuna takes each point as it is, without its warning of a value out of the distribution's range.
    study = optuna.create_study(sampler=optuna.samplers.GridSampler({"x": grid}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for x in grid:
            study.enqueue_trial({"x": x})
            assert study.ask({"x": distribution}).params["x"] == x


@pytest.mark.parametrize(
    "expression", ["interval(1)", "interval(1, 0)", "choice()", "range(1, 5, 0)", "tag(log, interval(-1, 1))"]
)
def test_malformed_search_space_names_the_key(expression):
    with pytest.raises(SweeperError, match=r"hydra\.sweeper\.params\.lr="):
        search_space({"lr": expression}, [])


def _kill_while_trial_2_runs(command: list[str], storage: str, tmp_path: Path) -> None:
    """Run the sweep ``command`` (whose trial 2 waits: ``hold=2``) until trial 2 runs with its parameters, then
    SIGKILL it."""
    first = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None:  # until trial 2 runs (and waits)
            trials = _trials(storage, tmp_path)
            # RUNNING from the sweeper's ask(); its parameters come a moment later, with suggest (a kill in
            # between leaves a trial without them)
            if trials is not None and len(trials) == 3 and trials[2].state == TrialState.RUNNING and trials[2].params:
                break
            time.sleep(0.2)
        else:
            pytest.fail(
                f"the first sweep did not reach trial 2: {first.stderr.read() if first.poll() is not None else ''}"
            )
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # also when the test fails: no sweep is left waiting
        first.wait(timeout=30)


# ------------------------------------------------------------------ resume
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
@pytest.mark.slow
def test_a_killed_sweep_resumes_its_study(tmp_path, kind):
    """Stop a sweep (SIGKILL) while trial 2 runs; the same command then ends the study with exactly n_trials
    finished trials: the first two kept as they were, trial 2 marked failed, no number twice."""
    storage = f"sqlite:///{tmp_path / 'study.db'}" if kind == "sqlite" else str(tmp_path / "study.log")
    command = [
        sys.executable,
        "-m",
        APP,
        *SWEEP,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra/launcher=basic",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.seed=0",
        "x=interval(0, 1)",
        "hold=2",
        "hold_s=300",
    ]
    _kill_while_trial_2_runs(command, storage, tmp_path)
    before = load(storage).trials
    assert [t.state for t in before] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]

    again = subprocess.run(
        [*command[:-2], "hold=null"], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
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


@pytest.mark.parametrize("kind, sampler", [("sqlite", "tpe"), ("journal", "random")])
@pytest.mark.slow
def test_a_resumed_seeded_search_continues_and_is_reproduced(tmp_path, kind, sampler):
    """hydra.sweeper.seed=0, 3 trials, then the same command with n_trials=5: trials 3 and 4 drew the parameters of
    trials 0 and 1 again (the sampler was rebuilt with the same seed). Now no trial repeats another's, and the
    study is the same as one run of 5 trials with that seed, whether in one sweep or two (TPE's first trials are
    its random start-up; each trial's draws depend on the seed and its number)."""

    def sweep(where: str, n_trials: int) -> subprocess.CompletedProcess:
        storage = f"sqlite:///{tmp_path / where}.db" if kind == "sqlite" else str(tmp_path / f"{where}.log")
        return app(
            tmp_path,
            "hydra/launcher=basic",
            f"hydra.sweeper.storage={storage}",
            "hydra.sweeper.seed=0",
            f"hydra.sweeper.sampler={sampler}",
            f"hydra.sweeper.n_trials={n_trials}",
            "x=interval(0, 1)",
            "y=range(0, 1000)",
            f"hydra.sweep.dir={tmp_path / where}",
        )

    def params(where: str) -> list[tuple]:
        storage = f"sqlite:///{tmp_path / where}.db" if kind == "sqlite" else str(tmp_path / f"{where}.log")
        return [(t.params["x"], t.params["y"]) for t in load(storage).trials]

    for where, n_trials in (("resumed", 3), ("resumed", 5), ("again", 3), ("again", 5), ("once", 5)):
        done = sweep(where, n_trials)
        assert done.returncode == 0, done.stderr[-3000:]
    resumed = params("resumed")
    assert len(resumed) == 5 and len(set(resumed)) == 5  # no trial repeats a finished one
    assert params("again") == resumed  # reproduced from the seed and the storage
    assert params("once") == resumed  # one sweep of 5 samples what 3, then 2 more, sampled


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
    done = app(
        tmp_path,
        "hydra/launcher=devices",
        "hydra.launcher.jobs_per_device=2",
        "hydra.launcher.devices=[cpu]",
        "x=interval(0, 1)",
        "hydra.sweeper.n_trials=4",
        "hold=0",
        "release=2",
        "hold_s=120",
        timeout=300,
    )
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
    the sweeper ends the search itself, at the grid's size. A float range's points are the ones a user writes
    (0.3, not 0.1 + 2 * 0.1 = 0.30000000000000004, outside the range, which Optuna warned about at every trial)."""
    done = app(
        tmp_path,
        "hydra/launcher=basic",
        "hydra.sweeper.sampler=grid",
        "x=range(0.1, 0.3, 0.1)",
        "y=choice(0, 1)",
        "hydra.sweeper.n_trials=10",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    study = load(str(tmp_path / "sweep" / "optuna_journal.log"))
    points = [(x, y) for x in (0.1, 0.2, 0.3) for y in (0, 1)]
    assert sorted((t.params["x"], t.params["y"]) for t in study.trials) == points
    assert {t.state for t in study.trials} == {TrialState.COMPLETE}
    assert "n_trials: 6" in (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    assert "out of range" not in done.stdout + done.stderr


def test_a_grid_point_whose_trial_failed_runs_again(tmp_path):
    """Grid y in {8, 9, 10}, trial 1 crashes once: Optuna's grid sampler counted its point as visited and the
    replacement landed on a random point (with seed 1: y=10 failed, [8, 9, 8] completed). Now every point is
    completed once."""
    done = app(
        tmp_path,
        "hydra/launcher=basic",
        "hydra.sweeper.sampler=grid",
        "hydra.sweeper.seed=1",
        "y=range(8, 10)",
        "crash=1",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    study = load(str(tmp_path / "sweep" / "optuna_journal.log"))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL, *[TrialState.COMPLETE] * 2]
    assert sorted(t.params["y"] for t in study.trials if t.state == TrialState.COMPLETE) == [8, 9, 10]
    assert "grid points not run" not in done.stdout + done.stderr


def test_a_grid_point_that_always_fails_is_named(tmp_path):
    """y=9 fails every time: the other points run first, y=9 is tried until n_trials (3) trials failed, and the
    search's one line names the point it could not run."""
    done = app(tmp_path, "hydra/launcher=basic", "hydra.sweeper.sampler=grid", "y=range(8, 10)", "crash_y=9")
    assert done.returncode == 1
    assert (
        "the search stopped: 3 trial(s) of this sweep failed, 2 of 3 finished; grid points not run: y=9 (see "
        in done.stderr
    ), done.stderr
    study = load(str(tmp_path / "sweep" / "optuna_journal.log"))
    assert [t.params["y"] for t in study.trials] == [8, 9, 10, 9, 9]
    assert [t.state for t in study.trials].count(TrialState.COMPLETE) == 2


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
@pytest.mark.slow
def test_a_killed_grid_search_runs_exactly_the_missing_points(tmp_path, kind):
    """Grid y in {8, 9, 10, 11}, killed while trial 2 (y=10) runs: the same command runs y=10 and y=11, once each
    (Optuna's grid sampler took the killed trial's point as visited: [8, 8, 9, 10] completed, 11 missing)."""
    storage = f"sqlite:///{tmp_path / 'study.db'}" if kind == "sqlite" else str(tmp_path / "study.log")
    command = [
        sys.executable,
        "-m",
        APP,
        *SWEEP,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra/launcher=basic",
        f"hydra.sweeper.storage={storage}",
        "hydra.sweeper.sampler=grid",
        "y=range(8, 11)",
        "hold=2",
        "hold_s=300",
    ]
    _kill_while_trial_2_runs(command, storage, tmp_path)
    again = subprocess.run(
        [*command[:-2], "hold=null"], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr[-3000:]
    trials = load(storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL] + [TrialState.COMPLETE] * 2
    assert [t.params["y"] for t in trials] == [8, 9, 10, 10, 11]


def test_a_key_the_config_does_not_have_is_one_line(tmp_path):
    done = app(tmp_path, "hydra/launcher=devices", "hydra.launcher.devices=[cpu]", "nothere=interval(0, 1)")
    assert done.returncode == 1 and "Could not override 'nothere'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_direction_has_one_home_in_a_run_config(tmp_path):
    from omegaconf import OmegaConf

    from hydra_plugins.rlchain_optuna._study import Search
    from hydra_plugins.rlchain_optuna.config import OptunaSweeperConf

    config = OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(tmp_path / "sweep")}, "job": {"name": "train"}},
            "trainer": {"objective_direction": "maximize"},
        }
    )
    space = {"params": {"x": "interval(0, 1)"}}
    assert Search(OptunaSweeperConf(**space), config, []).direction == "maximize"
    with pytest.raises(
        SweeperError,
        match="hydra.sweeper.direction='minimize' is not allowed with trainer.objective_direction='maximize'",
    ):
        Search(OptunaSweeperConf(direction="minimize", **space), config, [])


def test_the_metric_name_has_one_home_in_a_run_config(tmp_path):
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from hydra_plugins.rlchain_optuna._study import Search
    from hydra_plugins.rlchain_optuna.config import OptunaSweeperConf

    def search(objective: str | None, **settings) -> Search:
        sweep_dir = str(tmp_path / (objective or "app").replace("/", "_"))
        config = OmegaConf.create(
            {
                "hydra": {"sweep": {"dir": sweep_dir}, "job": {"name": "a"}},
                **({"trainer": {"objective": objective}} if objective else {}),
            }
        )
        return Search(OptunaSweeperConf(params={"x": "interval(0, 1)"}, **settings), config, [])

    assert search("eval/avg_reward").study.metric_names == ["eval/avg_reward"]
    auto = search("auto")
    assert auto.study.metric_names is None  # named by the first run that resolves it:
    number, _ = auto.next_trial()
    summary = RunSummary(status="completed", objective=0.5, objective_name="eval/success_rate", start_time=time.time())
    summary.write(tmp_path / "job")
    hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path / "job")}}})
    auto.tell(number, JobReturn(overrides=[], status=JobStatus.COMPLETED, _return_value=0.5, hydra_cfg=hydra_cfg))
    assert auto.study.metric_names == ["eval/success_rate"]
    assert search(None, metric_name="loss").study.metric_names == ["loss"]
    with pytest.raises(
        SweeperError, match="hydra.sweeper.metric_name='loss' is not allowed with trainer.objective='auto'"
    ):
        search("auto", metric_name="loss")


def _direction_mismatch(tmp_path: Path) -> list[str]:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="optuna_app", storage=storage, direction="minimize")
    return ["x=interval(0, 1)", f"hydra.sweeper.storage={storage}", "hydra.sweeper.direction=maximize"]


CLI_BAD = {
    "space": (lambda _: ["x=interval(1, 0)"], "the argument 'x=interval(1, 0)'="),
    "storage": (
        lambda tmp: ["x=interval(0, 1)", f"hydra.sweeper.storage=sqlite:///{tmp / 'afile' / 'study.db'}"],
        "hydra.sweeper.storage='sqlite:///",
    ),
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
    "sampler": (
        {"sampler": "bayes"},
        "hydra.sweeper.sampler='bayes' is not allowed: expected one of tpe, random, cmaes, grid",
    ),
    "sampler_option": (
        {"sampler_options": {"seed": 3}},
        "hydra.sweeper.sampler_options.seed=3 is not allowed: the sampler's seed is hydra.sweeper.seed",
    ),
    "grid": ({"sampler": "grid"}, "hydra.sweeper.params.x is not allowed with hydra.sweeper.sampler=grid"),
    "pruner": (
        {"pruner": "asha"},
        "hydra.sweeper.pruner='asha' is not allowed: expected one of median, successive_halving, hyperband, none",
    ),
    "pruner_option": (
        {"pruner_options": {"warmup": 3}},
        "hydra.sweeper.pruner_options.warmup=3 is not allowed: MedianPruner takes n_startup_trials, n_warmup_steps",
    ),
    "pruner_value": (
        {"pruner_options": {"n_startup_trials": -1}},
        "hydra.sweeper.pruner_options={'n_startup_trials': -1} is not allowed for median",
    ),
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
@pytest.mark.slow
def test_a_hopeless_trial_is_pruned_and_its_files_say_so(tmp_path):
    """cart_pole PPO: trial 0 (learning_rate 3e-3; eval return 76 then 167) runs to its end; trial 1 (1e-9:
    nothing is learned, 9) is worse at its first report (iteration 2 of 4), where the median pruner stops it:
    its run keeps latest.pt and records status pruned."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="hopeless", storage=storage, direction="maximize")
    study.enqueue_trial({"algorithm.learning_rate": 3e-3})
    study.enqueue_trial({"algorithm.learning_rate": 1e-9})
    done = run_cli(
        [
            "-m",
            *PRUNABLE_CART_POLE,
            "hydra/launcher=basic",
            "hydra.sweeper.study_name=hopeless",
            f"hydra.sweeper.storage={storage}",
            "hydra.sweeper.n_trials=2",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        tmp_path,
    )
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
    assert "trainer.trial" not in md and "hydra.sweeper.trial" not in md  # no column: the job number is the trial
    assert load(storage, "hopeless").metric_names == ["eval/avg_reward"]  # the preset's trainer.objective
    results = (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    assert "pruned: 1" in results and "complete: 1" in results
    for plot in ("optimization_history.png", "trial_timeline.png", "learning_curves.png"):
        assert (tmp_path / "sweep" / plot).read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------ any Hydra app
@pytest.mark.parametrize("launcher", ["basic", "devices"])
def test_a_users_own_app_is_swept_and_pruned(tmp_path, launcher):
    """The sweeper added ++trainer.trial=... to every job, so an app that instantiates its own ``trainer`` node
    failed every trial. Now each job's config is the app's alone, and the app reports its loss with
    rlchain.run.tuning.report: trial 1 (lr 0.001, far worse at its first step) is pruned there, trial 0 runs on."""
    from omegaconf import OmegaConf

    from rlchain import tuning

    assert tuning.trial() is None and tuning.report(1.0, 0) is False  # outside a sweep's job: nothing to report to
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="user_app", storage=storage, direction="minimize")
    study.enqueue_trial({"trainer.lr": 0.25})
    study.enqueue_trial({"trainer.lr": 0.001})
    slots = ["hydra.launcher.devices=[cpu]", "hydra.launcher.jobs_per_device=1"] if launcher == "devices" else []
    done = run_cli(
        [
            *SWEEP,
            f"hydra/launcher={launcher}",
            *slots,
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            f"hydra.sweeper.storage={storage}",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.metric_name=loss",
            "+hydra.sweeper.pruner_options={n_startup_trials:1,n_warmup_steps:0}",
            "trainer.lr=interval(0.001, 0.5)",
        ],
        tmp_path,
        module="tests.helpers.user_app",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trials = load(storage, "user_app").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    assert sorted(trials[0].intermediate_values) == [0, 1, 2, 3, 4] and trials[0].value == pytest.approx(0.5**10)
    assert trials[1].intermediate_values == {0: pytest.approx(0.998**2)} and trials[1].last_step == 0
    assert trials[1].user_attrs[tuning.PRUNED_AT] == 0
    assert load(storage, "user_app").metric_names == ["loss"]
    for number, lr in ((0, 0.25), (1, 0.001)):  # the app's config, and nothing else
        job = tmp_path / "sweep" / str(number) / ".hydra"
        config = OmegaConf.to_container(OmegaConf.load(job / "config.yaml"))
        assert config == {"trainer": {"_target_": "tests.helpers.user_app.Trainer", "lr": lr, "steps": 5}}
        assert OmegaConf.to_container(OmegaConf.load(job / "overrides.yaml")) == [f"trainer.lr={lr}"]
