"""Learning speed on PushCube: the main job and the tuned presets, over seeds.

Usage: ``python benchmarks/train_push_cube.py [--runs main grpo ppo] [--seeds 0 1 2] [--out DIR] [overrides ...]``

Each run composes its configuration with Hydra, exactly as ``rlchain-train``
does, and trains in this process (one run at a time, torch's default thread
count):

* ``main``: ``algorithm=grpo env=push_cube`` with the schema defaults (the main
  job, ``make train``);
* ``grpo``: ``experiment=push_cube_grpo``;
* ``ppo``: ``experiment=push_cube_ppo``;
* ``pixels``: ``experiment=push_cube_pixels_ppo`` (the actor sees the camera, the critic the state);
* ``maniskill``: ``experiment=maniskill_push_cube_ppo`` (ManiSkill3's PushCube-v1, a Panda arm; needs the
  ``maniskill`` extra and a Vulkan device);
* ``defaults``: no override at all, the bare ``rlchain-train`` (PPO with its
  schema defaults on push_cube).

It prints one row per run and seed: env steps and wall seconds until the eval
success rate first reaches 0.6 (EmbodiChain's bar for push_cube) and 0.9, the
final and best eval success, the whole run's wall seconds and SPS. Wall
seconds are the trainer's ``time/elapsed_s`` (training and evaluation, not
start-up).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_module

from rlchain.commands.train import train

RUNS = {
    "main": ["algorithm=grpo", "env=push_cube"],
    "grpo": ["experiment=push_cube_grpo"],
    "ppo": ["experiment=push_cube_ppo"],
    "pixels": ["experiment=push_cube_pixels_ppo"],
    "maniskill": ["experiment=maniskill_push_cube_ppo"],
    "defaults": [],
}
BARS = (0.6, 0.9)


def run(name: str, seed: int, out: Path, extra: list[str]) -> dict[str, object]:
    """Train one configuration and return its row of the table."""
    run_dir = out / f"{name}_seed{seed}"
    overrides = [
        *RUNS[name],
        f"seed={seed}",
        "device=cpu",
        f"trainer.output_dir={run_dir}",
        f"exp_name=bench_{name}",
        "trainer.progress=false",
        *extra,
    ]
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    summary = train(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/success_rate" in r]
    row: dict[str, object] = {"run": name, "seed": seed}
    for bar in BARS:
        reached = next((r for r in evals if r["eval/success_rate"] >= bar), None)
        row[f"steps_to_{bar}"] = reached["global_step"] if reached else None
        row[f"seconds_to_{bar}"] = reached["time/elapsed_s"] if reached else None
    row.update(
        final_success=evals[-1]["eval/success_rate"],
        best_success=summary.best_eval_success_rate,
        total_steps=summary.global_step,
        total_seconds=summary.elapsed_s,
        SPS=summary.SPS,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run, e.g. trainer.iterations=50")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="rlchain-bench-"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, runs in {out}", flush=True)
    results = []
    for name in args.runs:
        for seed in args.seeds:
            results.append(run(name, seed, out, args.overrides))
            print(json.dumps(results[-1]), flush=True)

    def reached(r: dict[str, object], bar: float) -> str:
        steps, secs = r[f"steps_to_{bar}"], r[f"seconds_to_{bar}"]
        return f"{steps / 1e6:.2f}M / {secs:.0f} s" if steps else "not reached"

    print(
        "\n| run | seed | 0.6 at (env steps / wall s) | 0.9 at | final eval success | best | env steps | wall s | SPS |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['run']} | {r['seed']} | {reached(r, 0.6)} | {reached(r, 0.9)} | {r['final_success']:.3f} | "
            f"{r['best_success']:.3f} | {r['total_steps'] / 1e6:.2f}M | {r['total_seconds']:.0f} | {r['SPS']:,.0f} |"
        )


if __name__ == "__main__":
    main()
