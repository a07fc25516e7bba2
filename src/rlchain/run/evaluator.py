"""A run's evaluations during training: the evaluation env, each evaluation's row and video, the best success rate,
the names an objective may take, and the final score of ``best.pt`` on fresh start states.

:class:`Evaluator` takes plain values (an env or a factory, episode counts,
seeds, a directory for videos); the episodes themselves run in
:func:`rlchain.core.evaluation.evaluate`. :func:`evaluate_checkpoint` loads a
checkpoint's policy and evaluates it: the final score of ``best.pt``, and
``rlchain-eval``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlchain.console import error_line, notice
from rlchain.core.envs.base import VecEnv
from rlchain.core.evaluation import Evaluation, check_renders, evaluate, fresh_seed
from rlchain.core.policies import Policy
from rlchain.run.checkpoint import check_state_matches, load_checkpoint
from rlchain.run.objective import Best
from rlchain.run.video import write_mp4
from rlchain.settings import SettingError

__all__ = ["Evaluator", "evaluate_checkpoint"]

#: The ``eval/`` metrics every evaluation logs (besides ``success_rate`` and the task's own metrics).
EVAL_METRICS = ("avg_reward", "avg_length", "episodes", "global_step")


class Evaluator:
    """Deterministic evaluations of a policy during training, and the best success rate they reached.

    Args:
        env: the evaluation env, a factory called as
            ``env(num_envs=num_envs, seed=seed)`` (e.g. a Hydra ``_partial_``
            of the env config; with ``video_episodes``, also with
            ``render_mode="rgb_array"``), or None for a run without evaluation.
        num_envs: envs of an env the factory builds.
        num_episodes: episodes per evaluation (rounded up to a multiple of the env's ``num_envs``).
        seed: the seed of the factory's env and of each evaluation's resets.
        video_episodes: episodes recorded into ``videos/step_<global_step>.mp4`` at each evaluation (0: none).
        video_dir: where the videos go.

    Raises:
        SettingError: ``video`` with an env whose settings take no ``render_mode``, or one that does not render.
    """

    def __init__(
        self,
        env: VecEnv | Callable[..., VecEnv] | None,
        num_envs: int,
        num_episodes: int,
        seed: int,
        video_episodes: int = 0,
        video_dir: str | Path = "videos",
    ) -> None:
        if callable(env) and not isinstance(env, VecEnv):
            env = _build(env, num_envs, seed, video_episodes > 0)
        if video_episodes and env is not None:
            check_renders(env)
        self.env = env
        self.num_episodes, self.seed, self.video_episodes = num_episodes, seed, video_episodes
        self.video_dir = Path(video_dir)
        self.last: dict[str, float] = {}
        """The row of the latest evaluation (``eval/*``); restored with a resumed run."""
        self.best_success = Best("maximize")
        """The best ``eval/success_rate`` so far and its ``global_step``."""

    def evaluate(self, policy: Any, global_step: int, writer: Any = None) -> dict[str, float]:
        """Evaluate ``policy`` at ``global_step``: its row (``eval/*`` and ``time/eval_s``).

        With ``video_episodes``, the video is written to ``video_dir`` and
        logged through ``writer`` (a :class:`~rlchain.run.writer.MetricWriter`).
        """
        began = time.perf_counter()
        result = evaluate(self.env, policy, self.num_episodes, seed=self.seed, video_episodes=self.video_episodes)
        return self.record(result, global_step, time.perf_counter() - began, writer)

    def record(self, result: Evaluation, global_step: int, seconds: float, writer: Any = None) -> dict[str, float]:
        """Take ``result`` as the evaluation at ``global_step`` (run by :meth:`evaluate`, or for a population's
        member by its population, which evaluates every member at once, :mod:`rlchain.run.population`), that took
        ``seconds``: its row (``eval/*`` and ``time/eval_s``), the best success rate, the video."""
        stats = result.means()
        self.last = {f"eval/{k}": v for k, v in stats.items()}
        self.last["eval/global_step"] = global_step
        self.best_success.offer(stats.get("success_rate"), global_step)
        if result.frames is not None:
            path = write_mp4(self.video_dir / f"step_{global_step:012d}.mp4", result.frames, result.fps)
            if writer is not None:
                writer.log_video("eval/video", path, result.frames, result.fps, global_step)
        return {**self.last, "time/eval_s": seconds}

    def metric_names(self, train_row: dict[str, float]) -> set[str]:
        """The ``eval/`` names an evaluation logs, known before any ran: :data:`EVAL_METRICS`, ``success_rate``
        for an env that reports success, and each task metric of ``train_row`` (``metrics/<name>``); none without
        an evaluation env."""
        if self.env is None:
            return set()
        names = {f"eval/{k}" for k in EVAL_METRICS}
        names |= {f"eval/{k.removeprefix('metrics/')}" for k in train_row if k.startswith("metrics/")}
        if self.env.reports_success:
            names.add("eval/success_rate")
        return names

    def fresh_score(self, policy: Any, checkpoint: Path, run_seed: int) -> dict[str, Any] | None:
        """Evaluate ``checkpoint`` (``best.pt``) on fresh start states: what ``summary.json`` records as
        ``best_fresh``.

        The same path as ``rlchain-eval`` (:func:`evaluate_checkpoint`),
        on the evaluation env, with ``num_episodes`` deterministic episodes
        from :func:`~rlchain.core.evaluation.fresh_seed` of ``run_seed``, and a
        copy of ``policy`` (which is left as it is). When it fails, the run
        stays complete: the score is ``{"error": <one line>}`` and a notice
        says so.

        Returns:
            ``{"checkpoint", "global_step", "seed", "episodes", "deterministic",
            "metrics": {name: {"mean", "std", "ci95_low", "ci95_high", "n"}}}``,
            or None without an evaluation env or checkpoint.
        """
        if self.env is None or not checkpoint.is_file():
            return None
        try:
            result, state = evaluate_checkpoint(
                self.env, copy.deepcopy(policy), checkpoint, self.num_episodes, seed=fresh_seed(run_seed)
            )
        except Exception as err:  # noqa: BLE001 - training is done and saved; the score alone is lost, and said so
            notice(f"the fresh evaluation of best.pt failed (the run is complete): {error_line(err)}")
            return {"error": error_line(err)}
        return {"checkpoint": str(checkpoint), "global_step": state["global_step"], **result.to_json()}


def _build(factory: Callable[..., VecEnv], num_envs: int, seed: int, video: bool) -> VecEnv:
    """The evaluation env from ``factory``: ``num_envs`` envs seeded ``seed``, rendering for ``video``.

    Raises:
        SettingError: ``video`` with an env whose settings have no ``render_mode``.
    """
    if not video:
        return factory(num_envs=num_envs, seed=seed)
    try:
        return factory(num_envs=num_envs, seed=seed, render_mode="rgb_array")
    except TypeError as err:
        if "render_mode" not in str(err):
            raise
        raise SettingError(
            "video", True, f" needs an env that renders: its settings have no render_mode ({err})"
        ) from None


def evaluate_checkpoint(
    env: VecEnv,
    policy: Policy,
    path: str | Path,
    num_episodes: int,
    seed: int,
    deterministic: bool = True,
    video_episodes: int = 0,
    name: str = "checkpoint",
) -> tuple[Evaluation, dict[str, Any]]:
    """Load the policy of the checkpoint at ``path`` into ``policy`` and :func:`evaluate` it on ``env``.

    What ``rlchain-eval`` runs, and the trainer's final score of ``best.pt``
    (:meth:`Evaluator.fresh_score`). The checkpoint is read as
    data (``weights_only=True``).

    Returns:
        ``(evaluation, the checkpoint's whole state)``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        SettingError: ``<name>=<path>``: not an rlchain checkpoint, or its
            policy's parameter names or shapes differ from ``policy``'s.
        RuntimeError, ValueError: see :func:`evaluate`.
    """
    state = load_checkpoint(path, map_location=env.device, name=name)
    check_state_matches(policy, state["policy"], name, path)
    policy.load_state_dict(state["policy"])
    return evaluate(env, policy, num_episodes, seed, deterministic=deterministic, video_episodes=video_episodes), state
