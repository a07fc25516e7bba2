"""Hydra composition, the rlchain-train command, bad input, and the installed wheel."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from rlchain.algorithms import GRPO, PPO, GRPOConfig
from rlchain.config import SCHEMAS
from rlchain.envs import PushCubeEnv
from rlchain.policies import ActorCritic, ActorOnly
from rlchain.settings import Settings
from rlchain.train import ConfigError, build, train
from rlchain.trainer import Trainer, TrainerConfig
from rlchain.summary import RunSummary

from conftest import TESTS, TINY, run_cli

REPO = TESTS.parent
#: Arguments given at instantiate time, never written in YAML.
RUNTIME_ONLY = {"observation_space", "action_space", "policy", "env", "algorithm", "eval_env", "run_config"}


# ------------------------------------------------------------ composition
def test_default_composition_builds_ppo_on_push_cube(compose_cfg):
    cfg = compose_cfg(TINY)
    assert cfg.env._target_ == "rlchain.envs.push_cube.PushCubeEnv"
    assert cfg.algorithm._target_ == "rlchain.algorithms.PPO" and cfg.policy._target_ == "rlchain.policies.ActorCritic"
    trainer = build(cfg)
    assert isinstance(trainer, Trainer) and isinstance(trainer.env, PushCubeEnv)
    assert type(trainer.policy) is ActorCritic and isinstance(trainer.algorithm, PPO)
    assert trainer.env.num_envs == 16 and trainer.eval_env.num_envs == 8
    assert trainer.eval_env is not trainer.env and trainer.eval_env.seed == cfg.seed + 1
    assert trainer.config["algorithm"]["total_iterations"] == 2  # interpolated from trainer.iterations


def test_grpo_selects_actor_only_unless_a_policy_is_named(compose_cfg):
    cfg = compose_cfg(["algorithm=grpo", *TINY, "env.num_envs=16", "env.episode_length=8"])
    assert cfg.policy._target_ == "rlchain.policies.ActorOnly"
    trainer = build(cfg)
    assert isinstance(trainer.algorithm, GRPO) and type(trainer.policy) is ActorOnly
    assert trainer.algorithm.reset_options == {"group_size": 8}
    cfg = compose_cfg(["algorithm=grpo", "policy=actor_critic", *TINY, "env.episode_length=8"])
    assert type(build(cfg).policy) is ActorCritic


@pytest.mark.parametrize("group, option", [(g, n) for g, n, _ in SCHEMAS])
def test_every_option_composes_and_is_validated_by_its_schema(compose_cfg, group, option):
    cfg = compose_cfg([f"{group}={option}"])
    node = cfg[group]
    schema = dict(SCHEMAS_BY_OPTION)[(group, option)]
    assert node._target_ == schema._target_
    assert set(node.keys()) == {f.name for f in dataclasses.fields(schema)}


SCHEMAS_BY_OPTION = [((g, n), s) for g, n, s in SCHEMAS]


def test_seed_and_device_reach_every_component(compose_cfg):
    cfg = compose_cfg(["seed=7", "device=cpu"])
    assert cfg.env.seed == cfg.algorithm.seed == cfg.trainer.seed == 7
    assert cfg.env.device == "cpu"
    assert compose_cfg([]).env.device == "auto"


def test_overrides_reach_the_instances(compose_cfg):
    cfg = compose_cfg([*TINY, "algorithm.learning_rate=0.002", "policy.hidden_sizes=[16,8]", "env.episode_length=50"])
    trainer = build(cfg)
    assert trainer.algorithm.current_lr == pytest.approx(0.002)
    assert [m.out_features for m in trainer.policy.actor if isinstance(m, torch.nn.Linear)] == [16, 8, 2]
    assert trainer.env.max_episode_steps == 50


@pytest.mark.parametrize("experiment, algo", [("push_cube_ppo", PPO), ("push_cube_grpo", GRPO)])
def test_experiment_presets(compose_cfg, experiment, algo):
    cfg = compose_cfg([f"experiment={experiment}", *TINY, "env.episode_length=8"])
    assert isinstance(build(cfg).algorithm, algo)
    assert compose_cfg([f"experiment={experiment}"]).algorithm.learning_rate == 1e-3


def test_settings_errors_write_their_bounds_in_full():
    with pytest.raises(ValueError, match=r"^seed=-1 is not allowed: expected an integer in \[0, 4294967295\]$"):
        TrainerConfig(seed=-1)
    with pytest.raises(ValueError, match=r"^eps=0.0 is not allowed: expected a number > 0$"):
        GRPOConfig(eps=0)


def test_the_algorithm_checks_its_env_once(compose_cfg):
    from user_components import EnvCheckCountingPPO

    EnvCheckCountingPPO.checks = 0
    build(compose_cfg([*TINY, "algorithm._target_=user_components.EnvCheckCountingPPO"]))
    assert EnvCheckCountingPPO.checks == 1


def test_presets_fill_their_slots(tmp_path, compose_cfg):
    # experiment, study, sweep, hparams_search and debug have slots in the defaults list: `experiment=x`
    # selects a preset, and debug comes last, so it shrinks whatever preset the run chose.
    for args in (["experiment=push_cube_ppo"], ["experiment=push_cube_ppo", "debug=tiny"]):
        proc = run_cli(["--cfg", "job", *args], tmp_path)
        assert proc.returncode == 0, proc.stderr
        job = OmegaConf.create(proc.stdout)
        tiny = "debug=tiny" in args
        assert (job.env.num_envs, job.trainer.iterations) == ((16, 2) if tiny else (512, 400)), args
    assert compose_cfg(["hparams_search=ppo_push_cube_optuna"]).trainer.iterations == 400
    # `+experiment=x`, the spelling from before the slots, is Hydra's error: the group is in the defaults list
    proc = run_cli(["--cfg", "job", "+experiment=push_cube_ppo"], tmp_path)
    assert proc.returncode == 1 and "Multiple values for experiment" in proc.stderr


def test_each_setting_is_written_once_in_its_schema():
    # A component's constructor names only runtime objects and takes its
    # settings as **settings: the schema (a Settings dataclass) is the one
    # place of each setting's default, type, range and doc.
    for group, option, schema in SCHEMAS:
        target = get_class(schema._target_)
        params = list(inspect.signature(target.__init__).parameters.values())
        # a positional-only shorthand (GymVecEnv("Pendulum-v1", ...)) passes the value on, with no default of its own
        named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.POSITIONAL_ONLY)} - {"self"}
        assert named <= RUNTIME_ONLY, f"{group}/{option}: {target.__name__} names settings {named - RUNTIME_ONLY}"
        assert all(p.default is None for p in params[1:] if p.kind is p.POSITIONAL_ONLY), f"{group}/{option}"
        assert any(p.kind is p.VAR_KEYWORD for p in params), f"{group}/{option}: {target.__name__} takes no **settings"
        assert issubclass(schema, Settings), f"{group}/{option}: {schema.__name__} is not a Settings dataclass"


def test_a_built_component_holds_its_composed_settings(compose_cfg):
    cfg = compose_cfg([*TINY, "algorithm.clip_coef=0.3", "policy.hidden_sizes=[16,8]", "trainer.save_freq=7"])
    trainer = build(cfg)
    for component, node in ((trainer, cfg.trainer), (trainer.algorithm, cfg.algorithm), (trainer.policy, cfg.policy),
                            (trainer.env, cfg.env)):  # fmt: skip
        expected = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "_target_"}
        assert {k: getattr(component.cfg, k) for k in expected} == expected, type(component).__name__


# ------------------------------------------------------------ the command
def test_single_run_end_to_end(tmp_path):
    proc = run_cli(["algorithm=grpo", *TINY, "env.episode_length=8"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "metrics.jsonl", "summary.json",
                 "checkpoints/latest.pt", "checkpoints/best.pt"):  # fmt: skip
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").glob("events.*"))
    summary = RunSummary.read(run_dir)
    assert summary.status == "completed" and summary.global_step == 2 * 16 * 8
    assert summary.exp_name == "grpo_push_cube"
    assert f"final eval success rate {summary.final['eval/success_rate']:.3f}" in proc.stdout


def test_multirun_runs_four_jobs_each_in_its_own_directory(tmp_path):
    proc = run_cli(["-m", "algorithm=ppo,grpo", "seed=0,1", *TINY, "env.episode_length=8"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    (sweep,) = list((tmp_path / "multirun").glob("*/*"))
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]
    seen = set()
    for job in jobs:
        summary = RunSummary.read(job)
        assert summary.status == "completed" and summary.global_step == 256
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        seen.add((summary.exp_name, "seed=1" in overrides))
        assert (job / "checkpoints" / "latest.pt").is_file()
    assert seen == {("ppo_push_cube", False), ("ppo_push_cube", True), ("grpo_push_cube", False), ("grpo_push_cube", True)}


def test_users_own_env_policy_and_algorithm_from_their_config_dir(tmp_path):
    proc = run_cli(["--config-dir", str(TESTS / "user_conf"), "env=line", "policy=wide", "algorithm=counting_ppo",
                    "device=cpu", "trainer.iterations=3", "trainer.rollout_steps=6", "trainer.num_eval_envs=4",
                    "trainer.num_eval_episodes=4", "trainer.progress=false"], tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["losses/updates_seen"] for r in rows] == [1.0, 2.0, 3.0]
    assert "metrics/distance" in rows[-1]


def test_help_and_cfg_job(tmp_path):
    proc = run_cli(["--help"], tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("rlchain-train is powered by Hydra.")
    for text in ("algorithm: grpo, grpo_schema, ppo, ppo_schema",
                 "env: cart_pole, cart_pole_schema, gym, gym_schema, push_cube, push_cube_schema",
                 "experiment: cart_pole_grpo, cart_pole_ppo, gym_cart_pole_ppo, gym_half_cheetah_ppo, gym_pendulum_ppo, "
                 "push_cube_grpo, push_cube_ppo", "sweep: grpo_push_cube, ppo_push_cube",
                 "policy: actor_critic, actor_critic_schema, actor_only, actor_only_schema"):
        assert text in proc.stdout
    proc = run_cli(["--cfg", "job", "algorithm=grpo"], tmp_path)
    assert proc.returncode == 0 and "_target_: rlchain.algorithms.GRPO" in proc.stdout
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm=ppx"], "Could not find 'algorithm/ppx'"),
        (["algorithm.learning_rat=1e-3"], "Key 'learning_rat' not in 'PPOConfig'"),
        (["env.num_envs=many"], "Value 'many' of type 'str' could not be converted to Integer"),
        (["algorithm.clip_coef=-1"], "algorithm.clip_coef=-1.0 is not allowed: expected a number > 0"),
        (["env.num_envs=0"], "env.num_envs=0 is not allowed: expected an integer > 0"),
        (["trainer.iterations=0"], "trainer.iterations=0 is not allowed: expected an integer > 0"),
        (["algorithm=grpo", "algorithm.reset_every_rollout=false"], "Key 'reset_every_rollout' not in 'GRPOConfig'"),
        (["algorithm=grpo", "algorithm.advantage_norm=max"],
         "algorithm.advantage_norm='max' is not allowed: expected one of 'std', 'none', 'rollout_std'"),
        (["algorithm=grpo", "algorithm.group_size=3", "env.num_envs=64"],
         "algorithm.group_size=3 is not allowed with env.num_envs=64: num_envs must be a multiple of group_size"),
        pytest.param(["device=cuda"], "device='cuda' is not available: this machine has no CUDA device",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")),
    ],
)
def test_bad_input_gives_one_clear_message_and_no_traceback(tmp_path, overrides, message):
    proc = run_cli([*overrides, "trainer.progress=false"], tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("*.pt")), "no checkpoint may be left behind"


def test_a_run_rejected_at_build_still_records_its_failure(tmp_path):
    proc = run_cli(["env.num_envs=0", "device=cpu"], tmp_path)
    assert proc.returncode != 0
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    summary = RunSummary.read(run_dir)
    assert summary.status == "failed" and summary.global_step == 0
    assert summary.error == "Invalid config: env.num_envs=0 is not allowed: expected an integer > 0"
    assert summary.device == "cpu" and summary.end_time >= summary.start_time


def test_hydra_full_error_shows_the_traceback(tmp_path):
    proc = run_cli(["env.num_envs=0"], tmp_path, HYDRA_FULL_ERROR="1")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


TOP_LEVEL_KEYS = "expected one of algorithm, device, env, exp_name, policy, seed, trainer"


@pytest.mark.parametrize(
    "override, message",
    [("+sed=3", f"Invalid config: unknown top-level key 'sed' (did you mean 'seed'?): {TOP_LEVEL_KEYS}"),
     ("+nonexistent=1", f"Invalid config: unknown top-level key 'nonexistent': {TOP_LEVEL_KEYS}")],
)  # fmt: skip
def test_a_new_top_level_key_is_rejected_with_one_clear_message(tmp_path, override, message):
    # Hydra's +key=value adds a key even to a struct config: +sed=3 used to train with seed 0 and exit 0.
    proc = run_cli([override, *TINY], tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr.splitlines(), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("*.pt")), "no checkpoint may be left behind"
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    summary = RunSummary.read(run_dir)
    assert summary.status == "failed" and summary.global_step == 0 and summary.error == message


def test_a_users_config_group_may_add_a_top_level_key(tmp_path):
    # robot_train.yaml, a primary config of the user's, selects their group `robot` (key `robot`).
    user = ["--config-dir", str(TESTS / "user_conf"), "--config-name", "robot_train", "trainer.iterations=2",
            "trainer.rollout_steps=4", "trainer.num_eval_envs=4", "trainer.num_eval_episodes=4",
            "trainer.progress=false", "algorithm.batch_size=32"]  # fmt: skip
    (tmp_path / "ok").mkdir(), (tmp_path / "misspelt").mkdir()
    proc = run_cli(user, tmp_path / "ok")
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = list((tmp_path / "ok" / "outputs").glob("*/*"))
    summary = RunSummary.read(run_dir)
    assert summary.status == "completed" and summary.global_step == 2 * 4 * 16
    proc = run_cli([*user, "+sed=3"], tmp_path / "misspelt")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert ("Invalid config: unknown top-level key 'sed' (did you mean 'seed'?): "
            "expected one of algorithm, device, env, exp_name, policy, robot, seed, trainer") in proc.stderr.splitlines()  # fmt: skip


def test_a_preset_at_global_adds_no_top_level_key(compose_cfg, tmp_path):
    # experiment=... is a group choice whose option is `# @package _global_`: it sets
    # env, algorithm, ... and adds no key `experiment`, so +experiment.<anything> is a mistake.
    cfg = compose_cfg(["experiment=cart_pole_ppo", "+experiment.algorithm.learning_rate=1e-3", *TINY])
    with pytest.raises(ConfigError, match=r"^Invalid config: unknown top-level key 'experiment': expected one of "
                                          r"algorithm, device, env, exp_name, policy, seed, trainer$"):  # fmt: skip
        train(cfg)
    summary = RunSummary.read(tmp_path)
    assert summary.status == "failed" and "unknown top-level key 'experiment'" in summary.error
    assert isinstance(build(compose_cfg(["experiment=cart_pole_ppo", *TINY, f"trainer.output_dir={tmp_path / 'ok'}"])), Trainer)


# ------------------------------------------------------------ the wheel
def _running_site_dirs() -> list[str]:
    """The site-packages directories of the interpreter running the tests (a venv, conda or the system).

    ``venv.create(system_site_packages=True)`` would link the new venv to the *base*
    interpreter's site-packages, which inside a venv or conda env lacks hydra, torch & co.
    """
    dirs = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def test_wheel_ships_the_configs_and_runs_outside_the_repo(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(REPO)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = list(wheels.glob("rlchain-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    python = env_dir / "bin" / "python"
    # torch & co. come from this interpreter's site-packages, listed in a .pth after the venv's own
    # site-packages (so the wheel installed there wins). Directories named in a .pth are only put on
    # sys.path; their own .pth files are not run, so an editable install of rlchain there (its finder
    # or path .pth) cannot bring the source tree back.
    venv_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    Path(venv_site, "running_interpreter.pth").write_text("".join(f"{d}\n" for d in _running_site_dirs()))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(python), "-c", "import rlchain; print(rlchain.__file__)"], cwd=outside, env=env,
                           capture_output=True, text=True, check=True)  # fmt: skip
    in_venv = lambda file: Path(file.strip()).resolve().is_relative_to(env_dir.resolve())  # noqa: E731
    assert in_venv(where.stdout), "the venv must import the installed wheel, not the source tree"
    # Hydra discovers the devices launcher in the installed hydra_plugins namespace package, once: the wheel's
    discover = ("import sys; from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; "
                "[print(c.__name__, sys.modules[c.__module__].__file__) for c in Plugins.instance().discover(Launcher)]")  # fmt: skip
    found = subprocess.run([str(python), "-c", discover], cwd=outside, env=env, capture_output=True, text=True, check=True)
    devices = [line.split(" ", 1)[1] for line in found.stdout.splitlines() if line.startswith("DevicesLauncher ")]
    assert len(devices) == 1 and in_venv(devices[0]), found.stdout
    proc = subprocess.run([str(env_dir / "bin" / "rlchain-train"), "--cfg", "job", "algorithm=grpo"], cwd=outside,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "_target_: rlchain.algorithms.GRPO" in proc.stdout and "_target_: rlchain.policies.ActorOnly" in proc.stdout
