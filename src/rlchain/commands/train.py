"""``rlchain-train``: compose one configuration with Hydra, build its components and train.

Usage::

    rlchain-train algorithm=grpo env=push_cube                  # one run -> outputs/<date>/<time>_<id>/
    rlchain-train experiment=push_cube_ppo                      # a tuned preset (debug=tiny: the smallest run)
    rlchain-train env.num_envs=1024 algorithm.learning_rate=1e-3 # override any field
    rlchain-train -m algorithm=ppo,grpo seed=0,1                 # a sweep -> multirun/<date>/<time>_<id>/<job>/
    torchrun --nproc_per_node=2 -m rlchain.commands.train ...             # one run over 2 processes (rlchain.distributed)
    rlchain-train --help | --cfg job                             # groups and options | the composed config

:func:`build` instantiates env, policy (given the env's spaces), algorithm
(given the policy) and trainer with ``hydra.utils.instantiate``;
:func:`train` builds and trains; :func:`main` is the Hydra entry, which
turns the errors a user can fix into one line and returns the objective
(``trainer.objective``) for sweepers.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rlchain import distributed
from rlchain.commands.command_line import register_help_resolver
from rlchain.commands.config import RunConfig, check_top_level_keys
from rlchain.console import error_line, logged_warnings, show
from rlchain.core.compiling import CompileFailure
from rlchain.distributed import CollectiveError, rank_seed
from rlchain.run import tuning
from rlchain.run.heap import keep_freed_memory
from rlchain.run.run_dir import remove_if_unused
from rlchain.run.stopping import in_submitit_job, requeue_signal
from rlchain.run.summary import STOPPED, RunSummary, placement
from rlchain.run.trainer import Trainer, TrainerConfig
from rlchain.run.video import prefer_headless_gl
from rlchain.settings import rejection
from rlchain.utils import resolve_device

__all__ = ["ConfigError", "RunFailed", "build", "main", "train"]

register_help_resolver()


class ConfigError(CompactHydraException):
    """A config value a component rejected; Hydra prints just this message (no traceback)."""


class RunFailed(CompactHydraException):
    """A run that failed while training; Hydra prints just this one line (``HYDRA_FULL_ERROR=1`` for the traceback)."""


@contextlib.contextmanager
def _component(group: str) -> Iterator[None]:
    """Turn the ``ValueError`` of building the component of config group ``group`` into a :class:`ConfigError`.

    A :class:`~rlchain.settings.SettingError` names its setting in full
    (``env.num_envs=0 is not allowed: ...``); another ``ValueError`` is
    prefixed with the group (``policy: ...``).
    """
    try:
        yield
    except (InstantiationException, ValueError) as err:
        message = rejection(err, group)
        if message is None:
            raise
        raise ConfigError(f"Invalid config: {message}") from (err if isinstance(err, ValueError) else err.__cause__)


def build(cfg: DictConfig, *, member: bool = False) -> Trainer:
    """Seed torch's global RNG with ``cfg.seed``, instantiate env, policy, algorithm and trainer, then start the
    trainer (:meth:`~rlchain.run.trainer.Trainer.start`: resume, ``init_from`` or a fresh start, and ``compile``;
    for a population's ``member``, whose population compiles the steps it trains with, no ``compile``).

    In a process that torchrun started, first join the run's other processes
    (:func:`rlchain.distributed.setup`): ``device`` becomes this rank's, its
    env is seeded with :func:`~rlchain.distributed.rank_seed` of the env's
    seed and, once the policy is built (the same weights on every rank), its
    action noise with that of ``seed``; rank 0 alone builds the evaluation env.
    In a job of ``hydra/sweeper=rlchain_optuna``, rank 0 connects to the job's
    trial (:func:`rlchain.run.tuning.trial`) and hands it to the trainer.

    Raises:
        ConfigError: a top-level key no schema field or selected config group
            accounts for (see :func:`rlchain.commands.config.check_top_level_keys`); a
            value a component rejects, naming ``group.key``, the value and
            what is allowed (a checkpoint to resume from or start from that
            does not exist or does not fit, naming it); a job's trial that
            cannot be opened (naming ``hydra.sweeper.trial``); ``trainer.compile=true`` where compiling fails
            (naming the step, the cause and the file with the traceback); all raised before any env step is taken.
    """
    with _component(""):
        check_top_level_keys(cfg)
        RunConfig(seed=cfg.seed, device=cfg.device, exp_name=cfg.exp_name)  # the ranges of the run-wide settings
        resolve_device(cfg.device, name="device")
    with _component("trainer"):
        TrainerConfig(dist_timeout_s=cfg.trainer.dist_timeout_s)  # its range, before the processes join
    world, device = distributed.setup(cfg.device, cfg.trainer.dist_timeout_s)
    if world.distributed:
        cfg.device = device
    with _component(""):
        trial = tuning.trial() if world.main else None  # a job of hydra/sweeper=rlchain_optuna reports to its trial
    if cfg.trainer.get("video"):
        prefer_headless_gl()
    torch.manual_seed(cfg.seed)  # the run's random stream starts here: initial weights, then action sampling
    own_seed = {"seed": rank_seed(cfg.env.seed, world.rank)} if world.rank > 0 and "seed" in cfg.env else {}
    with _component("env"):
        env = instantiate(cfg.env, **own_seed, _convert_="all")
    eval_env = instantiate(cfg.env, _partial_=True, _convert_="all") if world.main else None
    with _component("policy"):
        policy = instantiate(
            cfg.policy,
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            _convert_="all",
        ).to(env.device)
    with _component("algorithm"):
        algorithm = instantiate(cfg.algorithm, policy=policy, _convert_="all")
    if world.rank > 0:
        torch.manual_seed(rank_seed(cfg.seed, world.rank))
    if hasattr(policy, "seed_actions"):  # the action noise's own stream (a population member's, alone)
        policy.seed_actions(rank_seed(cfg.seed, world.rank))
    config = OmegaConf.to_container(cfg, resolve=True)
    with _component("trainer"):
        trainer = instantiate(
            cfg.trainer,
            env=env,
            policy=policy,
            algorithm=algorithm,
            eval_env=eval_env,
            run_config=config,
            trial=trial,
            **_sweep_wandb(cfg),
            _convert_="all",
            _recursive_=False,  # run_config holds _target_ keys: keep it data
        )
        try:
            trainer.start(steps=not member)  # resume, init_from or a fresh start; compile
        except CompileFailure as err:  # its one line says what failed and where its traceback is
            raise ConfigError(str(err)) from err
    return trainer


def _sweep_wandb(cfg: DictConfig) -> dict[str, str]:
    """For a job of a sweep, the W&B name and group its settings leave to the sweep (``trainer.wandb_name`` and
    ``trainer.wandb_group`` null): ``<exp_name>_<job number>`` in the group of the sweep directory."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return {}
    hc = HydraConfig.get()
    defaults = {"wandb_name": f"{cfg.exp_name}_{hc.job.num}", "wandb_group": "/".join(Path(hc.sweep.dir).parts[-2:])}
    return {key: value for key, value in defaults.items() if cfg.trainer.get(key) is None}


def train(cfg: DictConfig) -> RunSummary:
    """Build and train; print the run's result line and return its summary (``summary.json``).

    A job of a sweep refused before its first step (a rejected config, an
    env that cannot be built) still leaves ``summary.json`` with
    ``status="failed"``, the error and its traceback in ``trainer.output_dir``
    (where that directory can be written and holds no other run's summary), so
    sweep tables list it; such a summary does not make the directory hold a run
    (:func:`rlchain.run.run_dir.existing_run`). A single run refused so says it in
    its one line and leaves no directory behind
    (:func:`rlchain.run.run_dir.remove_if_unused`). The process keeps the host memory a step frees for the next
    (:func:`rlchain.run.heap.keep_freed_memory`).

    Raises:
        ConfigError: see :func:`build`.
        RunFailed: the processes of a multi-process run did not all join
            (naming the rank and the timeout); training failed (a non-finite loss, an env error, a full
            disk, ...): one line naming what went wrong; ``summary.json`` has
            the traceback. With ``HYDRA_FULL_ERROR=1`` the original error is
            raised instead.
        Exception: other errors of the components while they are built, as raised.
    """
    try:
        summary = _train(cfg)
    except BaseException:
        distributed.shutdown()
        raise
    distributed.shutdown(together=True)
    return summary


def build_member(cfg: DictConfig) -> Trainer:
    """:func:`build` for a member of a population (``hydra/launcher=population``), as a job of its sweep: a member
    refused before its first step leaves ``summary.json`` with ``status="failed"`` and raises, and the other
    members go on. Its steps are not compiled here: its population compiles those it trains with."""
    return _build(cfg, time.time(), functools.partial(build, member=True))


def train_population(
    trainers: Sequence[Trainer], log_files: Sequence[str | None] | None = None, free_bytes: int | None = None
) -> list[tuple[RunSummary, BaseException | None]]:
    """Train the built members ``trainers`` as one population (:class:`rlchain.run.population.PopulationRun`);
    print each one's result line (or its one-line failure) and return each one's summary and failure.
    ``log_files``: each member's log file (Hydra's job log), which takes its own lines
    (:func:`~rlchain.run.population.member_logs`); None: the logging as it is. ``free_bytes``: the device memory
    the population may plan for (None: what its device has free, :func:`~rlchain.run.population.free_memory`).
    The process keeps the host memory a step frees for the next (:func:`rlchain.run.heap.keep_freed_memory`).

    Raises:
        ConfigError: members that cannot form one population (before any step), naming the setting; each
            member's ``summary.json`` says so.
    """
    from rlchain.run.population import PopulationRun, as_member, member_logs

    keep_freed_memory()
    results = []
    with member_logs(log_files or []):
        try:
            population = PopulationRun(trainers, free_bytes)
        except (ValueError, CompileFailure) as err:  # members that cannot train as one (or whose steps did not
            # compile): each says so in its summary.json, in one line
            error = error_line(str(err))
            for trainer in trainers:
                with contextlib.suppress(OSError):
                    _refusal(error, trainer.cfg.exp_name, trainer.env.device, trainer.cfg.objective, time.time()).write(
                        trainer.output_dir
                    )
            raise ConfigError(error) from err
        sessions = population.train()
        for p, session in enumerate(sessions):
            summary, trainer, failure = session.summary, session.trainer, session.failure
            with as_member(p):
                if failure is None:
                    show(_result_line(summary, trainer))
                else:
                    failure.run_summary = summary
                    show(_failed_line(summary.error, trainer.output_dir, "the traceback is in its summary.json"))
            results.append((summary, failure))
    return results


def _train(cfg: DictConfig) -> RunSummary:
    keep_freed_memory()
    trainer = _build(cfg, time.time())
    try:
        summary = trainer.train()
    except Exception as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if not trainer.world.main:  # rank 0 says what ended the run, and writes it down
            raise RunFailed(f"rlchain: rank {trainer.world.rank} stopped: {error_line(str(err))}") from err
        ended: RunSummary | None = getattr(err, "run_summary", None)
        error = ended.error if ended is not None and ended.error else error_line(err)
        where = "the traceback is in its summary.json" if ended is not None else "no summary.json could be written"
        raise RunFailed(_failed_line(error, trainer.output_dir, where)) from err
    if trainer.world.main:
        show(_result_line(summary, trainer))
    return summary


def _build(cfg: DictConfig, start_time: float, builder: Callable[[DictConfig], Trainer] | None = None) -> Trainer:
    """:func:`build` (or ``builder``); a run refused before its first step leaves its ``summary.json`` as
    :func:`train` says."""
    try:
        return (builder or build)(cfg)
    except Exception as err:
        error = error_line(str(err) if isinstance(err, ConfigError) else err)
        distributed.world().report_failure(error)
        rank = distributed.from_environment()[0]
        if rank > 0:  # rank 0 writes the summary (also before the ranks joined)
            if isinstance(err, CollectiveError):
                raise RunFailed(f"rlchain: rank {rank} stopped: {err}") from err
            raise
        refused = _refusal(error, cfg.get("exp_name"), cfg.device, cfg.trainer.objective, start_time)
        run_dir = Path(cfg.trainer.output_dir)
        if _single_run():  # its one line says it all: the directory Hydra made for it goes (when it holds no run)
            with contextlib.suppress(OSError):
                remove_if_unused(run_dir)
        elif RunSummary.read(run_dir) is None:  # a run refused for its directory leaves the summary it found
            with contextlib.suppress(OSError):  # an unwritable run directory: the error itself is what matters
                refused.write(run_dir)
        if isinstance(err, CollectiveError):  # the ranks did not all join
            raise RunFailed(f"rlchain: failed: {err} | {run_dir}") from err
        raise


def _refusal(error: str, exp_name: str | None, device: Any, objective: str, start_time: float) -> RunSummary:
    """The summary of a run refused before its first step: ``failed``, its one-line ``error`` and the traceback
    being handled."""
    return RunSummary(
        status="failed",
        error=error,
        traceback=traceback.format_exc(),
        exp_name=exp_name,
        **placement(device),
        start_time=start_time,
        end_time=time.time(),
        objective_name=objective,
    )


def _failed_line(error: str, run_dir: Path, where: str) -> str:
    """The one line of a run whose training failed: its error, its directory and ``where`` its traceback is."""
    return f"rlchain: failed: {error} | {run_dir} ({where})"


def _result_line(summary: RunSummary, trainer: Trainer) -> str:
    """The one line a run ends with: what happened, how far it got, its results and where it is."""
    steps = f"{summary.global_step:,} env steps in {summary.elapsed_s:.0f} s"
    if summary.status in ("completed", "pruned"):
        parts = [f"rlchain: {summary.status} {steps}"]
    else:  # stopped by a signal: interrupted or aborted
        parts = [f"rlchain: {summary.status} by {summary.signal} at {steps}"]
    success = summary.final.get("eval/success_rate")  # absent for a task without success
    if success is not None:
        parts.append(f"final eval success rate {success:.3f}")
    if summary.objective_name != "eval/success_rate" and isinstance(summary.objective, (int, float)):
        parts.append(f"{summary.objective_name} {summary.objective:.4g}")
    parts.append(str(trainer.output_dir))
    if summary.status in STOPPED:
        latest = trainer.checkpoints.latest
        resume = f"rlchain-train trainer.resume_from={trainer.output_dir.absolute()}"
        parts.append(f"resume with: {resume}" if latest.exists() else "no checkpoint was written")
    return " | ".join(parts)


def _single_run() -> bool:
    """Whether this is a single run of the command line (not a job of a sweep, nor a call from Python)."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.RUN


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """The errors a user can fix (:class:`ConfigError`, :class:`RunFailed`) as one line and exit status 1.

    In a single run only (a launcher records a job's error with the job), and
    not with ``HYDRA_FULL_ERROR=1`` (which shows the traceback).
    """
    try:
        yield
    except (ConfigError, RunFailed) as err:
        if not _single_run() or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        show(str(err), sys.stderr, logging.ERROR)
        raise SystemExit(1) from None


@hydra.main(version_base="1.3", config_path="pkg://rlchain.conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point: train, and return the run objective for sweepers.

    A run stopped by a signal exits its process with 128 + the signal's
    number (130 for Ctrl-C, 143 for SIGTERM; :attr:`RunSummary.exit_code`),
    so a shell or a scheduler can tell it from a completed run; in a sweep
    that ends the sweep of an in-process launcher (``hydra/launcher=basic``),
    and the devices launcher records the job as stopped. A rejected config or
    a failed training prints its one line and exits 1. In a submitit job
    (``hydra/launcher=slurm``), a run stopped by submitit's time-limit or
    preemption signal is then handed to submitit's handler, which requeues
    the job and exits; the requeued job goes on from its ``latest.pt``.
    """
    with _one_line_errors(), logged_warnings():
        summary = train(cfg)
    requeue = requeue_signal()
    if requeue is not None and summary.signal == requeue.name:
        # The trainer held the signal back until latest.pt and summary.json were
        # written; its handler, submitit's again, requeues the job and exits.
        signal.raise_signal(requeue)
    if distributed.from_environment()[0] > 0 and not in_submitit_job():
        # A rank other than 0 (of torchrun, or of processes started with its variables) has nothing left to
        # write; it leaves without the interpreter's teardown, where a thread of torch.distributed's C++ side,
        # destroyed while joinable, sometimes aborted the process after its run had ended ("terminate called
        # without an active exception": twice in about 60 runs of the tests under load, and once at a stop by
        # SIGTERM of two ranks started without torchrun). A task of submitit returns, so that submitit records
        # its result.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(summary.exit_code if summary.status in STOPPED else 0)
    if summary.status in STOPPED:
        raise SystemExit(summary.exit_code)
    return summary.objective


if __name__ == "__main__":  # python -m rlchain.commands.train; `python -m rlchain` is the whole rlchain-train command
    main()
