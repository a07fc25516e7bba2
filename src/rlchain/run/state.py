"""A run's state: the one record of how far a run got, and the checkpoint composed from it and its components.

:class:`RunState` is a run's own mutable state (where it lives, its step count, what it last logged, its W&B run,
where its policy came from, ...). A :class:`~rlchain.run.trainer.Trainer` holds one and alone changes it while it
trains; :func:`rlchain.run.starting.start` chooses where a run starts and returns the state it starts from. Each
component keeps its own state (policy, algorithm, collector, env, the episode window, the evaluator's and the
objective's bests), and :class:`RunParts` names them. A checkpoint composes what each one's ``state_dict()``
returns with the run's state (:func:`run_state`, every rank of a multi-process run taking part), and
:func:`restore` hands each its own back, as rsl_rl's runner delegates its ``save`` and ``load`` to its algorithm.

The checkpoint's keys: ``policy``, ``algorithm``, this rank's own part (``collector``, ``algorithm_rank``, ``env``,
``torch_rng``, ``cuda_rng`` on a CUDA machine, ``action_rng`` for a policy that draws its action noise from a
counter stream; :func:`rank_state`), ``episodes``, ``global_step``, ``iteration``,
``best_success``, ``best_step``, ``best_objective``, ``best_objective_step``, ``best_objective_id``,
``last_train``, ``last_eval``, ``config``, ``wandb_id``; in a multi-process run also ``world_size`` and ``ranks``
(the other ranks' own parts, rank 1 first).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlchain.console import notice
from rlchain.core.algorithms.base import Algorithm, NonFiniteError, first_non_finite
from rlchain.core.collector import EpisodeWindow, SyncCollector
from rlchain.core.envs.base import VecEnv
from rlchain.core.policies import Policy
from rlchain.distributed import World
from rlchain.run.checkpoint import Checkpoints
from rlchain.run.evaluator import Evaluator
from rlchain.run.objective import Objective
from rlchain.utils import to_device

__all__ = ["RunParts", "RunState", "checked_state", "rank_state", "restore", "run_state", "save_best"]


@dataclass
class RunState:
    """A run's own mutable state, beside its components' (see the module docstring).

    Attributes:
        output_dir: the run directory (on a rank other than 0 of a multi-process run: rank 0's, once started).
        checkpoints: its ``checkpoints/`` (``latest.pt``, ``best.pt``).
        global_step: env transitions so far, every rank's counted.
        iteration: collect-and-update iterations so far.
        last_train: the row the latest iteration logged (``losses/*``, ``charts/*``, ``time/*``, ...).
        wandb_id: the run's W&B run id, so that a resumed run continues that W&B run; None before W&B started.
        init_from: the checkpoint the policy started from (``trainer.init_from``), else None.
        compile_s: seconds compiling took before the first step (``compile``), until the first row logs it as
            ``time/compile_s``; None without compiling, or once logged.
        best_fresh: the fresh-seed score of ``best.pt`` once a completed run computed it (``fresh_eval``), else None.
        pruned: whether the study's pruner pruned the run's trial.
        started: whether :func:`rlchain.run.starting.start` chose the start (fresh, resumed or from another
            run's policy, compiled).
    """

    output_dir: Path
    checkpoints: Checkpoints
    global_step: int = 0
    iteration: int = 0
    last_train: dict[str, float] = field(default_factory=dict)
    wandb_id: str | None = None
    init_from: str | None = None
    compile_s: float | None = None
    best_fresh: dict[str, Any] | None = None
    pruned: bool = False
    started: bool = False

    @classmethod
    def new(cls, output_dir: str | Path, world: World) -> RunState:
        """The state of a run not started yet, written into ``output_dir`` (rank 0 alone writes its checkpoints;
        creating them removes the temporary files of a save cut short there, :class:`Checkpoints`)."""
        output_dir = Path(output_dir)
        return cls(output_dir, Checkpoints(output_dir / "checkpoints", writer=world.main))


@dataclass(frozen=True)
class RunParts:
    """The components of a run whose own state a checkpoint holds, each with ``state_dict``/``load_state_dict``.

    Attributes:
        env: the training env (its episodes, where it restores them: ``resumes_episodes``).
        policy: the policy (weights, observation normaliser).
        algorithm: the algorithm (optimiser, schedule, reference policy; ``rank_state_dict`` for its envs).
        collector: the collector (the observation in progress, recurrent states, episode counters).
        episodes: the window the ``charts/episodic_*`` statistics average.
        evaluator: rank 0's evaluations (``best_success``, ``last``; no env elsewhere).
        objective: the run objective and its best evaluation (``best``).
    """

    env: VecEnv
    policy: Policy
    algorithm: Algorithm
    collector: SyncCollector
    episodes: EpisodeWindow
    evaluator: Evaluator
    objective: Objective


def rank_state(parts: RunParts) -> dict[str, Any]:
    """This rank's own part of a checkpoint: its collector, its env, what the algorithm keeps of its envs
    (PPO's discounted returns with ``reward_norm``) and its random streams."""
    state = {
        "collector": parts.collector.state_dict(),
        "algorithm_rank": parts.algorithm.rank_state_dict(),
        "env": parts.env.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    action_rng = getattr(parts.policy, "action_rng", None)
    if action_rng is not None:
        state["action_rng"] = action_rng.state_dict()
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def run_state(state: RunState, parts: RunParts, world: World, config: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint of the run (its keys: the module docstring), ``config`` being its composed configuration;
    None on a rank other than 0.

    What each rank has of its own (:func:`rank_state`) is rank 0's at the top
    level and every other rank's in ``ranks`` (rank 1 first), with
    ``world_size``; every rank calls this (a gather).

    Raises:
        CollectiveError: a multi-process run whose ranks do not all take part.
    """
    own = rank_state(parts)
    if world.distributed:
        others = world.gather(to_device(own, "cpu"), "the gather of the ranks' states for the checkpoint")
        if not world.main:
            return None
    checkpoint = {
        "policy": parts.policy.state_dict(),
        "algorithm": parts.algorithm.state_dict(),
        **own,
        "episodes": parts.episodes.state_dict(),
        "global_step": state.global_step,
        "iteration": state.iteration,
        "best_success": parts.evaluator.best_success.value,
        "best_step": parts.evaluator.best_success.step,
        "best_objective": parts.objective.best.value,
        "best_objective_step": parts.objective.best.step,
        "best_objective_id": parts.objective.best.id,
        "last_train": state.last_train,
        "last_eval": parts.evaluator.last,
        "config": config,
        "wandb_id": state.wandb_id,
    }
    if world.distributed:
        checkpoint.update(world_size=world.world_size, ranks=others[1:])
    return checkpoint


def checked_state(state: RunState, parts: RunParts, world: World, config: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`run_state`, refused when a policy parameter or buffer is not finite (None on ranks but 0).

    Raises:
        NonFiniteError: a policy parameter or buffer (e.g. the observation
            normaliser's statistics) is NaN or infinite.
    """
    checkpoint = run_state(state, parts, world, config)
    bad = first_non_finite(dict(parts.policy.state_dict()))
    if bad is not None:
        raise NonFiniteError(f"policy {bad[0]}", bad[1], state.iteration)
    return checkpoint


def save_best(state: RunState, parts: RunParts, world: World, config: dict[str, Any], value: float) -> Path | None:
    """Take ``value`` as the objective's best and write ``best.pt`` (and ``latest.pt``) with it.

    The best stays as it was when the checkpoints cannot be written (a
    full disk, a second stop signal), so that ``summary.json`` never names a
    best that no ``best.pt`` holds. In a multi-process run every rank
    calls it (each sends its state); rank 0 alone keeps the best and writes.

    Raises:
        NonFiniteError: see :func:`checked_state`; nothing is written.
        OSError: a checkpoint cannot be written (the previous ones stay).
    """
    if not world.main:
        checked_state(state, parts, world, config)
        return None
    best = parts.objective.best
    previous = best.state_dict()
    best.take(value, state.global_step)
    try:
        return state.checkpoints.save_best(checked_state(state, parts, world, config))
    except BaseException:
        best.load_state_dict(previous)
        raise


def restore(
    checkpoint: dict[str, Any], path: str | Path, state: RunState, parts: RunParts, world: World
) -> tuple[RunState, bool]:
    """Hand each component its own part of ``checkpoint`` (read from ``path``) and return the run's ``state`` with
    the checkpoint's step count, last row and W&B run, and whether the envs went on with their episodes.

    With an env that does not restore its episodes
    (:attr:`~rlchain.core.envs.base.VecEnv.resumes_episodes`), or a checkpoint
    without env state, the collector starts afresh instead of acting on
    the saved observation: every env is reset before the next rollout and
    no episode is carried over. The same happens for a checkpoint of a run
    with another number of processes (``world_size``), whose envs were
    not these. ``best.pt`` is made the checkpoint of the best evaluation
    the checkpoint records (:meth:`Checkpoints.align_best`, rank 0).

    Returns:
        ``(state, exact)``: ``exact`` is True when the env went on with its episodes (an exact resume).

    Raises:
        ValueError: env state of another env (see the env's ``load_state_dict``).
        OSError: ``best.pt`` cannot be written or removed.
    """
    parts.policy.load_state_dict(checkpoint["policy"])
    parts.algorithm.load_state_dict(checkpoint["algorithm"])
    saved_world = checkpoint.get("world_size", 1)
    own = None
    if saved_world == world.world_size:
        own = checkpoint if world.rank == 0 else checkpoint["ranks"][world.rank - 1]
    else:
        notice(
            f"{path} was saved by a run of {saved_world} process(es) and this one has {world.world_size}: "
            "policy, optimiser, observation statistics and step count go on; every env is reset "
            "(episodes in progress at the checkpoint are dropped) and each rank's random stream starts "
            "from its seed"
        )
    exact = False
    if own is not None:
        parts.collector.load_state_dict(own["collector"])
        if "env" in own:
            parts.env.load_state_dict(own["env"])
        exact = "env" in own and parts.env.resumes_episodes
        if exact:  # the envs go on with their episodes, and so do the returns the algorithm carries for them
            parts.algorithm.load_rank_state_dict(own.get("algorithm_rank", {}))
        torch.set_rng_state(own["torch_rng"].cpu())
        action_rng = getattr(parts.policy, "action_rng", None)
        if action_rng is not None and "action_rng" in own:
            action_rng.load_state_dict(own["action_rng"])
        if "cuda_rng" in own and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in own["cuda_rng"]])
    if not exact:
        parts.collector.restart()
    parts.episodes.load_state_dict(checkpoint["episodes"])
    evaluator, objective = parts.evaluator, parts.objective
    evaluator.best_success.load_state_dict({"value": checkpoint["best_success"], "step": checkpoint["best_step"]})
    objective.best.load_state_dict(
        {
            "value": checkpoint.get("best_objective"),
            "step": checkpoint.get("best_objective_step"),
            "id": checkpoint.get("best_objective_id"),
        }
    )
    evaluator.last = checkpoint.get("last_eval", {})
    objective.resolve(evaluator.last)
    if world.main and not state.checkpoints.align_best(checkpoint, path):
        notice(
            f"the best evaluation of {path} (global_step {objective.best.step:,}) has no checkpoint "
            "there or here: best.pt starts afresh"
        )
        objective.best.load_state_dict({})
    state = dataclasses.replace(
        state,
        global_step=checkpoint["global_step"],
        iteration=checkpoint["iteration"],
        last_train=checkpoint.get("last_train", {}),
        wandb_id=checkpoint.get("wandb_id"),
    )
    return state, exact
