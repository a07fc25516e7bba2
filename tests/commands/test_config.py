"""Hydra composition: schemas, options, presets, one home per setting, the top-level keys."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

import rlchain.conf
import tests.helpers.gym_toy_envs  # noqa: F401  (registers the toy gymnasium ids)
from rlchain.commands.config import SCHEMAS, register_schema
from rlchain.commands.train import ConfigError, build, train
from rlchain.core.algorithms import GRPO, PPO, AlgorithmConfig, GRPOConfig, PPOConfig
from rlchain.core.envs import PushCubeConfig, PushCubeEnv
from rlchain.core.policies import ActorCritic, ActorOnly
from rlchain.run.summary import RunSummary
from rlchain.run.trainer import Trainer
from rlchain.settings import Settings, setting
from tests.helpers.maniskill import skip_without_maniskill
from tests.helpers.runs import HELPERS, TINY, run_cli
from tests.helpers.toy_env import LineEnv

#: Arguments given at instantiate time, never written in YAML.
RUNTIME_ONLY = {"observation_space", "action_space", "policy", "env", "algorithm", "eval_env", "run_config", "trial"}


def test_default_composition_builds_ppo_on_push_cube(compose_cfg):
    cfg = compose_cfg(TINY)
    assert cfg.env._target_ == "rlchain.core.envs.push_cube.PushCubeEnv"
    assert (
        cfg.algorithm._target_ == "rlchain.core.algorithms.PPO"
        and cfg.policy._target_ == "rlchain.core.policies.ActorCritic"
    )
    trainer = build(cfg)
    assert isinstance(trainer, Trainer) and isinstance(trainer.env, PushCubeEnv)
    assert type(trainer.policy) is ActorCritic and isinstance(trainer.algorithm, PPO)
    assert trainer.env.num_envs == 16 and trainer.eval_env.num_envs == 8
    assert trainer.eval_env is not trainer.env and trainer.eval_env.seed == cfg.seed + 1
    assert trainer.config["algorithm"]["total_iterations"] == 2  # interpolated from trainer.iterations


def test_grpo_selects_actor_only_unless_a_policy_is_named(compose_cfg):
    cfg = compose_cfg(["algorithm=grpo", *TINY, "env.num_envs=16", "env.max_episode_steps=8"])
    assert cfg.policy._target_ == "rlchain.core.policies.ActorOnly"
    trainer = build(cfg)
    assert isinstance(trainer.algorithm, GRPO) and type(trainer.policy) is ActorOnly
    assert trainer.algorithm.reset_options == {"group_size": 8}
    cfg = compose_cfg(["algorithm=grpo", "policy=actor_critic", *TINY, "env.max_episode_steps=8"])
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
    cfg = compose_cfg(
        [*TINY, "algorithm.learning_rate=0.002", "policy.hidden_sizes=[16,8]", "env.max_episode_steps=50"]
    )
    trainer = build(cfg)
    assert trainer.algorithm.current_lr == pytest.approx(0.002)
    assert [m.out_features for m in trainer.policy.actor if isinstance(m, torch.nn.Linear)] == [16, 8, 2]
    assert trainer.env.max_episode_steps == 50


@pytest.mark.parametrize("experiment, algo", [("push_cube_ppo", PPO), ("push_cube_grpo", GRPO)])
def test_experiment_presets(compose_cfg, experiment, algo):
    cfg = compose_cfg([f"experiment={experiment}", *TINY, "env.max_episode_steps=8"])
    assert isinstance(build(cfg).algorithm, algo)
    assert compose_cfg([f"experiment={experiment}"]).algorithm.learning_rate == 1e-3


def test_the_algorithm_checks_its_env_once(compose_cfg):
    from tests.helpers.user_components import EnvCheckCountingPPO

    EnvCheckCountingPPO.checks = 0
    build(compose_cfg([*TINY, "algorithm._target_=tests.helpers.user_components.EnvCheckCountingPPO"]))
    assert EnvCheckCountingPPO.checks == 1


@pytest.mark.slow
def test_presets_fill_their_slots(tmp_path, compose_cfg):
    # experiment, study, sweep, hparams_search and debug have slots in the defaults list: `experiment=x`
    # selects a preset, and debug comes last, so it shrinks whatever preset the run chose.
    for args in (["experiment=push_cube_ppo"], ["experiment=push_cube_ppo", "debug=tiny"]):
        proc = run_cli(["--cfg", "job", *args], tmp_path)
        assert proc.returncode == 0, proc.stderr
        job = OmegaConf.create(proc.stdout)
        tiny = "debug=tiny" in args
        assert (job.env.num_envs, job.trainer.iterations) == ((16, 2) if tiny else (512, 400)), args
    search = compose_cfg(["hparams_search=ppo_push_cube_optuna"])  # push_cube_ppo, each trial 150 iterations long
    assert (search.env.num_envs, search.trainer.iterations) == (512, 150)
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
    for component, node in (
        (trainer, cfg.trainer),
        (trainer.algorithm, cfg.algorithm),
        (trainer.policy, cfg.policy),
        (trainer.env, cfg.env),
    ):
        expected = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "_target_"}
        assert {k: getattr(component.cfg, k) for k in expected} == expected, type(component).__name__


TOP_LEVEL_KEYS = "expected one of algorithm, device, env, exp_name, policy, seed, trainer"


@pytest.mark.parametrize(
    "override, message",
    [
        ("+sed=3", f"Invalid config: unknown top-level key 'sed' (did you mean 'seed'?): {TOP_LEVEL_KEYS}"),
        ("+nonexistent=1", f"Invalid config: unknown top-level key 'nonexistent': {TOP_LEVEL_KEYS}"),
    ],
)
def test_a_new_top_level_key_is_rejected_with_one_clear_message(tmp_path, override, message):
    # Hydra's +key=value adds a key even to a struct config: +sed=3 used to train with seed 0 and exit 0.
    proc = run_cli([override, *TINY], tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr.splitlines(), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("*.pt")), "no checkpoint may be left behind"
    assert not (tmp_path / "outputs").exists()  # refused before its first step: no run directory is left


@pytest.mark.slow
def test_a_users_config_group_may_add_a_top_level_key(tmp_path):
    # robot_train.yaml, a primary config of the user's, selects their group `robot` (key `robot`).
    user = [
        "--config-dir",
        str(HELPERS / "user_conf"),
        "--config-name",
        "robot_train",
        "trainer.iterations=2",
        "trainer.rollout_steps=4",
        "trainer.num_eval_envs=4",
        "trainer.num_eval_episodes=4",
        "trainer.progress=false",
        "algorithm.batch_size=32",
    ]
    (tmp_path / "ok").mkdir(), (tmp_path / "misspelt").mkdir()
    proc = run_cli(user, tmp_path / "ok")
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = list((tmp_path / "ok" / "outputs").glob("*/*"))
    summary = RunSummary.read(run_dir)
    assert summary.status == "completed" and summary.global_step == 2 * 4 * 16
    proc = run_cli([*user, "+sed=3"], tmp_path / "misspelt")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert (
        "Invalid config: unknown top-level key 'sed' (did you mean 'seed'?): "
        "expected one of algorithm, device, env, exp_name, policy, robot, seed, trainer"
    ) in proc.stderr.splitlines()


def test_a_preset_at_global_adds_no_top_level_key(compose_cfg, tmp_path):
    # experiment=... is a group choice whose option is `# @package _global_`: it sets
    # env, algorithm, ... and adds no key `experiment`, so +experiment.<anything> is a mistake.
    cfg = compose_cfg(["experiment=cart_pole_ppo", "+experiment.algorithm.learning_rate=1e-3", *TINY])
    with pytest.raises(
        ConfigError,
        match=r"^Invalid config: unknown top-level key 'experiment': expected one of "
        r"algorithm, device, env, exp_name, policy, seed, trainer$",
    ):
        train(cfg)
    summary = RunSummary.read(tmp_path)
    assert summary.status == "failed" and "unknown top-level key 'experiment'" in summary.error
    assert isinstance(
        build(compose_cfg(["experiment=cart_pole_ppo", *TINY, f"trainer.output_dir={tmp_path / 'ok'}"])), Trainer
    )


@pytest.mark.parametrize("preset, n_jobs", [("ppo_push_cube", 48), ("grpo_push_cube", 36)])
def test_sweep_presets_compose(preset, n_jobs):
    GlobalHydra.instance().clear()
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"sweep={preset}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    params = cfg.hydra.sweeper.params
    assert "seed" in params and len(str(params.seed).split(",")) == 3
    total = 1
    for value in params.values():
        total *= len(str(value).split(","))
    assert total == n_jobs
    assert cfg.algorithm._target_.endswith(preset.split("_")[0].upper())
    assert cfg.hydra.launcher._target_ == "hydra_plugins.rlchain_launcher.devices_launcher.DevicesLauncher"


@pytest.mark.parametrize("env, budget", [("push_cube", 5.12e6), ("cart_pole", 3.0e5)])
def test_the_study_presets_compare_ppo_and_grpo_arms_at_one_budget(compose_cfg, env, budget):
    GlobalHydra.instance().clear()
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"sweep=ppo_vs_grpo_{env}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    arms = str(params["study"]).split(",")
    assert len(arms) == 7 and str(params.seed) == "0,1,2"
    assert list(cfg.hydra.callbacks.sweep_summary.at_steps)[-1] <= budget
    seen = set()
    for arm in arms:
        arm_cfg = compose_cfg([f"study={arm}"])
        steps = arm_cfg.trainer.iterations * arm_cfg.trainer.rollout_steps * arm_cfg.env.num_envs
        assert steps == pytest.approx(budget, rel=0.02), arm
        algorithm = arm_cfg.algorithm
        seen.add((algorithm._target_.rsplit(".", 1)[1], algorithm.get("group_size"), algorithm.get("advantage_norm")))
        build(arm_cfg)  # every arm is accepted (group sizes divide num_envs, GRPO rollouts hold an episode)
    grpo = {(g, n) for name, g, n in seen if name == "GRPO"}
    assert ("PPO", None, None) in seen and len(seen) == 7
    assert {g for g, n in grpo if n == "std"} == {2, 4, 8, 16} and {n for g, n in grpo if g == 8} == {
        "std",
        "none",
        "rollout_std",
    }


def test_slurm_launcher_option_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    GlobalHydra.instance().clear()
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose(
            "train", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], return_hydra_config=True
        )
    GlobalHydra.instance().clear()
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.partition) == (1, 1, "gpu")


# Every preset of conf/experiment/. `make test` installs the mujoco extra, so
# CI runs the MuJoCo presets (their YAML says `Needs: pip install
# "rlchain[mujoco]"`); a machine without it skips those.
NO_MUJOCO = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason='needs pip install "rlchain[mujoco]"')
NO_MJLAB = pytest.mark.skipif(importlib.util.find_spec("mjlab") is None, reason='needs pip install "rlchain[mjlab]"')
PRESETS = [
    pytest.param(
        path.stem,
        marks=[
            mark
            for extra, mark in (("mujoco", NO_MUJOCO), ("mjlab", NO_MJLAB))
            if f"rlchain[{extra}]" in path.read_text()
        ],
    )
    for path in sorted((Path(rlchain.conf.__file__).parent / "experiment").glob("*.yaml"))
]


def test_the_smoke_tested_presets_are_read_from_the_package_mujoco_and_push_cube_among_them():
    assert {"gym_half_cheetah_ppo", "gym_hopper_ppo", "gym_walker2d_ppo", "push_cube_ppo"} <= {
        p.values[0] for p in PRESETS
    }


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_with_debug_tiny(compose_cfg, preset):
    # debug=tiny comes last and shrinks any preset: 16 envs, 8-step episodes (a GRPO rollout holds a whole one),
    # eager on the CPU (the GPU presets' compiled and captured steps are for CUDA; they are tested against eager
    # in tests/core/test_captured_steps.py and tests/run/test_compile.py). It had stopped push_cube_grpo and
    # cart_pole_grpo ("rollout_steps=8 is shorter than the env's time limit").
    extra = []
    if "maniskill" in preset:  # a process per env on the CPU: 2 here
        skip_without_maniskill()
        extra = ["env.num_envs=2"]
    cfg = compose_cfg([f"experiment={preset}", "debug=tiny", *extra])
    summary = build(cfg).train()
    assert summary.status == "completed" and summary.global_step == 2 * 8 * cfg.env.num_envs
    assert summary.objective == summary.final[summary.objective_name]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_debug_tiny_shrinks_either_algorithm_on_the_main_task(compose_cfg, algorithm):
    cfg = compose_cfg([f"algorithm={algorithm}", "env=push_cube", "debug=tiny"])
    assert build(cfg).train().status == "completed"


@pytest.mark.parametrize("preset", [p.values[0] for p in PRESETS])
def test_every_presets_minibatches_use_every_sample(compose_cfg, preset):
    # Every minibatch has batch_size samples and an epoch leaves the rest out: push_cube_grpo left 4.0% of each
    # epoch out (4,096 into 51,200), cart_pole_grpo 10.4% (1,024 into 8,000). A recurrent policy's minibatches are
    # whole sequences (batch_size rounds down to them), and a rollout smaller than batch_size is one minibatch.
    cfg = compose_cfg([f"experiment={preset}"])
    samples = cfg.env.num_envs * cfg.trainer.rollout_steps
    if cfg.policy.get("rnn_type") is None and samples > cfg.algorithm.batch_size:
        assert samples % cfg.algorithm.batch_size == 0, f"{cfg.algorithm.batch_size} into {samples}"


def test_the_batch_size_help_says_that_equal_minibatches_leave_the_remainder_out():
    from docs.hooks.settings_reference import _field_sources  # what the configuration reference shows

    for schema in (AlgorithmConfig, PPOConfig, GRPOConfig):
        assert "leaves out the remainder" in _field_sources(schema)["batch_size"][1], schema.__name__


@pytest.mark.parametrize("preset", ["push_cube_ppo_gpu", "push_cube_grpo_gpu"])
def test_gpu_presets_compile_and_capture_on_cuda_in_whole_minibatches(compose_cfg, preset):
    cfg = compose_cfg([f"experiment={preset}"])
    assert (cfg.device, cfg.trainer.compile, cfg.trainer.cudagraphs, cfg.env.num_envs) == ("cuda", True, True, 4096)
    # every minibatch has batch_size samples: a size that divides the rollout leaves none out
    assert cfg.env.num_envs * cfg.trainer.rollout_steps % cfg.algorithm.batch_size == 0
    assert cfg.trainer.eval_freq < cfg.trainer.iterations


@pytest.mark.parametrize(
    "overrides",
    [
        ["env=cart_pole"],
        ["env=cart_pole", "algorithm=grpo", "env.max_episode_steps=8"],
        ["env=gym", "env.id=Pendulum-v1", "env.num_envs=4"],
    ],
)
def test_task_options_work_with_the_defaults(compose_cfg, overrides):
    cfg = compose_cfg([*overrides, *TINY, "trainer.num_eval_envs=2", "trainer.num_eval_episodes=2"])
    trainer = build(cfg)
    assert trainer.train().status == "completed"


@dataclasses.dataclass
class ToyLineConfig(Settings):
    """A user's schema of :class:`tests.helpers.toy_env.LineEnv` (registered by the test below)."""

    _target_: str = "tests.helpers.toy_env.LineEnv"
    num_envs: int = setting(8, gt=0)
    device: str = "cpu"
    seed: int = setting(0, ge=0)
    max_episode_steps: int = setting(5, gt=0)
    discrete: bool = False


def test_register_schema_checks_the_options_of_a_users_config_dir_that_extend_it(tmp_path):
    register_schema("env", "toy_line", ToyLineConfig)
    register_schema("env", "toy_line", ToyLineConfig)  # again: nothing changes
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "short_line.yaml").write_text(
        "defaults:\n  - toy_line_schema\n  - _self_\n\nseed: ${seed}\nmax_episode_steps: 3\n"
    )
    (tmp_path / "env" / "misspelt_line.yaml").write_text(
        "defaults:\n  - toy_line_schema\n  - _self_\n\nmax_episode_step: 3\n"
    )

    def composed(*overrides: str):
        GlobalHydra.instance().clear()
        try:
            with initialize_config_module("rlchain.conf", version_base="1.3"):
                return compose("train", overrides=[f"hydra.searchpath=[file://{tmp_path}]", *overrides])
        finally:
            GlobalHydra.instance().clear()

    cfg = composed("env=short_line", "seed=4")
    expected = {**dataclasses.asdict(ToyLineConfig()), "seed": 4, "max_episode_steps": 3}
    assert OmegaConf.to_container(cfg.env, resolve=True) == expected
    env = instantiate(cfg.env)
    assert isinstance(env, LineEnv) and (env.num_envs, env.max_episode_steps) == (8, 3)
    # the schema checks the user's option, its overrides and the command line at composition, as rlchain's own
    with pytest.raises(ConfigCompositionException) as err:
        composed("env=misspelt_line")
    assert "max_episode_step" in str(err.value.__cause__ or err.value)
    with pytest.raises(ConfigCompositionException, match="env.max_episode_step"):
        composed("env=short_line", "env.max_episode_step=4")
    with pytest.raises(ConfigCompositionException, match="env.num_envs"):
        composed("env=short_line", "env.num_envs=many")
    # rlchain's own options keep their schemas
    register_schema("env", "push_cube", PushCubeConfig)
    with pytest.raises(ValueError, match=r"^env/push_cube_schema is rlchain's schema of env=push_cube"):
        register_schema("env", "push_cube", ToyLineConfig)
    with pytest.raises(TypeError, match="expected a dataclass type"):
        register_schema("env", "toy_line", dict)
    with pytest.raises(ValueError, match="non-empty strings"):
        register_schema("", "toy_line", ToyLineConfig)
