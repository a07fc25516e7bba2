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
