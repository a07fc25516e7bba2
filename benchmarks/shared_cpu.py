"""The main job's speed on a CPU that other processes share: alone, beside one busy process, beside two.

Usage: ``python benchmarks/shared_cpu.py [--iterations 6] [--rounds 2] [--settings default passive one_thread]``

Each measurement is a real ``rlchain-train algorithm=grpo env=push_cube`` process of ``--iterations`` iterations
(no evaluation but the last, no fresh evaluation), its SPS the trainer's over the iterations after the first
(``time/collect_s + time/update_s``, from ``metrics.jsonl``), while 0, 1 or 2 other processes spin in
``while True: pass`` (a busy neighbour on a shared machine: another job, a compile, a test run). The settings:

* ``default``: rlchain-train as it starts (``trainer.adapt_threads=true``: fewer threads while others are busy);
* ``fixed``: ``trainer.adapt_threads=false``: torch's thread count throughout, the default before it;
* ``passive``: ``fixed`` with ``OMP_WAIT_POLICY=PASSIVE``: OpenMP's waiting threads sleep at once instead of
  spinning a while;
* ``one_thread``: ``fixed`` with ``OMP_NUM_THREADS=1``.

Rounds alternate the settings and loads, so that a change in the machine's speed falls on all of them. Prints
the median SPS of each (setting, load) and each load's SPS as a share of the same setting alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: Each setting's environment variables and overrides.
SETTINGS = {
    "default": ({}, []),
    "fixed": ({}, ["trainer.adapt_threads=false"]),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, ["trainer.adapt_threads=false"]),
    "one_thread": ({"OMP_NUM_THREADS": "1"}, ["trainer.adapt_threads=false"]),
}


def measure(setting: str, busy: int, iterations: int, out: Path) -> float:
    """The SPS of one main job under ``setting`` beside ``busy`` spinning processes."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    run = Path(tempfile.mkdtemp(dir=out))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")}
    environ, overrides = SETTINGS[setting]
    env.update(environ)
    try:
        subprocess.run(
            [sys.executable, "-m", "rlchain", "algorithm=grpo", "env=push_cube", f"trainer.iterations={iterations}"]
            + [f"trainer.eval_freq={iterations}", "trainer.fresh_eval=false", "trainer.progress=false"]
            + [f"hydra.run.dir={run}", *overrides],
            env=env,
            check=True,
            capture_output=True,
        )
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    per_iteration, timed = rows[0]["global_step"], rows[1:]  # the first iteration warms up
    return per_iteration * len(timed) / sum(r["time/collect_s"] + r["time/update_s"] for r in timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=["default", "fixed", "one_thread"])
    parser.add_argument("--busy", nargs="+", type=int, default=[0, 1, 2], help="spinning neighbours of each measure")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="rlchain-shared-cpu-"))
    sps: dict[tuple[str, int], list[float]] = {}
    for round_ in range(args.rounds):
        for busy in args.busy if round_ % 2 == 0 else reversed(args.busy):
            for setting in args.settings if round_ % 2 == 0 else reversed(args.settings):
                value = measure(setting, busy, args.iterations, out)
                sps.setdefault((setting, busy), []).append(value)
                print(f"round {round_}: {setting}, {busy} busy: {value:,.0f} SPS", flush=True)
    print(f"\n{os.cpu_count()} CPUs; median SPS of {args.rounds} rounds (share of the same setting alone)")
    print("| setting | " + " | ".join(f"{b} busy" for b in args.busy) + " |")
    print("|---|" + "---:|" * len(args.busy))
    rows = []
    for setting in args.settings:
        alone = statistics.median(sps[(setting, args.busy[0])])
        cells = []
        for busy in args.busy:
            value = statistics.median(sps[(setting, busy)])
            cells.append(f"{value:,.0f} ({value / alone:.0%})")
            rows.append({"setting": setting, "busy": busy, "sps": sps[(setting, busy)], "median": value})
        print(f"| {setting} | " + " | ".join(cells) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
