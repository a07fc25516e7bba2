"""The training loop: collect -> update -> log -> evaluate -> save.

``global_step`` counts env transitions (``rollout_steps * num_envs`` per
iteration); ``eval_freq`` and ``save_freq`` count iterations. A run directory
(``output_dir``) receives:

* ``tensorboard/`` and ``metrics.jsonl`` (one JSON row per iteration);
* ``checkpoints/latest.pt`` and ``checkpoints/best.pt`` (:class:`~rlchain.run.checkpoint.Checkpoints`);
* ``videos/step_<global_step>.mp4`` with ``video=True``: the first
  ``video_episodes`` episodes of each evaluation;
* ``summary.json`` (:class:`~rlchain.run.summary.RunSummary`) at the end, also
  returned by :meth:`Trainer.train`, whatever ended the run. A completed run
  first evaluates ``best.pt`` once more on start states that no evaluation
  during training used (``fresh_eval``; the summary's ``best_fresh``).

In a multi-process run (``torchrun``; :mod:`rlchain.distributed`) every rank
runs this loop on its own envs with the same policy; rank 0 alone evaluates,
logs and writes the run directory, and every rank's envs go into its
checkpoints.

The run's own mutable state (step count, run directory, last row, W&B run, ...)
is one :class:`~rlchain.run.state.RunState` (:attr:`Trainer.state`), which the
trainer alone changes while it trains; the components keep their own, and a
checkpoint composes both (:func:`rlchain.run.state.run_state`).
What surrounds the loop is a component each: :func:`rlchain.run.starting.start`
(afresh, resumed or from another run's policy, before the first step: it returns
the state the run starts from),
:class:`~rlchain.run.evaluator.Evaluator` (the evaluations, their videos, the
best success rate, the fresh final score), :class:`~rlchain.run.stopping.StopSignals`
(Ctrl-C, SIGTERM, a cluster's requeue signal), :class:`~rlchain.run.objective.Objective`
(the objective and the best evaluation), :class:`~rlchain.run.checkpoint.Checkpoints`
and :class:`~rlchain.run.summary.RunSummary`.

Checkpoints hold the policy, the algorithm (optimiser, schedule, reference
policy), the collector and env state, ``global_step``, ``iteration``, the
best values, the torch RNG states and the run's config. An env that restores
its episodes (:attr:`~rlchain.core.envs.base.VecEnv.resumes_episodes`, as every
torch-native task does) resumes exactly where the saved run stopped
(bit-identical on the CPU). Another (``env=gym``: gymnasium envs cannot save
their state) restarts instead: every env is reset, the episodes in progress at
the checkpoint are dropped from the statistics, and a one-line notice says so;
policy, optimiser, step count and the env's own saved state (``env=gym``: the
generator of its reset seeds) continue as saved.
"""

from __future__ import annotations

import importlib.util
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlchain.console import Progress, error_line, notice
from rlchain.core.algorithms.base import Algorithm, NonFiniteError
from rlchain.core.collector import Episodes, EpisodeWindow, SyncCollector
from rlchain.core.envs.base import VecEnv
from rlchain.core.evaluation import Evaluation
from rlchain.core.policies import Policy
from rlchain.distributed import CollectiveError, World, world
from rlchain.run.checkpoint import Checkpoints
from rlchain.run.cpu_share import CpuShare
from rlchain.run.evaluator import Evaluator
from rlchain.run.objective import OBJECTIVE_DIRECTIONS, Objective, ObjectiveError
from rlchain.run.starting import start
from rlchain.run.state import RunParts, RunState, checked_state, run_state, save_best
from rlchain.run.stopping import Abort, StopSignals
from rlchain.run.summary import RunSummary, placement
from rlchain.run.video import check_video_support
from rlchain.run.writer import MetricWriter
from rlchain.settings import SettingError, Settings, setting
from rlchain.utils import MAX_SEED

__all__ = ["WANDB_MODES", "Trainer", "TrainerConfig"]

WANDB_MODES = (None, "online", "offline", "disabled")


@dataclass
class TrainerConfig(Settings):
    """Trainer settings, their defaults and ranges."""

    _target_: str = "rlchain.run.trainer.Trainer"
    iterations: int = setting(100, gt=0)
    """Collect-and-update iterations."""
    rollout_steps: int = setting(100, gt=0)
    """Steps per env per rollout (GRPO, which resets every env each rollout: at least the env's max_episode_steps)."""
    spread_episode_starts: bool = False
    """After the first reset of training (and the reset of a resume that cannot restore the episodes in
    progress), put each env at a random step of its episode (rsl_rl's init_at_random_ep_len), so that episodes do
    not all reach their time limit at once; those first episodes are shorter (their returns are logged as they
    are). Not with GRPO; evaluation always starts episodes afresh."""
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
    evaluation during training used (rlchain.core.evaluation.fresh_seed), and record it as summary.json's best_fresh."""
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
    """Compile the collection step (act, env step, writes) and the minibatch update (loss, backward, clip, Adam)
    each whole with torch.compile(fullgraph=True) before the first step; where the env steps outside torch's
    compiler (env=gym, mjlab, maniskill) only the acting forward pass, and for a recurrent policy or under torchrun
    only the loss. The time it takes is logged once as time/compile_s and left out of SPS. Needs a C++ compiler for
    the CPU backend, Triton for CUDA: a run that cannot compile stops before any step with one line naming the
    step and the cause, its traceback in the run directory's compile_error.txt."""
    cudagraphs: bool = False
    """Replay the compiled collection step and minibatch update each as one CUDA graph (with compile=true; a CUDA
    device, an env whose step compiles, a feed-forward policy, one process): refused before any step, naming why,
    where it cannot apply."""
    adapt_threads: bool = True
    """On a CPU device, after each iteration train on as many of torch's threads as other processes leave CPUs free
    (read from Linux's /proc/stat; at least 1, at most the count the run started with), saying so in one line the
    first time: threads that spin for a core another process holds slow a run several times (benchmarks/README.md).
    False: torch's thread count as it is."""
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
                raise SettingError(
                    "video_episodes",
                    self.video_episodes,
                    f" is not allowed with num_eval_envs={self.num_eval_envs}: expected at most "
                    "num_eval_envs (each recorded episode is the first of one evaluation env)",
                )


class Trainer:
    """Runs the training loop: collect -> update -> log -> evaluate -> save.

    Args:
        env: training env (a :class:`rlchain.core.envs.base.VecEnv`).
        policy: the policy, on ``env.device``.
        algorithm: an :class:`rlchain.core.algorithms.Algorithm` of ``policy``.
        eval_env: the evaluation env, or a factory called as
            ``eval_env(num_envs=num_eval_envs, seed=seed + 1)`` (e.g. a Hydra
            ``_partial_`` of the env config), or None for no evaluation.
        run_config: the run's composed configuration (plain dict), stored in
            checkpoints and logged as hyperparameters.
        trial: the Optuna trial this run reports to (a
            :class:`rlchain.run.tuning.JobTrial`: ``number``, ``report(value, step)
            -> pruned``), or None. Rank 0 reports the objective at every
            evaluation (step: the iteration) and, once the study's pruner
            prunes the trial, stops after that iteration with status
            ``pruned`` (``latest.pt`` saved, no fresh evaluation).
        settings: fields of :class:`TrainerConfig` (``self.cfg``).

    Building a trainer starts nothing: :meth:`start` resumes it
    (``resume_from``), starts its policy from another run (``init_from``) or
    checks that its fresh start may use ``output_dir``, and compiles
    (``compile``); the entry calls it once the trainer is built, and
    :meth:`train` calls it where nobody did.

    The run's own mutable state is :attr:`state` (a
    :class:`~rlchain.run.state.RunState`); ``global_step``, ``iteration``,
    ``output_dir``, ``checkpoints``, ``last_train``, ``init_from`` and
    ``wandb_id`` read it.

    Raises:
        SettingError: a setting out of its range (naming it), an env the
            algorithm rejects (e.g. GRPO's ``group_size`` not dividing
            ``num_envs``), a ``rollout_steps`` below the env's
            ``max_episode_steps`` for an algorithm that resets every env each
            rollout (GRPO), ``use_wandb`` without the wandb package, ``video``
            without an evaluation env that renders (or without imageio); all
            before any step.
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
        algorithm.check_rollout(cfg.rollout_steps)
        self.collector = SyncCollector(
            env, policy, cfg.rollout_steps, algorithm.reset_options, spread_episode_starts=cfg.spread_episode_starts
        )
        self.state = RunState.new(cfg.output_dir, self.world)
        """The run's own mutable state; :meth:`start` chooses it, the loop alone changes it."""
        self.evaluator = Evaluator(
            eval_env if self.world.main else None,
            cfg.num_eval_envs,
            cfg.num_eval_episodes,
            seed=cfg.seed + 1,
            video_episodes=cfg.video_episodes if cfg.video else 0,
            video_dir=self.state.output_dir / "videos",
        )
        """Rank 0's evaluations (no evaluation env on the other ranks)."""
        self.objective = Objective(cfg.objective, cfg.objective_direction)
        self.episodes = EpisodeWindow(cfg.stats_min_episodes)
        self._objective_checked = False
        self.trial = trial if self.world.main else None

    @property
    def parts(self) -> RunParts:
        """The components whose own state the run's checkpoints hold."""
        return RunParts(
            self.env, self.policy, self.algorithm, self.collector, self.episodes, self.evaluator, self.objective
        )

    @property
    def global_step(self) -> int:
        """Env transitions so far, every rank's counted (:attr:`state`)."""
        return self.state.global_step

    @property
    def iteration(self) -> int:
        """Iterations so far (:attr:`state`)."""
        return self.state.iteration

    @property
    def output_dir(self) -> Path:
        """The run directory (:attr:`state`; on a rank other than 0, rank 0's once started)."""
        return self.state.output_dir

    @property
    def checkpoints(self) -> Checkpoints:
        """The run's ``checkpoints/`` (:attr:`state`)."""
        return self.state.checkpoints

    @property
    def last_train(self) -> dict[str, float]:
        """The row the latest iteration logged (:attr:`state`)."""
        return self.state.last_train

    @property
    def init_from(self) -> str | None:
        """The checkpoint the policy started from (``init_from``; :attr:`state`), else None."""
        return self.state.init_from

    @property
    def wandb_id(self) -> str | None:
        """The run's W&B run id, kept in checkpoints so that a resumed run continues that W&B run (:attr:`state`)."""
        return self.state.wandb_id

    def start(self, *, steps: bool = True) -> RunState:
        """Start the run where nobody did (:func:`rlchain.run.starting.start`: resume, ``init_from`` or a fresh
        start, then ``compile``) and return its state; a started run's state is returned as it is.

        Args:
            steps: apply ``compile`` and ``cudagraphs`` to the run's own steps; False for a population's member,
                whose steps are its population's (:class:`~rlchain.run.population.PopulationRun` compiles those).

        Raises:
            SettingError: see :func:`rlchain.run.starting.start`; all before any step.
            CollectiveError: a multi-process run whose ranks do not all take part.
        """
        cfg = self.cfg
        self.state = start(
            self.state,
            self.parts,
            self.world,
            resume_from=cfg.resume_from,
            init_from=cfg.init_from,
            compile=cfg.compile and steps,
            cudagraphs=cfg.cudagraphs and steps,
        )
        return self.state

    @property
    def eval_env(self) -> VecEnv | None:
        """The evaluation env (:attr:`evaluator`'s; None on a rank other than 0 or without evaluation)."""
        return self.evaluator.env

    # ------------------------------------------------------------ the loop
    def train(self) -> RunSummary:
        """Run the remaining iterations; write ``summary.json`` and return it.

        SIGINT (Ctrl-C) and SIGTERM (``scancel``, Kubernetes, most
        preemptions) stop the run after the current iteration: ``latest.pt`` is
        saved, the logs are flushed, and the summary says ``status="interrupted"``
        and which ``signal``. A second one aborts at once (``status="aborted"``;
        the last checkpoint stands). See :mod:`rlchain.run.stopping`.

        Raises:
            RuntimeError: a non-finite loss, gradient norm, KL, other reported
                term or parameter, naming it, the iteration and the last good
                checkpoint (kept; no non-finite checkpoint is written).
            Exception: any other error of an iteration (e.g. CUDA out of
                memory, an env error, a full disk) as raised.
            CollectiveError: a multi-process run whose other rank failed (its
                error), ended, or did not join a collective within
                ``dist_timeout_s`` (see :mod:`rlchain.distributed`).

        In every case of failure ``summary.json`` first records
        ``status="failed"``, the one-line ``error`` and the ``traceback``, and
        the logs are flushed; the error raised carries that summary as its
        ``run_summary`` attribute (a :class:`~rlchain.run.summary.RunSummary`).

        In a multi-process run (torchrun) every rank calls this; the ranks
        stop after the same iteration, and rank 0 alone logs and writes
        ``summary.json`` (every rank returns its summary).
        """
        self.start()  # where the entry has not already
        with StopSignals(abort_on_repeat=not self.world.distributed) as stop:
            session = Session(self, stop)
            try:
                session.open()
                while session.running:
                    session.iteration()
                session.finish()
            except Abort:
                session.abort()
            except Exception as err:  # noqa: BLE001 - any error ends the run as failed, recorded in its summary
                session.fail(err)
            summary = session.close()
        session.raise_failure()
        return summary

    def _iteration(
        self, writer: MetricWriter | None, start: float, stop: StopSignals, step: Step | None = None
    ) -> tuple[dict[str, float], str | None]:
        """One iteration: collect -> update -> log -> evaluate -> save; returns the logged row and the stop signal.

        In a multi-process run every rank collects and updates; rank 0 gathers
        the ranks' episodes and reward terms (and the stop signals each got),
        logs, evaluates and decides, and every rank then takes its decision:
        stop (after the same iteration), pruned, and which checkpoint to write
        (every rank's state goes into it). A checkpoint is written after its
        row is logged and flushed, so that a resume from it (which drops the
        rows logged after its step) never leaves a hole in the logs.

        ``step``: this iteration's rollout and update, made elsewhere (a population's member, whose collection and
        update are its population's, and its evaluation where one is due: :attr:`Step.evaluation`); None: collect,
        update and evaluate here.
        """
        world, state, clock = self.world, self.state, time.perf_counter
        if step is None:
            t0 = clock()
            world.at(state.iteration + 1, "collect")
            rollout = self.collector.collect()
            t1 = clock()
            world.at(state.iteration + 1, "update")
            losses = self.algorithm.update(rollout.data)
            step = Step(rollout.episodes, rollout.term_means, losses, rollout.data.numel(), t1 - t0, clock() - t1)
        t2 = clock()
        state.iteration += 1
        samples = step.samples * world.world_size
        state.global_step += samples
        world.at(state.iteration, "report")
        reports = world.gather(
            (step.episodes, step.term_means, stop.received), "the gather of the iteration's episodes"
        )
        row: dict[str, float] = {}
        decision = None
        if world.main:
            episodes = Episodes(
                *(
                    [x for report in reports for x in getattr(report[0], name)]
                    for name in ("returns", "lengths", "successes")
                )
            )
            terms = {key: sum(report[1][key] for report in reports) / len(reports) for key in reports[0][1]}
            signal = next((report[2] for report in reports if report[2] is not None), None)
            self.episodes.add(episodes)
            world.at(state.iteration, "log and evaluate")
            row = self._training_row(
                terms, step.losses, samples, collect_s=step.collect_s, update_s=step.update_s, elapsed_s=t2 - start
            )
            decision = (signal, *self._log_and_evaluate(row, writer, step.evaluation))
        world.at(state.iteration, "decision")
        signal, state.pruned, save, value = world.share(decision, "the broadcast of the iteration's decision")
        if save is not None:
            world.at(state.iteration, "checkpoint")
            if writer is not None:
                writer.flush()
            if save == "best":
                save_best(state, self.parts, world, self.config, value)
            else:
                self.save()
        return row, signal

    def evaluation_due(self, iteration: int) -> bool:
        """Whether the loop evaluates after iteration ``iteration`` (1-based): every ``eval_freq`` and at the last,
        with an evaluation env."""
        cfg = self.cfg
        return self.evaluator.env is not None and (iteration % cfg.eval_freq == 0 or iteration == cfg.iterations)

    def _log_and_evaluate(
        self, row: dict[str, float], writer: MetricWriter, made: tuple[Evaluation | Exception, float] | None = None
    ) -> tuple[bool, str | None, float | None]:
        """Rank 0's part of an iteration: evaluate (when due; ``made``: the evaluation a population made, see
        :attr:`Step.evaluation`), log, report to the trial; return ``(pruned, checkpoint to write: "best",
        "latest" or None, the objective's value)``."""
        cfg, iteration = self.cfg, self.state.iteration
        evaluated = self.evaluation_due(iteration)
        if evaluated:
            if made is None:
                row.update(self.evaluator.evaluate(self.policy, self.state.global_step, writer))
            elif isinstance(made[0], Exception):
                raise made[0]
            else:
                row.update(self.evaluator.record(made[0], self.state.global_step, made[1], writer))
            self.objective.resolve(self.evaluator.last)
        writer.log(row, self.state.global_step)
        if not self._objective_checked:
            self._objective_checked = True
            self._check_objective(row)
        value = self.objective.value(row) if evaluated else None
        pruned = False
        if self.trial is not None and evaluated:
            pruned = self.trial.report(value, iteration) and iteration < cfg.iterations
        if self.objective.best.improves(value):
            return pruned, "best", value
        periodic = iteration % cfg.save_freq == 0 and iteration < cfg.iterations and not pruned
        return pruned, "latest" if periodic else None, value

    def _training_row(
        self, terms: dict[str, float], losses: dict[str, float], samples: int, **times: float
    ) -> dict[str, float]:
        """What an iteration logs, with CleanRL's names: the update's terms under ``losses/``, the rate, the
        episodes and SPS under ``charts/``, the env's terms (``rewards/``, ``metrics/``) and ``time/``.

        ``terms``: the rollout's reward terms and metrics (the ranks' mean); ``samples``: env steps of every rank.
        """
        row = {("charts/" if k == "learning_rate" else "losses/") + k: v for k, v in losses.items()}
        row.update(self.episodes.means(success=self.env.reports_success))
        row.update(terms)
        row["charts/SPS"] = samples / (times["collect_s"] + times["update_s"])
        state = self.state
        row["charts/iteration"] = state.iteration
        row.update({f"time/{name}": value for name, value in times.items()})
        if state.compile_s is not None:  # once, in the first row this process logs
            row["time/compile_s"], state.compile_s = state.compile_s, None
        state.last_train = row
        return row

    def _check_objective(self, row: dict[str, float]) -> None:
        """Raise :class:`ObjectiveError` unless the objective is a key this run logs (after its first iteration).

        The evaluation's names are known before any evaluation ran
        (:meth:`Evaluator.metric_names`). A run without an evaluation env has
        no ``eval/`` metrics; its ``eval/`` objective stays None.
        """
        if self.evaluator.env is None and self.objective.name.startswith("eval/"):
            return
        self.objective.check(set(row) | self.evaluator.metric_names(row))

    def _failure(self, err: Exception) -> tuple[dict[str, Any], BaseException]:
        """The summary fields of a failed iteration, and what :meth:`train` raises for it."""
        trace = traceback.format_exc()
        if isinstance(err, NonFiniteError):
            latest = self.state.checkpoints.latest
            error = (
                f"non-finite {err.metric} at iteration {self.state.iteration + 1} ({err.value}); "
                f"last good checkpoint: {latest if latest.exists() else 'none written yet'}"
            )
            failure = RuntimeError(error)
            failure.__cause__ = err
        else:
            error = error_line(str(err) if isinstance(err, (ObjectiveError, CollectiveError)) else err)
            failure = err
        return {"status": "failed", "error": error, "traceback": trace}, failure

    def _summary(self, ending: dict[str, Any], start_time: float, elapsed: float, steps: int) -> RunSummary:
        state = self.state
        final = {**state.last_train, **self.evaluator.last}
        return RunSummary(
            **ending,
            exp_name=self.cfg.exp_name,
            **placement(self.env.device),
            world_size=self.world.world_size,
            global_step=state.global_step,
            iteration=state.iteration,
            elapsed_s=elapsed,
            SPS=steps / elapsed if elapsed > 0 else 0.0,
            start_time=start_time,
            end_time=time.time(),
            init_from=state.init_from,
            objective_name=self.objective.name,
            objective_direction=self.objective.direction,
            objective=self.objective.value(final),
            best_objective=self.objective.best.value,
            best_objective_step=self.objective.best.step,
            best_eval_success_rate=self.evaluator.best_success.value,
            best_eval_step=self.evaluator.best_success.step,
            best_fresh=state.best_fresh,
            final=final,
            checkpoints=state.checkpoints.files(),
        )

    # ------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any] | None:
        """Everything a resumed run needs (:func:`rlchain.run.state.run_state`: the run's state and its components');
        None on a rank other than 0. Every rank calls it in a multi-process run (a gather)."""
        return run_state(self.state, self.parts, self.world, self.config)

    def save(self) -> Path | None:
        """Write the state atomically to ``checkpoints/latest.pt`` and return the path.

        In a multi-process run every rank calls it and rank 0 writes (None elsewhere).

        Raises:
            NonFiniteError: a policy parameter or buffer is not finite (:func:`~rlchain.run.state.checked_state`);
                nothing is written.
            OSError: the file cannot be written (the previous one stays).
        """
        checkpoint = checked_state(self.state, self.parts, self.world, self.config)
        return self.state.checkpoints.save(checkpoint) if checkpoint is not None else None


@dataclass
class Step:
    """An iteration's collection and update, as the loop logs them (:meth:`Trainer._iteration`): the episodes that
    ended, the means of the env's reward terms and metrics, the update's terms, the env steps collected and the
    seconds each part took."""

    episodes: Episodes
    term_means: dict[str, float]
    losses: dict[str, float]
    samples: int
    collect_s: float
    update_s: float
    evaluation: tuple[Evaluation | Exception, float] | None = None
    """A population's member: this iteration's evaluation, where one is due, made by its population (every member
    at once), and its seconds; an error in place of the evaluation is raised as the evaluation's own would be.
    None: the loop evaluates here, where one is due."""


class Session:
    """One run's training from its first iteration to its summary: what :meth:`Trainer.train` runs, in parts, so
    that a population (:mod:`rlchain.run.population`) runs its members' sessions side by side.

    :meth:`open` opens the logs and the progress; :meth:`iteration` runs one iteration (its collection and
    update given, for a population's member, or made here); :meth:`finish` ends a run that was not failed
    (pruned, stopped by a signal or completed: ``latest.pt`` and the fresh evaluation); :meth:`fail` and
    :meth:`abort` record how it ended otherwise; :meth:`close` writes ``summary.json``, closes the logs and
    returns the summary; :meth:`raise_failure` then raises the failure, if any, carrying the summary.

    Args:
        trainer: the run's started trainer.
        stop: the process's stop signals (:class:`~rlchain.run.stopping.StopSignals`), shared by every session of
            the process.
        lead: whether this session shows its progress and adapts torch's threads (``trainer.progress``,
            ``trainer.adapt_threads``): a population's first member does, for the process.
    """

    def __init__(self, trainer: Trainer, stop: StopSignals, lead: bool = True) -> None:
        self.trainer, self.stop = trainer, stop
        self.start_time, self.began = time.time(), time.perf_counter()
        self.start_step = trainer.state.global_step
        self.ending: dict[str, Any] = {"status": "completed"}
        self.failure: BaseException | None = None
        self.writer: MetricWriter | None = None
        self.progress: Progress | None = None
        self.stopped: str | None = None
        """The stop signal every rank agreed on, once one arrived."""
        self.ended = False
        self.lead = lead
        self.cpu_share = CpuShare(trainer.cfg.adapt_threads and lead, trainer.env.device)

    def open(self) -> None:
        """Open the run's logs (rank 0) and its progress display."""
        trainer, cfg, state = self.trainer, self.trainer.cfg, self.trainer.state
        if trainer.world.main:  # rank 0 alone logs
            self.writer = MetricWriter(
                state.output_dir,
                config=trainer.config,
                run_name=cfg.wandb_name or cfg.exp_name,
                purge_step=state.global_step or None,
                use_wandb=cfg.use_wandb,
                wandb_project=cfg.wandb_project,
                wandb_entity=cfg.wandb_entity,
                wandb_mode=cfg.wandb_mode,
                wandb_group=cfg.wandb_group,
                wandb_tags=cfg.wandb_tags,
                wandb_id=state.wandb_id,
            )
            state.wandb_id = self.writer.wandb_id or state.wandb_id
        self.progress = Progress(cfg.iterations, state.iteration, cfg.progress and trainer.world.main and self.lead)
        if state.iteration >= cfg.iterations:
            notice(f"the run has already reached trainer.iterations={cfg.iterations}: nothing to train")

    @property
    def running(self) -> bool:
        """Whether another iteration is due: not ended, iterations left, no stop signal, not pruned."""
        state = self.trainer.state
        return (
            not self.ended
            and state.iteration < self.trainer.cfg.iterations
            and self.stopped is None
            and not state.pruned
        )

    def iteration(self, step: Step | None = None) -> None:
        """One iteration (:meth:`Trainer._iteration`; ``step`` as it takes it), its progress shown."""
        row, self.stopped = self.trainer._iteration(self.writer, self.began, self.stop, step)
        self.progress.update(self.trainer.state.iteration, self.trainer.state.global_step, row)
        self.cpu_share.update()

    def finish(self) -> None:
        """End a run that did not fail: pruned, stopped by a signal, or completed (then its fresh evaluation);
        ``latest.pt`` is written in each case."""
        trainer, state, cfg = self.trainer, self.trainer.state, self.trainer.cfg
        if state.pruned:
            self.ending = {"status": "pruned"}
            notice(f"pruned by the study's pruner after iteration {state.iteration} (trial {trainer.trial.number})")
        elif state.iteration < cfg.iterations:  # a stop signal ended it early
            self.ending = {"status": "interrupted", "signal": self.stopped or self.stop.received}
        trainer.save()
        if self.ending["status"] == "completed" and cfg.fresh_eval:
            state.best_fresh = trainer.evaluator.fresh_score(trainer.policy, state.checkpoints.best, cfg.seed)
        self.ended = True

    def abort(self) -> None:
        """A second stop signal: the run ends at once (the last checkpoint stands)."""
        self.ending = {"status": "aborted", "signal": self.stop.received}
        self.ended = True

    def fail(self, err: Exception) -> None:
        """Record ``err`` as what ended the run (:meth:`Trainer._failure`); another rank hears of it."""
        self.ending, self.failure = self.trainer._failure(err)
        if not isinstance(err, CollectiveError):  # another rank's failure is that rank's to report
            self.trainer.world.report_failure(self.ending["error"])
        self.ended = True

    def close(self) -> RunSummary:
        """Write ``summary.json`` (rank 0) and close the logs, whatever signal arrives meanwhile; the summary."""
        trainer, state = self.trainer, self.trainer.state
        with self.stop.held():  # the summary and the logs are written whatever arrives now
            self.cpu_share.close()
            if self.progress is not None:
                self.progress.close()
            summary = trainer._summary(
                self.ending, self.start_time, time.perf_counter() - self.began, state.global_step - self.start_step
            )
            try:
                if trainer.world.main:
                    summary.write(state.output_dir)
            finally:
                if self.writer is not None:
                    self.writer.close()
        self.summary = summary
        return summary

    def raise_failure(self) -> None:
        """Raise what failed the run, carrying its summary (``run_summary``); nothing for a run that did not fail."""
        if self.failure is not None:
            self.failure.run_summary = self.summary  # what the entry says of it, without reading summary.json back
            raise self.failure
