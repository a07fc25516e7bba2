"""The training loop: the run directory, what is logged, the objective and best.pt, failures."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pytest
import torch

from rlchain.commands.train import ConfigError, build
from rlchain.core.algorithms import GRPO, PPO, NonFiniteError
from rlchain.core.algorithms.ppo import ppo_loss
from rlchain.core.envs import PushCubeEnv
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.run.summary import RunSummary
from rlchain.run.trainer import Trainer
from tests.helpers.toy_env import LineEnv, ScoredByEvaluation
from tests.helpers.user_components import FailingPPO


def test_trainer_writes_the_run_directory(tmp_path):
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(
        env,
        policy,
        PPO(policy, batch_size=16),
        eval_env=lambda num_envs, seed: LineEnv(num_envs, seed=seed),
        iterations=4,
        rollout_steps=4,
        eval_freq=2,
        save_freq=2,
        num_eval_envs=4,
        num_eval_episodes=6,
        output_dir=str(tmp_path),
        progress=False,
        run_config={"algorithm": {"name": "ppo"}},
    )
    summary = trainer.train()
    assert summary == RunSummary.read(tmp_path)
    assert summary.status == "completed" and summary.global_step == 4 * 8 * 4
    assert summary.objective == summary.final["eval/success_rate"]
    assert summary.final["eval/episodes"] == 8.0  # 6 rounded up to whole rounds of 4 envs
    assert set(summary.checkpoints) == {"latest", "best"}
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [32, 64, 96, 128]
    assert "eval/success_rate" in rows[1] and "eval/success_rate" not in rows[0]
    for key in (
        "charts/SPS",
        "losses/policy_loss",
        "losses/explained_variance",
        "losses/clipfrac",
        "charts/learning_rate",
        "rewards/progress",
        "metrics/distance",
    ):
        assert key in rows[-1], key
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    state = torch.load(tmp_path / "checkpoints" / "latest.pt", weights_only=True)
    assert state["global_step"] == 128 and state["config"] == {"algorithm": {"name": "ppo"}}
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


@pytest.mark.parametrize("direction, best_eval", [("maximize", 4), ("minimize", 1)])
def test_best_checkpoint_follows_the_objective_and_its_direction(tmp_path, direction, best_eval):
    env = ScoredByEvaluation(num_envs=4, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(
        env,
        policy,
        PPO(policy, batch_size=8),
        eval_env=ScoredByEvaluation(num_envs=4, max_episode_steps=3),
        iterations=4,
        rollout_steps=3,
        eval_freq=1,
        num_eval_envs=4,
        num_eval_episodes=4,
        objective="eval/avg_reward",
        output_dir=str(tmp_path),
        progress=False,
        **({} if direction == "maximize" else {"objective_direction": direction}),
    )  # maximize: the default
    summary = trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/avg_reward"] for r in rows] == [3.0, 6.0, 9.0, 12.0]
    best = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    assert best["global_step"] == 12 * best_eval and best["best_objective"] == 3.0 * best_eval
    assert summary.best_objective == 3.0 * best_eval and summary.best_objective_step == 12 * best_eval
    assert summary.objective_direction == direction


def test_a_task_without_success_logs_and_shows_no_success_rate(tmp_path, capsys):
    env = ScoredByEvaluation(num_envs=4, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    summary = Trainer(
        env,
        policy,
        PPO(policy, batch_size=8),
        eval_env=ScoredByEvaluation(num_envs=4, max_episode_steps=3),
        iterations=2,
        rollout_steps=3,
        eval_freq=1,
        num_eval_envs=4,
        num_eval_episodes=4,
        objective="eval/avg_reward",
        output_dir=str(tmp_path),
        progress=True,
    ).train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter ")]
    assert len(lines) == 2 and all("success" not in line and "eval return" in line for line in lines)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(not any("success" in key for key in row) for row in rows)
    assert "charts/episodic_return" in rows[-1] and "eval/avg_reward" in rows[-1]
    assert summary.best_eval_success_rate is None and "eval/success_rate" not in summary.final


def test_wandb_mirrors_rows_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    Trainer(
        env,
        policy,
        PPO(policy, batch_size=16),
        iterations=2,
        rollout_steps=4,
        output_dir=str(tmp_path),
        progress=False,
        use_wandb=True,
        wandb_project="rlchain-test",
    ).train()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def _wandb_records(run_dir) -> dict[str, bytes]:
    """Each offline W&B run directory under ``run_dir`` and the bytes of its transaction log (protobuf records, whose
    strings are stored as they are).

    ``run.finish()`` returns before W&B's service has closed the log of an offline run, so under load a log read
    at once can still be short; ``wandb.teardown()`` waits for the service to close every log it writes.
    """
    import wandb

    wandb.teardown()
    return {d.name: next(d.glob("*.wandb")).read_bytes() for d in sorted((run_dir / "wandb").glob("offline-run-*"))}


def test_a_resumed_run_continues_its_wandb_run_with_its_name_group_and_tags(tmp_path, monkeypatch):
    # Every resume opened a new W&B run, splitting one run's curves over several.
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    def make(iterations, resume_from=None):
        env = LineEnv(num_envs=8)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return Trainer(
            env,
            policy,
            PPO(policy, batch_size=16),
            iterations=iterations,
            rollout_steps=4,
            output_dir=str(tmp_path),
            progress=False,
            use_wandb=True,
            wandb_project="rlchain-test",
            wandb_name="line-run-7",
            wandb_group="line-group-3",
            wandb_tags=["tag-alpha"],
            resume_from=resume_from,
        )

    make(2).train()
    # The resumed run reuses the first one's id in this same process. A new process (as a real resume is) starts a
    # fresh W&B service; here the first run's stream must be closed before a second stream takes the same id.
    wandb.teardown()
    make(3, resume_from="auto").train()
    records = _wandb_records(tmp_path)
    assert len(records) == 2 and len({name.split("-")[3] for name in records}) == 1  # offline-run-<time>-<id>[-1]
    assert all(b"line-run-7" in r and b"line-group-3" in r and b"tag-alpha" in r for r in records.values())


def test_use_wandb_without_the_extra_names_it_before_any_step(compose_cfg, monkeypatch):
    # sys.modules[name] = None is Python's own way to make `import name` fail, as on a machine without wandb.
    monkeypatch.setitem(sys.modules, "wandb", None)
    cfg = compose_cfg(["trainer.use_wandb=true", "env.num_envs=8", "device=cpu"])
    with pytest.raises(
        ConfigError,
        match=r"^Invalid config: trainer.use_wandb=True needs wandb, an optional extra: "
        r'pip install "rlchain\[wandb\]"$',
    ):
        build(cfg)
    assert not (Path(cfg.trainer.output_dir) / "metrics.jsonl").exists()


def test_non_finite_loss_stops_the_run_naming_the_iteration_and_keeps_the_checkpoint(tmp_path):
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(
        env,
        policy,
        PPO(policy, batch_size=16),
        iterations=3,
        rollout_steps=4,
        save_freq=1,
        output_dir=str(tmp_path),
        progress=False,
    )
    trainer.train()  # 3 good iterations, checkpoint at the end
    good = (tmp_path / "checkpoints" / "latest.pt").read_bytes()
    trainer.cfg.iterations = 5
    with torch.no_grad():
        policy.critic[0].weight.fill_(float("nan"))
    with pytest.raises(
        RuntimeError, match=r"non-finite loss at iteration 4 \(nan\); last good checkpoint: .*latest.pt"
    ):
        trainer.train()
    assert (tmp_path / "checkpoints" / "latest.pt").read_bytes() == good
    summary = RunSummary.read(tmp_path)
    assert summary.status == "failed" and "iteration 4" in summary.error


def test_any_error_during_training_is_recorded_and_reraised(tmp_path):
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(
        env,
        policy,
        FailingPPO(policy, fail_at=3, batch_size=16),
        iterations=5,
        rollout_steps=4,
        output_dir=str(tmp_path),
        progress=False,
    )
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        trainer.train()
    summary = RunSummary.read(tmp_path)
    assert summary.status == "failed" and summary.iteration == 2
    assert summary.error == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [32, 64]  # the two good iterations were flushed


class InfiniteGradientPPO(PPO):
    """PPO plus a term that is 0 but has an infinite gradient (d sqrt(x) / dx at 0)."""

    def update(self, rollout):
        weight = self.policy.actor[0].weight
        original = ppo_loss

        def loss_with_a_kink(*args, **kwargs):
            terms = original(*args, **kwargs)
            terms["loss"] = terms["loss"] + torch.sqrt(weight[0, 0] - weight[0, 0].detach())
            return terms

        import rlchain.core.algorithms.ppo as ppo_module

        ppo_module.ppo_loss = loss_with_a_kink
        try:
            return super().update(rollout)
        finally:
            ppo_module.ppo_loss = original


def non_finite_run(tmp_path, make_algorithm, policy_cls=ActorCritic, **trainer_kwargs):
    torch.manual_seed(0)
    env = PushCubeEnv(num_envs=64, seed=0, max_episode_steps=16)
    policy = policy_cls(env.single_observation_space, env.single_action_space, hidden_sizes=[32])
    trainer = Trainer(
        env,
        policy,
        make_algorithm(policy),
        iterations=4,
        rollout_steps=16,
        save_freq=1,
        output_dir=str(tmp_path),
        progress=False,
        **trainer_kwargs,
    )
    with pytest.raises(RuntimeError) as info:
        trainer.train()
    summary = RunSummary.read(tmp_path)
    assert summary.status == "failed" and summary.error == str(info.value)
    assert "Traceback" in summary.traceback and "NonFiniteError" in summary.traceback
    for path in (tmp_path / "checkpoints").glob("*.pt"):
        state = torch.load(path, weights_only=True)
        assert all(torch.isfinite(v).all() for v in state["policy"].values() if v.is_floating_point()), path
    return str(info.value)


def test_a_non_finite_gradient_norm_stops_the_run(tmp_path):
    message = non_finite_run(tmp_path, lambda policy: InfiniteGradientPPO(policy, batch_size=256))
    assert message == "non-finite grad_norm at iteration 1 (inf); last good checkpoint: none written yet"


def test_grpo_with_a_huge_learning_rate_stops_at_its_non_finite_kl(tmp_path):
    # GRPO at a huge learning rate once completed with approx_kl = inf in every row. Adam's first step moves every
    # parameter by about the rate: the action mean moves by 1e25 or more, kept finite by the tanh features (at most
    # 33e25), and the log-std leaves its bounds. Every stored action is then over 1e24 standard deviations from the
    # mean; its squared z-score overflows float32: log-prob -inf, ratio 0, approx_kl = inf from the first update's
    # second minibatch on, with the loss finite and the gradients too (ratio 0 passes 0 to the mean; the log-std's
    # 0 * inf = nan is dropped by its bound, which it is beyond). Rates from 1e19 to 1e35 did this on every seed
    # tried (mean overflow and a nan gradient norm at 1e37); at 1e8 with ELU features 3 seeds of 10 completed, the
    # KL about 1e33.
    message = non_finite_run(
        tmp_path,
        lambda policy: GRPO(policy, learning_rate=1e25, batch_size=512, group_size=8),
        policy_cls=functools.partial(ActorOnly, activation="tanh"),
    )
    assert message == "non-finite approx_kl at iteration 1 (inf); last good checkpoint: none written yet"
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_a_non_finite_parameter_stops_the_run(tmp_path):
    # A parameter outside the loss's path (here one a user's policy holds) goes NaN:
    # loss and gradient norm stay finite, so only the parameter check can see it.
    def make(policy):
        policy.temperature = torch.nn.Parameter(torch.tensor([float("nan")]))
        return PPO(policy, batch_size=512)

    message = non_finite_run(tmp_path, make)
    assert message == "non-finite parameter temperature at iteration 1 (nan); last good checkpoint: none written yet"


def test_no_checkpoint_is_written_from_a_non_finite_policy(tmp_path):
    env = LineEnv(num_envs=8)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(
        env, policy, PPO(policy, batch_size=16), iterations=1, rollout_steps=4, output_dir=str(tmp_path), progress=False
    )
    trainer.train()
    good = (tmp_path / "checkpoints" / "latest.pt").read_bytes()
    policy.obs_normalizer.mean.fill_(float("nan"))  # as NaN observations would leave it
    with pytest.raises(NonFiniteError, match=r"policy obs_normalizer.mean is nan"):
        trainer.save()
    assert (tmp_path / "checkpoints" / "latest.pt").read_bytes() == good
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


def test_a_best_checkpoint_that_cannot_be_written_leaves_the_recorded_best_as_it_was(tmp_path):
    # Every evaluation of ScoredByEvaluation beats the one before; the second one's best.pt cannot be written.
    env = ScoredByEvaluation(num_envs=4, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(
        env,
        policy,
        PPO(policy, batch_size=8),
        eval_env=ScoredByEvaluation(num_envs=4, max_episode_steps=3),
        iterations=1,
        rollout_steps=3,
        eval_freq=1,
        num_eval_envs=4,
        num_eval_episodes=4,
        objective="eval/avg_reward",
        output_dir=str(tmp_path),
        progress=False,
        fresh_eval=False,
    )  # its evaluation would be the env's next reset, and score 6
    trainer.train()
    first = torch.load(tmp_path / "checkpoints" / "best.pt", weights_only=True)
    (tmp_path / "checkpoints" / "best.pt").unlink()
    (tmp_path / "checkpoints" / "best.pt").mkdir()  # a path no file can be renamed onto
    trainer.cfg.iterations = 2
    with pytest.raises(OSError, match="cannot write the checkpoint"):
        trainer.train()
    summary = RunSummary.read(tmp_path)
    assert summary.status == "failed" and summary.final["eval/avg_reward"] == 6.0  # the second evaluation's
    assert (
        (summary.best_objective, summary.best_objective_step)
        == (first["best_objective"], first["global_step"])
        == (3.0, 12)
    )


def test_a_failed_fresh_evaluation_leaves_the_run_completed_and_says_why(tmp_path, capsys):
    from rlchain.core.evaluation import fresh_seed

    class RefusesFreshStarts(LineEnv):
        def reset(self, *, seed=None, options=None):
            if seed == fresh_seed(0):
                raise RuntimeError("no such start states")
            return super().reset(seed=seed, options=options)

    env = LineEnv(num_envs=4)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
    trainer = Trainer(
        env,
        policy,
        PPO(policy, batch_size=8),
        eval_env=RefusesFreshStarts(num_envs=4),
        iterations=2,
        rollout_steps=4,
        eval_freq=1,
        num_eval_envs=4,
        num_eval_episodes=4,
        output_dir=str(tmp_path),
        progress=False,
    )
    summary = trainer.train()
    assert summary.status == "completed" and summary.exit_code == 0
    assert summary.best_fresh == {"error": "RuntimeError: no such start states"} == RunSummary.read(tmp_path).best_fresh
    assert "the fresh evaluation of best.pt failed (the run is complete)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, rest",
    [
        (["algorithm=grpo"], "with an algorithm that resets every env when a rollout starts (GRPO): expected false"),
        (["env=gym", "env.id=Pendulum-v1"], "with GymVecEnv, which cannot move its episodes' step counts"),
    ],
)
def test_spread_episode_starts_where_it_cannot_work_is_refused_before_any_step(compose_cfg, overrides, rest):
    cfg = compose_cfg([*overrides, "trainer.spread_episode_starts=true", "env.num_envs=8", "device=cpu"])
    with pytest.raises(ConfigError) as info:
        build(cfg)
    assert str(info.value).startswith("Invalid config: trainer.spread_episode_starts=True is not allowed ")
    assert rest in str(info.value)
    assert not (Path(cfg.trainer.output_dir) / "metrics.jsonl").exists()
