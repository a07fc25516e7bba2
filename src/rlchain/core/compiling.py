"""The one seam through which rlchain compiles and captures its hot loops: a :class:`Step`.

A step is a function of no arguments over buffers whose addresses stay from call to call: the collection step
(:class:`~rlchain.core.collector.SyncCollector`: act, env step, the row written) and the minibatch update
(:class:`~rlchain.core.algorithms.update.MinibatchUpdate`: loss, backward, clip, Adam). ``trainer.compile``
compiles each whole with ``torch.compile(fullgraph=True)`` (:meth:`Step.compile`) and runs it once on the run's
own buffers, restoring what that touched; ``trainer.cudagraphs`` then replays each as one CUDA graph
(:meth:`Step.capture`). Where a step cannot compile whole (:attr:`Step.blocker`) a part of it compiles instead.

Nothing else in rlchain calls ``torch.compile`` for training, and the classes users subclass (``Algorithm``,
``VecEnv``, ``Policy``) carry no compiler knowledge. :func:`compile_failure` turns what compiling raised into the
one line a run ends with.

What breaks inductor's Triton backend is kept out of the graphs handed to it: no ``aten._foreach_*`` op (a
foreach copy of push_cube's state became a kernel that Triton 3.6 could not generate with torch 2.11: ``NameError
'in_ptr0 is not defined'`` in ``triton_for_fused_4``). ``tests/core/test_compiling.py`` checks every graph
``trainer.compile`` hands to inductor for that, on the CPU.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["STEP_COMPILE_OPTIONS", "CompileFailure", "Step", "compile_failure", "compile_step"]

#: Inductor's options for a compiled env or collection step: its C++ loops vectorised even where inductor's
#: tiling heuristics would leave them scalar for their strided loads and stores (a step's ``[N, K]`` outputs are
#: written with stride ``K``). CPU code only; benchmarks/README.md has what it buys.
STEP_COMPILE_OPTIONS = {"cpp.enable_tiling_heuristics": False}


def compile_step(fn: Any, backend: str | Callable = "inductor", options: dict[str, Any] | None = None) -> Any:
    """``fn`` compiled whole, as ``trainer.compile`` compiles a step: ``torch.compile(fn, fullgraph=True)`` with
    ``backend`` and, for inductor, ``options`` (:data:`STEP_COMPILE_OPTIONS` when None). The compiled function
    returns what ``fn`` returns, within float rounding.

    Raises:
        torch._dynamo.exc.Unsupported: at the first call, where ``fn`` does not trace whole (a graph break; a
            host read raises dynamo's ``UserError``).
        Exception: what inductor raises at the first call (e.g. ``InductorError`` without a C++ compiler).
    """
    if backend != "inductor":
        return torch.compile(fn, fullgraph=True, backend=backend)
    return torch.compile(fn, fullgraph=True, options=STEP_COMPILE_OPTIONS if options is None else options)


class StepCompileError(RuntimeError):
    """Compiling or warming up :attr:`step` (a :class:`Step`'s name) raised :attr:`cause`."""

    def __init__(self, step: str, cause: BaseException) -> None:
        self.step, self.cause = step, cause
        super().__init__(f"compiling rlchain's {step} failed: {type(cause).__name__}: {cause}")


class Step:
    """A step of no arguments over fixed buffers, run eager, compiled whole, or compiled and captured.

    Call it to run the step in its current :attr:`mode`. :meth:`compile` compiles ``fn`` whole
    (``fullgraph=True``) where :attr:`blocker` is None, else only ``part``, then runs ``warm_up`` once so that
    the step is compiled before training: ``snapshot()`` first and ``restore(snapshot)`` after, under a fork of
    torch's random streams, so the warm-up changes nothing the run keeps. :meth:`capture` then replays the
    compiled step as one CUDA graph (tensordict's ``CudaGraphModule``: its first two calls run eagerly, warm-up
    and capture, and its outputs are copied out of the graph).

    Args:
        name: what the step is, in messages (``"collection step"``, ``"minibatch update"``).
        fn: the eager step; it reads and writes only tensors whose addresses stay (what a CUDA graph replays),
            reads nothing on the host and branches on no tensor's value.
        device: the device of its buffers.
        warm_up: one call that runs the step as training will (e.g. a rollout's first step, or one update).
        snapshot: what ``warm_up`` changes, saved (any object); ``restore`` puts it back, into the same tensors.
        restore: see ``snapshot``.
        blocker: why ``fn`` cannot compile whole, or None.
        part: where ``blocker`` is set, what compiles instead: called with a function that compiles a callable
            (``torch.compile`` with this step's backend), it compiles its part in place; None: nothing compiles.
        autograd: ``fn`` differentiates inside (``torch.autograd.grad``): traced with dynamo's
            ``trace_autograd_ops``, so forward, backward and optimiser step are one graph.
        options: inductor's options for ``fn`` (None: inductor's defaults).

    Attributes:
        mode: ``"eager"``, ``"compiled"`` (whole), ``"part"`` (only ``part`` compiled) or ``"captured"``.
    """

    def __init__(
        self,
        name: str,
        fn: Callable[[], Any],
        device: torch.device,
        *,
        warm_up: Callable[[], Any],
        snapshot: Callable[[], Any],
        restore: Callable[[Any], None],
        blocker: str | None = None,
        part: Callable[[Callable[[Callable], Callable]], None] | None = None,
        autograd: bool = False,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.name, self.fn, self.device = name, fn, torch.device(device)
        self.warm_up, self.snapshot, self.restore = warm_up, snapshot, restore
        self.blocker, self.part, self.autograd, self.options = blocker, part, autograd, options
        self.mode = "eager"
        self._call: Callable[[], Any] = fn

    def __call__(self) -> Any:
        """Run the step once (eager, compiled or replayed); return what ``fn`` returns."""
        return self._call()

    def compile(self, backend: str | Callable = "inductor") -> None:
        """Compile the step (whole, or its ``part`` where :attr:`blocker` says why not) and warm it up.

        Args:
            backend: ``torch.compile``'s backend (inductor for training; tests record what inductor is handed).

        Raises:
            StepCompileError: what compiling or the warm-up raised (dynamo's ``Unsupported`` for a graph break,
                ``InductorError`` for a kernel that could not be generated or built), with the step's name.
            RuntimeError: a step compiled already.
        """
        if self.mode != "eager":
            raise RuntimeError(f"rlchain's {self.name} is compiled already ({self.mode})")

        def compile_part(fn: Callable) -> Callable:
            return torch.compile(fn, backend=backend)

        try:
            if self.blocker is not None:
                if self.part is not None:
                    self.part(compile_part)
                self.mode = "part"
            else:
                compiled = compile_step(self.fn, backend=backend, options=self.options or {})
                self._call = _tracing_autograd(compiled) if self.autograd else compiled
                self.mode = "compiled"
            self._warm_up()
        except Exception as err:
            raise StepCompileError(self.name, err) from err

    def _warm_up(self) -> None:
        saved = self.snapshot()
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                self.warm_up()
        finally:
            self.restore(saved)

    def capture(self) -> None:
        """Replay the compiled step as one CUDA graph from its third call on (the first two: warm-up, capture).

        Raises:
            RuntimeError: a step not compiled whole (naming :attr:`blocker`).
        """
        from tensordict.nn import CudaGraphModule  # imported where used: see rlchain.commands.config

        if self.mode != "compiled":
            raise RuntimeError(f"rlchain's {self.name} is not compiled whole: {self.blocker or self.mode}")
        self._call = CudaGraphModule(self._call, warmup=2, device=self.device)
        self.mode = "captured"


def _tracing_autograd(compiled: Callable[[], Any]) -> Callable[[], Any]:
    """``compiled`` called with dynamo tracing the autograd ops inside it (one graph for forward and backward)."""

    def call() -> Any:
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            return compiled()

    return call


class CompileFailure(RuntimeError):
    """``trainer.compile=true`` failed: the one line a run ends with (see :func:`compile_failure`)."""


#: Exceptions that blame the machine, not rlchain's graph: no C++ compiler, no working Triton.
_MACHINE = {
    "InvalidCxxCompiler": "no working C++ compiler for inductor's CPU backend",
    "TritonMissing": "no working Triton",
}
#: A generated kernel's name (inductor's: ``triton_poi_fused_add_0``, ``triton_for_fused_4``, ``cpp_fused_mul_0``).
_KERNEL = re.compile(r"\b((?:triton|cpp)_(?:[a-z]+_)?fused\w*)")
#: An exception shown as its repr, e.g. ``NameError('in_ptr0 is not defined')``.
_REPR = re.compile(r"\b([A-Z]\w*(?:Error|Exception))\((['\"])(.+?)\2\)")
#: An exception's own line of a traceback, e.g. ``triton.compiler.errors.CompilationError: at 12:11:``.
_LINE = re.compile(r"^\s*(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Unsupported))\b:?\s*(.*)$")


def compile_failure(err: StepCompileError, trace_file: Path | None) -> CompileFailure:
    """The one line of a run whose ``trainer.compile`` failed, naming the step, the innermost cause and, where
    inductor generated it, the kernel; "cannot run here" only where the machine is to blame (no C++ compiler, no
    Triton). The full traceback is written to ``trace_file`` (when given and writable), named in the line.

    E.g. ``trainer.compile=true: Triton could not compile rlchain's collection step (kernel triton_for_fused_4:
    NameError 'in_ptr0 is not defined'); run with trainer.compile=false (full traceback: <run>/compile_error.txt)``.
    """
    chain = _chain(err.cause)
    names = [type(e).__name__ for e in chain]
    text = "\n".join(_text(e) for e in chain)
    kernel = _KERNEL.search(text)
    cause = _innermost(chain)
    machine = next((_MACHINE[name] for name in names if name in _MACHINE), None)
    if machine is not None:
        what = f"cannot run here: {machine} ({cause})"
    elif any(name in ("Unsupported", "UserError") for name in names):
        what = f"rlchain's {err.step} does not compile whole ({cause})"
    else:
        backend = "Triton" if "triton" in text.lower() else "inductor" if "InductorError" in names else "torch.compile"
        where = f"kernel {kernel.group(1)}: {cause}" if kernel else cause
        what = f"{backend} could not compile rlchain's {err.step} ({where})"
    line = f"trainer.compile=true: {what}; run with trainer.compile=false"
    if trace_file is not None:
        try:
            trace_file.parent.mkdir(parents=True, exist_ok=True)
            trace_file.write_text("".join(traceback.format_exception(err.cause)))
            line += f" (full traceback: {trace_file})"
        except OSError:
            pass
    return CompileFailure(line)


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the errors behind it (``inner_exception``, ``__cause__``, ``__context__``), outermost first."""
    chain: list[BaseException] = []
    while err is not None and all(err is not seen for seen in chain):
        chain.append(err)
        err = getattr(err, "inner_exception", None) or err.__cause__ or err.__context__
    return chain


def _text(err: BaseException) -> str:
    """All an error says: its message, and a subprocess's traceback text where inductor's workers raised it."""
    details = getattr(err, "details", None)
    return f"{err}\n{details}" if isinstance(details, str) else str(err)


def _innermost(chain: list[BaseException]) -> str:
    """The innermost cause, short: the last exception shown in the innermost error's text (``NameError
    'in_ptr0 is not defined'``, from a subprocess's traceback), else its type and first line."""
    inner = chain[-1]
    text = _text(inner)
    shown = _REPR.findall(text)
    if shown:
        name, _, message = shown[-1]
        return _short(f"{name} {message!r}")
    lines = [m for m in (_LINE.match(line) for line in text.splitlines()) if m and m.group(2)]
    if lines and type(inner).__name__ in ("SubprocException", "InductorError"):
        return _short(f"{lines[-1].group(1)}: {lines[-1].group(2)}")
    first = next((line.strip() for line in str(inner).splitlines() if line.strip()), "")
    return _short(f"{type(inner).__name__}: {first}" if first else type(inner).__name__)


def _short(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
