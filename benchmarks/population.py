"""One sweep two ways: jobs of the devices launcher (one process per job) against one population per shape; or
populations of P members of the main job against one run.

Usage: ``python benchmarks/population.py [--sweep seeds|grid|both] [--iterations N] [--jobs-per-device 2]
[--compile] [--out FILE]``; ``python benchmarks/population.py --members 16 64 --device cuda --iterations 3 [--out FILE]``

The sweeps:

* ``seeds``: 8 seeds of the main job (``rlchain-train`` with its defaults);
* ``grid``: a 4 x 4 grid of ``algorithm.learning_rate`` and ``algorithm.ent_coef`` of ``experiment=push_cube_ppo``.

Each sweep runs twice, one way after the other, each with the whole machine and the same slots:
``rlchain-train -m ... hydra/launcher=devices hydra.launcher.jobs_per_device=J`` (``J`` jobs at once, the CPU's
cores shared among them), then ``rlchain-train -m ... hydra/launcher=population
hydra.launcher.jobs_per_device=J`` (the sweep split into ``J`` populations, one per slot, trained at once). Reported per way: the wall time of the command,
the aggregate env steps per second (every job's ``global_step`` over that wall time), and each job's final
evaluation success rate (mean and std over the jobs, and job by job). ``--iterations`` shortens every job
(``trainer.iterations``) where the full sweep would take too long; the table says so. Writes a markdown table
to stdout and, with ``--out``, the numbers as JSON.

``--members P ...`` (the GPU's measurement; ``benchmarks/gpu_check.sh population`` runs it): one run of the main
job on ``--device``, then for each ``P`` the seeds ``0 .. P-1`` of the main job as one population
(``hydra/launcher=population``; ``P`` = 1: a population of one) on that device, ``--iterations`` each. Reported
per row: the wall time of the command; the aggregate training env steps/s, the sum over the members of each
one's median ``charts/SPS`` over its iterations but the first (env steps over the seconds of collection and
update, which a population's members share); every member's env steps over the wall time (builds, evaluations,
one member after another, and start-up included); and their ratios to the one run's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEPS = {
    "seeds": ["seed=range(8)"],
    "grid": [
        "experiment=push_cube_ppo",
        "algorithm.learning_rate=3e-4,1e-3,2e-3,4e-3",
        "algorithm.ent_coef=0,0.003,0.01,0.03",
    ],
}


def timed_rlchain(args: list[str], what: str, out: Path | None = None) -> float:
    """``rlchain-train`` with ``args`` (wandb off); its wall seconds. Exits naming ``what`` and the command's
    stderr when it fails, with the full traceback of a failed compile (``compile_error.txt`` under ``out``, where
    the runs write)."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rlchain", *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        traces = sorted(out.rglob("compile_error.txt")) if out is not None else []
        shown = "".join(f"\n{path}:\n{path.read_text()[-20000:]}" for path in traces)
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stderr[-3000:]}{shown}")
    return wall


def run(sweep: str, way: str, root: Path, iterations: int | None, jobs_per_device: int, compiled: bool) -> dict:
    """Run ``sweep`` one ``way`` in ``root`` (every job's, or population's, steps compiled with ``compiled``); its
    wall time, aggregate env steps/s and each job's result."""
    out = root / f"{sweep}_{way}"
    launcher = [f"hydra/launcher={way}", f"hydra.launcher.jobs_per_device={jobs_per_device}"]
    extra = [f"trainer.iterations={iterations}"] if iterations else []
    extra += ["trainer.compile=true"] if compiled else []
    args = [*SWEEPS[sweep], *launcher, *extra, "trainer.progress=false", f"hydra.sweep.dir={out}"]
    wall = timed_rlchain(["-m", *args], f"{sweep} via {way}", out)
    jobs = []
    for summary in sorted(out.glob("*/summary.json"), key=lambda p: int(p.parent.name)):
        data = json.loads(summary.read_text())
        jobs.append(
            {
                "job": int(summary.parent.name),
                "global_step": data["global_step"],
                "success": data["final"].get("eval/success_rate"),
            }
        )
    steps = sum(j["global_step"] for j in jobs)
    return {
        "sweep": sweep,
        "way": way,
        "wall_s": wall,
        "env_steps": steps,
        "env_steps_per_s": steps / wall,
        "jobs": jobs,
    }


def members_run(members: int | None, device: str, iterations: int, root: Path, mode: str = "eager") -> dict:
    """The main job on ``device`` for ``iterations``: one run (``members`` None) or a population of ``members``
    seeds, its steps ``"eager"``, ``"compiled"`` (``trainer.compile=true``) or ``"captured"`` (and
    ``trainer.cudagraphs=true``); its wall time (compiling included), aggregate training env steps/s (see the module
    docstring) and env steps over the wall time (build, evaluations and start-up included)."""
    out = root / f"members_{members or 'solo'}_{mode}"
    common = [
        f"device={device}",
        f"trainer.compile={str(mode != 'eager').lower()}",
        f"trainer.cudagraphs={str(mode == 'captured').lower()}",
        f"trainer.iterations={iterations}",
        "trainer.progress=false",
        "trainer.fresh_eval=false",
    ]
    if members is None:
        args = [*common, f"hydra.run.dir={out}"]
    else:
        args = ["-m", f"seed=range({members})", "hydra/launcher=population", *common, f"hydra.sweep.dir={out}"]
    wall = timed_rlchain(args, f"{'one run' if members is None else f'a population of {members}'} ({mode})", out)
    sps = []
    env_steps = 0
    for run_dir in [out] if members is None else sorted(p for p in out.iterdir() if (p / "metrics.jsonl").exists()):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        values = [r["charts/SPS"] for r in rows if "charts/SPS" in r]
        sps.append(statistics.median(values[1:] or values))
        env_steps += json.loads((run_dir / "summary.json").read_text())["global_step"]
    return {
        "members": members,
        "mode": mode,
        "runs": len(sps),
        "wall_s": wall,
        "train_sps": sum(sps),
        "wall_sps": env_steps / wall,
    }


def main_members(args: argparse.Namespace) -> None:
    """``--members``: one run, then populations of each size (and of each ``--compiled`` size with
    ``trainer.compile=true``, each ``--captured`` size with ``trainer.cudagraphs=true`` too); a markdown table, and
    JSON with ``--out``. A population that fails is a row that says so, its error on stderr; the others go on."""
    results = []
    runs = [
        (None, "eager"),
        *((m, "eager") for m in args.members),
        *((m, "compiled") for m in args.compiled or ()),
        *((m, "captured") for m in args.captured or ()),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for members, mode in runs:
            try:
                results.append(members_run(members, args.device, args.iterations or 3, Path(tmp), mode))
            except SystemExit as failed:
                if members is None:  # no single run: no ratio to report
                    raise
                print(failed, file=sys.stderr, flush=True)
                results.append({"members": members, "mode": mode, "error": str(failed).splitlines()[0]})
                continue
            print(f"{members or 'one run'} ({mode}): {results[-1]['wall_s']:.0f} s", file=sys.stderr, flush=True)
    base = results[0]
    print(f"the main job on {args.device}, trainer.iterations={args.iterations or 3}")
    print("| members | wall s | aggregate training env steps/s | ratio | env steps / wall s | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        what = f"{r['members'] or 'one run'}{'' if r['mode'] == 'eager' else ' ' + r['mode']}"
        if "error" in r:
            print(f"| {what} | {r['error']} | | | | |")
            continue
        print(
            f"| {what} | {r['wall_s']:.0f} | {r['train_sps']:,.0f} | {r['train_sps'] / base['train_sps']:.2f}x | "
            f"{r['wall_sps']:,.0f} | {r['wall_sps'] / base['wall_sps']:.2f}x |"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", choices=("seeds", "grid", "both"), default="both")
    parser.add_argument("--iterations", type=int, help="trainer.iterations of every job (default: the configs')")
    parser.add_argument(
        "--jobs-per-device", type=int, default=2, help="slots of either way: jobs or populations at once"
    )
    parser.add_argument("--out", type=Path, help="write the numbers as JSON here")
    parser.add_argument("--compile", action="store_true", help="the sweeps: trainer.compile=true both ways")
    parser.add_argument("--members", type=int, nargs="+", help="populations of the main job of these sizes")
    parser.add_argument(
        "--compiled", type=int, nargs="+", help="--members: also populations of these sizes with trainer.compile=true"
    )
    parser.add_argument(
        "--captured",
        type=int,
        nargs="+",
        help="--members: also populations of these sizes with trainer.cudagraphs=true",
    )
    parser.add_argument("--device", default="cuda", help="--members: the device (default cuda)")
    args = parser.parse_args()
    if (args.compiled or args.captured) and not args.members:
        parser.error("--compiled and --captured go with --members")
    if args.members:
        main_members(args)
        return
    sweeps = ("seeds", "grid") if args.sweep == "both" else (args.sweep,)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for sweep in sweeps:
            for way in ("devices", "population"):
                results.append(run(sweep, way, Path(tmp), args.iterations, args.jobs_per_device, args.compile))
                print(f"{sweep} via {way}: {results[-1]['wall_s']:.0f} s", file=sys.stderr, flush=True)
    budget = f"trainer.iterations={args.iterations}" if args.iterations else "the configs' iterations"
    budget += "; trainer.compile=true both ways (compiling inside the wall time)" if args.compile else ""
    print(f"{os.cpu_count()} CPU(s); {args.jobs_per_device} slots each way (jobs or populations at once); {budget}")
    print("| sweep | way | wall s | aggregate env steps/s | ratio | final eval success (mean ± std) |")
    print("|---|---|---:|---:|---:|---|")
    for sweep in sweeps:
        base = next(r for r in results if r["sweep"] == sweep and r["way"] == "devices")
        for r in (x for x in results if x["sweep"] == sweep):
            success = [j["success"] for j in r["jobs"] if j["success"] is not None]
            spread = f"{statistics.mean(success):.3f} ± {statistics.stdev(success):.3f}" if len(success) > 1 else "-"
            ratio = r["env_steps_per_s"] / base["env_steps_per_s"]
            print(
                f"| {sweep} | {r['way']} | {r['wall_s']:.0f} | {r['env_steps_per_s']:,.0f} | {ratio:.2f}x | {spread} |"
            )
    for r in results:
        print(f"{r['sweep']} via {r['way']}: " + ", ".join(f"{j['job']}: {j['success']}" for j in r["jobs"]))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
