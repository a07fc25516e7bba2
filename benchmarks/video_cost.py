"""What ``trainer.video=true`` costs: the ``push_cube_ppo`` preset with and without videos, side by side.

Both runs are real ``rlchain-train experiment=push_cube_ppo`` commands started
at the same moment, one thread each (``OMP_NUM_THREADS=1``), pinned with
``taskset`` to separate cores; then again with the cores swapped, so that
neither side keeps the faster core. Wall time is each process's own, start-up
and the final fresh evaluation included.

    python benchmarks/video_cost.py                      # the preset as it is (400 iterations)
    python benchmarks/video_cost.py --iterations 100     # a quicker look
    python benchmarks/video_cost.py --device cuda        # on a GPU (the pinning still applies to the CPU side)

Prints each run's wall time, the ratio (video / no video) of each pair and
their mean, and the trainer's own account of the video's cost, which the
cores' speeds do not blur: the extra seconds of ``time/eval_s`` (evaluation,
rendering and encoding) over the plain run's loop seconds. ``--json`` also
writes them to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def start(args: list[str], core: int, cwd: Path, log: Path) -> tuple[subprocess.Popen, float]:
    """Start ``python -m rlchain *args`` with one thread on ``core`` (stderr to ``log``); the process and its start."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled")
    cmd = [sys.executable, "-m", "rlchain", *args]
    if shutil.which("taskset") and len(os.sched_getaffinity(0)) > 1:
        cmd = ["taskset", "-c", str(core), *cmd]
    with open(log, "w") as err:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err), time.perf_counter()


def pair(common: list[str], video_core: int, cwd: Path) -> dict[str, float]:
    """Run the preset without and with video at once (video on ``video_core``); their wall seconds."""
    cores = sorted(os.sched_getaffinity(0))
    plain_core = next(c for c in cores if c != video_core) if len(cores) > 1 else video_core
    procs = {
        "plain": start([*common, f"hydra.run.dir={cwd / 'plain'}"], plain_core, cwd, cwd / "plain.log"),
        "video": start(
            [*common, "trainer.video=true", f"hydra.run.dir={cwd / 'video'}"], video_core, cwd, cwd / "video.log"
        ),
    }
    walls: dict[str, float] = {}
    while len(walls) < len(procs):  # each process's own end, whichever ends first
        for name, (proc, t0) in procs.items():
            if name not in walls and proc.poll() is not None:
                walls[name] = time.perf_counter() - t0
                if proc.returncode != 0:
                    raise RuntimeError(f"the {name} run failed:\n{(cwd / f'{name}.log').read_text()[-3000:]}")
        time.sleep(0.05)
    for name in ("plain", "video"):  # the trainer's own account: seconds evaluating (video included) and in the loop
        rows = [json.loads(line) for line in (cwd / name / "metrics.jsonl").read_text().splitlines()]
        walls[f"{name}_eval_s"] = sum(row.get("time/eval_s", 0.0) for row in rows)
        walls[f"{name}_loop_s"] = rows[-1]["time/elapsed_s"]
    videos = sorted((cwd / "video" / "videos").glob("*.mp4"))
    walls["videos"] = len(videos)
    walls["video_mb"] = sum(v.stat().st_size for v in videos) / 1e6
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=None, help="trainer.iterations (default: the preset's 400)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    common = ["experiment=push_cube_ppo", f"device={args.device}", "trainer.progress=false"]
    if args.iterations is not None:
        common.append(f"trainer.iterations={args.iterations}")
    cores = sorted(os.sched_getaffinity(0))
    pairs = []
    for video_core in (cores[0], cores[-1]):
        with tempfile.TemporaryDirectory() as tmp:
            pairs.append(pair(common, video_core, Path(tmp)))
    ratios = [p["video"] / p["plain"] for p in pairs]
    # The video's own cost, free of the cores' speeds: the extra evaluation seconds over the plain run's loop.
    shares = [(p["video_eval_s"] - p["plain_eval_s"]) / p["plain_loop_s"] for p in pairs]
    results = {
        "device": args.device,
        "iterations": args.iterations or 400,
        "pairs": pairs,
        "ratios": ratios,
        "mean_ratio": sum(ratios) / len(ratios),
        "eval_shares": shares,
        "mean_eval_share": sum(shares) / len(shares),
    }
    print(
        f"push_cube_ppo on {args.device}, {results['iterations']} iterations, one thread per run, cores swapped between pairs"
    )
    print(
        f"{'pair':<6}{'no video s':>12}{'video s':>10}{'ratio':>8}{'eval s':>14}{'extra/loop':>12}{'videos':>8}{'MB':>7}"
    )
    for i, (p, r, x) in enumerate(zip(pairs, ratios, shares)):
        evals = f"{p['plain_eval_s']:.1f}/{p['video_eval_s']:.1f}"
        print(
            f"{i:<6}{p['plain']:>12.1f}{p['video']:>10.1f}{r:>8.3f}{evals:>14}{x:>12.1%}{p['videos']:>8}{p['video_mb']:>7.1f}"
        )
    print(
        f"mean wall ratio (video / no video): {results['mean_ratio']:.3f}; "
        f"mean extra evaluation time over the loop: {results['mean_eval_share']:.1%}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
