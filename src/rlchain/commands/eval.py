"""``rlchain-eval``: evaluate a trained policy again, on fresh start states or on another variant of its task.

Usage::

    rlchain-eval outputs/2026-11-24/10-00-00_1a2b3c                 # best.pt, the run's evaluation settings
    rlchain-eval outputs/... checkpoint=latest num_episodes=1000 seed=7
    rlchain-eval outputs/... env.success_threshold=0.05 env.num_envs=64 video=true
    rlchain-eval path/to/best.pt deterministic=false
    rlchain-eval outputs/... --allow-target my_robot                 # a run whose env is my_robot.envs.Arm
    rlchain-eval outputs/... --allow-target gymnasium_robotics       # a run with env.imports=[gymnasium_robotics]

It rebuilds env and policy from the run's own composed config
(:mod:`rlchain.commands.saved_run`), loads the checkpoint's weights, runs
``num_episodes`` episodes (:func:`rlchain.run.evaluator.evaluate_checkpoint`, the
path of the trainer's final score) and prints one table: return, length,
success rate and every task metric as mean ± std with a 95% confidence
interval. It writes ``eval.json`` (and with ``video=true`` ``eval.mp4``) next to
the checkpoint. Overrides change the evaluation, not the policy: they are
``env.<key>=<value>`` of the saved config and the options of
:class:`EvalConfig`, in Hydra's override syntax.

With the defaults (``best.pt``, the run's ``num_eval_envs`` and
``num_eval_episodes``, :func:`~rlchain.core.evaluation.fresh_seed` of the run's
seed) it reproduces the run's ``summary.json`` ``best_fresh``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlchain.commands.arguments import SavedRunOptions, command_parser, read_options
from rlchain.settings import SettingError, setting
from rlchain.utils import MAX_SEED

__all__ = ["EvalConfig", "main", "run_eval"]


@dataclass
class EvalConfig(SavedRunOptions):
    """The options of ``rlchain-eval`` (``key=value`` on its command line), their defaults and ranges."""

    num_episodes: int | None = setting(None, gt=0)
    """Episodes to run, on min(num_episodes, the run's num_eval_envs) envs unless env.num_envs is given (every env
    runs as many; a count rounded up to a multiple of env.num_envs is said in one line); None: the run's
    trainer.num_eval_episodes on its num_eval_envs envs (its evaluation)."""
    deterministic: bool = True
    """The policy's deterministic actions (the Gaussian's mean, the likeliest category); false samples them."""
    seed: int | None = setting(None, ge=0, le=MAX_SEED)
    """Reset seed of the episodes; None: rlchain.core.evaluation.fresh_seed of the run's seed (start states that no
    evaluation during training used)."""
    video: bool = False
    """Record the first video_episodes episodes as eval.mp4 next to the checkpoint."""
    video_episodes: int = setting(2, gt=0)
    """Episodes in the video (the first episode of each of the first video_episodes envs)."""
    device: str | None = None
    """Torch device of env and policy: 'cpu', 'cuda', 'cuda:N' or 'auto'; None: the run's env.device."""


def run_eval(source: str | Path, overrides: Sequence[str] = (), allowed: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate the checkpoint of ``source`` (a run directory or a checkpoint) and write ``eval.json`` next to it.

    Args:
        source: a run directory or a checkpoint file.
        overrides: ``key=value`` strings: options of :class:`EvalConfig` and
            ``env.<key>=<value>`` of the saved config.
        allowed: modules whose ``_target_`` s the saved config may instantiate besides rlchain's.

    Returns:
        what ``eval.json`` holds: ``source``, ``checkpoint``, ``global_step``,
        ``overrides``, ``seed``, ``episodes``, ``deterministic``, ``metrics``
        (name -> mean, std, ci95_low, ci95_high, n), ``video`` (a path or None).

    Raises:
        rlchain.commands.saved_run.SavedRunError: a missing run or checkpoint, a
            directory without a config, an unknown key, a value out of range, a
            target that is not allowed, ``video=true`` on an env that cannot
            render, a file that cannot be written; one line each.
    """
    import torch

    from rlchain.commands.saved_run import SavedRunError, open_run
    from rlchain.console import notice
    from rlchain.core.evaluation import check_renders, fresh_seed
    from rlchain.files import write_json
    from rlchain.run.evaluator import evaluate_checkpoint
    from rlchain.run.video import check_video_support, prefer_headless_gl, write_mp4

    cfg, env_overrides = read_options(overrides, EvalConfig)
    if cfg.video and check_video_support() is not None:
        raise SavedRunError(f"video=True{check_video_support()}")
    run = open_run(source, cfg.checkpoint, allowed)
    settings: dict[str, Any] = {"num_envs": run.trainer_setting("num_eval_envs", run.config["env"].get("num_envs"))}
    if cfg.num_episodes is not None and settings["num_envs"] is not None:  # no more envs than episodes asked for
        settings["num_envs"] = min(int(settings["num_envs"]), cfg.num_episodes)
    if cfg.device is not None:
        settings["device"] = cfg.device
    if cfg.video:
        settings["render_mode"] = "rgb_array"
        prefer_headless_gl()
    try:
        env = run.build_env(env_overrides, **settings)
    except SavedRunError as err:
        if cfg.video and "render_mode" in str(err):
            raise SavedRunError(
                f"video=True needs an env that renders: {run.config['env'].get('_target_')} takes no render_mode"
            ) from None
        raise
    try:
        if cfg.video:
            if cfg.video_episodes > env.num_envs:
                raise SavedRunError(
                    f"video_episodes={cfg.video_episodes} is not allowed with env.num_envs={env.num_envs}: "
                    "expected at most num_envs (each recorded episode is the first of one env)"
                )
            check_renders(env)
        policy = run.build_policy(env)
        seed = cfg.seed if cfg.seed is not None else fresh_seed(int(run.trainer_setting("seed", 0)))
        episodes = cfg.num_episodes or int(run.trainer_setting("num_eval_episodes", env.num_envs))
        if episodes % env.num_envs:
            notice(
                f"{-(-episodes // env.num_envs) * env.num_envs} episodes: num_episodes={episodes} rounded up to a "
                f"multiple of env.num_envs={env.num_envs} (every env runs as many)"
            )
        torch.manual_seed(seed)  # the sampled actions of deterministic=false
        result, _ = evaluate_checkpoint(
            env,
            policy,
            run.checkpoint,
            episodes,
            seed,
            deterministic=cfg.deterministic,
            video_episodes=cfg.video_episodes if cfg.video else 0,
        )
    except SettingError as err:
        raise SavedRunError(str(err)) from None
    except (RuntimeError, ValueError) as err:  # the env's own error, or episodes that never end
        if isinstance(err, SavedRunError):
            raise
        raise SavedRunError(f"the evaluation failed: {type(err).__name__}: {err}") from None
    finally:
        env.close()
    out_dir = run.checkpoint.parent
    video = None
    try:
        if result.frames is not None:
            video = str(write_mp4(out_dir / "eval.mp4", result.frames, result.fps))
        record = {
            "source": str(source),
            "checkpoint": str(run.checkpoint),
            "global_step": run.global_step,
            "overrides": list(overrides),
            **result.to_json(),
            "video": video,
        }
        record["eval_json"] = str(write_json(out_dir / "eval.json", record))
    except OSError as err:
        raise SavedRunError(f"cannot write next to the checkpoint in {out_dir}: {err.strerror or err}") from None
    return record


def _table(record: dict[str, Any]) -> str:
    """The evaluation as a rich table (plain text when not on a terminal)."""
    from rich.console import Console
    from rich.table import Table

    title = (
        f"{record['checkpoint']} (global_step {record['global_step']:,}): {record['episodes']} episodes, "
        f"seed {record['seed']}, {'deterministic' if record['deterministic'] else 'stochastic'}"
    )
    table = Table()
    for column in ("metric", "mean", "std", "95% CI"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    names = {"avg_reward": "return", "avg_length": "length", "success_rate": "success rate"}
    for key, stats in record["metrics"].items():
        interval = "" if stats["ci95_low"] is None else f"[{stats['ci95_low']:.4g}, {stats['ci95_high']:.4g}]"
        table.add_row(names.get(key, key), f"{stats['mean']:.4g}", f"{stats['std']:.3g}", interval)
    console = Console(file=sys.stdout, width=max(100, Console().width))
    with console.capture() as capture:
        console.print(table)
    return title + "\n" + capture.get()


def main(argv: Sequence[str] | None = None) -> int:
    """The ``rlchain-eval`` command: evaluate, print the table and where ``eval.json`` went; 1 on bad input."""
    from rlchain.commands.saved_run import SavedRunError

    args = command_parser("rlchain-eval", __doc__, EvalConfig).parse_intermixed_args(argv)
    try:
        record = run_eval(args.source, args.overrides, args.allow_target)
    except SavedRunError as err:
        print(f"rlchain-eval: {err}", file=sys.stderr, flush=True)
        return 1
    print(_table(record), end="", flush=True)
    print(
        f"rlchain-eval: wrote {record['eval_json']}" + (f" and {record['video']}" if record["video"] else ""),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
