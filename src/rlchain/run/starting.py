"""Starting a run before its first step: afresh, from its own checkpoint (resume), or from another run's policy.

The entry that builds a :class:`~rlchain.run.trainer.Trainer` calls :func:`start`
on it (rlchain-train's :func:`rlchain.commands.train.build`), as rsl_rl's launching
script calls its runner's ``load``; :meth:`Trainer.train` starts a trainer
that nobody started. What happens:

* ``resume_from`` (a checkpoint, a run directory, or ``auto``: the run
  directory's own ``latest.pt`` when there is one): the trainer takes the
  checkpoint's state (what :meth:`Trainer.state_dict` saved) and its step
  count goes on;
* ``init_from`` (a checkpoint or a run directory's ``latest.pt``): the policy
  alone starts from it, with a fresh optimiser and step count;
* neither: a fresh start, refused in an ``output_dir`` that holds a run.

In a multi-process run rank 0 alone reads the files and sends what it read
to every rank; a fresh start sends rank 0's initial policy. With
``compile`` the acting forward pass and the update's loss are compiled last,
before the first step.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rlchain.console import notice
from rlchain.run.checkpoint import Checkpoints, check_state_matches, checkpoint_of, load_checkpoint
from rlchain.run.run_dir import taken
from rlchain.run.stopping import in_submitit_job
from rlchain.settings import SettingError
from rlchain.utils import to_device

__all__ = ["start"]


def start(trainer: Any) -> None:
    """Resume, start the policy from another run (``init_from``), or start afresh; then compile (``compile``).

    ``trainer`` is a :class:`~rlchain.run.trainer.Trainer` (not imported here: the trainer starts itself with this
    function where its entry did not).

    A trainer is started once: a second call does nothing.

    Raises:
        SettingError: an ``output_dir`` that holds another run while not
            resuming; a ``resume_from`` or ``init_from`` that does not exist,
            is not an rlchain checkpoint or holds a policy that does not match
            the trainer's (naming the parameters and shapes); ``compile=True``
            where compiling fails; all before any step.
        CollectiveError: a multi-process run whose ranks do not all take part.
    """
    if trainer.started:
        return
    world, cfg = trainer.world, trainer.cfg
    source = None
    if world.main:
        resume_from = _resume_source(cfg.resume_from, trainer.output_dir, trainer.checkpoints)
        if resume_from is not None:
            source = ("resume_from", str(resume_from), _read(trainer, resume_from, "resume_from"))
        elif cfg.init_from is not None:
            path = checkpoint_of(cfg.init_from, "init_from")
            source = ("init_from", str(path), _read(trainer, path, "init_from"))
    if world.distributed:
        shared = world.share((str(trainer.output_dir), source), "the broadcast of the run's start")
        trainer.output_dir, source = Path(shared[0]), shared[1]
        trainer.checkpoints = Checkpoints(trainer.output_dir / "checkpoints", writer=world.main)
        if source is not None:
            source = (source[0], source[1], to_device(source[2], trainer.env.device))
    if source is None:
        if world.distributed:
            world.broadcast_(trainer.policy.state_dict().values(), "the broadcast of the initial policy")
            trainer.algorithm.reset_reference()
    elif source[0] == "resume_from":
        exact = _restore(trainer, source[2], source[1])
        restart = (
            ""
            if exact or source[2].get("world_size", 1) != world.world_size
            else (
                f"; {type(trainer.env).__name__} cannot restore its state: every env reset "
                "(episodes in progress at the checkpoint are dropped)"
            )
        )
        notice(
            f"resumed from {source[1]} at iteration {trainer.iteration} (global_step {trainer.global_step:,}){restart}"
        )
    else:
        _init_policy(trainer, source[2], source[1])
    if cfg.compile:
        trainer.compile_s = _compile(trainer)
    trainer.started = True


def _restore(trainer: Any, state: dict[str, Any], path: str | Path) -> bool:
    """Take the checkpoint ``state`` (read from ``path``) as the trainer's: training goes on with its step count.

    With an env that does not restore its episodes
    (:attr:`~rlchain.core.envs.base.VecEnv.resumes_episodes`), or a checkpoint
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
    trainer.policy.load_state_dict(state["policy"])
    trainer.algorithm.load_state_dict(state["algorithm"])
    saved_world = state.get("world_size", 1)
    own = None
    if saved_world == trainer.world.world_size:
        own = state if trainer.world.rank == 0 else state["ranks"][trainer.world.rank - 1]
    else:
        notice(
            f"{path} was saved by a run of {saved_world} process(es) and this one has {trainer.world.world_size}: "
            "policy, optimiser, observation statistics and step count go on; every env is reset "
            "(episodes in progress at the checkpoint are dropped) and each rank's random stream starts "
            "from its seed"
        )
    exact = False
    if own is not None:
        trainer.collector.load_state_dict(own["collector"])
        if "env" in own:
            trainer.env.load_state_dict(own["env"])
        exact = "env" in own and trainer.env.resumes_episodes
        if exact:  # the envs go on with their episodes, and so do the returns the algorithm carries for them
            trainer.algorithm.load_rank_state_dict(own.get("algorithm_rank", {}))
        torch.set_rng_state(own["torch_rng"].cpu())
        if "cuda_rng" in own and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in own["cuda_rng"]])
    if not exact:
        trainer.collector.restart()
    trainer.episodes.load_state_dict(state["episodes"])
    trainer.global_step, trainer.iteration = state["global_step"], state["iteration"]
    trainer.evaluator.best_success.load_state_dict({"value": state["best_success"], "step": state["best_step"]})
    trainer.objective.best.load_state_dict(
        {
            "value": state.get("best_objective"),
            "step": state.get("best_objective_step"),
            "id": state.get("best_objective_id"),
        }
    )
    trainer.last_train, trainer.evaluator.last = state.get("last_train", {}), state.get("last_eval", {})
    trainer.wandb_id = state.get("wandb_id")
    trainer.objective.resolve(trainer.evaluator.last)
    if trainer.world.main and not trainer.checkpoints.align_best(state, path):
        notice(
            f"the best evaluation of {path} (global_step {trainer.objective.best.step:,}) has no checkpoint "
            "there or here: best.pt starts afresh"
        )
        trainer.objective.best.load_state_dict({})
    return exact


def _init_policy(trainer: Any, state: dict[str, Any], path: str | Path) -> None:
    """Take the policy (weights and observation normaliser) of the checkpoint ``state`` (read from ``path``) as
    the trainer's start. Only the policy is taken: optimiser, step count and collector start fresh, and the
    algorithm re-takes its reference policy from the loaded one (GRPO's KL anchor,
    :meth:`~rlchain.core.algorithms.Algorithm.reset_reference`)."""
    trainer.policy.load_state_dict(state["policy"])
    trainer.algorithm.reset_reference()
    trainer.init_from = str(path)
    notice(f"policy initialised from {path} (trained for {state['global_step']:,} env steps there)")


def _resume_source(resume_from: str | None, output_dir: Path, checkpoints: Checkpoints) -> Path | None:
    """The checkpoint a run resumes from, or None for a fresh start (refused in a directory that holds a run).

    ``resume_from`` None is ``auto`` in a job of submitit, so that a requeued job goes on from its own ``latest.pt``.

    Raises:
        SettingError: a fresh start in an ``output_dir`` that holds a run; a ``resume_from`` that names neither
            a checkpoint nor a run directory with ``checkpoints/latest.pt``.
    """
    if resume_from is None and in_submitit_job():
        resume_from = "auto"  # a requeued job goes on from its own latest.pt
    if resume_from is None:
        reason = taken(output_dir)
        if reason is not None:
            raise SettingError("output_dir", str(output_dir), reason)
        return None
    if resume_from == "auto":
        return checkpoints.latest if checkpoints.latest.is_file() else None
    return checkpoint_of(resume_from, "resume_from")


def _read(trainer: Any, path: str | Path, name: str) -> dict[str, Any]:
    """Read the checkpoint at ``path`` and check that its policy fits the trainer's (on the CPU in a multi-process
    run, whose rank 0 sends it to the others).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        SettingError: ``<name>=...``: not an rlchain checkpoint, or a policy
            whose names or shapes differ from this run's (naming them).
    """
    device = "cpu" if trainer.world.distributed else trainer.env.device
    state = load_checkpoint(path, map_location=device, name=name)
    check_state_matches(trainer.policy, state["policy"], name, path)
    return state


def _compile(trainer: Any) -> float:
    """Compile the trainer's acting forward pass and minibatch loss (``compile``); return the seconds it took.

    Raises:
        SettingError: ``compile=True`` where compiling fails (no C++ compiler for the CPU backend, an op
            torch cannot compile), with the cause on the same line, before any step.
    """
    began = time.perf_counter()
    try:
        trainer.collector.compile()
        trainer.algorithm.compile(trainer.collector.buffer.data)
    except Exception as err:  # noqa: BLE001 - torch's compiler raises many kinds; each becomes this one line
        cause = " ".join(str(err).split("\n")[0].split()) or type(err).__name__
        raise SettingError(
            "compile", True, f" cannot run here: {type(err).__name__}: {cause[:300]}; expected false (eager PyTorch)"
        ) from None
    seconds = time.perf_counter() - began
    notice(f"compiled the acting forward pass and the update's loss in {seconds:.1f} s (time/compile_s)")
    return seconds
