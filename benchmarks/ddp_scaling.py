"""Training SPS of one process against two ``torchrun`` ranks on the same machine, at the same global batch.

Both are real ``rlchain-train`` runs of the ``push_cube_ppo`` preset (PPO on
push_cube) with evaluation pushed past the end, one after the other,
alternating, ``--repeats`` times each:

* ``1 process``: ``--num-envs`` envs and minibatches of ``--batch-size``;
* ``2 ranks`` (``torchrun --standalone --nproc_per_node=2``): half the envs
  and half the minibatch on each rank, so each update sees the same number of
  samples and the same global minibatch.

On the CPU the single process gets every core's thread (``OMP_NUM_THREADS``
= the cores) and each rank one core's share. With ``--device cuda`` the single
process has the GPU to itself and both ranks share it (every rank on
``cuda:0``, gloo between them: NCCL needs a GPU per rank).

    python benchmarks/ddp_scaling.py                              # 2-core CPU: 512 envs, 60 iterations
    python benchmarks/ddp_scaling.py --device cuda --num-envs 4096 --batch-size 16384

It prints, per configuration, the median over runs of the median
``charts/SPS`` of the iterations after the first ``--warmup`` (env steps of
every rank per second of collect + update), the whole run's SPS
(``summary.json``: global_step / elapsed_s, start-up excluded) and the
final training ``charts/success_rate``, then the ratios. ``--json`` writes them to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from rlchain.run.summary import RunSummary


def run(name: str, ranks: int, args: argparse.Namespace, repeat: int) -> dict:
    """One run of ``ranks`` processes into ``<out>/<name>_<repeat>``; its SPS and final training success rate.

    Raises:
        RuntimeError: the run exited non-zero (its stderr tail is included).
    """
    run_dir = (args.out / f"{name.replace(' ', '_')}_{repeat}").resolve()
    overrides = [
        "experiment=push_cube_ppo",
        f"device={args.device if ranks == 1 or args.device == 'cpu' else 'cuda:0'}",
        f"env.num_envs={args.num_envs // ranks}",
        f"algorithm.batch_size={args.batch_size // ranks}",
        f"trainer.iterations={args.iterations}",
        f"trainer.eval_freq={args.iterations + 1}",
        "trainer.fresh_eval=false",
        "trainer.num_eval_episodes=64",
        "trainer.num_eval_envs=64",
        "trainer.progress=false",
        f"hydra.run.dir={run_dir}",
    ]
    if ranks == 1:
        cmd = [sys.executable, "-m", "rlchain", *overrides]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks}",
            "-m",
            "rlchain.commands.train",
            *overrides,
        ]
    threads = max(1, (os.cpu_count() or 1) // ranks) if args.device == "cpu" else 1
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = RunSummary.read(run_dir)
    return {
        "iteration_sps": statistics.median(r["charts/SPS"] for r in rows[args.warmup :]),
        "run_sps": summary.SPS,
        "success_rate": rows[-1].get("charts/success_rate"),
        "threads": threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--num-envs", type=int, default=512, help="envs of all ranks together")
    parser.add_argument("--batch-size", type=int, default=2048, help="global minibatch (samples of all ranks)")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5, help="first iterations left out of the iteration SPS")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/ddp_scaling"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    configs = {"1 process": 1, "2 ranks": 2}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for repeat in range(args.repeats):  # alternate, so that a slow spell of the machine hits both
        for name, ranks in configs.items() if repeat % 2 == 0 else reversed(configs.items()):
            runs[name].append(run(name, ranks, args, repeat))
            print(f"{name} #{repeat}: {runs[name][-1]}", flush=True)
    result = {
        "device": args.device,
        "num_envs": args.num_envs,
        "batch_size": args.batch_size,
        "iterations": args.iterations,
        "configs": {},
    }
    for name, results in runs.items():
        result["configs"][name] = {
            "iteration_sps": statistics.median(r["iteration_sps"] for r in results),
            "run_sps": statistics.median(r["run_sps"] for r in results),
            "success_rate": [r["success_rate"] for r in results],
            "threads_per_process": results[0]["threads"],
        }
    one, two = result["configs"]["1 process"], result["configs"]["2 ranks"]
    result["ratio_iteration_sps"] = two["iteration_sps"] / one["iteration_sps"]
    result["ratio_run_sps"] = two["run_sps"] / one["run_sps"]
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
