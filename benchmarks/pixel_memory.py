"""The memory of a rollout of camera images: rlchain's storage (uint8 images) against the same rollout as float32.

A rollout of ``--num-envs`` envs x ``--rollout-steps`` steps of push_cube's pixel observations
(``env.obs_mode=pixels_state``, ``--image-size`` square RGB images), stored as rlchain's collector stores it
(:class:`rlchain.core.buffer.RolloutBuffer`, ``final_obs`` holding the groups the critic reads), for two critics:

* ``privileged``: the critic reads the exact state (``env.privileged_critic=true``): the image is stored once;
* ``image``: the critic reads the image too: the final observations keep a second copy.

For each, the bytes of every key, measured twice: the sum of the buffer's tensors (numel x element size) and,
with ``--allocate``, the growth of this process's resident memory when the buffer is allocated on the CPU and
written once (every page touched). The float32 column is the same buffer with the images declared float32
(counted on torch's ``meta`` device, which allocates nothing: 4096 x 64 float32 images do not fit in 24 GiB).

    python benchmarks/pixel_memory.py                       # 4096 envs x 64 steps of 64 x 64 x 3
    python benchmarks/pixel_memory.py --allocate            # and allocate the uint8 buffers for real
"""

from __future__ import annotations

import argparse
import gc

import gymnasium as gym
import numpy as np
import torch

from rlchain.core.buffer import RolloutBuffer


def _rss_bytes() -> int:
    """This process's resident set size, bytes (Linux ``/proc/self/statm``)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def spaces(image_size: int, privileged: bool, image_dtype: type) -> tuple[gym.spaces.Dict, list[str]]:
    """push_cube's pixel observation space (``pixels_state``) and the groups its critic reads."""
    high = 255 if image_dtype is np.uint8 else 1.0
    groups = {
        "image": gym.spaces.Box(0, high, (image_size, image_size, 3), image_dtype),
        "state": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
    }
    if privileged:
        groups["critic"] = gym.spaces.Box(-np.inf, np.inf, (15,), np.float32)
    return gym.spaces.Dict(groups), ["critic"] if privileged else ["image", "state"]


def buffer_bytes(buffer: RolloutBuffer) -> dict[str, int]:
    """Bytes of each top-level key of the buffer (a group TensorDict summed over its groups)."""
    out = {}
    for key in buffer.data.keys():
        value = buffer.data[key]
        leaves = [value] if isinstance(value, torch.Tensor) else value.values(include_nested=True, leaves_only=True)
        out[key] = sum(t.numel() * t.element_size() for t in leaves)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--rollout-steps", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--allocate", action="store_true", help="allocate the uint8 buffers on the CPU and measure RSS")
    args = parser.parse_args()
    action = gym.spaces.Box(-1, 1, (2,), np.float32)
    gib = 2**30
    print(
        f"{args.num_envs} envs x {args.rollout_steps} steps of {args.image_size} x {args.image_size} x 3 images "
        "(push_cube, obs_mode=pixels_state)\n"
    )
    print("| critic reads | obs (uint8) | final_obs | whole buffer (uint8) | measured RSS growth | as float32 |")
    print("|---|---:|---:|---:|---:|---:|")
    for privileged in (True, False):
        space, critic = spaces(args.image_size, privileged, np.uint8)
        meta = RolloutBuffer(args.rollout_steps, args.num_envs, space, action, "meta", final_obs_groups=critic)
        sizes = buffer_bytes(meta)
        float_space, _ = spaces(args.image_size, privileged, np.float32)
        as_float = buffer_bytes(
            RolloutBuffer(args.rollout_steps, args.num_envs, float_space, action, "meta", final_obs_groups=critic)
        )
        measured = "-"
        if args.allocate:
            gc.collect()
            before = _rss_bytes()
            real = RolloutBuffer(args.rollout_steps, args.num_envs, space, action, "cpu", final_obs_groups=critic)
            for leaf in real.data.values(include_nested=True, leaves_only=True):
                leaf.fill_(1)  # touch every page
            measured = f"{(_rss_bytes() - before) / gib:.2f} GiB"
            del real
            gc.collect()
        print(
            f"| {'exact state (privileged)' if privileged else 'the image'} | {sizes['obs'] / gib:.2f} GiB "
            f"| {sizes['final_obs'] / gib:.2f} GiB | {sum(sizes.values()) / gib:.2f} GiB | {measured} "
            f"| {sum(as_float.values()) / gib:.2f} GiB |"
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
