"""A population of trainers built from Python: refused before its first step where it does not fit in memory,
naming the largest population that does; members of other shapes refused naming the setting; a member whose
actions its envs reject fails alone; the members' evaluations run at once, each as its own evaluator's."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from rlchain.core.algorithms import GRPO, PPO
from rlchain.core.envs import PushCubeEnv
from rlchain.core.networks import CNNEncoder
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.run.population import PopulationRun, free_memory, member_bytes
from rlchain.run.summary import RunSummary
from rlchain.run.trainer import Trainer
from rlchain.settings import SettingError
from tests.helpers.evaluation_fault_env import EvaluationFaultPushCube
from tests.helpers.runs import rows


def trainer(
    tmp_path, seed: int, ppo: dict | None = None, grpo: dict | None = None, env_cfg: dict | None = None, **settings
) -> Trainer:
    """A started trainer of push_cube (8 envs, 8-step episodes; ``env_cfg``: another ``_target_`` and its
    settings) and PPO with ``ppo``'s settings, or GRPO with ``grpo``'s (groups of 4), as rlchain-train builds one."""
    torch.manual_seed(seed)
    env_cfg = {
        "_target_": "rlchain.core.envs.PushCubeEnv",
        **(env_cfg or {}),
        "num_envs": 8,
        "seed": seed,
        "max_episode_steps": 8,
    }
    env = instantiate(env_cfg)
    if grpo is None:
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[16])
        algorithm = PPO(policy, **{"batch_size": 32, "n_epochs": 1, **(ppo or {})})
    else:
        policy = ActorOnly(env.single_observation_space, env.single_action_space, hidden_sizes=[16])
        algorithm = GRPO(policy, batch_size=32, n_epochs=1, group_size=4, **grpo)
    policy.seed_actions(seed)
    built = Trainer(
        env,
        policy,
        algorithm,
        run_config={"env": env_cfg},
        output_dir=str(tmp_path / str(seed)),
        seed=seed,
        rollout_steps=8,
        progress=False,
        **{"iterations": 2, **settings},
    )
    built.start()
    return built


def test_a_population_that_does_not_fit_is_refused_naming_the_largest_that_does(tmp_path):
    members = [trainer(tmp_path, s) for s in (1, 2, 3)]
    per = member_bytes(members[0])
    assert per > 8 * 8 * 4  # at least the rollout storage of 8 envs x 8 steps
    with pytest.raises(SettingError, match=r"^hydra\.launcher\.max_members=3 members need about .* at most 2 fit"):
        PopulationRun(members, free_bytes=2 * per + per // 2)
    sessions = PopulationRun(members, free_bytes=3 * per).train()  # it fits: every member trains
    assert [s.summary.status for s in sessions] == ["completed"] * 3
    assert all((tmp_path / str(s) / "checkpoints" / "latest.pt").exists() for s in (1, 2, 3))


def test_members_whose_trainer_settings_differ_are_refused_naming_the_setting(tmp_path):
    members = [trainer(tmp_path, 1), trainer(tmp_path, 2, eval_freq=5)]
    with pytest.raises(SettingError, match=r"^trainer\.eval_freq=\[10, 5\] differs between members"):
        PopulationRun(members)


def test_a_member_whose_actions_its_envs_reject_fails_alone_as_its_solo_run_fails(tmp_path):
    """Member 1's policy acts with NaN weights (as one whose update diverged into its parameters would): its envs
    reject its actions. It ends alone, with its solo run's one line; the others train to their end, and their
    envs never see its actions."""

    def poisoned(t: Trainer) -> Trainer:
        with torch.no_grad():
            for param in t.policy.parameters():
                param.fill_(float("nan"))
        return t

    solo = poisoned(trainer(tmp_path / "solo", 2))
    with pytest.raises(Exception) as solo_failure:
        solo.train()
    members = [trainer(tmp_path, 1), poisoned(trainer(tmp_path, 2)), trainer(tmp_path, 3)]
    sessions = PopulationRun(members).train()
    assert [s.summary.status for s in sessions] == ["completed", "failed", "completed"]
    assert sessions[1].summary.error == RunSummary.read(solo.output_dir).error
    assert "action" in sessions[1].summary.error, sessions[1].summary.error
    assert type(sessions[1].failure) is type(solo_failure.value)
    # The others are the population they would be without member 1: the same weights at the end.
    clean = [trainer(tmp_path / "clean", s) for s in (1, 2, 3)]
    PopulationRun(clean).train()
    for p in (0, 2):
        for mine, theirs in zip(members[p].policy.state_dict().values(), clean[p].policy.state_dict().values()):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def test_a_population_evaluates_its_members_at_once_each_as_its_own_evaluator_would(tmp_path):
    """Every member's evaluations run as one (the population's policy on every member's evaluation envs): each
    member logs them as its own rows, at its own evaluation steps, and the last equals what the member's own
    evaluator gives for its final policy (to float rounding); the shared evaluation's seconds are each member's."""
    evaluation = {"eval_freq": 1, "num_eval_envs": 4, "num_eval_episodes": 8}
    members = [
        trainer(tmp_path, s, eval_env=functools.partial(PushCubeEnv, max_episode_steps=8), **evaluation)
        for s in (1, 2, 3)
    ]
    run = PopulationRun(members)
    assert run.eval_env is not None and run.eval_env.num_envs == 12
    sessions = run.train()
    assert [s.summary.status for s in sessions] == ["completed"] * 3
    logged = [[r for r in rows(tmp_path / str(s)) if "eval/avg_reward" in r] for s in (1, 2, 3)]
    assert [[r["charts/iteration"] for r in member] for member in logged] == [[1, 2]] * 3
    assert len({member[-1]["time/eval_s"] for member in logged}) == 1
    for member, t in zip(logged, members):
        last = member[-1]
        own = t.evaluator.evaluate(t.policy, t.state.global_step)
        assert last["eval/episodes"] == own["eval/episodes"] == 8
        for key in ("eval/avg_reward", "eval/avg_length", "eval/success_rate"):
            assert last[key] == pytest.approx(own[key], rel=1e-5, abs=1e-6), key


def test_a_shared_evaluation_that_fails_leaves_each_member_to_evaluate_alone_failing_only_its_own(tmp_path, capsys):
    """The members' shared evaluation raises (its env refuses the reset split into members): from then on each
    member due evaluates alone, with its own evaluator, as its solo run does. Member 1's own evaluation raises too (its reset
    seed 3): it fails alone with its solo run's error; the others complete with their evaluations logged."""
    faults = {"_target_": "tests.helpers.evaluation_fault_env.EvaluationFaultPushCube", "fail_seed": 3}
    evaluation = {"eval_freq": 1, "num_eval_envs": 4, "num_eval_episodes": 4}
    eval_env = functools.partial(EvaluationFaultPushCube, fail_seed=3, max_episode_steps=8)
    solo = trainer(tmp_path / "solo", 2, env_cfg=faults, eval_env=eval_env, **evaluation)
    with pytest.raises(RuntimeError, match="the reset of seed 3 failed"):
        solo.train()
    members = [
        trainer(tmp_path, s, env_cfg={**faults, "shared_fails": True}, eval_env=eval_env, **evaluation)
        for s in (1, 2, 3)
    ]
    sessions = PopulationRun(members).train()
    assert [s.summary.status for s in sessions] == ["completed", "failed", "completed"]
    assert sessions[1].summary.error == RunSummary.read(solo.output_dir).error
    # Said once: after the first failure the members evaluate alone, without trying the shared evaluation again.
    assert capsys.readouterr().err.count("the members' shared evaluation failed (RuntimeError: the shared reset") == 1
    for p in (0, 2):
        t = members[p]
        logged = [r for r in rows(t.output_dir) if "eval/avg_reward" in r]
        assert [r["charts/iteration"] for r in logged] == [1, 2]
        own = t.evaluator.evaluate(t.policy, t.state.global_step)
        assert logged[-1]["eval/avg_reward"] == pytest.approx(own["eval/avg_reward"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_members_that_resume_and_members_that_start_afresh_train_in_one_population_as_they_would_apart(tmp_path, algo):
    """A sweep resumed with other slots can put a resumed member (seed 1, stopped after 2 of its 3 iterations)
    beside one that starts afresh (seed 2): each ends as it would have without the other, bit for bit on the CPU,
    its linear schedule at its own update count (PPO: episodes that carry across rollouts; GRPO: every rollout
    starts with a reset)."""
    linear = {"lr_schedule": "linear", "total_iterations": 3}
    settings = {"ppo": linear} if algo == "ppo" else {"grpo": linear}
    first = PopulationRun([trainer(tmp_path / "mixed", s, **settings) for s in (1, 3)])  # 2 iterations
    first.train()
    mixed = [
        trainer(tmp_path / "mixed", 1, iterations=3, resume_from="auto", **settings),
        trainer(tmp_path / "mixed", 2, iterations=3, **settings),
    ]
    assert mixed[0].state.iteration == 2 and mixed[1].state.iteration == 0
    sessions = PopulationRun(mixed).train()
    assert [s.summary.status for s in sessions] == ["completed"] * 2
    straight = [trainer(tmp_path / "straight", s, iterations=3, **settings) for s in (1, 2)]
    PopulationRun(straight).train()
    for mine, theirs in zip(mixed, straight):
        assert mine.state.global_step == theirs.state.global_step == 3 * 8 * 8
        for a, b in zip(mine.policy.state_dict().values(), theirs.policy.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        logged, want = rows(mine.output_dir), rows(theirs.output_dir)
        assert [r["losses/policy_loss"] for r in logged] == [r["losses/policy_loss"] for r in want]


def test_a_population_on_a_device_that_slots_share_plans_for_its_share_of_the_memory():
    """Populations that start together on one device each see what is free at their start: with the launcher's
    jobs_per_device=J (in each worker's environment, which the population launcher's worker passes on), each plans
    for at most 1/J of the device's memory."""
    from hydra_plugins.rlchain_launcher._slots import SHARING, make_slots

    assert {slot.environ()[SHARING] for slot in make_slots(["cpu"], 4, 1)} == {"4"}
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    alone = free_memory(torch.device("cpu"))
    assert alone > total // 4  # this machine has more than a quarter of its memory free
    assert free_memory(torch.device("cpu"), sharing=4) == total // 4


def test_a_camera_members_memory_estimate_counts_its_image_encoders_maps(tmp_path):
    """A CNN's activations (every convolution's output map, per sample of a minibatch, kept for the backward, and
    their gradients) are most of a camera member's memory: each sample more in a minibatch adds them."""
    camera = trainer(tmp_path / "32", 1, env_cfg={"obs_mode": "pixels"})
    encoders = [m for m in camera.policy.modules() if isinstance(m, CNNEncoder)]
    assert len(encoders) == 2  # the actor's and the critic's
    maps = sum(e.activation_floats for e in encoders)
    assert maps == 2 * (32 * 15 * 15 + 64 * 6 * 6 + 64 * 4 * 4 + 256)  # the default CNN on a 64 x 64 image
    larger = trainer(tmp_path / "64", 1, ppo={"batch_size": 64}, env_cfg={"obs_mode": "pixels"})
    per_sample = 2 * 16 + maps  # both networks' hidden layer of 16, and the maps
    assert member_bytes(larger) - member_bytes(camera) == 32 * per_sample * 4 * 4  # float32, kept and grads, x 2
