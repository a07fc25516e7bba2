"""Starting a run before its first step: afresh, from its own checkpoint (resume), or from another run's policy.

:func:`start` chooses where a run starts and returns the :class:`~rlchain.run.state.RunState` it starts from; a
:class:`~rlchain.run.trainer.Trainer` calls it from :meth:`~rlchain.run.trainer.Trainer.start` (rlchain-train's
:func:`rlchain.commands.train.build` does once the trainer is built, as rsl_rl's launching script calls its
runner's ``load``; :meth:`Trainer.train` where nobody did). What happens:

* ``resume_from`` (a checkpoint, a run directory, or ``auto``: the run
  directory's own ``latest.pt`` when there is one): every component takes its
  part of the checkpoint (:func:`rlchain.run.state.restore`) and the step count
  goes on;
* ``init_from`` (a checkpoint or a run directory's ``latest.pt``): the policy
  alone starts from it, with a fresh optimiser and step count;
* neither: a fresh start, refused in an ``output_dir`` that holds a run.

In a multi-process run rank 0 alone reads the files and sends what it read
to every rank; a fresh start sends rank 0's initial policy. With
``compile`` the collection step and the minibatch update are compiled last,
before the first step.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from rlchain.console import notice
from rlchain.core.algorithms.update import update_step
from rlchain.core.compiling import Step, StepCompileError, compile_failure
from rlchain.distributed import World
from rlchain.run.checkpoint import Checkpoints, check_state_matches, checkpoint_of, load_checkpoint
from rlchain.run.run_dir import taken
from rlchain.run.state import RunParts, RunState, restore
from rlchain.run.stopping import in_submitit_job
from rlchain.settings import SettingError
from rlchain.utils import to_device

__all__ = ["compile_steps", "start"]


def start(
    state: RunState,
    parts: RunParts,
    world: World,
    *,
    resume_from: str | None = None,
    init_from: str | None = None,
    compile: bool = False,
    cudagraphs: bool = False,
) -> RunState:
    """Resume, start the policy from another run (``init_from``), or start afresh; then compile (``compile``).

    Args:
        state: the run's state before its start (:meth:`RunState.new`: where it writes); returned as it is when
            it has started already.
        parts: the components, which take their start in place (the checkpoint's states, or ``init_from``'s
            policy; compiled with ``compile``).
        world: the run's processes (:func:`rlchain.distributed.world`).
        resume_from: the checkpoint or run to resume (``trainer.resume_from``; ``auto``: ``output_dir``'s own).
        init_from: the checkpoint or run the policy starts from (``trainer.init_from``), where not resuming.
        compile: compile the collection step and the minibatch update (``trainer.compile``).
        cudagraphs: replay them as CUDA graphs (``trainer.cudagraphs``).

    Returns:
        The state the run starts from (``started``): the checkpoint's step count, last row and W&B run for a
        resume, ``init_from`` for a policy started from another run, ``compile_s`` where compiled; on a rank
        other than 0 of a multi-process run, rank 0's ``output_dir``.

    Raises:
        SettingError: an ``output_dir`` that holds another run while not
            resuming; a ``resume_from`` or ``init_from`` that does not exist,
            is not an rlchain checkpoint or holds a policy that does not match
            the trainer's (naming the parameters and shapes); ``cudagraphs=True`` where capture cannot apply;
            all before any step.
        CompileFailure: ``compile=True`` where compiling fails (:func:`_compile`), before any step.
        CollectiveError: a multi-process run whose ranks do not all take part.
    """
    if state.started:
        return state
    source = None
    if world.main:
        resume = _resume_source(resume_from, state.output_dir, state.checkpoints)
        if resume is not None:
            source = ("resume_from", str(resume), _read(resume, "resume_from", parts, world))
        elif init_from is not None:
            path = checkpoint_of(init_from, "init_from")
            source = ("init_from", str(path), _read(path, "init_from", parts, world))
    if world.distributed:
        shared = world.share((str(state.output_dir), source), "the broadcast of the run's start")
        output_dir, source = Path(shared[0]), shared[1]
        state = dataclasses.replace(
            state, output_dir=output_dir, checkpoints=Checkpoints(output_dir / "checkpoints", writer=world.main)
        )
        if source is not None:
            source = (source[0], source[1], to_device(source[2], parts.env.device))
    if source is None:
        if world.distributed:
            world.broadcast_(parts.policy.state_dict().values(), "the broadcast of the initial policy")
            parts.algorithm.reset_reference()
    elif source[0] == "resume_from":
        state, exact = restore(source[2], source[1], state, parts, world)
        restart = (
            ""
            if exact or source[2].get("world_size", 1) != world.world_size
            else (
                f"; {type(parts.env).__name__} cannot restore its state: every env reset "
                "(episodes in progress at the checkpoint are dropped)"
            )
        )
        notice(f"resumed from {source[1]} at iteration {state.iteration} (global_step {state.global_step:,}){restart}")
    else:
        _init_policy(parts, source[2], source[1])
        state = dataclasses.replace(state, init_from=source[1])
    compile_s = None
    if compile or cudagraphs:
        steps = (parts.collector.step, update_step(parts.algorithm, parts.collector.buffer.data))
        compile_s = compile_steps(steps, parts.env.device, compile, cudagraphs, state.output_dir)
    return dataclasses.replace(state, compile_s=compile_s, started=True)


def compile_steps(
    steps: tuple[Step, ...], device: torch.device, compile: bool, cudagraphs: bool, output_dir: Path
) -> float | None:
    """``trainer.compile`` and ``trainer.cudagraphs`` applied to a run's steps (its collection step and minibatch
    update; a population's): capture checked (:func:`_check_capture`), each step compiled, then captured; the
    seconds it took, or None without ``compile``.

    Raises:
        SettingError: ``cudagraphs`` where capture cannot apply, naming why, before anything compiles.
        CompileFailure: see :func:`_compile`.
    """
    if cudagraphs:
        _check_capture(steps, device, compile)
    return _compile(steps, cudagraphs, output_dir) if compile else None


def _init_policy(parts: RunParts, checkpoint: dict[str, Any], path: str | Path) -> None:
    """Take the policy (weights and observation normaliser) of ``checkpoint`` (read from ``path``) as the run's
    start. Only the policy is taken: optimiser, step count and collector start fresh, and the algorithm re-takes
    its reference policy from the loaded one (GRPO's KL anchor,
    :meth:`~rlchain.core.algorithms.Algorithm.reset_reference`)."""
    parts.policy.load_state_dict(checkpoint["policy"])
    parts.algorithm.reset_reference()
    notice(f"policy initialised from {path} (trained for {checkpoint['global_step']:,} env steps there)")


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


def _read(path: str | Path, name: str, parts: RunParts, world: World) -> dict[str, Any]:
    """Read the checkpoint at ``path`` and check that its policy fits ``parts.policy`` (on the CPU in a
    multi-process run, whose rank 0 sends it to the others).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        SettingError: ``<name>=...``: not an rlchain checkpoint, or a policy
            whose names or shapes differ from this run's (naming them).
    """
    device = "cpu" if world.distributed else parts.env.device
    checkpoint = load_checkpoint(path, map_location=device, name=name)
    check_state_matches(parts.policy, checkpoint["policy"], name, path)
    return checkpoint


def _check_capture(steps: tuple[Step, ...], device: torch.device, compile: bool) -> None:
    """Refuse ``cudagraphs=True`` where capture cannot apply, in one line naming why.

    Raises:
        SettingError: without ``compile``, off CUDA, or a step that cannot compile whole (an env whose step does
            not compile, a recurrent policy, a multi-process run), naming the step's reason.
    """
    why = (
        "it replays the compiled steps: expected trainer.compile=true with it"
        if not compile
        else f"CUDA graphs need a CUDA device, and the run's is {device}"
        if device.type != "cuda"
        else next((step.blocker for step in steps if step.blocker is not None), None)
    )
    if why is not None:
        raise SettingError("cudagraphs", True, f" cannot apply here: {why}; expected false")


def _compile(steps: tuple[Step, ...], cudagraphs: bool, output_dir: Path) -> float:
    """Compile each step (``compile``: :meth:`~rlchain.core.compiling.Step.compile`), and with ``cudagraphs``
    capture each as one CUDA graph; return the seconds it took.

    Raises:
        CompileFailure: compiling failed: one line naming the step, the innermost cause and the kernel, with the
            full traceback in ``output_dir/compile_error.txt`` (:func:`~rlchain.core.compiling.compile_failure`),
            before any step.
    """
    began = time.perf_counter()
    try:
        for step in steps:
            step.compile()
    except StepCompileError as err:
        raise compile_failure(err, output_dir / "compile_error.txt") from None
    if cudagraphs:
        for step in steps:
            step.capture()
    seconds = time.perf_counter() - began
    what = " and ".join(
        f"the {step.name}" + ("" if step.mode in ("compiled", "captured") else f"'s {_PARTS[step.name]}")
        for step in steps
    )
    notice(f"compiled {what}{' (CUDA graphs)' if cudagraphs else ''} in {seconds:.1f} s (time/compile_s)")
    return seconds


#: What compiles of a step that cannot compile whole.
_PARTS = {"collection step": "acting forward pass", "minibatch update": "loss"}
