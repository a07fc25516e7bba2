"""PushCube: physics invariants, solvability, determinism, gymnasium API, errors."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from rlchain.core.collector import SyncCollector
from rlchain.core.envs import PushCubeEnv, check_vec_env
from rlchain.core.envs.push_cube_controller import scripted_action
from rlchain.core.envs.push_cube_physics import square_contact
from rlchain.core.policies import ActorCritic


def penetration(env: PushCubeEnv) -> torch.Tensor:
    """Depth (m) by which the pusher disc overlaps the cube, ``[N]``."""
    c, s = torch.cos(env.cube_yaw), torch.sin(env.cube_yaw)
    rx, ry = env.pusher_x - env.cube_x, env.pusher_y - env.cube_y
    signed = square_contact(c * rx + s * ry, c * ry - s * rx, env.cfg.cube_size / 2)[0]
    return (env.cfg.pusher_radius - signed).clamp_min(0)


def place(env: PushCubeEnv, **state: float | torch.Tensor) -> None:
    """Set every env to one state given by keyword (unnamed fields become zero)."""
    n = env.num_envs
    full = {k: torch.zeros(n) for k in ("cube_x", "cube_y", "cube_yaw", "cube_vx", "cube_vy", "cube_omega")}
    full.update(pusher_x=torch.full((n,), -0.3), pusher_y=torch.full((n,), -0.3))
    full.update(goal_x=torch.full((n,), 0.3), goal_y=torch.full((n,), 0.3))
    for key, value in state.items():
        full[key] = torch.as_tensor(value, dtype=torch.float32).expand(n).clone()
    env.set_state(full)


def random_contact_states(env: PushCubeEnv, gen: torch.Generator) -> None:
    """Cubes anywhere on the table with random yaw and twist; pushers in or near contact."""
    n = env.num_envs
    u = lambda lo, hi: lo + (hi - lo) * torch.rand(n, generator=gen)  # noqa: E731
    cube_x, cube_y, yaw = u(-0.4, 0.4), u(-0.4, 0.4), u(-math.pi, math.pi)
    ang, dist = u(-math.pi, math.pi), u(0.06, 0.12)
    env.set_state(
        dict(
            cube_x=cube_x,
            cube_y=cube_y,
            cube_yaw=yaw,
            cube_vx=u(-0.5, 0.5),
            cube_vy=u(-0.5, 0.5),
            cube_omega=u(-5, 5),
            pusher_x=cube_x + dist * torch.cos(ang),
            pusher_y=cube_y + dist * torch.sin(ang),
            goal_x=u(-0.3, 0.3),
            goal_y=u(-0.3, 0.3),
        )
    )
    # Start from a contact-free configuration, as the env itself guarantees.
    inside = penetration(env) > 0
    env.set_state(
        dict(
            pusher_x=torch.where(inside, cube_x + 0.2 * torch.cos(ang), env.pusher_x),
            pusher_y=torch.where(inside, cube_y + 0.2 * torch.sin(ang), env.pusher_y),
        )
    )


def test_no_interpenetration_deeper_than_2mm_under_random_pushing():
    env = PushCubeEnv(num_envs=4096, seed=0)
    gen = torch.Generator().manual_seed(0)
    random_contact_states(env, gen)
    worst = 0.0
    for _ in range(40):
        # Aim at the cube with noise so that most envs are in contact.
        aim = torch.stack((env.cube_x - env.pusher_x, env.cube_y - env.pusher_y), -1) / env.cfg.action_scale
        action = (aim + torch.randn(env.num_envs, 2, generator=gen)).clamp(-1, 1)
        _, _, term, trunc, info = env.step(action)
        fin = info["final_obs"]
        # Measure on the state the step ended in (final_obs for reset envs).
        probe = PushCubeEnv(num_envs=env.num_envs)
        probe.set_state(
            dict(
                pusher_x=fin[:, 0],
                pusher_y=fin[:, 1],
                cube_x=fin[:, 2],
                cube_y=fin[:, 3],
                cube_yaw=torch.atan2(fin[:, 5], fin[:, 4]),
            )
        )
        worst = max(worst, penetration(probe).max().item())
    assert worst <= 0.002, f"pusher penetrated the cube by {worst * 1000:.2f} mm"
    # The test really exercised contacts: the cubes moved.
    assert torch.hypot(env.cube_vx, env.cube_vy).max() > 0.1


def test_cube_at_rest_without_contact_stays_put():
    env = PushCubeEnv(num_envs=8, seed=0)
    place(env, cube_x=0.1, cube_y=-0.05, cube_yaw=0.3, pusher_x=-0.4, pusher_y=-0.4)
    for _ in range(20):
        env.step(torch.zeros(8, 2))
    assert torch.equal(env.cube_x, torch.full((8,), 0.1))
    assert torch.equal(env.cube_y, torch.full((8,), -0.05))
    assert torch.allclose(env.cube_yaw, torch.full((8,), 0.3))


def test_released_sliding_cube_comes_to_rest_by_friction():
    env = PushCubeEnv(num_envs=4, seed=0)
    place(env, cube_vx=0.5, cube_vy=-0.2, cube_omega=3.0, pusher_x=-0.5, pusher_y=-0.5)
    x0 = env.cube_x.clone()
    _, _, _, _, info = env.step(torch.zeros(4, 2))
    assert (env.cube_x > x0).all(), "the cube slides in the direction of its velocity"
    for _ in range(5):
        env.step(torch.zeros(4, 2))
    assert torch.count_nonzero(env.cube_vx) == 0 and torch.count_nonzero(env.cube_omega) == 0
    # Coulomb deceleration mu*g: sliding distance v^2 / (2 mu g), up to discretisation.
    speed = math.hypot(0.5, 0.2)
    travelled = math.hypot(env.cube_x[0].item(), env.cube_y[0].item() + 0.0)
    assert travelled == pytest.approx(speed**2 / (2 * 0.5 * 9.81), rel=0.15)


def test_face_centre_push_translates_without_rotation():
    env = PushCubeEnv(num_envs=1, seed=0)
    place(env, cube_x=0.0, cube_y=0.0, cube_yaw=0.0, pusher_x=-0.09, pusher_y=0.0)
    for _ in range(10):
        env.step(torch.tensor([[1.0, 0.0]]))
    assert env.cube_x.item() > 0.3
    assert env.cube_yaw.item() == 0.0 and env.cube_y.item() == 0.0


@pytest.mark.parametrize("offset, sense", [(0.035, -1.0), (-0.035, 1.0)])
def test_off_centre_push_rotates_in_the_sense_of_the_torque(offset, sense):
    # Pushing the left face in +x above its centre turns the cube clockwise
    # (torque r x F < 0), below the centre counter-clockwise.
    env = PushCubeEnv(num_envs=1, seed=0)
    place(env, pusher_x=-0.08, pusher_y=offset)
    for _ in range(3):
        env.step(torch.tensor([[1.0, 0.0]]))
    assert sense * env.cube_yaw.item() > 0.1
    assert env.cube_x.item() > 0.02


def test_cube_pushed_off_the_table_terminates_as_failure():
    env = PushCubeEnv(num_envs=1, seed=0)
    place(env, cube_x=0.5, cube_y=0.0, pusher_x=0.41, pusher_y=0.0, goal_x=-0.2, goal_y=0.0)
    ended = False
    for _ in range(10):
        _, _, term, trunc, info = env.step(torch.tensor([[1.0, 0.0]]))
        cube_x = info["final_obs"][0, 2].item()
        if cube_x > env.cfg.table_half_extent:
            assert term.item() and not trunc.item() and not info["success"].item()
            assert info["metrics"][0, env.metric_names.index("cube_off_table")].item() == 1.0
            ended = True
            break
        assert not term.item()
    assert ended
    # The env reset in the same step: the cube is back in the spawn region.
    assert abs(env.cube_x.item()) <= env.cfg.cube_spawn_half_extent


def test_cube_never_leaves_the_table_unnoticed():
    env = PushCubeEnv(num_envs=2048, seed=3)
    gen = torch.Generator().manual_seed(3)
    for _ in range(300):
        action = torch.rand(env.num_envs, 2, generator=gen) * 2 - 1
        obs, _, term, trunc, info = env.step(action)
        fin = info["final_obs"]
        off = (fin[:, 2:4].abs() > env.cfg.table_half_extent).any(-1)
        assert bool(term[off].all())
        # Live envs are always on the table.
        assert bool((obs[:, 2:4].abs() <= env.cfg.table_half_extent).all())


def test_scripted_controller_solves_90_percent_of_1000_episodes():
    env = PushCubeEnv(num_envs=1000, seed=123)
    obs, _ = env.reset()
    finished = torch.zeros(1000, dtype=torch.bool)
    solved = torch.zeros(1000, dtype=torch.bool)
    for _ in range(env.cfg.max_episode_steps):
        obs, _, term, trunc, info = env.step(scripted_action(obs, env))
        solved |= info["success"] & ~finished
        finished |= term | trunc
    assert bool(finished.all())
    assert solved.float().mean().item() >= 0.9


def rollout(seed: int, steps: int = 50, **kw) -> list[torch.Tensor]:
    env = PushCubeEnv(num_envs=64, seed=seed, **kw)
    obs, _ = env.reset()
    gen = torch.Generator().manual_seed(99)
    out = [obs]
    for _ in range(steps):
        obs, reward, *_ = env.step(torch.rand(64, 2, generator=gen) * 2 - 1)
        out += [obs, reward]
    return out


def test_same_seed_gives_bit_identical_trajectories():
    a, b = rollout(7), rollout(7)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_different_seeds_give_different_trajectories():
    assert not torch.equal(rollout(7, steps=1)[0], rollout(8, steps=1)[0])


def test_reset_seed_restarts_the_stream():
    env = PushCubeEnv(num_envs=16, seed=0)
    first, _ = env.reset(seed=5)
    env.step(torch.zeros(16, 2))
    again, _ = env.reset(seed=5)
    assert torch.equal(first, again)


def test_group_reset_shares_states_within_groups_only():
    env = PushCubeEnv(num_envs=32, seed=0)
    obs, _ = env.reset(options={"group_size": 4})
    groups = obs.view(8, 4, -1)
    assert torch.equal(groups, groups[:, :1].expand_as(groups))
    firsts = groups[:, 0]
    assert torch.cdist(firsts, firsts).add(torch.eye(8) * 1e3).min() > 1e-3


def test_initial_states_satisfy_the_spawn_rules():
    env = PushCubeEnv(num_envs=20000, seed=1)
    obs, _ = env.reset()
    assert (obs[:, 2:4].abs() <= 0.2).all()
    assert (obs[:, 9:11].abs() <= 0.3).all()
    assert (obs[:, 13:15].norm(dim=-1) >= 0.15).all()
    assert (penetration(env) == 0).all() and (obs[:, 11:13].norm(dim=-1) > 0.0907).all()
    # Uniform yaw: both signs and the full range occur.
    yaw = torch.atan2(obs[:, 5], obs[:, 4])
    assert yaw.min() < -3.0 and yaw.max() > 3.0


def test_time_limit_truncates_and_bootstraps_final_obs():
    env = PushCubeEnv(num_envs=4, seed=0, max_episode_steps=5)
    place(env, pusher_x=-0.5, pusher_y=-0.5)
    for _ in range(5):
        obs, _, term, trunc, info = env.step(torch.zeros(4, 2))
    assert trunc.all() and not term.any()
    assert torch.equal(info["final_obs"][:, 0], torch.full((4,), -0.5))  # the state it ended in
    assert not torch.equal(obs, info["final_obs"])  # ... and a fresh episode began
    assert (env.elapsed_steps == 0).all()


def test_reward_terms_sum_to_the_reward_and_follow_their_potentials():
    env = PushCubeEnv(num_envs=256, seed=0, smoothness_weight=0.01)
    env.reset()
    place_before = torch.exp(-(env.goal_pos - env.cube_pos).norm(dim=-1).square() / (2 * 0.12**2))
    # Seeded actions: the global RNG's state depends on which tests ran before in the worker.
    actions = torch.rand(256, 2, generator=torch.Generator().manual_seed(11)) * 2 - 1
    _, reward, term, _, info = env.step(actions)
    assert env.reward_terms == ("reach", "place", "smoothness", "success")
    assert info["rewards"].shape == (256, 4) and info["rewards"].dtype == torch.float32
    terms = dict(zip(env.reward_terms, info["rewards"].unbind(-1)))
    assert torch.allclose(info["rewards"].sum(-1), reward)
    assert (terms["smoothness"] <= 0).all() and (terms["smoothness"] < 0).any()
    # Potential-based shaping: weight * shaping_scale * (Phi(s') - Phi(s)).
    fin = info["final_obs"]
    place_after = torch.exp(-fin[:, 13:15].norm(dim=-1).square() / (2 * 0.12**2))
    expected = 0.8 * 30.0 * (place_after - place_before)
    # float32: the env's Phi and this one round apart by ~1e-7 each, scaled by 0.8 * 30 (up to ~4e-6 seen)
    assert torch.allclose(terms["place"], expected, atol=1e-5)


def test_shaping_pays_nothing_for_hovering_and_the_success_bonus_once():
    # A cube held still just outside the success radius earns no shaping reward.
    env = PushCubeEnv(num_envs=2, seed=0)
    place(env, cube_x=0.0, cube_y=0.0, goal_x=0.12, goal_y=0.0, pusher_x=-0.4, pusher_y=0.4)
    _, reward, term, trunc, info = env.step(torch.zeros(2, 2))
    assert torch.equal(reward, torch.zeros(2)) and not term.any()
    # Pushing it in: success bonus 10 on the step the goal is reached.
    place(env, cube_x=0.0, cube_y=0.0, goal_x=0.13, goal_y=0.0, pusher_x=-0.075, pusher_y=0.0)
    _, reward, term, _, info = env.step(torch.tensor([[1.0, 0.0]] * 2))
    assert term.all() and info["success"].all()
    assert torch.allclose(info["rewards"][:, env.reward_terms.index("success")], torch.full((2,), 10.0))


@pytest.mark.filterwarnings("ignore:.*Box observation space m.*:UserWarning")
def test_gymnasium_single_env_passes_env_checker():
    env = gym.make("rlchain/PushCube-v0")
    check_env(env.unwrapped)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (15,) and obs.dtype.name == "float32"


def test_gymnasium_make_vec_returns_the_batched_env():
    env = gym.make_vec("rlchain/PushCube-v0", num_envs=32, vectorization_mode="vector_entry_point")
    assert isinstance(env, PushCubeEnv) and env.num_envs == 32
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, torch.Tensor) and obs.shape == (32, 15)
    assert env.observation_space.shape == (32, 15) and env.single_action_space.shape == (2,)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_cuda_agree():
    cpu = PushCubeEnv(num_envs=256, seed=0, device="cpu")
    gpu = PushCubeEnv(num_envs=256, seed=0, device="cuda")
    gpu.set_state(cpu.get_state())
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        action = torch.rand(256, 2, generator=gen) * 2 - 1
        a = cpu.step(action)
        b = gpu.step(action.cuda())
        done = (a[2] | a[3]).cpu()
        # Compare the states the step ended in; resets draw from different generators.
        assert torch.allclose(a[4]["final_obs"], b[4]["final_obs"].cpu(), atol=1e-4)
        assert torch.equal(done, (b[2] | b[3]).cpu())
        gpu.set_state(cpu.get_state())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_envs=0), "num_envs=0"),
        (dict(num_envs=2.5), "num_envs=2.5"),
        (dict(cube_size=-0.1), "cube_size=-0.1"),
        (dict(max_episode_steps=0), "max_episode_steps=0"),
        (dict(substeps=0), "substeps=0"),
        (dict(control_dt=float("nan")), "control_dt=nan"),
        (dict(action_scale=0.2, substeps=2), "pusher_radius"),
        (dict(goal_spawn_half_extent=0.7), "goal_spawn_half_extent=0.7"),
        (dict(friction_coef=-1), "friction_coef=-1"),
        (dict(seed="a"), "seed='a'"),
    ],
)
def test_bad_constructor_arguments_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PushCubeEnv(**kwargs)


def test_the_time_limits_old_name_is_refused_naming_the_new_one():
    import gymnasium as gym

    refusal = r"^episode_length=30 is not a setting any more: it is max_episode_steps now \(max_episode_steps=30\)$"
    with pytest.raises(ValueError, match=refusal):
        PushCubeEnv(num_envs=2, episode_length=30)
    with pytest.raises(ValueError, match=refusal):
        gym.make("rlchain/PushCube-v0", episode_length=30)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_device_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="device='cuda'.*no CUDA device"):
        PushCubeEnv(num_envs=4, device="cuda")


def test_bad_actions_raise():
    env = PushCubeEnv(num_envs=4, seed=0)
    with pytest.raises(ValueError, match=r"action has shape \(4, 3\): expected \(4, 2\)"):
        env.step(torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"action has shape \(2\,\)"):
        env.step(torch.zeros(2))
    with pytest.raises(ValueError, match="NaN or inf"):
        env.step(torch.tensor([[0.0, float("nan")]] * 4))


def test_actions_are_clipped_to_the_unit_box():
    a, b = PushCubeEnv(num_envs=4, seed=0), PushCubeEnv(num_envs=4, seed=0)
    a.step(torch.full((4, 2), 5.0))
    b.step(torch.full((4, 2), 1.0))
    assert torch.equal(a.pusher_pos, b.pusher_pos)


@pytest.mark.parametrize(
    "group_size, match", [(3, "group_size=3.*num_envs=8"), (0, "group_size=0"), (2.0, "group_size=2.0")]
)
def test_bad_group_size_raises(group_size, match):
    env = PushCubeEnv(num_envs=8, seed=0)
    with pytest.raises(ValueError, match=match):
        env.reset(options={"group_size": group_size})


def test_a_privileged_critic_variant_gives_the_actor_noisy_features_and_the_critic_the_exact_ones():
    env = PushCubeEnv(num_envs=64, seed=0, privileged_critic=True, obs_noise_std=0.05)
    check_vec_env(env)  # groups, their final observations, and a group reset's shared first observation
    exact = PushCubeEnv(num_envs=64, seed=0)
    obs, _ = env.reset(seed=1)
    truth, _ = exact.reset(seed=1)
    assert torch.equal(obs["critic"], truth)
    noise = obs["actor"] - obs["critic"]
    assert 0.045 < float(noise.std()) < 0.055 and abs(float(noise.mean())) < 0.005
    grouped, _ = env.reset(seed=1, options={"group_size": 8})
    assert torch.equal(grouped["actor"][:8], grouped["actor"][:1].expand(8, -1))  # a group's first draw is shared
    assert env.observation_names["actor"] == PushCubeEnv.observation_names
    single = gym.make("rlchain/PushCube-v0", privileged_critic=True)
    first, _ = single.reset(seed=0)
    assert set(first) == {"actor", "critic"} and first["actor"].shape == (15,)


class PushCubeAsDicts(PushCubeEnv):
    """PushCube in the dict form of the contract: the same terms, as dicts of ``[N]`` tensors."""

    reward_terms = metric_names = None

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        info["rewards"] = dict(zip(PushCubeEnv.reward_terms, info["rewards"].unbind(-1)))
        info["metrics"] = dict(zip(PushCubeEnv.metric_names, info["metrics"].unbind(-1)))
        return obs, reward, terminated, truncated, info


def test_the_collectors_term_means_are_the_means_of_each_steps_terms_in_either_form():
    steps, n = 12, 16
    settings = {"num_envs": n, "seed": 2, "max_episode_steps": 5, "smoothness_weight": 0.01}

    def collect(env_class):
        torch.manual_seed(0)  # the policy's weights and its sampled actions
        env = env_class(**settings)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[8])
        return SyncCollector(env, policy, rollout_steps=steps).collect()

    rollout = collect(PushCubeEnv)
    # The plain reference: the same env replayed with the rollout's actions, each step's columns summed in float64.
    env = PushCubeEnv(**settings)
    env.reset()
    sums: dict[str, float] = {}
    for action in rollout.data["action"]:  # episodes of at most 5 steps: resets inside the rollout
        info = env.step(action)[4]
        for group, names in (("rewards", env.reward_terms), ("metrics", env.metric_names)):
            for k, name in enumerate(names):
                key = f"{group}/{name}"
                sums[key] = sums.get(key, 0.0) + info[group][:, k].double().sum().item()
    assert list(rollout.term_means) == list(sums)
    for key, total in sums.items():
        assert rollout.term_means[key] == pytest.approx(total / (steps * n), rel=1e-5, abs=1e-8), key
    assert rollout.term_means["rewards/smoothness"] < 0 and rollout.term_means["metrics/distance_to_goal"] > 0
    assert collect(PushCubeAsDicts).term_means == rollout.term_means  # the dict form: the same sums, exactly
