"""Learning speed on PushCube: PPO and GRPO from the tuned experiment presets.

Usage: ``python benchmarks/train_push_cube.py [--algorithms ppo grpo] [--seed 0] [--out DIR]``

Composes ``+experiment=push_cube_<algorithm>`` with Hydra (exactly what
``rlchain-train +experiment=push_cube_<algorithm>`` runs), trains, and prints
per algorithm: env steps and wall seconds until the eval success rate first
reaches the bar (0.9 for PPO; 0.6 for GRPO, EmbodiChain's bar for push_cube),
the final and best eval success, and SPS. Wall seconds are the trainer's
``time/elapsed_s`` (training and evaluation, not start-up).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_module

from rlchain.train import train

BARS = {"ppo": 0.9, "grpo": 0.6}


def run(algorithm: str, seed: int, out: Path, extra: list[str]) -> dict[str, object]:
    """Train one preset and return its row of the table."""
    run_dir = out / algorithm
    overrides = [f"+experiment=push_cube_{algorithm}", f"seed={seed}", "device=cpu", f"trainer.output_dir={run_dir}",
                 f"exp_name=bench_{algorithm}", "trainer.progress=false", *extra]  # fmt: skip
    with initialize_config_module("rlchain.conf", version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    summary = train(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/success_rate" in r]
    reached = next((r for r in evals if r["eval/success_rate"] >= BARS[algorithm]), None)
    return {
        "algorithm": algorithm,
        "bar": BARS[algorithm],
        "steps_to_bar": reached["global_step"] if reached else None,
        "seconds_to_bar": reached["time/elapsed_s"] if reached else None,
        "final_success": evals[-1]["eval/success_rate"],
        "best_success": summary["best_eval_success_rate"],
        "SPS": summary["SPS"],
        "total_steps": summary["global_step"],
        "total_seconds": summary["elapsed_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=["ppo", "grpo"], choices=sorted(BARS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. trainer.iterations=50")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="rlchain-bench-"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, runs in {out}")
    results = [run(a, args.seed, out, args.overrides) for a in args.algorithms]
    print("\n| algorithm | bar | env steps to bar | wall s to bar | final eval success | best | SPS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        steps = f"{r['steps_to_bar']:,}" if r["steps_to_bar"] else "not reached"
        secs = f"{r['seconds_to_bar']:.0f}" if r["seconds_to_bar"] else f"> {r['total_seconds']:.0f}"
        print(f"| {r['algorithm']} | {r['bar']} | {steps} | {secs} | {r['final_success']:.3f} | "
              f"{r['best_success']:.3f} | {r['SPS']:,.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
