"""``hydra/launcher=population`` through ``rlchain-train`` as a user runs it: each member writes its run as its solo
run would, jobs of other shapes form other populations, a refused job fails alone, and a population stopped by
SIGTERM saves every member and resumes bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from hydra_plugins.rlchain_launcher.population_launcher import populations
from tests.helpers.runs import PRUNABLE_CART_POLE, TINY, rows, run_cli, summaries, summary_of

POPULATION = ["-m", "hydra/launcher=population", *TINY]


def sweep_dir(cwd):
    (path,) = [p for p in (cwd / "multirun").glob("*/*") if p.is_dir()]
    return path


#: push_cube through its camera: a 16 x 16 image and the state for the actor (a CNN whose spatial softmax keeps its
#: pixel coordinates out of the checkpoint), the exact state for the critic.
CAMERA = [
    "env.obs_mode=pixels_state",
    "env.privileged_critic=true",
    "env.image_size=16",
    "policy.cnn_channels=[4,8]",
    "policy.cnn_kernel_sizes=[4,3]",
    "policy.cnn_strides=[2,2]",
    "policy.cnn_features=8",
    "policy.cnn_head=spatial_softmax",
]


@pytest.mark.parametrize("camera", [False, True], ids=["state", "camera"])
def test_each_member_writes_the_run_its_solo_run_writes(tmp_path, camera):
    extra = CAMERA if camera else []
    done = run_cli([*POPULATION, "seed=1,2", *extra], tmp_path)
    assert done.returncode == 0, done.stderr
    sweep = sweep_dir(tmp_path)
    solo = run_cli([*TINY, "seed=2", "hydra.run.dir=solo", *extra], tmp_path)
    assert solo.returncode == 0, solo.stderr
    member = sweep / "1"
    for name in ("metrics.jsonl", "summary.json", "checkpoints/latest.pt", "checkpoints/best.pt", ".hydra/config.yaml"):
        assert (member / name).exists(), name
    assert summary_of(member).status == "completed" and summary_of(sweep / "0").status == "completed"
    for job in ("0", "1"):  # each member's log holds its own result line, not another member's
        lines = [line for line in (sweep / job / "train.log").read_text().splitlines() if "completed" in line]
        assert len(lines) == 1 and lines[0].endswith(str(sweep / job)), lines
    mine, theirs = rows(member), rows(tmp_path / "solo")
    assert len(mine) == len(theirs) == 2
    for a, b in zip(mine, theirs):
        for key in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "charts/episodic_return"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert a["eval/global_step"] == b["eval/global_step"]
    # The member's checkpoint is an ordinary single-run checkpoint: the solo run's keys, its policy's weights.
    ours = torch.load(member / "checkpoints/latest.pt", weights_only=True)
    solo_ckpt = torch.load(tmp_path / "solo/checkpoints/latest.pt", weights_only=True)
    assert set(ours) == set(solo_ckpt) and set(ours["policy"]) == set(solo_ckpt["policy"])
    for name, value in solo_ckpt["policy"].items():
        torch.testing.assert_close(ours["policy"][name], value, rtol=1e-3, atol=1e-5)
    assert "population" in done.stderr + done.stdout and (sweep / "summary.md").exists()
    if camera:
        return
    # rlchain-export takes the member's run as any run: its ONNX policy acts as the solo run's, to rounding.
    import onnxruntime

    from rlchain.commands.export import main as export

    obs = torch.randn(5, 15, generator=torch.Generator().manual_seed(0)) * 0.5
    actions = []
    for run in (member, tmp_path / "solo"):
        out = tmp_path / f"{run.name}.onnx"
        assert export([str(run), "format=onnx", f"output={out}"]) == 0
        session = onnxruntime.InferenceSession(str(out))
        actions.append(torch.from_numpy(session.run(["action"], {"obs": obs.numpy()})[0]))
    torch.testing.assert_close(actions[0], actions[1], rtol=1e-3, atol=1e-4)


def test_populations_spread_over_the_slots(tmp_path):
    done = run_cli([*POPULATION, "seed=1,2,3,4", "hydra.launcher.jobs_per_device=2"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "4 jobs as 2 populations, spread over 2 slots" in done.stderr + done.stdout
    sweep = sweep_dir(tmp_path)
    records = {r["job"]: r for r in map(json.loads, (sweep / "launcher.jsonl").read_text().splitlines())}
    assert {r["status"] for r in records.values()} == {"completed"}
    assert {r["num_threads"] for r in records.values()} == {1}  # the slot's threads: the 2 cores shared
    # Jobs 0-1 and 2-3 trained as two populations, in two worker processes.
    assert records[0]["pid"] == records[1]["pid"] != records[2]["pid"] == records[3]["pid"]
    assert records[0]["slot"] != records[2]["slot"]
    for job in range(4):
        assert summary_of(sweep / str(job)).status == "completed"


@pytest.mark.slow
def test_a_population_whose_worker_dies_fails_its_members_and_the_other_slot_goes_on(tmp_path):
    killing = "env._target_=rlchain.core.envs.push_cube.PushCubeEnv,tests.helpers.user_components.process_killing_env"
    done = run_cli([*POPULATION, killing, "seed=0,1", "hydra.launcher.jobs_per_device=2"], tmp_path)
    assert done.returncode != 0
    runs = summaries(sweep_dir(tmp_path))
    assert [runs[n].status for n in range(4)] == ["completed", "completed", "failed", "failed"]
    assert all("the worker process died" in runs[n].error for n in (2, 3))


@pytest.mark.parametrize(
    "jobs, max_members, slots, expected",
    [
        (8, None, 1, [8]),
        (8, None, 2, [4, 4]),
        (8, None, 3, [3, 3, 2]),
        (3, 2, 1, [2, 1]),
        (8, 3, 2, [3, 3, 2]),
        (2, None, 4, [1, 1]),  # no more populations than jobs
    ],
)
def test_a_shape_is_split_evenly_into_populations_that_keep_the_slots_busy(jobs, max_members, slots, expected):
    configs = [OmegaConf.create({"seed": s, "trainer": {"rollout_steps": 8}}) for s in range(jobs)]
    groups, split_by = populations(configs, max_members, slots)
    assert [len(g) for g in groups] == expected and split_by == []
    assert [i for g in groups for i in g] == list(range(jobs))  # job order kept


def test_shapes_share_the_slots_before_a_shape_is_split():
    configs = [OmegaConf.create({"seed": s, "trainer": {"rollout_steps": 8 * (1 + s % 2)}}) for s in range(8)]
    groups, split_by = populations(configs, None, 2)
    assert groups == [[0, 2, 4, 6], [1, 3, 5, 7]] and split_by == ["trainer.rollout_steps"]
    groups, _ = populations(configs, None, 4)
    assert groups == [[0, 2], [4, 6], [1, 3], [5, 7]]


@pytest.mark.slow
def test_jobs_of_other_shapes_form_other_populations_and_a_refused_job_fails_alone(tmp_path):
    done = run_cli([*POPULATION, "trainer.rollout_steps=8,16", "algorithm.learning_rate=1e-3,-1"], tmp_path)
    assert done.returncode != 0
    assert "4 jobs as 2 populations, split by trainer.rollout_steps" in done.stderr + done.stdout
    sweep = sweep_dir(tmp_path)
    statuses = {p.name: summary_of(p) for p in sweep.iterdir() if (p / "summary.json").exists()}
    # Jobs 0 and 2 (learning_rate=1e-3) train; 1 and 3 (-1) are refused before their first step, naming it.
    assert statuses["0"].status == statuses["2"].status == "completed"
    for job in ("1", "3"):
        assert statuses[job].status == "failed" and "algorithm.learning_rate=-1" in statuses[job].error
        assert "Traceback" in (sweep / job / "train.log").read_text()  # its own log has its traceback
    assert len(rows(sweep / "0")) == 2 and len(rows(sweep / "2")) == 2


@pytest.mark.slow
@pytest.mark.parametrize("groups", [False, True], ids=["flat", "observation_groups"])
def test_sigterm_stops_every_member_with_its_checkpoint_and_the_resumed_population_goes_on_bit_for_bit(
    tmp_path, groups
):
    signal_env = [
        f"env.privileged_critic={str(groups).lower()}",  # the actor's and the critic's groups: resumed as groups
        "env._target_=tests.helpers.signal_env.SignallingPushCube",
        "+env.signal_at_step=12",  # in iteration 2 (8 steps each)
        "+env.signal_to=parent",  # the launcher, which forwards it to the population's worker
        f"+env.marker={tmp_path / 'signalled'}",
        "trainer.iterations=3",
        "trainer.save_freq=100",
        "algorithm.reward_norm=true",  # each member's return statistics resume with it
    ]
    stopped = run_cli([*POPULATION, "seed=1,2", *signal_env, "hydra.sweep.dir=stopped"], tmp_path)
    assert stopped.returncode == 143, stopped.stderr
    for member in ("0", "1"):
        summary = summary_of(tmp_path / "stopped" / member)
        assert summary.status == "interrupted" and summary.signal == "SIGTERM" and summary.iteration == 2
        assert (tmp_path / "stopped" / member / "checkpoints/latest.pt").exists()
    resumed = run_cli(
        [*POPULATION, "seed=1,2", *signal_env, "hydra.sweep.dir=stopped", "trainer.resume_from=auto"], tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    straight = run_cli([*POPULATION, "seed=1,2", *signal_env, "hydra.sweep.dir=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr  # the marker exists: no signal this time
    for member in ("0", "1"):
        a = torch.load(tmp_path / "stopped" / member / "checkpoints/latest.pt", weights_only=True)
        b = torch.load(tmp_path / "straight" / member / "checkpoints/latest.pt", weights_only=True)
        assert a["global_step"] == b["global_step"] == 3 * 8 * 16
        for name, value in b["policy"].items():
            assert torch.equal(a["policy"][name], value), (member, name)
        assert [r["losses/policy_loss"] for r in rows(tmp_path / "stopped" / member)] == [
            r["losses/policy_loss"] for r in rows(tmp_path / "straight" / member)
        ]


def test_a_stop_signal_while_members_are_built_keeps_what_each_member_said_of_itself(tmp_path):
    # Job 0 is refused (its env built, then its learning rate); the env of job 1, the second built, sends SIGTERM
    # to the launcher, which forwards it while job 1 is built: job 0 stays failed with its own error, 1 and 2 are
    # interrupted, and the sweep exits 143.
    signalling = [
        "env._target_=tests.helpers.signal_env.SignallingPushCube",
        "+env.signal_at_step=0",
        "+env.signal_at_build=2",
        "+env.signal_to=parent",
        f"+env.marker={tmp_path / 'signalled'}",
    ]
    done = run_cli([*POPULATION, "algorithm.learning_rate=-1,1e-3,1e-3", *signalling], tmp_path)
    assert done.returncode == 143, done.stderr
    records = {r["job"]: r for r in map(json.loads, (sweep_dir(tmp_path) / "launcher.jsonl").read_text().splitlines())}
    assert records[0]["status"] == "failed" and "algorithm.learning_rate=-1" in records[0]["error"], records[0]
    assert records[1]["status"] == records[2]["status"] == "interrupted"
    assert summary_of(sweep_dir(tmp_path) / "0").status == "failed"


@pytest.mark.slow
def test_max_members_caps_a_population_and_a_bad_value_is_one_line(tmp_path):
    done = run_cli([*POPULATION, "seed=1,2,3", "hydra.launcher.max_members=2"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "3 jobs as 2 populations, at most hydra.launcher.max_members=2 each" in done.stderr + done.stdout
    assert all(summary_of(sweep_dir(tmp_path) / j).status == "completed" for j in ("0", "1", "2"))
    bad = run_cli([*POPULATION, "seed=1", "hydra.launcher.max_members=0"], tmp_path)
    assert bad.returncode != 0
    assert "hydra.launcher.max_members=0 is not allowed: expected None or an integer >= 1" in bad.stderr


def test_what_a_population_does_not_take_is_refused_in_one_line_before_any_step(tmp_path):
    # CUDA graphs on the CPU: refused for the population's steps as for a solo run's, in each member's summary.
    done = run_cli([*POPULATION, "seed=1,2", "trainer.compile=true", "trainer.cudagraphs=true"], tmp_path)
    assert done.returncode != 0
    for job in ("0", "1"):
        summary = summary_of(sweep_dir(tmp_path) / job)
        assert summary.status == "failed"
        assert summary.error == (
            "cudagraphs=True cannot apply here: CUDA graphs need a CUDA device, and the run's is cpu; expected false"
        )
        assert not (sweep_dir(tmp_path) / job / "checkpoints").exists()
    # What only the built members show (a recurrent policy) refuses the population after the build: one line,
    # in each member's summary.json.
    recurrent = run_cli([*POPULATION, "seed=1,2", "policy.rnn_type=gru", "hydra.sweep.dir=recurrent"], tmp_path)
    assert recurrent.returncode != 0
    assert "policy.rnn_type='gru' is not taken by a population yet" in recurrent.stderr
    for job in ("0", "1"):
        summary = summary_of(tmp_path / "recurrent" / job)
        assert summary.status == "failed"
        assert (
            summary.error
            == "policy.rnn_type='gru' is not taken by a population yet (torch.vmap cannot batch torch.nn.GRU's or "
            "LSTM's kernels): expected None (a feed-forward policy)"
        )


@pytest.mark.slow
def test_a_population_compiles_its_steps_once_for_all_its_members(tmp_path):
    """trainer.compile=true: the population's collection step and minibatch update compile once, with inductor (no
    member compiles steps of its own), and each member trains and logs the compile time in its first row."""
    done = run_cli([*POPULATION, "seed=1,2", "env=cart_pole", "trainer.compile=true"], tmp_path)
    assert done.returncode == 0, done.stderr
    said = done.stderr + done.stdout
    assert said.count("rlchain: compiled the collection step and the minibatch update in") == 1, said
    for job in ("0", "1"):
        assert summary_of(sweep_dir(tmp_path) / job).status == "completed"
        logged = rows(sweep_dir(tmp_path) / job)
        assert [("time/compile_s" in row) for row in logged] == [True] + [False] * (len(logged) - 1)
        assert logged[0]["time/compile_s"] > 0


@pytest.mark.slow
def test_each_batch_of_optuna_trials_trains_as_one_population(tmp_path):
    pytest.importorskip("optuna")
    done = run_cli(
        [
            *POPULATION,
            "hparams_search=ppo_push_cube_optuna",
            "algorithm.n_epochs=5",  # the command line fixes what the preset searches: one shape
            "hydra.sweeper.n_trials=4",
            "hydra.sweeper.n_jobs=2",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = done.stderr + done.stdout
    assert "population of jobs 0-1 started" in out and "population of jobs 2-3 started" in out
    sweep = sweep_dir(tmp_path)
    assert all(summary_of(sweep / str(j)).status == "completed" for j in range(4))
    assert (sweep / "optimization_results.yaml").exists()


@pytest.mark.slow
def test_optunas_pruner_stops_one_member_and_its_population_goes_on(tmp_path):
    """Trials 0 and 1 (a population) complete; in the next batch trial 2 (learning_rate 1e-9: nothing is learned)
    is worse at its first report than the completed trials, and the median pruner stops it there, while trial 3,
    its population's other member, trains to its end."""
    optuna = pytest.importorskip("optuna")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="members", storage=storage, direction="maximize")
    for rate in (3e-3, 3e-3, 1e-9, 3e-3):
        study.enqueue_trial({"algorithm.learning_rate": rate})
    done = run_cli(
        [
            "-m",
            *PRUNABLE_CART_POLE,
            "hydra/launcher=population",
            "hydra.sweeper.study_name=members",
            f"hydra.sweeper.storage={storage}",
            "hydra.sweeper.n_trials=4",
            "hydra.sweeper.n_jobs=2",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    states = [t.state for t in optuna.load_study(study_name="members", storage=storage).trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.PRUNED] + [
        optuna.trial.TrialState.COMPLETE
    ]
    pruned, other = summary_of(tmp_path / "sweep" / "2"), summary_of(tmp_path / "sweep" / "3")
    assert pruned.status == "pruned" and pruned.iteration == 2 and pruned.exit_code == 0
    assert (tmp_path / "sweep" / "2" / "checkpoints" / "latest.pt").is_file()
    assert other.status == "completed" and other.iteration == 4
    assert len(rows(tmp_path / "sweep" / "2")) == 2 and len(rows(tmp_path / "sweep" / "3")) == 4
