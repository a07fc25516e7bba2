"""The training loop: collect -> update -> log -> evaluate -> save.

``global_step`` counts env transitions (``rollout_steps * num_envs`` per
iteration); ``eval_freq`` and ``save_freq`` count iterations. A run directory
(``output_dir``) receives:

* ``tensorboard/`` and ``metrics.jsonl`` (one JSON row per iteration);
* ``checkpoints/latest.pt`` and ``checkpoints/best.pt`` (:class:`~rlchain.checkpoint.Checkpoints`);
* ``videos/step_<global_step>.mp4`` with ``video=True``: the first
  ``video_episodes`` episodes of each evaluation;
* ``summary.json`` (:class:`~rlchain.summary.RunSummary`) at the end, also
  returned by :meth:`Trainer.train`, whatever ended the run. A completed run
  first evaluates ``best.pt`` once more on start states that no evaluation
  during training used (``fresh_eval``; the summary's ``best_fresh``).

In a multi-process run (``torchrun``; :mod:`rlchain.distributed`) every rank
runs this loop on its own envs with the same policy; rank 0 alone evaluates,
logs and writes the run directory, and every rank's envs go into its
checkpoints.

What surrounds the loop is a component each: :class:`~rlchain.stopping.StopSignals`
(Ctrl-C, SIGTERM, a cluster's requeue signal), :class:`~rlchain.objective.Objective`
(the objective and the best evaluation), :class:`~rlchain.checkpoint.Checkpoints`
and :class:`~rlchain.summary.RunSummary`.

Checkpoints hold the policy, the algorithm (optimiser, schedule, reference
policy), the collector and env state, ``global_step``, ``iteration``, the
best values, the torch RNG states and the run's config. An env that restores
its episodes (:attr:`~rlchain.envs.base.VecEnv.resumes_episodes`, as every
torch-native task does) resumes exactly where the saved run stopped
(bit-identical on the CPU). Another (``env=gym``: gymnasium envs cannot save
their state) restarts instead: every env is reset, the episodes in progress at
the checkpoint are dropped from the statistics, and a one-line notice says so;
policy, optimiser, step count and the env's own saved state (``env=gym``: the
generator of its reset seeds) continue as saved.
"""

from __future__ import annotations

import copy
import importlib.util
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from rlchain.algorithms.base import Algorithm, NonFiniteError, first_non_finite
from rlchain.checkpoint import Checkpoints, check_state_matches, load_checkpoint
from rlchain.collector import Episodes, EpisodeWindow, SyncCollector
from rlchain.console import Progress, notice
from rlchain.distributed import CollectiveError, World, world
from rlchain.envs.base import VecEnv
from rlchain.evaluation import check_renders, evaluate, evaluate_checkpoint, fresh_seed
from rlchain.objective import OBJECTIVE_DIRECTIONS, Best, Objective, ObjectiveError
from rlchain.policies import Policy
from rlchain.run_dir import taken
from rlchain.settings import SettingError, Settings, setting
from rlchain.stopping import Abort, StopSignals, in_submitit_job
from rlchain.summary import RunSummary, error_line, placement
from rlchain.utils import MAX_SEED
from rlchain.video import check_video_support, write_mp4
from rlchain.writer import MetricWriter

__all__ = ["WANDB_MODES", "Trainer", "TrainerConfig"]

WANDB_MODES = (None, "online", "offline", "disabled")


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
    """Write checkpoints/latest.pt every this many iterations (and at the end, and with every new best.pt)."""
    num_eval_envs: int = setting(256, gt=0)
    """Parallel envs of the evaluation env."""
    num_eval_episodes: int = setting(256, gt=0)
    """Episodes per evaluation (rounded up to a multiple of num_eval_envs)."""
    video: bool = False
    """Record the first video_episodes episodes of every evaluation as videos/step_<global_step>.mp4, also logged to
    TensorBoard (Images tab) and W&B; needs an env that renders and the extra: pip install "rlchain[video]"."""
    video_episodes: int = setting(2, gt=0)
    """Episodes per video (the first episode of each of the first video_episodes evaluation envs, one after another)."""
    fresh_eval: bool = True
    """When the run completes, evaluate best.pt once more (num_eval_episodes episodes) on start states that no
    evaluation during training used (rlchain.evaluation.fresh_seed), and record it as summary.json's best_fresh."""
    output_dir: str = "."
    """Run directory for logs, checkpoints and summary.json."""
    seed: int = setting(0, ge=0, le=MAX_SEED)
    """The evaluation env's seed is seed + 1 (rlchain-train seeds torch's global RNG with the run's seed)."""
    exp_name: str = "rlchain"
    """Experiment name: the W&B run name."""
    objective: str = "auto"
    """Key of summary['final'] returned as the run objective for sweepers; best.pt is the evaluation that is best
    by it. 'auto': eval/success_rate for a task that reports success, else eval/avg_reward."""
    objective_direction: str = setting("maximize", choices=OBJECTIVE_DIRECTIONS)
    """'maximize' or 'minimize': which way the objective is better (best.pt, sweep tables)."""
    resume_from: str | None = None
    """The run to continue (its step count continues): a run directory (its checkpoints/latest.pt) or a checkpoint
    in one, which rlchain-train rebuilds from the run's saved config and continues in its directory; a checkpoint
    file elsewhere, into this run's directory; 'auto': this run directory's own checkpoints/latest.pt when there is
    one, else a fresh start. None is 'auto' in a job of submitit (hydra/launcher=slurm), so that a requeued job goes
    on from its own latest.pt."""
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
    wandb_name: str | None = None
    """W&B run name; None: exp_name, and <exp_name>_<job number> for a job of a sweep (rlchain-train -m)."""
    wandb_group: str | None = None
    """W&B group; None: none for a single run, and the sweep directory (<date>/<time>_<id>) for the jobs of a sweep,
    so that a sweep's runs are grouped."""
    wandb_tags: list[str] = setting([])
    """W&B tags of the run."""
    stats_min_episodes: int = setting(100, gt=0)
    """charts/episodic_return, charts/episodic_length and charts/success_rate average every episode that ended in
    the latest rollout and, when fewer ended, the latest episodes before it, up to this many."""
    dist_timeout_s: float = setting(600.0, gt=0)
    """A multi-process run (torchrun): seconds a collective waits for the other ranks before the run ends with a
    message naming the collective and the rank that did not join it. It must cover what rank 0 does alone while the
    others wait: an evaluation, a checkpoint."""
    compile: bool = False
    """Compile the update's minibatch loss (forward and backward) and the acting forward pass with torch.compile
    (mode default) before the first step; the time it takes is logged once as time/compile_s and left out of SPS.
    Needs a C++ compiler for the CPU backend (a run that cannot compile says so before any step)."""
    progress: bool = True
    """Show the progress of the iterations: a bar on a terminal, plain lines otherwise (nothing on a terminal
    that another process owns, as a parallel job of the devices launcher)."""

    def check(self) -> None:
        """``use_wandb`` needs the wandb package; ``video`` needs imageio and at most ``num_eval_envs`` episodes."""
        if self.use_wandb and importlib.util.find_spec("wandb") is None:
            raise SettingError("use_wandb", True, ' needs wandb, an optional extra: pip install "rlchain[wandb]"')
        if self.video:
            missing = check_video_support()
            if missing is not None:
                raise SettingError("video", True, missing)
            if self.video_episodes > self.num_eval_envs:
                raise SettingError("video_episodes", self.video_episodes,
                                   f" is not allowed with num_eval_envs={self.num_eval_envs}: expected at most "
                                   "num_eval_envs (each recorded episode is the first of one evaluation env)")  # fmt: skip


class Trainer:
    """Runs the loop of DESIGN.md: collect -> update -> log -> evaluate -> save.

    Args:
        env: training env (a :class:`rlchain.envs.base.VecEnv`).
        policy: the policy, on ``env.device``.
        algorithm: an :class:`rlchain.algorithms.Algorithm` of ``policy``.
        eval_env: the evaluation env, or a factory called as
            ``eval_env(num_envs=num_eval_envs, seed=seed + 1)`` (e.g. a Hydra
            ``_partial_`` of the env config), or None for no evaluation.
        run_config: the run's composed configuration (plain dict), stored in
            checkpoints and logged as hyperparameters.
        trial: the Optuna trial this run reports to (a
            :class:`rlchain.tuning.JobTrial`: ``number``, ``report(value, step)
            -> pruned``), or None. Rank 0 reports the objective at every
            evaluation (step: the iteration) and, once the study's pruner
            prunes the trial, stops after that iteration with status
            ``pruned`` (``latest.pt`` saved, no fresh evaluation).
        settings: fields of :class:`TrainerConfig` (``self.cfg``).

    Raises:
        SettingError: a setting out of its range (naming it), an env the
            algorithm rejects (e.g. GRPO's ``group_size`` not dividing
            ``num_envs``), a ``rollout_steps`` below the env's
            ``max_episode_steps`` for an algorithm that resets every env each
            rollout (GRPO), an ``output_dir`` that holds another run while not
            resuming, a ``resume_from`` or ``init_from`` that is not an
            rlchain checkpoint or whose policy does not match this one (naming
            the parameters and shapes), ``use_wandb``
            without the wandb package, ``video`` without an evaluation env
            that renders (or without imageio), a ``resume_from`` that does not
            exist; all before any step.
    """

    def __init__(
        self,
        env: VecEnv,
        policy: Policy,
        algorithm: Algorithm,
        eval_env: VecEnv | Callable[..., VecEnv] | None = None,
        run_config: dict[str, Any] | None = None,
        trial: Any = None,
        **settings: Any,
    ) -> None:
        self.cfg = cfg = TrainerConfig(**settings)
        self.env, self.policy, self.algorithm = env, policy, algorithm
        self.config = run_config or {}
        self.world: World = world()
        algorithm.check_env(env)
        self.collector = SyncCollector(env, policy, cfg.rollout_steps, reset_options=algorithm.reset_options)
        if not self.world.main:  # rank 0 alone evaluates
            eval_env = None
        if callable(eval_env) and not isinstance(eval_env, VecEnv):
            eval_env = _build_eval_env(eval_env, cfg)
        self.eval_env = eval_env
        if cfg.video and self.world.main:
            check_renders(eval_env)
        self.output_dir = Path(cfg.output_dir)
        self.checkpoints = Checkpoints(self.output_dir / "checkpoints", writer=self.world.main)
        self.objective = Objective(cfg.objective, cfg.objective_direction)
        self.best_success = Best("maximize")
        self.episodes = EpisodeWindow(cfg.stats_min_episodes)
        self.global_step = 0
        self.iteration = 0
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self.best_fresh: dict[str, Any] | None = None
        self.init_from: str | None = None
        self.wandb_id: str | None = None
        """The run's W&B run id (kept in checkpoints, so that a resumed run continues that W&B run)."""
        self._objective_checked = False
        self.trial = trial if self.world.main else None
        self.pruned = False
        self._start()
        self.compile_s = self._compile() if cfg.compile else None
        """Seconds that compiling took before the first step (``compile``), logged once as ``time/compile_s``."""

    def _compile(self) -> float:
        """Compile the acting forward pass and the minibatch loss (``compile``); return the seconds it took.

        Raises:
            SettingError: ``compile=True`` where compiling fails (no C++ compiler for the CPU backend, an op
                torch cannot compile), with the cause on the same line, before any step.
        """
        start = time.perf_counter()
        try:
            self.collector.compile()
            self.algorithm.compile(self.collector.buffer.data)
        except Exception as err:  # noqa: BLE001 - torch's compiler raises many kinds; each becomes this one line
            cause = " ".join(str(err).split("\n")[0].split()) or type(err).__name__
            raise SettingError("compile", True, f" cannot run here: {type(err).__name__}: {cause[:300]}; "
                                                "expected false (eager PyTorch)") from None  # fmt: skip
        seconds = time.perf_counter() - start
        notice(f"compiled the acting forward pass and the update's loss in {seconds:.1f} s (time/compile_s)")
        return seconds

    def _start(self) -> None:
        """Resume, start the policy from another run (``init_from``), or start afresh.

        In a multi-process run rank 0 alone reads the files and sends what it
        read to every rank; a fresh start sends rank 0's initial policy.
        """
        world, cfg = self.world, self.cfg
        start = None
        if world.main:
            resume_from = self._resume_source()
            if resume_from is not None:
                start = ("resume_from", str(resume_from), self._read(resume_from, "resume_from"))
            elif cfg.init_from is not None:
                path = self._init_source(cfg.init_from)
                start = ("init_from", str(path), self._read(path, "init_from"))
        if world.distributed:
            start = world.share((str(self.output_dir), start), "the broadcast of the run's start")
            self.output_dir, start = Path(start[0]), start[1]
            self.checkpoints = Checkpoints(self.output_dir / "checkpoints", writer=world.main)
            if start is not None:
                start = (start[0], start[1], _to_device(start[2], self.env.device))
        if start is None:
            if world.distributed:
                world.broadcast_(self.policy.state_dict().values(), "the broadcast of the initial policy")
                self.algorithm.reset_reference()
        elif start[0] == "resume_from":
            exact = self._restore(start[2], start[1])
            restart = "" if exact or start[2].get("world_size", 1) != world.world_size else (
                f"; {type(self.env).__name__} cannot restore its state: every env reset "
                "(episodes in progress at the checkpoint are dropped)"
            )  # fmt: skip
            notice(f"resumed from {start[1]} at iteration {self.iteration} (global_step {self.global_step:,}){restart}")
        else:
            self._init_policy(start[2], start[1])

    def _resume_source(self) -> Path | None:
        """The checkpoint this run resumes from, or None for a fresh start (refused in a directory that holds a run).

        Raises:
            SettingError: a fresh start in an ``output_dir`` that holds a run; a ``resume_from`` that names neither
                a checkpoint nor a run directory with ``checkpoints/latest.pt``.
        """
        resume_from = self.cfg.resume_from
        if resume_from is None and in_submitit_job():
            resume_from = "auto"  # a requeued job goes on from its own latest.pt
        if resume_from is None:
            reason = taken(self.output_dir)
            if reason is not None:
                raise SettingError("output_dir", str(self.output_dir), reason)
            return None
        if resume_from == "auto":
            return self.checkpoints.latest if self.checkpoints.latest.is_file() else None
        path = Path(resume_from)
        if path.is_dir():
            path = path / "checkpoints" / "latest.pt"
        if not path.is_file():
            raise SettingError("resume_from", resume_from, " does not exist: expected an rlchain checkpoint file, a run "
                                                          "directory with checkpoints/latest.pt, or 'auto'")  # fmt: skip
        return path

    # ------------------------------------------------------------ the loop
    def train(self) -> RunSummary:
        """Run the remaining iterations; write ``summary.json`` and return it.

        SIGINT (Ctrl-C) and SIGTERM (``scancel``, Kubernetes, most
        preemptions) stop the run after the current iteration: ``latest.pt`` is
        saved, the logs are flushed, and the summary says ``status="interrupted"``
        and which ``signal``. A second one aborts at once (``status="aborted"``;
        the last checkpoint stands). See :mod:`rlchain.stopping`.

        Raises:
            RuntimeError: a non-finite loss, gradient norm, KL, other reported
                term or parameter, naming it, the iteration and the last good
                checkpoint (kept; no non-finite checkpoint is written).
            Exception: any other error of an iteration (e.g. CUDA out of
                memory, an env error, a full disk) as raised.
            CollectiveError: a multi-process run whose other rank failed (its
                error), ended, or did not join a collective within
                ``dist_timeout_s`` (see :mod:`rlchain.distributed`).
            In every case ``summary.json`` first records ``status="failed"``,
            the one-line ``error`` and the ``traceback``, and the logs are flushed.

        In a multi-process run (torchrun) every rank calls this; the ranks
        stop after the same iteration, and rank 0 alone logs and writes
        ``summary.json`` (every rank returns its summary).
        """
        cfg = self.cfg
        start_time, start, start_step = time.time(), time.perf_counter(), self.global_step
        ending: dict[str, Any] = {"status": "completed"}
        failure: BaseException | None = None
        writer = progress = None
        with StopSignals(abort_on_repeat=not self.world.distributed) as stop:
            try:
                if self.world.main:  # rank 0 alone logs
                    writer = MetricWriter(self.output_dir, config=self.config, run_name=cfg.wandb_name or cfg.exp_name,
                                          purge_step=self.global_step or None, use_wandb=cfg.use_wandb,
                                          wandb_project=cfg.wandb_project, wandb_entity=cfg.wandb_entity,
                                          wandb_mode=cfg.wandb_mode, wandb_group=cfg.wandb_group,
                                          wandb_tags=cfg.wandb_tags, wandb_id=self.wandb_id)  # fmt: skip
                    self.wandb_id = writer.wandb_id or self.wandb_id
                progress = Progress(cfg.iterations, self.iteration, cfg.progress and self.world.main)
                if self.iteration >= cfg.iterations:
                    notice(f"the run has already reached trainer.iterations={cfg.iterations}: nothing to train")
                stopped = None  # the stop signal every rank agreed on
                while self.iteration < cfg.iterations and stopped is None and not self.pruned:
                    row, stopped = self._iteration(writer, start, stop)
                    progress.update(self.iteration, self.global_step, row)
                if self.pruned:
                    ending = {"status": "pruned"}
                    notice(f"pruned by the study's pruner after iteration {self.iteration} (trial {self.trial.number})")
                elif self.iteration < cfg.iterations:  # a stop signal ended it early
                    ending = {"status": "interrupted", "signal": stopped}
                self.save()
                if ending["status"] == "completed" and cfg.fresh_eval:
                    self.best_fresh = self._fresh_score_or_error()
            except Abort:
                ending = {"status": "aborted", "signal": stop.received}
            except Exception as err:
                ending, failure = self._failure(err)
                if not isinstance(err, CollectiveError):  # another rank's failure is that rank's to report
                    self.world.report_failure(ending["error"])
            with stop.held():  # the summary and the logs are written whatever arrives now
                if progress is not None:
                    progress.close()
                summary = self._summary(ending, start_time, time.perf_counter() - start, self.global_step - start_step)
                try:
                    if self.world.main:
                        summary.write(self.output_dir)
                finally:
                    if writer is not None:
                        writer.close()
        if failure is not None:
            raise failure
        return summary

    def _iteration(self, writer: MetricWriter | None, start: float, stop: StopSignals) -> tuple[dict[str, float], str | None]:
        """One iteration: collect -> update -> log -> evaluate -> save; returns the logged row and the stop signal.

        In a multi-process run every rank collects and updates; rank 0 gathers
        the ranks' episodes and reward terms (and the stop signals each got),
        logs, evaluates and decides, and every rank then takes its decision:
        stop (after the same iteration), pruned, and which checkpoint to write
        (every rank's state goes into it). A checkpoint is written after its
        row is logged and flushed, so that a resume from it (which drops the
        rows logged after its step) never leaves a hole in the logs.
        """
        world, clock = self.world, time.perf_counter
        t0 = clock()
        world.at(self.iteration + 1, "collect")
        rollout = self.collector.collect()
        t1 = clock()
        world.at(self.iteration + 1, "update")
        losses = self.algorithm.update(rollout.data)
        t2 = clock()
        self.iteration += 1
        samples = rollout.data.numel() * world.world_size
        self.global_step += samples
        world.at(self.iteration, "report")
        reports = world.gather((rollout.episodes, rollout.term_means, stop.received), "the gather of the iteration's episodes")
        row: dict[str, float] = {}
        decision = None
        if world.main:
            episodes = Episodes(*([x for report in reports for x in getattr(report[0], name)]
                                  for name in ("returns", "lengths", "successes")))  # fmt: skip
            terms = {key: sum(report[1][key] for report in reports) / len(reports) for key in reports[0][1]}
            signal = next((report[2] for report in reports if report[2] is not None), None)
            self.episodes.add(episodes)
            world.at(self.iteration, "log and evaluate")
            row = self._training_row(terms, losses, samples, collect_s=t1 - t0, update_s=t2 - t1, elapsed_s=t2 - start)
            decision = (signal, *self._log_and_evaluate(row, writer))
        world.at(self.iteration, "decision")
        signal, self.pruned, save, value = world.share(decision, "the broadcast of the iteration's decision")
        if save is not None:
            world.at(self.iteration, "checkpoint")
            if writer is not None:
                writer.flush()
            if save == "best":
                self._save_best(value)
            else:
                self.save()
        return row, signal

    def _log_and_evaluate(self, row: dict[str, float], writer: MetricWriter) -> tuple[bool, str | None, float | None]:
        """Rank 0's part of an iteration: evaluate (when due), log, report to the trial; return
        ``(pruned, checkpoint to write: "best", "latest" or None, the objective's value)``."""
        cfg = self.cfg
        evaluated = self.eval_env is not None and (self.iteration % cfg.eval_freq == 0 or self.iteration == cfg.iterations)
        if evaluated:
            self._evaluate(row, writer)
        writer.log(row, self.global_step)
        if not self._objective_checked:
            self._objective_checked = True
            self._check_objective(row)
        value = self.objective.value(row) if evaluated else None
        pruned = False
        if self.trial is not None and evaluated:
            pruned = self.trial.report(value, self.iteration) and self.iteration < cfg.iterations
        if self.objective.best.improves(value):
            return pruned, "best", value
        periodic = self.iteration % cfg.save_freq == 0 and self.iteration < cfg.iterations and not pruned
        return pruned, "latest" if periodic else None, value

    def _training_row(self, terms: dict[str, float], losses: dict[str, float], samples: int,
                      **times: float) -> dict[str, float]:  # fmt: skip
        """What an iteration logs, with CleanRL's names: the update's terms under ``losses/``, the rate, the
        episodes and SPS under ``charts/``, the env's terms (``rewards/``, ``metrics/``) and ``time/``.

        ``terms``: the rollout's reward terms and metrics (the ranks' mean); ``samples``: env steps of every rank.
        """
        row = {("charts/" if k == "learning_rate" else "losses/") + k: v for k, v in losses.items()}
        row.update(self.episodes.means(success=self.env.reports_success))
        row.update(terms)
        row["charts/SPS"] = samples / (times["collect_s"] + times["update_s"])
        row["charts/iteration"] = self.iteration
        row.update({f"time/{name}": value for name, value in times.items()})
        if self.compile_s is not None:  # once, in the first row this process logs
            row["time/compile_s"], self.compile_s = self.compile_s, None
        self.last_train = row
        return row

    def _evaluate(self, row: dict[str, float], writer: MetricWriter) -> None:
        """Evaluate the policy into ``row`` (``eval/*``, ``time/eval_s``); with ``video``, write and log its video."""
        cfg, t0 = self.cfg, time.perf_counter()
        result = evaluate(self.eval_env, self.policy, cfg.num_eval_episodes, seed=cfg.seed + 1,
                          video_episodes=cfg.video_episodes if cfg.video else 0)  # fmt: skip
        stats = result.means()
        self.last_eval = {f"eval/{k}": v for k, v in stats.items()}
        self.last_eval["eval/global_step"] = self.global_step
        row.update(self.last_eval)
        self.best_success.offer(stats.get("success_rate"), self.global_step)
        self.objective.resolve(self.last_eval)
        if result.frames is not None:
            path = write_mp4(self.output_dir / "videos" / f"step_{self.global_step:012d}.mp4", result.frames, result.fps)
            writer.log_video("eval/video", path, result.frames, result.fps, self.global_step)
        row["time/eval_s"] = time.perf_counter() - t0

    def _fresh_score_or_error(self) -> dict[str, Any] | None:
        """:meth:`fresh_score`, or ``{"error": <one line>}`` when it fails: the trained run stays completed."""
        try:
            return self.fresh_score()
        except Exception as err:  # noqa: BLE001 - training is done and saved; the score alone is lost, and said so
            notice(f"the fresh evaluation of best.pt failed (the run is complete): {error_line(err)}")
            return {"error": error_line(err)}

    def fresh_score(self) -> dict[str, Any] | None:
        """Evaluate ``best.pt`` on fresh start states: what ``summary.json`` records as ``best_fresh``.

        The same path as ``rlchain-eval`` (:func:`~rlchain.evaluation.evaluate_checkpoint`),
        on the evaluation env, with ``num_eval_episodes`` deterministic
        episodes from :func:`~rlchain.evaluation.fresh_seed` of the run's
        seed, and a copy of the policy (this one is left as it is).

        Returns:
            ``{"checkpoint", "global_step", "seed", "episodes", "deterministic",
            "metrics": {name: {"mean", "std", "ci95_low", "ci95_high", "n"}}}``,
            or None without an evaluation env or ``best.pt``.
        """
        if self.eval_env is None or not self.checkpoints.best.is_file():
            return None
        result, state = evaluate_checkpoint(self.eval_env, copy.deepcopy(self.policy), self.checkpoints.best,
                                            self.cfg.num_eval_episodes, seed=fresh_seed(self.cfg.seed))  # fmt: skip
        return {"checkpoint": str(self.checkpoints.best), "global_step": state["global_step"], **result.to_json()}

    def _save_best(self, value: float) -> Path:
        """Take ``value`` as the objective's best and write ``best.pt`` (and ``latest.pt``) with it.

        The best stays as it was when the checkpoints cannot be written (a
        full disk, a second stop signal), so that ``summary.json`` never names a
        best that no ``best.pt`` holds. In a multi-process run every rank
        calls it (each sends its state); rank 0 alone keeps the best and writes.
        """
        if not self.world.main:
            self._checked_state()
            return None
        best = self.objective.best
        previous = best.state_dict()
        best.take(value, self.global_step)
        try:
            return self.checkpoints.save_best(self._checked_state())
        except BaseException:
            best.load_state_dict(previous)
            raise

    def _check_objective(self, row: dict[str, float]) -> None:
        """Raise :class:`ObjectiveError` unless the objective is a key this run logs (after its first iteration).

        The evaluation's names are known before any evaluation ran: ``eval/``
        plus ``avg_reward``, ``avg_length``, ``episodes``, ``global_step``,
        ``success_rate`` (for an env that reports success) and every task
        metric. A run without an evaluation env has no ``eval/`` metrics; its
        ``eval/`` objective stays None.
        """
        if self.eval_env is None and self.objective.name.startswith("eval/"):
            return
        names = set(row)
        if self.eval_env is not None:
            names |= {f"eval/{k}" for k in ("avg_reward", "avg_length", "episodes", "global_step")}
            names |= {f"eval/{k.removeprefix('metrics/')}" for k in row if k.startswith("metrics/")}
            if self.eval_env.reports_success:
                names.add("eval/success_rate")
        self.objective.check(names)

    def _failure(self, err: Exception) -> tuple[dict[str, Any], BaseException]:
        """The summary fields of a failed iteration, and what :meth:`train` raises for it."""
        trace = traceback.format_exc()
        if isinstance(err, NonFiniteError):
            latest = self.checkpoints.latest
            error = (f"non-finite {err.metric} at iteration {self.iteration + 1} ({err.value}); "
                     f"last good checkpoint: {latest if latest.exists() else 'none written yet'}")  # fmt: skip
            failure = RuntimeError(error)
            failure.__cause__ = err
        else:
            error = error_line(str(err) if isinstance(err, (ObjectiveError, CollectiveError)) else err)
            failure = err
        return {"status": "failed", "error": error, "traceback": trace}, failure

    def _summary(self, ending: dict[str, Any], start_time: float, elapsed: float, steps: int) -> RunSummary:
        final = {**self.last_train, **self.last_eval}
        return RunSummary(
            **ending, exp_name=self.cfg.exp_name, **placement(self.env.device), world_size=self.world.world_size,
            global_step=self.global_step, iteration=self.iteration, elapsed_s=elapsed,
            SPS=steps / elapsed if elapsed > 0 else 0.0, start_time=start_time, end_time=time.time(),
            init_from=self.init_from, objective_name=self.objective.name, objective_direction=self.objective.direction,
            objective=self.objective.value(final), best_objective=self.objective.best.value,
            best_objective_step=self.objective.best.step, best_eval_success_rate=self.best_success.value,
            best_eval_step=self.best_success.step, best_fresh=self.best_fresh, final=final,
            checkpoints=self.checkpoints.files(),
        )  # fmt: skip

    # ------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any] | None:
        """Everything a resumed run needs (see the module docstring); None on a rank other than 0.

        What each rank has of its own (its env, collector and random streams)
        is rank 0's at the top level and every other rank's in ``ranks``
        (rank 1 first), with ``world_size``; every rank calls this (a gather).
        """
        own = self._rank_state()
        if self.world.distributed:
            others = self.world.gather(_to_device(own, "cpu"), "the gather of the ranks' states for the checkpoint")
            if not self.world.main:
                return None
        state = {
            "policy": self.policy.state_dict(),
            "algorithm": self.algorithm.state_dict(),
            **own,
            "episodes": self.episodes.state_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "best_success": self.best_success.value,
            "best_step": self.best_success.step,
            "best_objective": self.objective.best.value,
            "best_objective_step": self.objective.best.step,
            "best_objective_id": self.objective.best.id,
            "last_train": self.last_train,
            "last_eval": self.last_eval,
            "config": self.config,
            "wandb_id": self.wandb_id,
        }
        if self.world.distributed:
            state.update(world_size=self.world.world_size, ranks=others[1:])
        return state

    def _rank_state(self) -> dict[str, Any]:
        """This rank's own part of a checkpoint: its collector, its env, what the algorithm keeps of its envs
        (PPO's discounted returns with ``reward_norm``) and its random streams."""
        state = {
            "collector": self.collector.state_dict(),
            "algorithm_rank": self.algorithm.rank_state_dict(),
            "env": self.env.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        return state

    def _checked_state(self) -> dict[str, Any] | None:
        """:meth:`state_dict`, refused when a policy parameter or buffer is not finite (None on ranks but 0).

        Raises:
            NonFiniteError: a policy parameter or buffer (e.g. the observation
                normaliser's statistics) is NaN or infinite.
        """
        state = self.state_dict()
        bad = first_non_finite(dict(self.policy.state_dict()))
        if bad is not None:
            raise NonFiniteError(f"policy {bad[0]}", bad[1], self.iteration)
        return state

    def save(self) -> Path | None:
        """Write the state atomically to ``checkpoints/latest.pt`` and return the path.

        In a multi-process run every rank calls it and rank 0 writes (None elsewhere).

        Raises:
            NonFiniteError: see :meth:`_checked_state`; nothing is written.
            OSError: the file cannot be written (the previous one stays).
        """
        state = self._checked_state()
        return self.checkpoints.save(state) if state is not None else None

    def _restore(self, state: dict[str, Any], path: str | Path) -> bool:
        """Take the checkpoint ``state`` (read from ``path`` by :meth:`_read`) as this run's: training goes on
        with its step count.

        With an env that does not restore its episodes
        (:attr:`~rlchain.envs.base.VecEnv.resumes_episodes`), or a checkpoint
        without env state, the collector starts afresh instead of acting on
        the saved observation: every env is reset before the next rollout and
        no episode is carried over. The same happens for a checkpoint of a run
        with another number of processes (``world_size``), whose envs were
        not these. ``best.pt`` is made the checkpoint of the best evaluation
        the state records (:meth:`Checkpoints.align_best`, rank 0).

        Returns:
            True when the env went on with its episodes (an exact resume).

        Raises:
            ValueError: env state of another env (see the env's ``load_state_dict``).
            OSError: ``best.pt`` cannot be written or removed.
        """
        self.policy.load_state_dict(state["policy"])
        self.algorithm.load_state_dict(state["algorithm"])
        saved_world = state.get("world_size", 1)
        own = None
        if saved_world == self.world.world_size:
            own = state if self.world.rank == 0 else state["ranks"][self.world.rank - 1]
        else:
            notice(f"{path} was saved by a run of {saved_world} process(es) and this one has {self.world.world_size}: "
                   "policy, optimiser, observation statistics and step count go on; every env is reset "
                   "(episodes in progress at the checkpoint are dropped) and each rank's random stream starts "
                   "from its seed")  # fmt: skip
        exact = False
        if own is not None:
            self.collector.load_state_dict(own["collector"])
            if "env" in own:
                self.env.load_state_dict(own["env"])
            exact = "env" in own and self.env.resumes_episodes
            if exact:  # the envs go on with their episodes, and so do the returns the algorithm carries for them
                self.algorithm.load_rank_state_dict(own.get("algorithm_rank", {}))
            torch.set_rng_state(own["torch_rng"].cpu())
            if "cuda_rng" in own and torch.cuda.is_available():
                torch.cuda.set_rng_state_all([s.cpu() for s in own["cuda_rng"]])
        if not exact:
            self.collector.restart()
        self.episodes.load_state_dict(state["episodes"])
        self.global_step, self.iteration = state["global_step"], state["iteration"]
        self.best_success.load_state_dict({"value": state["best_success"], "step": state["best_step"]})
        self.objective.best.load_state_dict({"value": state.get("best_objective"), "step": state.get("best_objective_step"),
                                             "id": state.get("best_objective_id")})  # fmt: skip
        self.last_train, self.last_eval = state.get("last_train", {}), state.get("last_eval", {})
        self.wandb_id = state.get("wandb_id")
        self.objective.resolve(self.last_eval)
        if self.world.main and not self.checkpoints.align_best(state, path):
            notice(f"the best evaluation of {path} (global_step {self.objective.best.step:,}) has no checkpoint "
                   "there or here: best.pt starts afresh")  # fmt: skip
            self.objective.best.load_state_dict({})
        return exact

    def _init_source(self, source: str | Path) -> Path:
        """The checkpoint file ``init_from=source`` names: a checkpoint, or a run directory's ``checkpoints/latest.pt``.

        Raises:
            SettingError: ``init_from=...``: the path does not exist, or is a
                directory without ``checkpoints/latest.pt``.
        """
        path = Path(source)
        if path.is_dir():
            path = path / "checkpoints" / "latest.pt"
            if not path.is_file():
                raise SettingError("init_from", str(source), " is a directory without checkpoints/latest.pt: "
                                                             "expected an rlchain run directory or a checkpoint file")
        elif not path.exists():
            raise SettingError("init_from", str(source), " does not exist: expected an rlchain checkpoint file or run directory")
        return path

    def _init_policy(self, state: dict[str, Any], path: str | Path) -> None:
        """Take the policy (weights and observation normaliser) of the checkpoint ``state`` (read from ``path``) as
        this run's start. Only the policy is taken: optimiser, step count and collector start fresh, and the
        algorithm re-takes its reference policy from the loaded one (GRPO's KL anchor,
        :meth:`~rlchain.algorithms.Algorithm.reset_reference`)."""
        self.policy.load_state_dict(state["policy"])
        self.algorithm.reset_reference()
        self.init_from = str(path)
        notice(f"policy initialised from {path} (trained for {state['global_step']:,} env steps there)")

    def _read(self, path: str | Path, name: str) -> dict[str, Any]:
        """Read the checkpoint at ``path`` and check that its policy fits this run's (on the CPU in a multi-process
        run, whose rank 0 sends it to the others).

        Raises:
            FileNotFoundError: ``path`` does not exist.
            SettingError: ``<name>=...``: not an rlchain checkpoint, or a policy
                whose names or shapes differ from this run's (naming them).
        """
        device = "cpu" if self.world.distributed else self.env.device
        state = load_checkpoint(path, map_location=device, name=name)
        check_state_matches(self.policy, state["policy"], name, path)
        return state


def _build_eval_env(factory: Callable[..., VecEnv], cfg: TrainerConfig) -> VecEnv:
    """The evaluation env from ``factory``: ``num_eval_envs`` envs seeded ``seed + 1``, rendering for ``video``.

    Raises:
        SettingError: ``video`` with an env whose settings have no ``render_mode``.
    """
    if not cfg.video:
        return factory(num_envs=cfg.num_eval_envs, seed=cfg.seed + 1)
    try:
        return factory(num_envs=cfg.num_eval_envs, seed=cfg.seed + 1, render_mode="rgb_array")
    except TypeError as err:
        if "render_mode" not in str(err):
            raise
        raise SettingError("video", True, f" needs an env that renders: its settings have no render_mode ({err})") from None


def _to_device(state: Any, device: torch.device | str) -> Any:
    """``state`` (nested dicts, lists and tuples) with every tensor moved to ``device``."""
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {key: _to_device(value, device) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_to_device(value, device) for value in state)
    return state
