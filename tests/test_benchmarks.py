"""The benchmark against rsl_rl runs end to end (tiny budget): a benchmark that breaks silently reports nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow
def test_vs_rsl_rl_runs_both_sides_and_evaluates_them(tmp_path):
    """Both sides train 2 iterations and evaluate after the last; results.json has each side's SPS and eval."""
    pytest.importorskip("rsl_rl")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "vs_rsl_rl.py"),
            "--seeds",
            "0",
            "--iterations",
            "2",
            "--num-envs",
            "64",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    for side in ("rlchain", "rsl_rl"):
        run = report["per_seed"]["0"][side]
        assert run["SPS"] > 0
        assert 0.0 <= run["final_eval_success"] <= 1.0
    rows = [json.loads(line) for line in (out / "rsl_rl_seed0" / "metrics.jsonl").read_text().splitlines()]
    assert [row["charts/iteration"] for row in rows] == [1, 2]
    assert "eval/success_rate" in rows[-1] and "eval/avg_reward" in rows[-1]


def test_the_pixel_memory_benchmark_counts_what_it_allocates():
    """A small rollout: the bytes counted equal the resident memory the real buffer takes, row by row."""
    args = ["--num-envs", "256", "--rollout-steps", "64", "--image-size", "32", "--allocate"]
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "pixel_memory.py"), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| exact") or "| the" in line]
    assert len(rows) == 2
    for row in rows:
        counted, measured = (float(cell.split()[0]) for cell in (row[3], row[4]))
        assert measured == pytest.approx(counted, abs=0.02)  # GiB: images of 256 x 64 x 32 x 32 x 3 are 0.05
    privileged, image = rows
    assert float(privileged[2].split()[0]) < float(image[2].split()[0])  # final_obs: no second copy of the image


def test_a_populations_calls_per_step_do_not_grow_with_its_members():
    """``kernel_count.py --population`` at 1 and 2 members (8 envs each): the counts it reports for the collection
    step and the minibatch update are within 10% at both sizes (the bar of benchmarks/README.md, Populations)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernel_count", BENCHMARKS / "kernel_count.py")
    kernel_count = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel_count)
    rows = {row["what"]: row["eager"] for row in kernel_count.population_rows(8, sizes=(1, 2))}
    for step in ("collection step", "minibatch update"):
        one, two = rows[f"population {step}, P=1"], rows[f"population {step}, P=2"]
        assert one > 0 and abs(two - one) <= 0.1 * one, (step, one, two)
