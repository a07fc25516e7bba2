"""Resuming a run and starting one from another's policy (trainer.resume_from, trainer.init_from)."""

from __future__ import annotations

import re
import time

import pytest
import torch

from rlchain.core.algorithms import GRPO, PPO
from rlchain.core.envs import CartPoleEnv, GymVecEnv, PushCubeEnv
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.run.starting import start
from rlchain.run.state import RunState
from rlchain.run.summary import RunSummary
from rlchain.run.trainer import Trainer
from tests.helpers.runs import TINY, USER, rows, run_cli, summary_of
from tests.helpers.toy_env import LineEnv, ScoredByEvaluation
from tests.helpers.user_components import FailingPPO


def started(trainer: Trainer) -> Trainer:
    """``trainer`` once :meth:`Trainer.start` resumed or initialised it (as rlchain-train's build does)."""
    trainer.start()
    return trainer


def make_push_cube_ppo(tmp_path, iterations, resume_from=None, seed=3):
    torch.manual_seed(seed)
    env = PushCubeEnv(num_envs=32, seed=seed, max_episode_steps=20)  # episodes that cross the checkpoint
    policy = ActorCritic(
        env.single_observation_space, env.single_action_space, hidden_sizes=[32, 32], obs_normalization=True
    )
    algo = PPO(policy, batch_size=256, n_epochs=2, seed=seed)
    return started(
        Trainer(
            env,
            policy,
            algo,
            iterations=iterations,
            rollout_steps=16,
            save_freq=100,
            output_dir=str(tmp_path),
            seed=seed,
            progress=False,
            resume_from=resume_from,
        )
    )


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    straight = make_push_cube_ppo(tmp_path / "a", iterations=3)
    straight.train()
    first = make_push_cube_ppo(tmp_path / "b", iterations=2)
    first.train()
    ckpt = tmp_path / "b" / "checkpoints" / "latest.pt"
    resumed = make_push_cube_ppo(tmp_path / "c", iterations=3, resume_from=str(ckpt))
    assert resumed.global_step == 2 * 32 * 16 and resumed.iteration == 2
    summary = resumed.train()
    assert summary.global_step == 3 * 32 * 16
    for (name, a), b in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(straight.env.cube_x, resumed.env.cube_x)
    # The episodes in progress at the checkpoint go on: the resumed iteration logs the uninterrupted one's episode
    # statistics (they had been cut at the resume, every carried return and length zeroed at its first step).
    episodic = ("charts/episodic_return", "charts/episodic_length", "charts/success_rate")
    want, got = rows(tmp_path / "a")[2], rows(tmp_path / "c")[-1]
    assert want["global_step"] == got["global_step"] and "charts/episodic_length" in want
    assert {key: got[key] for key in episodic} == {key: want[key] for key in episodic}


def test_start_returns_the_state_a_run_starts_from_and_assigns_nothing(tmp_path):
    # start reached into the trainer and assigned its step count, run directory, W&B id, ...: it returns them now.
    first = make_push_cube_ppo(tmp_path / "a", iterations=2)
    first.train()
    trainer = make_push_cube_ppo(tmp_path / "b", iterations=3)  # started afresh
    before = RunState.new(tmp_path / "b", trainer.world)
    state = start(before, trainer.parts, trainer.world, resume_from=str(tmp_path / "a" / "checkpoints" / "latest.pt"))
    assert (state.global_step, state.iteration, state.started, state.output_dir) == (
        2 * 32 * 16,
        2,
        True,
        before.output_dir,
    )
    assert state.last_train == first.state.last_train and state.last_train["charts/iteration"] == 2
    assert (before.global_step, before.iteration, before.started) == (0, 0, False)
    assert (trainer.state.global_step, trainer.global_step) == (0, 0)  # the trainer's state is the trainer's to take
    for (name, a), b in zip(first.policy.state_dict().items(), trainer.policy.state_dict().values()):
        assert torch.equal(a, b), name  # the components took the checkpoint's states
    assert start(state, trainer.parts, trainer.world, resume_from=str(tmp_path / "nope")) is state  # started once


def test_resume_on_an_env_that_cannot_save_its_state_restarts_it_fresh(tmp_path, capsys):
    # gymnasium envs cannot save their state: after a resume the env starts
    # afresh, so the policy must act on the env's own observation and no
    # episode may be carried over from the checkpoint.
    def make(out, iterations, resume_from=None):
        env = GymVecEnv("Pendulum-v1", num_envs=4, seed=0)  # 200-step episodes: in progress at every checkpoint
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return started(
            Trainer(
                env,
                policy,
                PPO(policy, batch_size=16),
                iterations=iterations,
                rollout_steps=8,
                output_dir=str(out),
                progress=False,
                resume_from=resume_from,
            )
        )

    make(tmp_path / "a", iterations=2).train()
    capsys.readouterr()
    resumed = make(tmp_path / "b", iterations=3, resume_from=str(tmp_path / "a" / "checkpoints" / "latest.pt"))
    twin = GymVecEnv("Pendulum-v1", num_envs=4, seed=0)
    twin.reset()  # the saved run's one reset, at its first rollout
    fresh_obs, _ = twin.reset()  # the restarted env's reset draws the next seeds of the saved generator
    rollout = resumed.collector.collect().data
    assert torch.equal(rollout["obs"][0], fresh_obs)
    assert torch.equal(rollout["episode_length"], torch.arange(1, 9)[:, None].expand(8, 4))
    assert resumed.global_step == 2 * 8 * 4 and resumed.iteration == 2
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1 and "resumed from" in notice[0] and "GymVecEnv cannot restore its state" in notice[0]
    assert "every env reset" in notice[0]


def test_a_resume_never_keeps_a_best_checkpoint_of_the_branch_it_discards(tmp_path):
    def make(fail_at=None, resume_from=None):
        env = ScoredByEvaluation(num_envs=4, max_episode_steps=3)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(
            env,
            policy,
            FailingPPO(policy, fail_at=fail_at, batch_size=8),
            eval_env=ScoredByEvaluation(num_envs=4, max_episode_steps=3),
            iterations=6,
            rollout_steps=3,
            eval_freq=1,
            save_freq=4,
            num_eval_envs=4,
            num_eval_episodes=4,
            objective="eval/avg_reward",
            output_dir=str(tmp_path),
            progress=False,
            resume_from=resume_from,
        )

    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        make(fail_at=6).train()  # evaluations 1-5 each a new best; latest.pt written at iteration 4
    summary = make(resume_from="auto").train()  # a fresh eval env scores 1, 2: below the best so far
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    assert best["global_step"] == summary.best_objective_step
    assert best["best_objective"] == summary.best_objective
    (row,) = [r for r in rows(tmp_path) if r["global_step"] == summary.best_objective_step]
    assert row["eval/avg_reward"] == summary.best_objective


def test_a_resume_from_a_latest_without_its_best_never_makes_latest_the_best(tmp_path):
    # latest.pt carries the id of the run's best evaluation, so the old check took it for the best's checkpoint:
    # best.pt then held a policy of a later step than the one summary.json called the best.
    def make(iterations, resume_from=None):
        env = ScoredByEvaluation(num_envs=4, max_episode_steps=3)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(
            env,
            policy,
            PPO(policy, batch_size=8),
            eval_env=ScoredByEvaluation(num_envs=4, max_episode_steps=3),
            iterations=iterations,
            rollout_steps=3,
            eval_freq=1,
            num_eval_envs=4,
            num_eval_episodes=4,
            objective="eval/avg_reward",
            objective_direction="minimize",
            output_dir=str(tmp_path),
            progress=False,
            resume_from=resume_from,
        )

    first = make(iterations=2).train()  # evaluations score 3 then 6: the best is the first
    assert first.best_objective_step == 12 and first.global_step == 24
    (tmp_path / "checkpoints" / "best.pt").unlink()  # e.g. latest.pt alone was copied to another machine
    summary = make(iterations=3, resume_from="auto").train()
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    assert best["global_step"] == summary.best_objective_step == 36  # the resumed run's own best, not latest.pt
    assert best["best_objective"] == summary.best_objective
    assert summary.best_fresh["global_step"] == summary.best_objective_step


# 3. A resume applies the config's learning rate under the constant and linear schedules.
@pytest.mark.parametrize(
    "schedule, notice",
    [
        ("constant", "algorithm.learning_rate=1e-05 replaces the checkpoint's 0.001 (lr_schedule='constant')"),
        ("linear", "algorithm.learning_rate=1e-05 replaces the checkpoint's 0.001 (lr_schedule='linear')"),
        (
            "adaptive",
            "lr_schedule='adaptive' goes on from the checkpoint's rate 0.000666667; "
            "algorithm.learning_rate=1e-05 starts fresh runs only",
        ),
    ],
)
def test_a_resume_takes_the_configs_learning_rate_unless_the_schedule_adapts_it(tmp_path, capsys, schedule, notice):
    def make(out, lr, iterations, resume_from=None):
        env = LineEnv(num_envs=8)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        extra = {"target_kl": 1e-9} if schedule == "adaptive" else {}  # adaptive: the rate falls at every update
        algorithm = PPO(
            policy, learning_rate=lr, lr_schedule=schedule, batch_size=16, total_iterations=iterations, **extra
        )
        return started(
            Trainer(
                env,
                policy,
                algorithm,
                iterations=iterations,
                rollout_steps=4,
                output_dir=str(out),
                progress=False,
                resume_from=resume_from,
            )
        )

    first = make(tmp_path / "a", 1e-3, iterations=1)
    first.train()
    capsys.readouterr()
    resumed = make(tmp_path / "b", 1e-5, iterations=2, resume_from=str(tmp_path / "a" / "checkpoints" / "latest.pt"))
    # the rate of the resumed run's next update: the config's (linear: half-way down its 2-iteration decay),
    # or, adaptive, the checkpoint's (1e-3 / 1.5)
    expected = {"constant": 1e-5, "linear": 1e-5 / 2, "adaptive": 1e-3 / 1.5}[schedule]
    assert resumed.algorithm.current_lr == pytest.approx(expected)
    assert f"rlchain: {notice}" in capsys.readouterr().err.splitlines()
    resumed.train()
    assert rows(tmp_path / "b")[-1]["charts/learning_rate"] == pytest.approx(
        expected / 1.5 if schedule == "adaptive" else expected
    )
    same = make(tmp_path / "c", 1e-3, iterations=2, resume_from=str(tmp_path / "a" / "checkpoints" / "latest.pt"))
    assert (
        "learning_rate" not in capsys.readouterr().err and same.global_step == first.global_step
    )  # unchanged: no line


# 5. env=gym's seed generator travels with checkpoints: a resumed GRPO run does not reuse its first start seeds.
def test_a_resumed_gym_run_continues_its_reset_seeds(tmp_path):
    def make(out, iterations, resume_from=None):
        torch.manual_seed(0)
        env = GymVecEnv("CartPole-v1", num_envs=4, seed=0, max_episode_steps=10)
        policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(
            env,
            policy,
            GRPO(policy, group_size=2, batch_size=20),
            iterations=iterations,
            rollout_steps=10,
            output_dir=str(out),
            progress=False,
            resume_from=resume_from,
        )

    straight = make(tmp_path / "a", 3)
    straight.train()
    make(tmp_path / "b", 2).train()
    resumed = make(tmp_path / "c", 3, resume_from=str(tmp_path / "b" / "checkpoints" / "latest.pt"))
    resumed.train()
    assert torch.equal(resumed.collector.buffer.data["obs"][0], straight.collector.buffer.data["obs"][0])


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"\x00\x9f random bytes \xff" * 10, "unreadable as a torch checkpoint"),
        (b"a text file\n", "unreadable as a torch checkpoint"),
        (b"", "an empty file"),
    ],
)
@pytest.mark.slow
def test_resuming_from_a_file_that_is_not_a_checkpoint_names_it(tmp_path, content, reason):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(content)
    proc = run_cli([*USER, f"trainer.resume_from={bad}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "weights_only" not in proc.stderr
    assert f"Invalid config: trainer.resume_from='{bad}' is not an rlchain checkpoint: {reason}" in proc.stderr


@pytest.mark.slow
def test_resuming_with_a_policy_that_does_not_match_names_the_shapes(tmp_path):
    run = tmp_path / "run"
    assert run_cli([*USER, "policy.hidden_sizes=[16]", f"hydra.run.dir={run}"], tmp_path).returncode == 0
    loose = tmp_path / "copied.pt"  # a checkpoint outside its run directory: the command line composes the run
    loose.write_bytes((run / "checkpoints" / "latest.pt").read_bytes())
    proc = run_cli([*USER, f"trainer.resume_from={loose}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Error in call to target" not in proc.stderr
    assert (
        "the checkpoint's policy does not match this run's: actor.0.weight is (16, 2) there, (128, 2) here"
        in proc.stderr
    )


@pytest.mark.slow
def test_resuming_a_finished_run_keeps_its_final_metrics_and_objective(tmp_path):
    run = tmp_path / "run"
    assert run_cli([*USER, f"hydra.run.dir={run}"], tmp_path).returncode == 0
    before = summary_of(run)
    (run / "checkpoints" / ".latest.pt.k9x2.tmp").write_bytes(b"torn")  # a save cut short by kill -9
    proc = run_cli([*USER, f"hydra.run.dir={run}", "trainer.resume_from=auto"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "already reached trainer.iterations=2" in proc.stderr
    after = summary_of(run)
    assert after.objective is not None and after.objective == before.objective
    assert after.final["eval/success_rate"] == before.final["eval/success_rate"]
    assert not list((run / "checkpoints").glob(".*.tmp"))


def test_a_run_resumed_into_its_directory_does_not_repeat_logged_rows(tmp_path):
    # The run logged iterations 3 and 4 after its last checkpoint (iteration 2), then died.
    def make(iterations, resume_from=None):
        torch.manual_seed(0)
        env = PushCubeEnv(num_envs=8, seed=0)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(
            env,
            policy,
            PPO(policy, batch_size=32),
            iterations=iterations,
            rollout_steps=4,
            output_dir=str(tmp_path),
            progress=False,
            resume_from=resume_from,
        )

    first = make(2)
    first.train()
    (tmp_path / "at_2.pt").write_bytes((tmp_path / "checkpoints" / "latest.pt").read_bytes())
    first.cfg.iterations = 4
    _a_later_second()
    first.train()
    assert [r["global_step"] for r in rows(tmp_path)] == [32, 64, 96, 128]
    _a_later_second()
    make(4, resume_from=str(tmp_path / "at_2.pt")).train()
    assert [r["global_step"] for r in rows(tmp_path)] == [32, 64, 96, 128]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("charts/SPS")] == [32, 64, 96, 128]


def _a_later_second() -> None:
    """Wait for the clock's next second, as a resumed run, a process of its own, starts in a later second.

    TensorBoard reads a directory's event files in the order of their names, and a writer names its file by
    the second it opened it, then by a counter of the process written without padding: two writers of one
    process opened in the same second sort as the strings of their counters ("10" before "9"), and the
    purge of a resume's rows then runs in the wrong order.
    """
    start = int(time.time())
    while int(time.time()) == start:
        time.sleep(0.01)


#: 8-step push_cube episodes, so that a GRPO rollout (TINY: 8 steps) holds a whole one.
GRPO_SHORT = [*TINY, "env=push_cube", "env.max_episode_steps=8"]


@pytest.mark.slow
def test_grpo_fine_tunes_a_ppo_policy_against_the_loaded_reference(tmp_path):
    ppo_dir, grpo_dir = tmp_path / "ppo", tmp_path / "grpo"
    # Without observation normalisation, so that the first rollout's statistics
    # do not move the live policy away from the reference before the first update.
    fixed = [*GRPO_SHORT, "policy.obs_normalization=false"]
    proc = run_cli(["algorithm=ppo", *fixed, f"trainer.output_dir={ppo_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # One minibatch per update (16 envs x 8 steps), one epoch: the first update's
    # KL is measured before its only optimiser step, so against the reference.
    proc = run_cli(
        [
            "algorithm=grpo",
            "policy=actor_critic",
            "algorithm.kl_coef=0.02",
            f"trainer.init_from={ppo_dir}",
            *fixed,
            "algorithm.n_epochs=1",
            "algorithm.batch_size=128",
            f"trainer.output_dir={grpo_dir}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    loaded = ppo_dir / "checkpoints" / "latest.pt"
    assert f"policy initialised from {loaded}" in proc.stderr

    rows_kl = [r for r in rows(grpo_dir) if "losses/approx_ref_kl" in r]
    assert [r["global_step"] for r in rows_kl] == [128, 256]  # a fresh step count
    assert rows_kl[0]["losses/approx_ref_kl"] == 0.0  # the reference is the loaded policy, not the random init
    assert rows_kl[1]["losses/approx_ref_kl"] > 0.0  # ... and it stays frozen while the policy moves

    ppo = torch.load(loaded, weights_only=True)
    grpo = torch.load(grpo_dir / "checkpoints" / "latest.pt", weights_only=True)
    reference = grpo["algorithm"]["ref_policy"]
    assert reference.keys() == ppo["policy"].keys()
    assert all(torch.equal(reference[k], ppo["policy"][k]) for k in reference)
    assert any(not torch.equal(grpo["policy"][k], ppo["policy"][k]) for k in reference)  # trained on from there
    adam_steps = {float(s["step"]) for s in grpo["algorithm"]["optimizer"]["state"].values()}
    assert adam_steps == {2.0}  # a fresh optimiser: this run's two minibatch steps only
    summary = RunSummary.read(grpo_dir)
    assert summary.status == "completed" and summary.init_from == str(loaded)


@pytest.mark.slow
def test_a_checkpoint_whose_policy_does_not_match_is_refused_naming_the_shapes(tmp_path):
    ppo_dir = tmp_path / "ppo"
    proc = run_cli(
        ["algorithm=ppo", *GRPO_SHORT, "policy.hidden_sizes=[32]", f"trainer.output_dir={ppo_dir}"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(
        [
            "algorithm=grpo",
            "policy=actor_critic",
            *GRPO_SHORT,
            f"trainer.init_from={ppo_dir}",
            f"trainer.output_dir={tmp_path / 'grpo'}",
        ],
        tmp_path,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("Invalid config: trainer.init_from=") and "does not match this run's" in line
    assert re.search(r"is \(32, \d+\) there, \(128, \d+\) here", line), line
    assert not (tmp_path / "grpo" / "metrics.jsonl").exists()


def _cart_pole_run(tmp_path, name, **trainer_kwargs):
    env = CartPoleEnv(num_envs=4, max_episode_steps=8, seed=0)
    policy = ActorCritic(env.single_observation_space, env.single_action_space)
    algorithm = GRPO(policy, group_size=2, kl_coef=0.1) if name == "grpo" else PPO(policy)
    return started(
        Trainer(
            env,
            policy,
            algorithm,
            iterations=1,
            rollout_steps=8,
            eval_freq=1,
            num_eval_envs=2,
            num_eval_episodes=2,
            output_dir=str(tmp_path / name),
            progress=False,
            **trainer_kwargs,
        )
    )


def test_bad_init_from_paths_are_refused_before_any_step(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"init_from='.*nowhere' does not exist"):
        _cart_pole_run(tmp_path, "a", init_from=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"init_from='.*empty' is a directory without checkpoints/latest.pt"):
        _cart_pole_run(tmp_path, "b", init_from=str(tmp_path / "empty"))
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"init_from='.*junk.pt' is not an rlchain checkpoint"):
        _cart_pole_run(tmp_path, "c", init_from=str(tmp_path / "junk.pt"))


def test_a_resumed_run_continues_from_its_own_checkpoint_not_from_init_from(tmp_path):
    source = _cart_pole_run(tmp_path, "ppo")
    source.train()
    run = _cart_pole_run(tmp_path, "grpo", init_from=str(tmp_path / "ppo"))
    loaded = torch.load(tmp_path / "ppo" / "checkpoints" / "latest.pt", weights_only=True)["policy"]
    assert "obs_normalizer.mean" in loaded and run.init_from is not None and run.global_step == 0
    for module in (run.policy, run.algorithm.ref_policy):  # the normaliser's statistics included
        assert all(torch.equal(v, loaded[k]) for k, v in module.state_dict().items())
    run.train()
    saved = torch.load(tmp_path / "grpo" / "checkpoints" / "latest.pt", weights_only=True)
    again = _cart_pole_run(tmp_path, "grpo", init_from=str(tmp_path / "ppo"), resume_from="auto")
    assert again.init_from is None and again.global_step == saved["global_step"] > 0
    assert all(torch.equal(v, saved["policy"][k]) for k, v in again.policy.state_dict().items())
    reference = again.algorithm.ref_policy.state_dict()
    assert all(torch.equal(v, saved["algorithm"]["ref_policy"][k]) for k, v in reference.items())


def _saved_files(run) -> dict:
    return {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}


@pytest.mark.parametrize("target", ["run directory", "checkpoint"])
@pytest.mark.slow
def test_resuming_a_run_rebuilds_it_from_its_saved_config_and_goes_on_in_its_directory(tmp_path, target):
    # The resume needed the run's overrides typed again (a shape mismatch said nothing of it), and went on in a new
    # directory.
    run = tmp_path / "run"
    assert run_cli([*USER, "policy.hidden_sizes=[16]", "seed=4", f"hydra.run.dir={run}"], tmp_path).returncode == 0
    saved = _saved_files(run)
    source = run if target == "run directory" else run / "checkpoints" / "latest.pt"
    proc = run_cli([f"trainer.resume_from={source}", "trainer.iterations=3", "algorithm.learning_rate=1e-4"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from {run / 'checkpoints' / 'latest.pt'} at iteration 2" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no new run directory
    summary = summary_of(run)
    assert (summary.status, summary.iteration) == ("completed", 3)
    assert [r["charts/iteration"] for r in rows(run)] == [1, 2, 3]
    assert rows(run)[-1]["charts/learning_rate"] == pytest.approx(1e-4)
    assert torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["config"]["seed"] == 4
    assert _saved_files(run) == saved  # the run's own config, overrides and Hydra config stay


@pytest.mark.parametrize(
    "override", ["policy.hidden_sizes=[32]", "env.num_envs=8", "seed=9", "experiment=push_cube_ppo"]
)
@pytest.mark.slow
def test_a_resume_refuses_what_would_change_the_saved_run_and_writes_nothing(tmp_path, override):
    # A failed resume attempt overwrote the run's .hydra/config.yaml and overrides.yaml with a config that did not
    # match its checkpoints.
    run = tmp_path / "run"
    assert run_cli([*USER, f"hydra.run.dir={run}"], tmp_path).returncode == 0
    saved, summary = _saved_files(run), (run / "summary.json").read_bytes()
    proc = run_cli([*USER, f"hydra.run.dir={run}", "trainer.resume_from=auto", override], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"rlchain: {override} is not allowed when resuming {run}: a resumed run keeps its saved config"
    ), line
    assert _saved_files(run) == saved and (run / "summary.json").read_bytes() == summary


@pytest.mark.slow
def test_a_resume_told_to_write_elsewhere_is_refused_naming_the_runs_directory(tmp_path):
    # The resume went on in the saved run's directory, exit 0, and the hydra.run.dir given was ignored without a word.
    run, other = tmp_path / "run", tmp_path / "other"
    assert run_cli([*USER, f"hydra.run.dir={run}"], tmp_path).returncode == 0
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    proc = run_cli([f"trainer.resume_from={run / 'checkpoints' / 'latest.pt'}", f"hydra.run.dir={other}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line == (
        f"rlchain: hydra.run.dir={other} is not allowed when resuming {run}: a resumed run goes on in its own "
        f"directory; drop hydra.run.dir or set it to {run}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no other directory, no outputs/
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before
    # Naming the run's own directory (relative here) resumes it.
    same = run_cli([f"trainer.resume_from={run}", "hydra.run.dir=run", "trainer.iterations=3"], tmp_path)
    assert same.returncode == 0, same.stderr
    assert summary_of(run).iteration == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_resume_from_a_path_that_does_not_exist_is_one_line_and_leaves_nothing(tmp_path):
    proc = run_cli([*USER, f"trainer.resume_from={tmp_path / 'nope'}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Error in call to target" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line == (
        f"rlchain: trainer.resume_from='{tmp_path / 'nope'}' does not exist: expected a run directory "
        "(outputs/<date>/<time>_<id>) or a checkpoint file"
    )
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_a_sweep_job_of_an_earlier_release_resumes_without_its_trainer_trial(tmp_path):
    # Sweep jobs of the release before this one carry the Optuna sweeper's link as trainer.trial in their saved
    # config; the trainer has no such setting now.
    run = tmp_path / "run"
    assert run_cli([*USER, f"hydra.run.dir={run}"], tmp_path).returncode == 0
    config = run / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace("trainer:\n", "trainer:\n  trial:\n    number: 3\n", 1))
    proc = run_cli([f"trainer.resume_from={run}", "trainer.iterations=3"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert summary_of(run).iteration == 3


@pytest.mark.slow
def test_a_resume_lets_through_the_option_the_saved_run_has_so_that_its_keys_compose(tmp_path):
    # A run of the push_cube_grpo preset: algorithm.group_size composes only with algorithm=grpo on the command line,
    # and naming that option (the preset chose it, the command line did not) was refused as a change of the run.
    run = tmp_path / "run"
    first = run_cli(["experiment=push_cube_grpo", *TINY, "env.max_episode_steps=8", f"hydra.run.dir={run}"], tmp_path)
    assert first.returncode == 0, first.stderr
    proc = run_cli(
        [f"trainer.resume_from={run}", "algorithm=grpo", "algorithm.group_size=4", "trainer.iterations=3"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    state = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert state["config"]["algorithm"]["group_size"] == 4 and state["iteration"] == 3
    other = run_cli([f"trainer.resume_from={run}", "algorithm=ppo"], tmp_path)
    assert other.returncode == 1 and "algorithm=ppo is not allowed when resuming" in other.stderr


def test_a_run_with_observation_groups_resumes_exactly(tmp_path):
    """Every group of the observation in progress, and each group's normaliser, come back from the checkpoint."""
    from tests.helpers.grouped_env import GroupedLineEnv

    def make(out, iterations, resume_from=None):
        torch.manual_seed(0)
        env = GroupedLineEnv(num_envs=8, max_episode_steps=7)  # episodes in progress at every checkpoint
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[16])
        algorithm = PPO(policy, batch_size=32, n_epochs=2, seed=0)
        trainer = Trainer(
            env,
            policy,
            algorithm,
            iterations=iterations,
            rollout_steps=5,
            eval_freq=100,
            save_freq=100,
            output_dir=str(out),
            progress=False,
            resume_from=resume_from,
            fresh_eval=False,
        )
        return started(trainer)

    straight = make(tmp_path / "a", iterations=4)
    straight.train()
    make(tmp_path / "b", iterations=2).train()
    resumed = make(tmp_path / "c", iterations=4, resume_from=str(tmp_path / "b" / "checkpoints" / "latest.pt"))
    assert set(resumed.collector.state_dict()["obs"]) == {"actor", "critic"}
    resumed.train()
    for (name, a), b in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b), name
    assert "obs_normalizer.critic.count" in straight.policy.state_dict()
