"""The ``rlchain-train`` command: a Ctrl-C at any moment of its start-up ends in one line and exit status 130.

A top-level module, so that nothing of rlchain runs before its ``try``:
importing ``rlchain`` registers the built-in tasks with gymnasium, and
``rlchain.train`` imports torch, Hydra and tensordict, seconds of start-up
during which Python would otherwise answer Ctrl-C with a traceback. Once the
trainer runs, its own handler takes SIGINT (see :mod:`rlchain.stopping`).
"""

from __future__ import annotations

import sys
from typing import Callable

#: ``rlchain.summary.signal_exit_code("SIGINT")``, which cannot be imported before the ``try``.
SIGINT_EXIT = 130


def train(main: Callable[[], object] | None = None) -> None:
    """Run ``rlchain.train.main`` (or ``main``), importing it inside the ``try``."""
    try:
        if main is None:
            from rlchain.train import main
        main()
    except KeyboardInterrupt:
        print("\nrlchain: interrupted by SIGINT before training started", file=sys.stderr, flush=True)
        raise SystemExit(SIGINT_EXIT) from None
