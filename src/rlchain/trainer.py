"""The training loop: collect, update, log, evaluate, checkpoint.

``global_step`` counts env transitions (``rollout_steps * num_envs`` per
iteration); ``eval_freq`` and ``save_freq`` count iterations. A run directory
(``output_dir``) receives:

* ``tensorboard/`` and ``metrics.jsonl`` (one JSON row per logged step);
* ``checkpoints/latest.pt`` (every ``save_freq`` iterations and at the end) and
  ``checkpoints/best.pt`` (the evaluation with the best ``objective``, by
  ``objective_direction``; ties go to the earlier);
* ``summary.json`` at the end, also returned by :meth:`Trainer.train`: status
  (completed, interrupted or failed, with the error), steps, wall time,
  ``start_time``/``end_time`` (Unix seconds), final and best metrics, the
  checkpoints, and where the run ran (:func:`run_placement`).

Checkpoints hold the policy, the algorithm (optimiser, schedule, reference
policy), the collector and env state, ``global_step``, ``iteration``, the
torch RNG states and the run's config. An env that can save its state
(``state_dict``/``load_state_dict``, as every torch-native task has) resumes
exactly where the saved run stopped (bit-identical on the CPU). An env that
cannot (``env=gym``: gymnasium envs have no such API) restarts instead: every
env is reset, the episodes in progress at the checkpoint are dropped from the
statistics, and a one-line notice says so; policy, optimiser and step count
continue as saved.
"""

from __future__ import annotations

import difflib
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from rlchain.algorithms.base import Algorithm, NonFiniteError, first_non_finite
from rlchain.checkpoint import atomic_write_json, check_state_matches, load_checkpoint, save_checkpoint
from rlchain.collector import EpisodeWindow, SyncCollector
from rlchain.envs.base import VecEnv
from rlchain.evaluation import evaluate
from rlchain.policies import Policy
from rlchain.progress import Progress
from rlchain.run_dir import existing_run
from rlchain.settings import Settings, setting
from rlchain.utils import LAUNCHER_SLOT_ENV, MAX_SEED
from rlchain.writer import MetricWriter

__all__ = ["OBJECTIVE_DIRECTIONS", "STOP_SIGNALS", "ObjectiveError", "WANDB_MODES", "Trainer", "TrainerConfig",
           "requeue_signal", "run_placement"]

OBJECTIVE_DIRECTIONS = ("maximize", "minimize")
WANDB_MODES = (None, "online", "offline", "disabled")
#: Signals that stop a run after its current iteration (a second one aborts it):
#: Ctrl-C, and what scancel, Kubernetes and most preemptions send.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def requeue_signal() -> signal.Signals | None:
    """The signal by which submitit announces a time limit or a preemption, inside a submitit job; else None.

    A job of Hydra's submitit launcher (``hydra/launcher=slurm``) gets it
    ``signal_delay_s`` before its time limit or when preempted: SIGUSR2, or
    ``SIG$SUBMITIT_PREEMPT_SIGNAL``. submitit's own handler requeues the job and
    exits the process at once, wherever the run is; :meth:`Trainer.train` holds
    it back like SIGTERM (the iteration ends, ``latest.pt`` and ``summary.json``
    are written) and :func:`rlchain.train.main` then hands it to that handler.
    """
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


class ObjectiveError(ValueError):
    """``trainer.objective`` names a metric the run never logs (found after its first iteration)."""


class _Abort(BaseException):
    """Raised by a second stop signal: leave the iteration at once (the last checkpoint stands)."""


@dataclass
class TrainerConfig(Settings):
    """Trainer settings, their defaults and ranges."""

    _target_: str = "rlchain.trainer.Trainer"
    iterations: int = setting(100, gt=0)
    """Collect-and-update iterations."""
    rollout_steps: int = setting(100, gt=0)
    """Steps per env per rollout (GRPO, which resets every env each rollout: at least the env's max_episode_steps)."""
    eval_freq: int = setting(10, gt=0)
    """Evaluate every this many iterations (and after the last one)."""
    save_freq: int = setting(50, gt=0)
    """Write checkpoints/latest.pt every this many iterations (and at the end)."""
    num_eval_envs: int = setting(256, gt=0)
    """Parallel envs of the evaluation env."""
    num_eval_episodes: int = setting(256, gt=0)
    """Episodes per evaluation (rounded up to a multiple of num_eval_envs)."""
    output_dir: str = "."
    """Run directory for logs, checkpoints and summary.json."""
    seed: int = setting(0, ge=0, le=MAX_SEED)
    """Seeds torch's global RNG (action sampling) and, plus 1, the eval env."""
    exp_name: str = "rlchain"
    """Experiment name: the W&B run name."""
    objective: str = "auto"
    """Key of summary['final'] returned as the run objective for sweepers; best.pt is the evaluation that is best
    by it. 'auto': eval/success_rate for a task that reports success, else eval/avg_reward."""
    objective_direction: str = setting("maximize", choices=OBJECTIVE_DIRECTIONS)
    """'maximize' or 'minimize': which way the objective is better (best.pt, sweep tables)."""
    resume_from: str | None = None
    """Checkpoint to continue from (its step count continues); 'auto': this run directory's own
    checkpoints/latest.pt when there is one (a requeued or restarted job), else a fresh start."""
    init_from: str | None = None
    """Start the policy (weights and observation normaliser) from an rlchain checkpoint, or from a run
    directory's checkpoints/latest.pt, with a fresh optimiser and step count: fine-tuning, e.g. GRPO with
    kl_coef > 0 against the loaded policy. A resumed run continues from its own checkpoint instead."""
    use_wandb: bool = False
    """Mirror every logged row to Weights & Biases (needs the extra: pip install "rlchain[wandb]")."""
    wandb_project: str = "rlchain"
    """W&B project."""
    wandb_entity: str | None = None
    """W&B entity (team or user); None for the default."""
    wandb_mode: str | None = setting(None, choices=WANDB_MODES)
    """W&B mode: online, offline or disabled; None follows WANDB_MODE."""
    stats_min_episodes: int = setting(100, gt=0)
    """charts/episodic_return, charts/episodic_length and charts/success_rate average every episode that ended in
    the latest rollout and, when fewer ended, the latest episodes before it, up to this many."""
    progress: bool = True
    """Show a progress bar on a terminal, plain lines otherwise; off inside the
    devices launcher's parallel jobs, which print a line as each job starts and ends."""



def run_placement(device: torch.device | str) -> dict[str, Any]:
    """Where a run ran, for ``summary.json``: its torch device, host and visible GPUs.

    Returns ``{"device": "cuda:0" | "cpu", "hostname": str,
    "cuda_visible_devices": str | None, "slurm_job_id": str | None}``; the
    last two read the environment variables of those names (None when unset).
    """
    return {
        "device": str(device),
        "hostname": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


class Trainer:
    """Runs the loop of DESIGN.md: collect, update, log, evaluate, checkpoint.

    Args:
        env: training env (a :class:`rlchain.envs.base.VecEnv`).
        policy: the policy, on ``env.device``.
        algorithm: an :class:`rlchain.algorithms.Algorithm` of ``policy``.
        eval_env: the evaluation env, or a factory called as
            ``eval_env(num_envs=num_eval_envs, seed=seed + 1)`` (e.g. a Hydra
            ``_partial_`` of the env config), or None for no evaluation.
        run_config: the run's composed configuration (plain dict), stored in
            checkpoints and logged as hyperparameters.
        settings: fields of :class:`TrainerConfig` (``self.cfg``).

    Raises:
        ValueError: a setting out of its range (naming it), an env the algorithm rejects (e.g.
            GRPO's ``group_size`` not dividing ``num_envs``), a
            ``rollout_steps`` below the env's ``max_episode_steps`` for an
            algorithm that resets every env each rollout (GRPO), an ``output_dir``
            that holds another run while not resuming, a ``resume_from`` that
            is not an rlchain checkpoint or whose policy does not match this
            one (naming the parameters and shapes), an ``init_from`` likewise
            (see :meth:`init_policy`), ``use_wandb`` without the wandb
            package installed; all before any step.
        FileNotFoundError: ``resume_from`` does not exist.
    """

    def __init__(
        self,
        env: VecEnv,
        policy: Policy,
        algorithm: Algorithm,
        eval_env: VecEnv | Callable[..., VecEnv] | None = None,
        run_config: dict[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        self.cfg = cfg = TrainerConfig(**settings)
        if cfg.use_wandb:
            try:
                import wandb  # noqa: F401  (an optional extra; the writer uses it)
            except ImportError:
                raise ValueError('use_wandb=True needs wandb, an optional extra: pip install "rlchain[wandb]"') from None
        algorithm.check_env(env)
        if algorithm.reset_options is not None and cfg.rollout_steps < env.max_episode_steps:
            raise ValueError(
                f"rollout_steps={cfg.rollout_steps} is shorter than the env's time limit (max_episode_steps="
                f"{env.max_episode_steps}): {type(algorithm).__name__} resets every env when a rollout starts, so an "
                f"episode longer than the rollout would never end (no whole-episode return, no success); "
                f"expected rollout_steps >= {env.max_episode_steps}"
            )
        self.env, self.policy, self.algorithm = env, policy, algorithm
        self.objective = cfg.objective  # 'auto' is resolved once an evaluation shows which metric exists
        self.config = run_config or {}
        if callable(eval_env) and not isinstance(eval_env, VecEnv):
            eval_env = eval_env(num_envs=cfg.num_eval_envs, seed=cfg.seed + 1)
        self.eval_env = eval_env
        self.output_dir = Path(cfg.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"

        torch.manual_seed(cfg.seed)
        self.collector = SyncCollector(env, policy, cfg.rollout_steps, reset_options=algorithm.reset_options)
        self.episodes = EpisodeWindow(cfg.stats_min_episodes)
        self.global_step = 0
        self.iteration = 0
        self.best_success: float | None = None
        self.best_step: int | None = None
        self.best_objective: float | None = None
        self.best_objective_step: int | None = None
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self._stop_signal: str | None = None
        self._objective_checked = False
        self.summary: dict[str, Any] = {}
        for stale in self.checkpoint_dir.glob(".*.tmp"):  # a save cut short by kill -9
            stale.unlink(missing_ok=True)
        resume_from = cfg.resume_from
        marker = existing_run(self.output_dir) if resume_from is None else None
        if marker is not None:
            raise ValueError(
                f"output_dir={str(self.output_dir)!r} already holds a run ({marker}): "
                "a fresh run never writes into another's directory; resume it (resume_from='auto') or choose another"
            )
        if resume_from == "auto":
            own = self.checkpoint_dir / "latest.pt"
            resume_from = str(own) if own.is_file() else None
        if resume_from is not None:
            exact = self.load(resume_from)
            restart = "" if exact else (
                f"; {type(self.env).__name__} cannot restore its state: every env reset "
                "(episodes in progress at the checkpoint are dropped)"
            )  # fmt: skip
            print(f"rlchain: resumed from {resume_from} at iteration {self.iteration} "
                  f"(global_step {self.global_step:,}){restart}", file=sys.stderr, flush=True)  # fmt: skip
        self.init_from: str | None = None
        if cfg.init_from is not None and resume_from is None:
            self.init_from = str(self.init_policy(cfg.init_from))

    def init_policy(self, source: str | Path) -> Path:
        """Load the policy (weights and observation normaliser) of a checkpoint into this run's policy.

        ``source`` is a checkpoint written by :meth:`save`, or a run directory
        (its ``checkpoints/latest.pt``). Only the policy is taken: optimiser,
        step count and collector start fresh, and the algorithm re-takes its
        reference policy from the loaded one (GRPO's KL anchor,
        :meth:`~rlchain.algorithms.Algorithm.reset_reference`).

        Returns:
            the checkpoint file that was loaded.

        Raises:
            ValueError: ``init_from=...``: the path does not exist, is a
                directory without ``checkpoints/latest.pt``, is not an rlchain
                checkpoint, or holds a policy whose parameter names or shapes
                differ from this run's (naming them).
        """
        path = Path(source)
        if path.is_dir():
            path = path / "checkpoints" / "latest.pt"
            if not path.is_file():
                raise ValueError(f"init_from={str(source)!r} is a directory without checkpoints/latest.pt: "
                                 "expected an rlchain run directory or a checkpoint file")  # fmt: skip
        elif not path.exists():
            raise ValueError(f"init_from={str(source)!r} does not exist: expected an rlchain checkpoint file or run directory")
        state = self._load_policy(path, "init_from")
        self.algorithm.reset_reference()
        print(f"rlchain: policy initialised from {path} (trained for {state['global_step']:,} env steps there)",
              file=sys.stderr, flush=True)  # fmt: skip
        return path

    # -------------------------------------------------------- checkpoints
    def _load_policy(self, path: str | Path, field: str) -> dict[str, Any]:
        """Read the checkpoint at ``path``, load its policy into this run's and return the whole state.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            ValueError: ``<field>=...``: not an rlchain checkpoint, or a policy
                whose names or shapes differ from this run's (naming them).
        """
        try:
            state = load_checkpoint(path, map_location=self.env.device)
        except ValueError as err:
            raise ValueError(f"{field}={err}") from None
        check_state_matches(self.policy, state["policy"], f"{field}={str(path)!r}")
        self.policy.load_state_dict(state["policy"])
        return state

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (see the module docstring)."""
        state = {
            "policy": self.policy.state_dict(),
            "algorithm": self.algorithm.state_dict(),
            "collector": self.collector.state_dict(),
            "episodes": self.episodes.state_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "best_success": self.best_success,
            "best_step": self.best_step,
            "best_objective": self.best_objective,
            "best_objective_step": self.best_objective_step,
            "last_train": self.last_train,
            "last_eval": self.last_eval,
            "torch_rng": torch.get_rng_state(),
            "config": self.config,
        }
        if hasattr(self.env, "state_dict"):
            state["env"] = self.env.state_dict()
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        return state

    def save(self, name: str = "latest.pt") -> Path:
        """Write the state atomically to ``checkpoints/<name>`` and return the path.

        Raises:
            NonFiniteError: a policy parameter or buffer (e.g. the observation
                normaliser's statistics) is NaN or infinite; nothing is written.
            OSError: the file cannot be written (the previous one stays).
        """
        state = self.state_dict()
        bad = first_non_finite(state["policy"])
        if bad is not None:
            raise NonFiniteError(f"policy {bad[0]}", bad[1], self.iteration)
        return save_checkpoint(self.checkpoint_dir / name, state)

    def load(self, path: str | Path) -> bool:
        """Restore a checkpoint written by :meth:`save`; training continues its step count.

        With an env that cannot restore its state (no ``load_state_dict``, or a
        checkpoint without env state) the collector starts afresh instead of
        acting on the saved observation: every env is reset before the next
        rollout and no episode is carried over (see the module docstring).

        Returns:
            True when the env state was restored too (an exact resume).
        """
        state = self._load_policy(path, "resume_from")
        self.algorithm.load_state_dict(state["algorithm"])
        self.collector.load_state_dict(state["collector"])
        self.episodes.load_state_dict(state["episodes"])
        exact = "env" in state and hasattr(self.env, "load_state_dict")
        if exact:
            self.env.load_state_dict(state["env"])
        else:
            self.collector.restart()
        self.global_step, self.iteration = state["global_step"], state["iteration"]
        self.best_success, self.best_step = state["best_success"], state["best_step"]
        self.best_objective = state.get("best_objective")
        self.best_objective_step = state.get("best_objective_step")
        self.last_train, self.last_eval = state.get("last_train", {}), state.get("last_eval", {})
        self._resolve_auto_objective()
        torch.set_rng_state(state["torch_rng"].cpu())
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])
        return exact

    # --------------------------------------------------------------- loop
    def _on_stop_signal(self, signum: int, frame: Any) -> None:  # pragma: no cover - exercised via subprocess
        name = signal.Signals(signum).name
        if self._stop_signal is not None:
            raise _Abort(name)
        self._stop_signal = name
        print(f"\nrlchain: {name}: stopping after this iteration (checkpoint and logs are kept); "
              "send it again to abort at once", file=sys.stderr, flush=True)  # fmt: skip

    def train(self) -> dict[str, Any]:
        """Run the remaining iterations and return the summary written to ``summary.json``.

        SIGINT (Ctrl-C) and SIGTERM (``scancel``, Kubernetes, most
        preemptions) stop the run after the current iteration: ``latest.pt`` is
        saved, the logs are flushed, and the summary says ``status="interrupted"``
        and which ``signal``. A second one aborts at once (``status="aborted"``;
        the last checkpoint stands). Inside a submitit job its time-limit and
        preemption signal (:func:`requeue_signal`) does the same. Signals are
        caught only when ``train`` runs in the main thread.

        Raises:
            RuntimeError: a non-finite loss, gradient norm, KL, other reported
                term or parameter, naming it, the iteration and the last good
                checkpoint (kept; no non-finite checkpoint is written).
            Exception: any other error of an iteration (e.g. CUDA out of
                memory, an env error, a full disk) as raised.
            In both cases ``summary.json`` first records ``status="failed"``,
            the one-line ``error`` and the ``traceback``, and the logs are flushed.
        """
        cfg = self.cfg
        wandb = dict(use_wandb=cfg.use_wandb, wandb_project=cfg.wandb_project, wandb_entity=cfg.wandb_entity,
                     wandb_mode=cfg.wandb_mode)  # fmt: skip
        writer = MetricWriter(self.output_dir, config=self.config, run_name=cfg.exp_name,
                              purge_step=self.global_step if self.global_step else None, **wandb)  # fmt: skip
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            requeue = requeue_signal()
            stop_signals = STOP_SIGNALS if requeue is None else (*STOP_SIGNALS, requeue)
            handlers = {s: signal.signal(s, self._on_stop_signal) for s in stop_signals}
        start = self._start = time.perf_counter()
        start_time = time.time()
        start_step = self.global_step
        status, error, failure, trace = "completed", None, None, None
        in_sweep_slot = LAUNCHER_SLOT_ENV in os.environ
        bar = Progress(cfg.iterations, self.iteration, enabled=cfg.progress and not in_sweep_slot)
        try:
            try:
                if self.iteration >= cfg.iterations:
                    print(f"rlchain: the run has already reached trainer.iterations={cfg.iterations}: nothing to train",
                          file=sys.stderr, flush=True)  # fmt: skip
                while self.iteration < cfg.iterations:
                    self._iterate(writer, bar)
                    if self._stop_signal is not None:
                        status = "interrupted"
                        break
                self.save()
            except NonFiniteError as err:
                status, trace = "failed", traceback.format_exc()
                last_good = self.checkpoint_dir / "latest.pt"
                error = (
                    f"non-finite {err.metric} at iteration {self.iteration + 1} ({err.value}); "
                    f"last good checkpoint: {last_good if last_good.exists() else 'none written yet'}"
                )
                failure = RuntimeError(error)
                failure.__cause__ = err
            except Exception as err:  # e.g. CUDA out of memory: record it, keep the logs, re-raise
                status, failure, trace = "failed", err, traceback.format_exc()
                error = str(err) if isinstance(err, ObjectiveError) else f"{type(err).__name__}: {err}"
        except _Abort:
            status = "aborted"
        finally:
            bar.close()
        for s in handlers:  # the summary and the logs are written whatever arrives now
            signal.signal(s, signal.SIG_IGN)
        try:
            elapsed = time.perf_counter() - start
            summary = self._summary(status, error, elapsed, self.global_step - start_step)
            summary.update(start_time=start_time, end_time=time.time())
            if trace is not None:
                summary["traceback"] = trace
            self.summary = summary
            try:
                atomic_write_json(self.output_dir / "summary.json", summary)
            finally:
                writer.close()
        finally:
            for s, handler in handlers.items():
                signal.signal(s, handler)
        if failure is not None:
            raise failure
        return summary

    def _iterate(self, writer: MetricWriter, bar: Progress) -> None:
        cfg = self.cfg
        t0 = time.perf_counter()
        rollout = self.collector.collect()
        t1 = time.perf_counter()
        train_stats = self.algorithm.update(rollout)
        t2 = time.perf_counter()
        self.iteration += 1
        steps = rollout.numel()
        self.global_step += steps
        self.episodes.add(self.collector.finished)

        # CleanRL's names: what the update reports under losses/, the rate and the episodes under charts/.
        row = {("charts/" if k == "learning_rate" else "losses/") + k: v for k, v in train_stats.items()}
        row.update(self.episodes.means(success=getattr(self.env, "reports_success", True)))
        row.update(self.collector.last_stats)
        row["charts/SPS"] = steps / (t2 - t0)
        row["charts/iteration"] = self.iteration
        row["time/collect_s"] = t1 - t0
        row["time/update_s"] = t2 - t1
        row["time/elapsed_s"] = t2 - self._start
        self.last_train = row

        last = self.iteration == cfg.iterations
        if self.eval_env is not None and (self.iteration % cfg.eval_freq == 0 or last):
            t3 = time.perf_counter()
            eval_stats = evaluate(self.eval_env, self.policy, cfg.num_eval_episodes, seed=cfg.seed + 1)
            self.last_eval = {f"eval/{k}": v for k, v in eval_stats.items()}
            self.last_eval["eval/global_step"] = self.global_step
            row.update(self.last_eval)
            row["time/eval_s"] = time.perf_counter() - t3
            success = eval_stats.get("success_rate")
            if success is not None and (self.best_success is None or success > self.best_success):
                self.best_success, self.best_step = success, self.global_step
            self._resolve_auto_objective()
            value = row.get(self.objective)
            if value is not None and math.isfinite(value) and self._improves(value):
                self.best_objective, self.best_objective_step = value, self.global_step
                self.save("best.pt")
        writer.log(row, self.global_step)
        if not self._objective_checked:
            self._check_objective(row)
        if self.iteration % cfg.save_freq == 0 and not last:
            self.save()
            writer.flush()
        bar.update(self.iteration, self.global_step, row)

    def _resolve_auto_objective(self) -> None:
        """``objective='auto'`` becomes eval/success_rate or eval/avg_reward once an evaluation shows which exists."""
        if self.objective == "auto" and self.last_eval:
            self.objective = "eval/success_rate" if "eval/success_rate" in self.last_eval else "eval/avg_reward"

    def _check_objective(self, row: dict[str, float]) -> None:
        """Raise :class:`ObjectiveError` unless the objective is a key this run logs.

        Runs after the first iteration: the names exist only once the env and
        the algorithm have produced them. A run without an evaluation env has
        no ``eval/`` metrics; its ``eval/`` objective stays None. The evaluation's names are known
        before any evaluation ran: ``eval/`` plus ``avg_reward``, ``avg_length``,
        ``episodes``, ``global_step``, ``success_rate`` (for an env that
        reports success) and every task metric.
        """
        self._objective_checked = True
        if self.objective == "auto" or (self.eval_env is None and self.objective.startswith("eval/")):
            return  # no evaluation, no objective: a run from Python that does not evaluate
        names = set(row)
        if self.eval_env is not None:
            names |= {f"eval/{k}" for k in ("avg_reward", "avg_length", "episodes", "global_step")}
            names |= {f"eval/{k.removeprefix('metrics/')}" for k in row if k.startswith("metrics/")}
            if getattr(self.eval_env, "reports_success", True) or getattr(self.env, "reports_success", True):
                names.add("eval/success_rate")
        if self.objective not in names:
            close = difflib.get_close_matches(self.objective, sorted(names), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ObjectiveError(
                f"trainer.objective={self.objective!r} is not a metric this run logs{hint}: "
                f"expected one of {', '.join(sorted(names))}"
            )

    def _improves(self, value: float) -> bool:
        """Whether ``value`` of the objective beats the best so far (strictly: ties keep the earlier)."""
        if self.best_objective is None:
            return True
        return value > self.best_objective if self.cfg.objective_direction == "maximize" else value < self.best_objective

    def _summary(self, status: str, error: str | None, elapsed: float, steps: int) -> dict[str, Any]:
        final = {**self.last_train, **self.last_eval}
        objective = final.get(self.objective)
        checkpoints = {p.stem: str(p) for p in sorted(self.checkpoint_dir.glob("*.pt"))}
        return {
            "status": status,
            "error": error,
            "signal": self._stop_signal,
            "exp_name": self.cfg.exp_name,
            **run_placement(self.env.device),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "elapsed_s": elapsed,
            "SPS": steps / elapsed if elapsed > 0 else 0.0,
            "init_from": self.init_from,
            "objective_name": self.objective,
            "objective_direction": self.cfg.objective_direction,
            "objective": objective,
            "best_objective": self.best_objective,
            "best_objective_step": self.best_objective_step,
            "best_eval_success_rate": self.best_success,
            "best_eval_step": self.best_step,
            "final": final,
            "checkpoints": checkpoints,
        }
