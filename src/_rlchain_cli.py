"""The ``rlchain-train``, ``rlchain-eval`` and ``rlchain-export`` commands (``python -m rlchain`` is
``rlchain-train``): a Ctrl-C at any moment of their start-up is one line and exit status 130.

A top-level module, so that nothing of rlchain runs before its ``try``:
importing ``rlchain`` registers the built-in tasks with gymnasium, and
``rlchain.train`` imports torch, Hydra and tensordict, seconds of start-up
during which Python would otherwise answer Ctrl-C with a traceback. Once the
trainer runs, its own handler takes SIGINT (see :mod:`rlchain.stopping`).
"""

from __future__ import annotations

import sys

#: ``rlchain.summary.signal_exit_code("SIGINT")``, which cannot be imported before the ``try``.
SIGINT_EXIT = 130


def train() -> None:
    """Run ``rlchain.train.main``, imported inside the ``try``."""
    try:
        from rlchain.train import main

        main()
    except KeyboardInterrupt:
        print("\nrlchain: interrupted by SIGINT before training started", file=sys.stderr, flush=True)
        raise SystemExit(SIGINT_EXIT) from None


def evaluate() -> None:
    """Run ``rlchain.eval_cli.main`` (``rlchain-eval``); Ctrl-C at any moment is one line and exit status 130."""
    try:
        from rlchain.eval_cli import main

        code = main()
    except KeyboardInterrupt:
        print("\nrlchain-eval: interrupted by SIGINT", file=sys.stderr, flush=True)
        raise SystemExit(SIGINT_EXIT) from None
    raise SystemExit(code)


def export() -> None:
    """Run ``rlchain.export.main`` (``rlchain-export``); Ctrl-C at any moment is one line and exit status 130."""
    try:
        from rlchain.export import main

        code = main()
    except KeyboardInterrupt:
        print("\nrlchain-export: interrupted by SIGINT", file=sys.stderr, flush=True)
        raise SystemExit(SIGINT_EXIT) from None
    raise SystemExit(code)
