"""Image observations: the CNN encoder against a plain reference, uint8 storage, push_cube's camera, and a pixel
run trained, resumed, evaluated and exported (uint8 inputs) against the live policy."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
import torch
from tensordict import TensorDict
from torch import nn

from rlchain.core.collector import SyncCollector
from rlchain.core.envs.push_cube import PushCubeEnv
from rlchain.core.networks import CNNEncoder
from rlchain.core.policies import ActorCritic
from rlchain.envs import check_vec_env

SMALL_CNN = {"cnn_channels": [8, 16], "cnn_kernel_sizes": [4, 3], "cnn_strides": [2, 2], "cnn_features": 32}


def test_the_encoder_is_a_plain_cnn_on_images_scaled_to_one_in_either_layout():
    torch.manual_seed(0)
    last = CNNEncoder("image", (20, 20, 3), [8, 16], [4, 3], [2, 2], 32)
    first = CNNEncoder("image", (3, 20, 20), [8, 16], [4, 3], [2, 2], 32)
    first.load_state_dict(last.state_dict())
    images = torch.randint(0, 256, (2, 5, 20, 20, 3), dtype=torch.uint8)  # any leading dims: [T, N, H, W, C]
    convs = [m for m in last.net if isinstance(m, nn.Conv2d)]
    linear = next(m for m in last.net if isinstance(m, nn.Linear))

    def reference(x: torch.Tensor) -> torch.Tensor:  # one image [H, W, C] at a time
        h = x.permute(2, 0, 1)[None].double() / 255.0
        for conv in convs:
            h = torch.relu(nn.functional.conv2d(h, conv.weight.double(), conv.bias.double(), conv.stride))
        return torch.relu(linear.weight.double() @ h.flatten() + linear.bias.double()).float()

    expected = torch.stack([torch.stack([reference(x) for x in row]) for row in images])
    with torch.no_grad():
        torch.testing.assert_close(last(images), expected, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(first(images.permute(0, 1, 4, 2, 3)), expected, atol=1e-5, rtol=1e-4)
    assert last(images).shape == (2, 5, 32)


def test_push_cube_pixels_draw_the_state_and_keep_the_contract():
    env = PushCubeEnv(num_envs=8, obs_mode="pixels_state", privileged_critic=True, image_size=32, obs_noise_std=0.0)
    obs, _ = env.reset(seed=0)
    assert set(obs.keys()) == {"image", "state", "critic"}
    assert obs["image"].shape == (8, 32, 32, 3) and obs["image"].dtype == torch.uint8
    torch.testing.assert_close(obs["state"], torch.cat([env.pusher_pos, env.goal_pos], -1))
    torch.testing.assert_close(obs["image"], env._draw(slice(None), 32))
    moved = env.step(torch.ones(8, 2))[0]["image"]
    assert not torch.equal(moved, obs["image"])  # the pusher (at least) moved on the image
    check_vec_env(PushCubeEnv(num_envs=8, obs_mode="pixels", image_size=32))
    check_vec_env(env)


def test_pixels_alone_refuse_observation_noise_in_one_line():
    with pytest.raises(ValueError) as caught:
        PushCubeEnv(num_envs=2, obs_mode="pixels", obs_noise_std=0.1)
    assert str(caught.value).startswith("obs_noise_std=0.1 is not allowed with obs_mode='pixels'")


def test_a_rollout_stores_images_as_uint8_and_the_policy_converts_them():
    torch.manual_seed(0)
    env = PushCubeEnv(num_envs=4, obs_mode="pixels_state", image_size=24, max_episode_steps=5)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[16], **SMALL_CNN)
    assert policy.image_groups == ["image"] and set(policy.obs_normalizer) == {"state"}  # images: no normaliser
    assert list(policy.actor_encoders) == list(policy.critic_encoders) == ["image"]
    assert policy.actor_encoders["image"] is not policy.critic_encoders["image"]
    collector = SyncCollector(env, policy, rollout_steps=6)
    data = collector.collect().data
    images = data["obs"]["image"]
    assert images.dtype == torch.uint8 and images.shape == (6, 4, 24, 24, 3)
    assert data["final_obs"]["image"].dtype == torch.uint8
    # The stored images are the env's: replay the run's start from its seed.
    replay = PushCubeEnv(num_envs=4, obs_mode="pixels_state", image_size=24, max_episode_steps=5)
    first, _ = replay.reset()
    assert torch.equal(images[0], first["image"])
    # The update's forward on stored uint8 images equals the acting forward.
    with torch.no_grad():
        td = policy.evaluate_actions(data.reshape(-1))
    torch.testing.assert_close(td["sample_log_prob"], data["sample_log_prob"].reshape(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(td["value"], data["value"].reshape(-1), atol=1e-5, rtol=1e-5)


def test_a_pixel_run_trains_evaluates_and_exports_its_uint8_inputs(compose_cfg, tmp_path, capsys):
    from rlchain.commands.eval import main as evaluate
    from rlchain.commands.export import main as export
    from rlchain.commands.saved_run import open_run
    from rlchain.commands.train import build

    cnn = [f"policy.{k}={v}".replace(" ", "") for k, v in SMALL_CNN.items()]
    overrides = ["env=push_cube", "env.obs_mode=pixels_state", "env.privileged_critic=true", "env.image_size=24"]
    cfg = compose_cfg([*overrides, *cnn, "debug=tiny", "trainer.fresh_eval=false"])
    trainer = build(cfg)
    assert (trainer.policy.actor_groups, trainer.policy.critic_groups) == (["image", "state"], ["critic"])
    assert trainer.train().status == "completed"
    assert evaluate([str(tmp_path), "num_episodes=4", "checkpoint=latest"]) == 0, capsys.readouterr().err

    run = open_run(tmp_path, "latest")
    env = run.build_env(num_envs=1, device="cpu")
    policy = run.build_policy(env)
    generator = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (5, 24, 24, 3), dtype=torch.uint8, generator=generator)
    state = torch.randn(5, 4, generator=generator) * 0.3
    with torch.no_grad():
        expected = policy.deterministic_action({"image": image, "state": state}).clamp(-1, 1)
    for fmt in ("torchscript", "onnx"):
        out = tmp_path / f"policy.{fmt}"
        assert export([str(tmp_path), f"format={fmt}", f"output={out}", "checkpoint=latest"]) == 0
        assert "image uint8 [B, 24, 24, 3], state float32 [B, 4] -> action" in capsys.readouterr().out
        if fmt == "torchscript":
            files = {"rlchain.json": ""}
            got = torch.jit.load(str(out), _extra_files=files)(image, state)
            metadata = json.loads(files["rlchain.json"])
            assert metadata["inputs"][0] == {
                "name": "image",
                "dtype": "uint8",
                "shape": ["B", 24, 24, 3],
                "layout": "HWC",
                "normalization": "divided by 255 inside",
            }
        else:
            session = onnxruntime.InferenceSession(str(out))
            assert [(i.name, i.type) for i in session.get_inputs()] == [
                ("image", "tensor(uint8)"),
                ("state", "tensor(float)"),
            ]
            got = torch.from_numpy(session.run(None, {"image": image.numpy(), "state": state.numpy()})[0])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_flat_image_space_is_one_image_group():
    space = gym.spaces.Box(0, 255, (3, 16, 16), np.uint8)  # channels first
    policy = ActorCritic(space, gym.spaces.Discrete(3), hidden_sizes=[8], **SMALL_CNN)
    assert policy.image_groups == ["obs"] and policy.obs_normalizer is None
    obs = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    td = policy.get_action(TensorDict({"obs": obs}, batch_size=[4]))
    assert td["action"].shape == (4,) and td["value"].shape == (4,)


def test_final_observations_keep_no_image_the_critic_does_not_read():
    env = PushCubeEnv(num_envs=4, obs_mode="pixels_state", privileged_critic=True, image_size=24, max_episode_steps=3)
    policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[16], **SMALL_CNN)
    data = SyncCollector(env, policy, rollout_steps=4).collect().data
    assert list(data["final_obs"].keys()) == ["critic"] and data["done"].any()
    done = data["done"]
    expected = policy.critic(policy.obs_normalizer["critic"].normalize(data["final_obs"]["critic"][done]))
    torch.testing.assert_close(data["next_value"][done], expected.squeeze(-1))


def test_a_pixel_run_resumes_exactly(tmp_path):
    """The image in progress (uint8) and every weight of the encoders come back from the checkpoint."""
    from rlchain.core.algorithms import PPO
    from rlchain.run.trainer import Trainer

    def make(out, iterations, resume_from=None):
        torch.manual_seed(0)
        env = PushCubeEnv(num_envs=8, obs_mode="pixels_state", image_size=24, max_episode_steps=7)
        policy = ActorCritic(env.single_observation_space, env.single_action_space, hidden_sizes=[16], **SMALL_CNN)
        algorithm = PPO(policy, batch_size=32, n_epochs=2, seed=0)
        trainer = Trainer(
            env,
            policy,
            algorithm,
            iterations=iterations,
            rollout_steps=5,
            eval_freq=100,
            save_freq=100,
            output_dir=str(tmp_path / out),
            progress=False,
            resume_from=resume_from and str(tmp_path / resume_from),
            fresh_eval=False,
        )
        trainer.start()
        return trainer

    straight = make("a", iterations=4)
    straight.train()
    make("b", iterations=2).train()
    resumed = make("c", iterations=4, resume_from="b/checkpoints/latest.pt")
    assert resumed.collector.state_dict()["obs"]["image"].dtype == torch.uint8
    resumed.train()
    for (name, a), b in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b), name
    assert "actor_encoders.image.net.0.weight" in straight.policy.state_dict()


def test_spatial_softmax_gives_each_channels_expected_position():
    from rlchain.core.networks import SpatialSoftmax

    logits = torch.full((2, 3, 5, 7), -1e4)
    logits[0, 0, 0, 0] = logits[0, 1, 4, 6] = logits[1, 0, 2, 3] = 0.0  # one hot pixel: its own position
    logits[0, 2] = logits[1, 1] = logits[1, 2] = 0.0  # uniform: the centre
    out = SpatialSoftmax(5, 7)(logits)
    expected_x = torch.tensor([[-1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    expected_y = torch.tensor([[-1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(out, torch.cat((expected_x, expected_y), -1), atol=1e-6, rtol=0)


def test_a_spatial_softmax_encoder_reads_positions_and_exports(tmp_path):
    from rlchain.commands.export import export_policy, input_spaces

    settings = {**SMALL_CNN, "cnn_head": "spatial_softmax"}
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (24, 24, 3), np.uint8)})
    policy = ActorCritic(space, gym.spaces.Box(-1, 1, (2,)), hidden_sizes=[8], **settings)
    encoder = policy.actor_encoders["image"]
    linear = next(m for m in encoder.net if isinstance(m, nn.Linear))
    assert linear.in_features == 2 * 16  # x and y of each of the last convolution's 16 channels
    images = torch.randint(0, 256, (3, 24, 24, 3), dtype=torch.uint8)
    with torch.no_grad():
        expected = policy.deterministic_action({"image": images}).clamp(-1, 1)
    action_space = gym.spaces.Box(-1, 1, (2,))
    script = export_policy(policy, action_space, input_spaces(policy, space), "torchscript", tmp_path / "p.pt", {})
    torch.testing.assert_close(torch.jit.load(str(script))(images), expected, atol=1e-5, rtol=1e-5)
    onnx = export_policy(policy, action_space, input_spaces(policy, space), "onnx", tmp_path / "p.onnx", {})
    got = onnxruntime.InferenceSession(str(onnx)).run(None, {"image": images.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-5, rtol=1e-5)
