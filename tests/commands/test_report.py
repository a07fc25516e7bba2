"""Sweep results: summary tables, seed groups, learning curves, rlchain-report, failed jobs."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
from omegaconf import OmegaConf

from rlchain.commands.report import JobResult, learning_curves, load_jobs
from tests.helpers.runs import run_cli, summaries


def test_summary_tables_rank_jobs_and_group_seeds(cpu_sweep):
    sweep, _ = cpu_sweep
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    runs = summaries(sweep)
    objectives = [float(r["objective"]) for r in rows]
    assert objectives == sorted(objectives, reverse=True)
    for row in rows:
        s = runs[int(row["job"])]
        assert row["status"] == "completed" and row["device"] == "cpu"
        assert int(row["global_step"]) == s.summary.global_step == 8 * 16 * 8
        assert float(row["final eval success rate"]) == pytest.approx(s.summary.final["eval/success_rate"])
        assert float(row["best eval success rate"]) == pytest.approx(s.summary.best_eval_success_rate)
        assert float(row["final eval return"]) == pytest.approx(s.summary.final["eval/avg_reward"])
        assert float(row["wall_s"]) == pytest.approx(s.record.wall_s)
        assert {"seed", "algorithm.learning_rate"} <= set(row)  # the overrides that vary, one column each
        fresh = s.summary.best_fresh["metrics"]["success_rate"]  # best.pt on fresh start states, beside the objective
        assert float(row["best.pt on fresh starts"]) == pytest.approx(fresh["mean"])
    assert not (sweep / ".summary.lock").exists()  # the jobs' lock goes with the sweep's end
    md = (sweep / "summary.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| job |"))
    assert "| objective | best.pt on fresh starts |" in header
    for job in runs.values():
        fresh = job.summary.best_fresh["metrics"]["success_rate"]
        line = next(line for line in md.splitlines() if line.startswith(f"| {job.num} |"))
        assert f"{fresh['mean']:.4g} [{fresh['ci95_low']:.3g}, {fresh['ci95_high']:.3g}]" in line
    assert "## Configurations over seeds (mean ± std)" in md and "![" in md
    for lr in ("0.001", "0.0003"):
        line = next(line for line in md.splitlines() if line.startswith(f"| algorithm.learning_rate={lr} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:3] == ["2", "2"]  # two seeds, both completed


def test_seed_group_statistics_are_mean_and_sample_std(cpu_sweep):
    import statistics

    sweep, _ = cpu_sweep
    jobs = load_jobs(sweep)
    by_lr: dict[str, list[float]] = {}
    for job in jobs:
        by_lr.setdefault(job.params()["algorithm.learning_rate"], []).append(job.summary.final["eval/avg_reward"])
    md = (sweep / "summary.md").read_text()
    for lr, values in by_lr.items():
        line = next(line for line in md.splitlines() if line.startswith(f"| algorithm.learning_rate={lr} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        walls = [j.wall_s for j in jobs if j.params()["algorithm.learning_rate"] == lr]
        assert float(cells[3].split(" ± ")[0]) == pytest.approx(statistics.fmean(walls), rel=1e-3)  # wall_s
        mean, std = (float(x) for x in cells[6].split(" ± "))  # final eval return
        assert mean == pytest.approx(statistics.fmean(values), rel=1e-3, abs=1e-4)
        assert std == pytest.approx(statistics.stdev(values), rel=0.05, abs=1e-2)


def test_rlchain_report_regenerates_tables_and_draws_curves(cpu_sweep, tmp_path):
    sweep, _ = cpu_sweep
    for name in ("summary.csv", "summary.md", "learning_curves.png"):
        (sweep / name).unlink(missing_ok=True)
    proc = run_cli([str(sweep)], tmp_path, module="rlchain.commands.report")
    assert proc.returncode == 0, proc.stderr
    assert "| configuration | jobs | completed |" in proc.stdout
    assert (sweep / "summary.csv").is_file() and (sweep / "summary.md").is_file()
    png = sweep / "learning_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    height, width, _ = imread(png).shape
    assert (width, height) == (960, 576)
    # the plotted data: per learning rate, the mean over both seeds at each eval step
    curves = learning_curves(load_jobs(sweep))
    assert set(curves) == {"learning_rate=0.001", "learning_rate=0.0003"}
    jobs = load_jobs(sweep)
    for label, (steps, mean, std, n) in curves.items():
        lr = label.split("=")[1]
        seeds = [
            j.curve("eval/success_rate") for j in jobs if float(j.params()["algorithm.learning_rate"]) == float(lr)
        ]
        assert n == 2 and steps == seeds[0][0] == [128.0 * i for i in range(1, 9)]
        assert mean == pytest.approx([(a + b) / 2 for a, b in zip(seeds[0][1], seeds[1][1])])
        assert std is not None and len(std) == len(steps)
    bad = run_cli([str(tmp_path / "nowhere")], tmp_path, module="rlchain.commands.report")
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_value_at_interpolates_between_evaluations_and_never_extrapolates(tmp_path):
    rows = [
        {"global_step": 100, "eval/x": 0.2},
        {"global_step": 150, "losses/y": 5.0},
        {"global_step": 300, "eval/x": 1.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    job = JobResult(0, tmp_path, [], {"global_step": 300})
    assert [job.value_at("eval/x", s) for s in (100, 200, 250, 300)] == pytest.approx([0.2, 0.6, 0.8, 1.0])
    assert job.value_at("eval/x", 99) is None and job.value_at("eval/x", 301) is None
    assert job.value_at("eval/absent", 200) is None


def test_report_gives_the_metric_at_env_step_budgets(cpu_sweep, tmp_path):
    # eval every 128 steps up to 1024: a 300-step budget lies between the evals at
    # 256 and 384, 1024 is the last one; 100 and 2000 lie outside (an empty cell, no mean).
    sweep = shutil.copytree(cpu_sweep[0], tmp_path / "sweep")
    proc = run_cli(
        [str(sweep), "--at-steps", "100", "300", "1024", "2000", "--no-plot"],
        tmp_path,
        module="rlchain.commands.report",
    )
    assert proc.returncode == 0, proc.stderr
    with open(sweep / "summary.csv") as f:
        rows = {int(r["job"]): r for r in csv.DictReader(f)}
    for job in load_jobs(sweep):
        steps, values = job.curve("eval/success_rate")
        row = rows[job.num]
        v256, v384 = values[steps.index(256.0)], values[steps.index(384.0)]
        assert float(row["eval/success_rate at 300 steps"]) == pytest.approx(v256 + (v384 - v256) * 44 / 128)
        assert float(row["eval/success_rate at 1.024k steps"]) == pytest.approx(values[-1])
        assert row["eval/success_rate at 100 steps"] == row["eval/success_rate at 2k steps"] == ""
    md = (sweep / "summary.md").read_text()
    assert (
        "| eval/success_rate at 100 steps | eval/success_rate at 300 steps | eval/success_rate at 1.024k steps |" in md
    )
    bad = run_cli([str(sweep), "--at-steps", "0"], tmp_path, module="rlchain.commands.report")
    assert bad.returncode == 2 and "at_steps=[0.0]: expected env-step budgets > 0" in bad.stderr


def test_sweep_summary_lists_each_failed_job_on_its_own_line(tmp_path):
    """The end of a multirun whose sweeper went on past failures: one line per failed job (a stopped job is none)."""
    import json

    from rlchain.commands.report import SweepFailed, SweepSummary

    jobs = {
        0: (["lr=1", "seed=0"], {"status": "completed", "objective": 0.5}),
        1: (
            ["lr=2", "seed=0"],
            {
                "status": "failed",
                "error": "InstantiationException: Error in call to target:\nRuntimeError('boom')\nfull_key: env",
            },
        ),
        2: (["lr=3", "seed=0"], {"status": "aborted", "signal": "SIGINT"}),
        3: (["lr=4", "seed=0"], {"status": "failed", "error": "RuntimeError: out of memory"}),
    }
    for num, (overrides, summary) in jobs.items():
        (tmp_path / str(num) / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create(overrides), tmp_path / str(num) / ".hydra" / "overrides.yaml")
        OmegaConf.save(
            OmegaConf.create({"hydra": {"job": {"num": num}}}), tmp_path / str(num) / ".hydra" / "hydra.yaml"
        )
        (tmp_path / str(num) / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SweepFailed) as info:
        SweepSummary(plot=False).on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert str(info.value).splitlines()[1:3] == [
        "  job 1 (lr=2): InstantiationException: Error in call to target: RuntimeError('boom') full_key: env",
        "  job 3 (lr=4): RuntimeError: out of memory",
    ]
    assert str(info.value).startswith("2 of 4 jobs failed")
    md = (tmp_path / "summary.md").read_text()
    assert "1 interrupted" not in md and "1 aborted, 2 failed or missing" in md


def _write_job(sweep, num: int, overrides: list[str], summary: dict, rows: list[dict]) -> None:
    """A job directory as rlchain-train leaves it: its overrides, job number, summary.json and metrics.jsonl."""
    (sweep / str(num) / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), sweep / str(num) / ".hydra" / "overrides.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": num}}}), sweep / str(num) / ".hydra" / "hydra.yaml")
    (sweep / str(num) / "summary.json").write_text(json.dumps(summary))
    (sweep / str(num) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_learning_curves_plot_the_objective_and_keep_a_long_legend_readable(tmp_path):
    # a task without success (eval/avg_reward is its objective) drew no plot, and a legend of 8 or more
    # configurations covered the curves
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from rlchain.commands.report import learning_curves_figure, write_summary

    rates = [f"{1e-4 * (i + 1):.4g}" for i in range(12)]
    for num, (lr, seed) in enumerate((lr, seed) for lr in rates for seed in (0, 1)):
        rows = [
            {"global_step": 100 * k, "eval/avg_reward": -1000 + 50 * k * float(lr) / 1e-4 + seed} for k in (1, 2, 3)
        ]
        summary = {"status": "completed", "objective_name": "eval/avg_reward", "objective": rows[-1]["eval/avg_reward"]}
        _write_job(
            tmp_path, num, [f"algorithm.learning_rate={lr}", "algorithm.clip_coef=0.2", f"seed={seed}"], summary, rows
        )
    paths = write_summary(tmp_path)
    assert paths["png"] == tmp_path / "learning_curves.png"
    assert "![eval/avg_reward against env steps](learning_curves.png)" in paths["md"].read_text()
    curves = learning_curves(load_jobs(tmp_path), "eval/avg_reward")
    assert len(curves) == 12
    fig = learning_curves_figure(curves, "eval/avg_reward")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    (ax,) = fig.axes
    assert ax.get_ylabel() == "eval/avg_reward" and "best 10 of 12 configurations" in ax.get_title()
    (legend,) = fig.legends
    assert len(legend.get_texts()) == 10 and legend.get_texts()[0].get_text() == "learning_rate=0.0012 (n=2)"
    box = legend.get_window_extent(renderer)
    assert not box.overlaps(ax.get_window_extent(renderer))  # no entry covers a curve
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0  # none leaves the figure
