"""rlchain-export end to end: TorchScript and ONNX files that act as the policy does, without rlchain, and its bad input."""

from __future__ import annotations

import json

import gymnasium as gym
import onnxruntime
import pytest
import torch

from rlchain.commands.export import main
from rlchain.commands.saved_run import open_run
from tests.helpers.runs import TINY, run_cli


@pytest.fixture(scope="module")
def cart_pole_run(tmp_path_factory):
    """A tiny PPO run on cart_pole (Discrete actions)."""
    cwd = tmp_path_factory.mktemp("cart_pole")
    proc = run_cli(["algorithm=ppo", "env=cart_pole", *TINY, f"hydra.run.dir={cwd / 'run'}"], cwd)
    assert proc.returncode == 0, proc.stderr
    return cwd / "run"


def _policy_actions(run_dir, obs: torch.Tensor) -> torch.Tensor:
    """What the run's best.pt policy does for ``obs``: its deterministic action, as the env receives it."""
    run = open_run(run_dir)
    env = run.build_env(num_envs=1, device="cpu")
    policy = run.build_policy(env)
    from tensordict import TensorDict

    with torch.no_grad():
        action = policy.get_action(TensorDict({"obs": obs}, batch_size=[obs.shape[0]]), deterministic=True)["action"]
    space = env.single_action_space
    if isinstance(space, gym.spaces.Box):
        action = action.clamp(torch.as_tensor(space.low), torch.as_tensor(space.high))
    return action


def _observations(batch: int) -> torch.Tensor:
    return torch.randn(batch, 15, generator=torch.Generator().manual_seed(batch)) * 0.5


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_exported_policy_acts_as_the_policy_on_any_batch_size(trained, tmp_path, capsys, fmt):
    out = tmp_path / f"policy.{fmt}"
    assert main([str(trained), f"format={fmt}", f"output={out}"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    for batch in (1, 7, 300):  # the export traced a batch of 2
        obs = _observations(batch)
        expected = _policy_actions(trained, obs)
        if fmt == "torchscript":
            got = torch.jit.load(str(out))(obs)
        else:
            session = onnxruntime.InferenceSession(str(out))
            got = torch.from_numpy(session.run(["action"], {"obs": obs.numpy()})[0])
        assert got.shape == (batch, 2) and got.dtype == torch.float32
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert float(got.abs().max()) <= 1.0  # clipped to the action space


def test_the_observation_normaliser_is_baked_in(trained, tmp_path):
    out = tmp_path / "policy.pt"
    assert main([str(trained), "format=torchscript", f"output={out}"]) == 0
    state = open_run(trained).state["policy"]
    assert float(state["obs_normalizer.count"]) > 0 and float(state["obs_normalizer.mean"].abs().max()) > 0.01
    obs = _observations(5)
    run = open_run(trained)
    policy = run.build_policy(run.build_env(num_envs=1, device="cpu"))
    raw = policy.actor(obs).clamp(-1, 1)  # the actor without the normaliser
    assert not torch.allclose(torch.jit.load(str(out))(obs), raw, atol=1e-3)


def test_metadata_names_spaces_layout_source_and_version(trained, tmp_path):
    import onnx

    import rlchain

    ts, ox = tmp_path / "p.pt", tmp_path / "p.onnx"
    assert main([str(trained), "format=torchscript", f"output={ts}"]) == 0
    assert main([str(trained), "format=onnx", f"output={ox}"]) == 0
    files = {"rlchain.json": ""}
    torch.jit.load(str(ts), _extra_files=files)
    from_ts = json.loads(files["rlchain.json"])
    from_onnx = json.loads({p.key: p.value for p in onnx.load(str(ox)).metadata_props}["rlchain"])
    for meta, fmt in ((from_ts, "torchscript"), (from_onnx, "onnx")):
        assert meta["format"] == fmt and meta["rlchain_version"] == rlchain.__version__
        assert meta["input"]["shape"] == ["B", 15] and meta["output"]["shape"] == ["B", 2]
        assert meta["action_space"] == {
            "type": "Box",
            "shape": [2],
            "dtype": "float32",
            "low": [-1.0, -1.0],
            "high": [1.0, 1.0],
        }
        assert meta["observation_space"]["low"][0] == "-inf"
        assert meta["observation_layout"][:4] == ["pusher_x", "pusher_y", "cube_x", "cube_y"]
        assert len(meta["observation_layout"]) == 15
        assert meta["checkpoint"].endswith("best.pt") and meta["env"] == "rlchain.core.envs.push_cube.PushCubeEnv"


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.slow
def test_a_discrete_policy_exports_its_likeliest_action(cart_pole_run, tmp_path, fmt):
    out = tmp_path / f"cart_pole.{fmt}"
    assert main([str(cart_pole_run), f"format={fmt}", f"output={out}", "checkpoint=latest"]) == 0
    obs = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    run = open_run(cart_pole_run, "latest")
    policy = run.build_policy(run.build_env(num_envs=1, device="cpu"))
    from tensordict import TensorDict

    expected = policy.get_action(TensorDict({"obs": obs}, batch_size=[64]), deterministic=True)["action"]
    if fmt == "torchscript":
        got = torch.jit.load(str(out))(obs)
    else:
        got = torch.from_numpy(onnxruntime.InferenceSession(str(out)).run(None, {"obs": obs.numpy()})[0])
    assert got.dtype == torch.int64 and got.shape == (64,)
    assert torch.equal(got, expected)


def test_default_output_lies_next_to_the_checkpoint(trained, capsys):
    assert main([str(trained), "format=onnx"]) == 0
    path = trained / "checkpoints" / "best.onnx"
    assert path.is_file() and onnxruntime.InferenceSession(str(path)).get_inputs()[0].name == "obs"


def test_bad_input_is_one_line(trained, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cases = [
        ([str(trained), "format=onnx", f"output={blocker / 'policy.onnx'}"], 1, "cannot be written"),
        ([str(tmp_path / "nowhere"), "format=onnx"], 1, "does not exist: expected a run directory or a checkpoint"),
        ([str(trained), "format=onnx", "checkpoint=oldest"], 1, "checkpoint oldest does not exist"),
    ]
    for args, code, fragment in cases:
        assert main(args) == code
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("rlchain-export: ") and fragment in err[0], err


def test_an_unknown_format_is_one_line_from_the_command(trained, tmp_path):
    proc = run_cli([str(trained), "format=tflite"], tmp_path, module="rlchain.commands.export")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "rlchain-export: format='tflite' is not allowed: expected one of 'torchscript', 'onnx' or None"
    ]


def test_options_are_key_value_as_rlchain_evals_and_the_old_flags_still_work(trained, tmp_path, capsys):
    assert main([str(trained), "format=torchscript", "checkpoint=latest", f"output={tmp_path / 'a.pt'}"]) == 0
    assert capsys.readouterr().err == ""
    assert (
        main([str(trained), "--format", "torchscript", "--checkpoint", "latest", "--output", str(tmp_path / "b.pt")])
        == 0
    )
    notes = capsys.readouterr().err.strip().splitlines()
    assert notes == [
        "rlchain-export: --format torchscript is read as format=torchscript (the flag will go: write the option)",
        "rlchain-export: --checkpoint latest is read as checkpoint=latest (the flag will go: write the option)",
        f"rlchain-export: --output {tmp_path / 'b.pt'} is read as output={tmp_path / 'b.pt'} (the flag will go: "
        "write the option)",
    ]
    files = [{"rlchain.json": ""}, {"rlchain.json": ""}]
    for name, extra in zip(("a.pt", "b.pt"), files):
        torch.jit.load(str(tmp_path / name), _extra_files=extra)
    assert json.loads(files[0]["rlchain.json"]) == json.loads(files[1]["rlchain.json"])
    assert json.loads(files[0]["rlchain.json"])["checkpoint"].endswith("latest.pt")


@pytest.mark.parametrize(
    "args, fragment",
    [
        ([], "format=<torchscript|onnx> is required"),
        (["format=onnx", "env.num_envs=4"], "env.num_envs=4: an export takes the saved run as it is"),
        (["format=onnx", "seed=3"], "seed: no such option: expected one of checkpoint, format, output"),
    ],
    ids=["no format", "an override", "an unknown option"],
)
def test_a_missing_or_unknown_option_is_one_line(trained, capsys, args, fragment):
    assert main([str(trained), *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_a_users_targets_need_their_module_allowed(user_run, capsys):
    assert main([str(user_run), "format=torchscript"]) == 1
    err = capsys.readouterr().err
    assert "env._target_='tests.helpers.toy_env.LineEnv'" in err and len(err.strip().splitlines()) == 1
    assert main([str(user_run), "format=torchscript", "--allow-target", "tests.helpers"]) == 0
    out = torch.jit.load(str(user_run / "checkpoints" / "best.torchscript.pt"))(torch.zeros(3, 2))
    assert out.shape == (3, 1)


def test_a_discrete_action_gets_the_start_of_the_gymnasium_envs_space(tmp_path):
    from rlchain.commands.export import export_policy
    from rlchain.core.policies import ActorCritic

    policy = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), hidden_sizes=[8])
    out = export_policy(policy, gym.spaces.Discrete(3), 4, "torchscript", tmp_path / "p.pt", {}, action_start=-1)
    obs = torch.randn(16, 4)
    with torch.no_grad():
        assert torch.equal(torch.jit.load(str(out))(obs), policy.deterministic_action(obs) - 1)


@pytest.fixture(scope="module")
def grouped_run(tmp_path_factory):
    """A run directory of a policy whose actor sees two observation groups of :class:`GroupedLineEnv`."""
    from rlchain.core.algorithms import PPO
    from rlchain.core.policies import ActorCritic
    from rlchain.run.trainer import Trainer
    from tests.helpers.grouped_env import GroupedLineEnv

    out = tmp_path_factory.mktemp("grouped")
    config = {
        "env": {"_target_": "tests.helpers.grouped_env.GroupedLineEnv", "num_envs": 8, "max_episode_steps": 5},
        "policy": {
            "_target_": "rlchain.core.policies.ActorCritic",
            "hidden_sizes": [8],
            "actor_obs": ["critic", "actor"],
        },
        "trainer": {"seed": 0, "num_eval_envs": 4, "num_eval_episodes": 4},
    }
    torch.manual_seed(0)
    env = GroupedLineEnv(num_envs=8, max_episode_steps=5)
    policy = ActorCritic(
        env.single_observation_space, env.single_action_space, hidden_sizes=[8], actor_obs=["critic", "actor"]
    )
    trainer = Trainer(
        env,
        policy,
        PPO(policy, batch_size=40),
        run_config=config,
        iterations=3,
        rollout_steps=5,
        eval_freq=100,
        output_dir=str(out),
        progress=False,
        fresh_eval=False,
    )
    trainer.train()
    return out


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_a_policy_of_observation_groups_exports_them_as_named_inputs(grouped_run, tmp_path, capsys, fmt):
    out = tmp_path / f"policy.{fmt}"
    assert (
        main(
            [str(grouped_run), f"format={fmt}", f"output={out}", "checkpoint=latest", "--allow-target", "tests.helpers"]
        )
        == 0
    )
    assert "critic float32 [B, 3], actor float32 [B, 2] -> action" in capsys.readouterr().out
    run = open_run(grouped_run, "latest", ["tests.helpers"])
    env = run.build_env(num_envs=1, device="cpu")
    policy = run.build_policy(env)
    critic, actor = torch.randn(7, 3) * 2, torch.randn(7, 2) * 2
    with torch.no_grad():
        expected = policy.deterministic_action({"critic": critic, "actor": actor}).clamp(-1, 1)
    assert (
        policy.obs_normalizer["critic"].count > 0
    )  # the normalisers carry statistics: baked in, they change the action
    if fmt == "torchscript":
        files = {"rlchain.json": ""}
        got = torch.jit.load(str(out), _extra_files=files)(critic, actor)
        metadata = json.loads(files["rlchain.json"])
    else:
        session = onnxruntime.InferenceSession(str(out))
        assert [i.name for i in session.get_inputs()] == ["critic", "actor"]
        got = torch.from_numpy(session.run(None, {"critic": critic.numpy(), "actor": actor.numpy()})[0])
        metadata = None
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    if metadata is not None:
        assert [(i["name"], i["shape"]) for i in metadata["inputs"]] == [("critic", ["B", 3]), ("actor", ["B", 2])]
        assert metadata["observation_space"]["type"] == "Dict"


def test_a_grouped_policy_whose_one_group_is_named_obs_exports_it_as_a_group(tmp_path):
    from rlchain.commands.export import export_policy, input_spaces
    from rlchain.core.policies import ActorCritic

    space = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (3,))})
    policy = ActorCritic(space, gym.spaces.Box(-1, 1, (1,)), hidden_sizes=[8])
    out = export_policy(
        policy, gym.spaces.Box(-1, 1, (1,)), input_spaces(policy, space), "torchscript", tmp_path / "p.pt", {}
    )
    obs = torch.randn(5, 3)
    with torch.no_grad():
        assert torch.equal(torch.jit.load(str(out))(obs), policy.deterministic_action({"obs": obs}).clamp(-1, 1))


def _recurrent_cart_pole(rnn_type: str):
    """CartPole without velocities (continuous force) and a recurrent policy whose actions its state moves."""
    from rlchain.core.envs import CartPoleEnv
    from tests.helpers.recurrent import recurrent

    env = CartPoleEnv(num_envs=3, seed=0, hide_velocities=True, action_mode="continuous")
    policy = recurrent(env, rnn_type)
    with torch.no_grad():
        policy.actor[-1].weight.mul_(100.0)  # the head's initial gain is 0.01: actions that depend on the state
        policy.obs_normalizer.update(torch.randn(64, 2) * 0.1)
    return env, policy.eval()


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_a_recurrent_policy_exported_with_its_state_steps_through_two_episodes_as_the_live_policy(
    tmp_path, fmt, rnn_type
):
    """The file steps three envs through two episodes each, its state fed back and zeroed where an episode ended
    (the metadata's reset rule), and acts as the live policy acting from its own state."""
    from tensordict import TensorDict

    from rlchain.commands.export import export_policy, input_spaces, metadata_of, state_spaces

    env, policy = _recurrent_cart_pole(rnn_type)
    inputs, state = input_spaces(policy, env.single_observation_space), state_spaces(policy)
    names = ["h_in"] if rnn_type == "gru" else ["h_in", "c_in"]
    assert state == {name: (2, 8) for name in names}
    metadata = metadata_of(env, tmp_path / "best.pt", 0, fmt, inputs, state)
    path = export_policy(policy, env.single_action_space, inputs, fmt, tmp_path / f"p.{fmt}", metadata)
    if fmt == "torchscript":
        files = {"rlchain.json": ""}
        module = torch.jit.load(str(path), _extra_files=files)
        saved = json.loads(files["rlchain.json"])
        run = lambda obs, *s: [t for t in module(obs, *s)]  # noqa: E731
    else:
        session = onnxruntime.InferenceSession(str(path))
        assert [i.name for i in session.get_inputs()] == ["obs", *names]
        assert [o.name for o in session.get_outputs()] == ["action", *(n.replace("_in", "_out") for n in names)]
        saved = json.loads(session.get_modelmeta().custom_metadata_map["rlchain"])
        feed = lambda obs, *s: dict(zip(["obs", *names], (x.numpy() for x in (obs, *s))))  # noqa: E731
        run = lambda obs, *s: [torch.from_numpy(x) for x in session.run(None, feed(obs, *s))]  # noqa: E731
    assert [i["name"] for i in saved["state"]["inputs"]] == names
    assert saved["state"]["inputs"][0]["shape"] == ["B", 2, 8] and "zeros" in saved["state"]["reset"]

    obs, _ = env.reset(seed=1)
    live = policy.initial_state(3)
    exported = [torch.zeros(3, 2, 8) for _ in names]
    episodes, steps = torch.zeros(3, dtype=torch.int64), 0
    with torch.no_grad():
        while bool((episodes < 2).any()):
            step = policy.get_action(TensorDict({"obs": obs, "hidden": live}, [3]), deterministic=True)
            action, *exported = run(obs, *exported)
            torch.testing.assert_close(action, step["action"].clamp(-1, 1), atol=1e-5, rtol=1e-5)
            for name, value in zip(names, exported):
                torch.testing.assert_close(value, step["next_hidden"]["actor_" + name[0]], atol=1e-5, rtol=1e-5)
            obs, _, terminated, truncated, _ = env.step(step["action"])
            done = terminated | truncated
            ended = done.view(-1, 1, 1)  # a fresh state where an episode ended
            live = step["next_hidden"].apply(lambda h, ended=ended: torch.where(ended, torch.zeros_like(h), h))
            exported = [torch.where(ended, torch.zeros_like(h), h) for h in exported]
            episodes += done.long()
            steps += 1
    assert steps > 20  # two whole episodes of each env, resets included


def test_a_recurrent_run_trains_evaluates_and_exports_from_the_commands(tmp_path, capsys):
    proc = run_cli(
        [
            "algorithm=ppo",
            "env=cart_pole",
            "env.hide_velocities=true",
            "policy.rnn_type=lstm",
            "policy.rnn_hidden_size=16",
            "policy.rnn_critic=false",
            *TINY,
            "trainer.fresh_eval=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "summary.json").exists()
    from rlchain.commands.eval import main as eval_main

    assert eval_main([str(tmp_path / "run"), "num_episodes=4"]) == 0
    assert main([str(tmp_path / "run"), "format=onnx"]) == 0
    out = capsys.readouterr().out
    assert "obs float32 [B, 2], h_in float32 [B, 1, 16], c_in float32 [B, 1, 16] -> action, h_out, c_out" in out
