"""The ``rlchain-train``, ``rlchain-eval`` and ``rlchain-export`` commands (``python -m rlchain`` is
``rlchain-train``): a Ctrl-C at any moment of their start-up is one line and exit status 130.

A top-level module, so that nothing of rlchain runs before its ``try``:
importing ``rlchain`` registers the built-in tasks with gymnasium, and
``rlchain.commands.train`` imports torch, Hydra and tensordict, seconds of start-up
during which Python would otherwise answer Ctrl-C with a traceback. Once the
trainer runs, its own handler takes SIGINT (see :mod:`rlchain.run.stopping`).

Each command freezes the objects still alive when it ends (:func:`gc.freeze`):
Python's exit then skips its last garbage collection over them (torch's modules
and the ``torch._dynamo`` that ``torch.optim`` imports; benchmarks/README.md
says what that saves). Nothing is lost by it: the commands close their own
files, and ``atexit`` handlers (logging's flush among them) still run.
"""

from __future__ import annotations

import gc
import importlib
import sys

#: ``rlchain.run.summary.signal_exit_code("SIGINT")``, which cannot be imported before the ``try``.
SIGINT_EXIT = 130


def train() -> None:
    """Run ``rlchain.commands.train.main``, imported inside the ``try``, once the command line's keys are known to exist.

    An override of a key that the config lacks is one line and exit status 1
    (:func:`rlchain.commands.command_line.unknown_keys`), before Hydra runs the command.
    """
    try:
        from rlchain.commands.command_line import unknown_keys
        from rlchain.commands.train import main

        unknown = unknown_keys(sys.argv[1:])
        if unknown:
            print("\n".join(unknown), file=sys.stderr, flush=True)
            raise SystemExit(1)
        main()
    except KeyboardInterrupt:
        print("\nrlchain: interrupted by SIGINT before training started", file=sys.stderr, flush=True)
        raise SystemExit(SIGINT_EXIT) from None
    finally:
        gc.freeze()


def evaluate() -> None:
    """``rlchain-eval``: run ``rlchain.commands.eval.main``, imported inside the ``try``."""
    _command("rlchain.commands.eval", "rlchain-eval")


def export() -> None:
    """``rlchain-export``: run ``rlchain.commands.export.main``, imported inside the ``try``."""
    _command("rlchain.commands.export", "rlchain-export")


def _command(module: str, prog: str) -> None:
    """Import ``module`` and exit with what its ``main()`` returns; Ctrl-C at any moment is one line and 130."""
    try:
        code = importlib.import_module(module).main()
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted by SIGINT", file=sys.stderr, flush=True)
        raise SystemExit(SIGINT_EXIT) from None
    finally:
        gc.freeze()
    raise SystemExit(code)
