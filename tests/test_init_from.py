"""trainer.init_from: a run starts from another run's policy (fine-tuning), with a fresh optimiser and step count."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import TINY, rows, run_cli
from rlchain.algorithms import GRPO, PPO
from rlchain.envs import CartPoleEnv
from rlchain.policies import ActorCritic
from rlchain.trainer import Trainer
from rlchain.summary import RunSummary

# 8-step push_cube episodes, so a GRPO rollout (TINY: 8 steps) holds a whole one.
SHORT = [*TINY, "env=push_cube", "env.episode_length=8"]


def test_grpo_fine_tunes_a_ppo_policy_against_the_loaded_reference(tmp_path):
    ppo_dir, grpo_dir = tmp_path / "ppo", tmp_path / "grpo"
    # Without observation normalisation, so that the first rollout's statistics
    # do not move the live policy away from the reference before the first update.
    fixed = [*SHORT, "policy.obs_normalization=false"]
    proc = run_cli(["algorithm=ppo", *fixed, f"trainer.output_dir={ppo_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # One minibatch per update (16 envs x 8 steps), one epoch: the first update's
    # KL is measured before its only optimiser step, so against the reference.
    proc = run_cli(["algorithm=grpo", "policy=actor_critic", "algorithm.kl_coef=0.02", f"trainer.init_from={ppo_dir}",
                    *fixed, "algorithm.n_epochs=1", "algorithm.batch_size=128", f"trainer.output_dir={grpo_dir}"],
                   tmp_path)  # fmt: skip
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


def test_a_checkpoint_whose_policy_does_not_match_is_refused_naming_the_shapes(tmp_path):
    ppo_dir = tmp_path / "ppo"
    proc = run_cli(["algorithm=ppo", *SHORT, "policy.hidden_sizes=[32]", f"trainer.output_dir={ppo_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(["algorithm=grpo", "policy=actor_critic", *SHORT, f"trainer.init_from={ppo_dir}",
                    f"trainer.output_dir={tmp_path / 'grpo'}"], tmp_path)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("Invalid config: trainer.init_from=") and "does not match this run's" in line
    assert re.search(r"is \(32, \d+\) there, \(128, \d+\) here", line), line
    assert not (tmp_path / "grpo" / "metrics.jsonl").exists()


def _cart_pole_run(tmp_path, name, **trainer_kwargs):
    env = CartPoleEnv(num_envs=4, max_episode_steps=8, seed=0)
    policy = ActorCritic(env.single_observation_space, env.single_action_space)
    algorithm = GRPO(policy, group_size=2, kl_coef=0.1) if name == "grpo" else PPO(policy)
    return Trainer(env, policy, algorithm, iterations=1, rollout_steps=8, eval_freq=1, num_eval_envs=2,
                   num_eval_episodes=2, output_dir=str(tmp_path / name), progress=False, **trainer_kwargs)  # fmt: skip


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
