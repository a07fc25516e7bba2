"""rlchain.core.buffer: the rollout's preallocated storage and the minibatches that cover it."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from rlchain.core.buffer import RolloutBuffer, minibatches
from rlchain.settings import SettingError


def test_the_buffer_holds_every_key_with_its_dtype_and_shape():
    box = RolloutBuffer(5, 3, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1, 1, (2,)), "cpu").data
    assert box.batch_size == (5, 3)
    assert box["obs"].shape == box["final_obs"].shape == (5, 3, 4) and box["action"].shape == (5, 3, 2)
    assert box["action"].dtype == torch.float32 and box["episode_return"].dtype == torch.float64
    assert box["done"].dtype == box["success"].dtype == torch.bool and box["episode_length"].dtype == torch.int64
    discrete = RolloutBuffer(5, 3, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), "cpu").data
    assert discrete["action"].shape == (5, 3) and discrete["action"].dtype == torch.int64
    with pytest.raises(SettingError, match="^rollout_steps=0 is not allowed"):
        RolloutBuffer(0, 3, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3), "cpu")


@pytest.mark.parametrize("batch_size", [1, 4, 5, 7, 12, 50])
def test_minibatches_are_equal_and_cover_each_sample_at_most_once_in_a_seeded_order(batch_size):
    data = TensorDict({"i": torch.arange(12).reshape(3, 4)}, batch_size=[3, 4])
    draw = lambda seed: [b["i"] for b in minibatches(data, batch_size, torch.Generator().manual_seed(seed))]  # noqa: E731
    batches = draw(0)
    size = min(batch_size, 12)
    assert [len(b) for b in batches] == [size] * (12 // size)  # the 12 % size left over are left out
    seen = torch.cat(batches).tolist()
    assert len(set(seen)) == len(seen) == 12 - 12 % size
    assert all(torch.equal(a, b) for a, b in zip(batches, draw(0)))
    if batch_size < 12:
        assert not torch.equal(torch.cat(batches), torch.cat(draw(1)))


def test_a_batch_size_below_one_is_refused():
    data = TensorDict({"i": torch.arange(4)}, batch_size=[4])
    with pytest.raises(ValueError, match="batch_size=0"):
        next(minibatches(data, 0, torch.Generator()))
