"""``python -m <module> <args>`` without paying for the interpreter's imports at every command.

Starting ``rlchain-train`` costs seconds of CPU before it reads its first argument: importing torch, its compiler
(``torch.optim`` imports ``torch._dynamo``), tensordict and Hydra. The suite starts it well over a hundred times.
Each pytest worker therefore starts one server (:class:`ForkServer`, this module run as ``python -m``) that
imports them once and then forks a child per command. The child sets the command's working directory,
environment, ``sys.argv`` and standard streams and runs the module as ``python -m`` does
(``runpy._run_module_as_main``); it then ends as a fresh interpreter would, with the module's exit status, a
traceback for an uncaught exception and the ``atexit`` handlers run. It is a real process: its own pid, signals,
files and subprocesses; what differs from a fresh interpreter is only that its imports were done by its parent.

That holds only while the imports themselves would have come out the same, so a command whose environment differs
from the server's in anything but variables read at run time (:data:`RUNTIME_VARIABLES`) is refused here and
started fresh by :func:`tests.helpers.runs.run_cli` (thread counts, ``MUJOCO_GL`` and ``PYTHONPATH`` are read
when torch, mujoco and the interpreter start).

The protocol is one JSON line each way on the server's stdin and stdout.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: Whether this OS lets a server fork its commands and wait for them with a timeout (Linux).
AVAILABLE = hasattr(os, "fork") and hasattr(os, "pidfd_open")
#: Environment variables that the preloaded libraries read only at run time (pytest sets the last one per test).
RUNTIME_VARIABLES = ("WANDB_", "HYDRA_", "RLCHAIN_TEST_", "PYTEST_CURRENT_TEST")


def _preload() -> None:
    """Import the libraries that every command imports first, and nothing of rlchain's: a child imports rlchain
    (its config schemas, its Hydra plugin) itself, as a fresh interpreter would."""
    import gymnasium  # noqa: F401
    import hydra.main  # noqa: F401
    import rich.console  # noqa: F401
    import tensordict  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.optim imports it at the first optimiser)
    import torch.utils.tensorboard  # noqa: F401


def _run_child(request: dict, preamble: bytes) -> None:
    """In the forked child: become ``python -m <module> <args>`` in the request's directory and environment.

    The module's exceptions (``SystemExit`` included) propagate out of the server's ``__main__``, so the
    interpreter ends this process exactly as it ends a ``python -m`` one.
    """
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, (path, flags) in enumerate(
        [(os.devnull, os.O_RDONLY), (request["stdout"], os.O_WRONLY), (request["stderr"], os.O_WRONLY)]
    ):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    os.write(2, preamble)
    sys.argv = [request["module"], *request["args"]]  # runpy sets argv[0] to the module's file
    sys.path[0] = request["cwd"]  # python -m puts the working directory first
    import runpy

    runpy._run_module_as_main(request["module"], alter_argv=True)


def _wait(pid: int, timeout: float) -> int | None:
    """The child's exit status as ``subprocess`` reports it (``-N``: killed by signal N), or None when it was
    still running after ``timeout`` seconds (it is then killed)."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if ready else None


def serve() -> None:
    """Preload, then answer each request line on stdin with ``{"returncode": int | null}`` on stdout.

    What the imports wrote to stderr (a library's warning) is written again at the start of each child's stderr,
    where a fresh interpreter would have written it.
    """
    saved = os.dup(2)
    with tempfile.TemporaryFile() as imports_stderr:
        os.dup2(imports_stderr.fileno(), 2)
        try:
            _preload()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        imports_stderr.seek(0)
        preamble = imports_stderr.read()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(request, preamble)
            raise SystemExit(0)  # a module that returns ends as python -m does
        print(json.dumps({"returncode": _wait(pid, request["timeout"])}), flush=True)


class ForkServer:
    """A pytest worker's handle on its server, started with ``env`` (the environment its commands share)."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = dict(env)
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__],
            cwd=cwd,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self._proc.stdout.readline()) == {"ready": True}, "the fork server did not start"

    @property
    def alive(self) -> bool:
        """Whether the server is still running."""
        return self._proc.poll() is None

    def close(self) -> None:
        """End the server (it exits at the end of its input)."""
        if self.alive:
            self._proc.stdin.close()
        self._proc.wait(timeout=60)

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a command with environment ``env`` would import the same as the server did."""
        changed = {key for key in env.keys() | self.env.keys() if env.get(key) != self.env.get(key)}
        return all(key.startswith(RUNTIME_VARIABLES) for key in changed)

    def run(
        self, module: str, args: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        """``subprocess.run([python, "-m", module, *args], capture_output=True, text=True, timeout=timeout)``.

        Raises:
            subprocess.TimeoutExpired: the command ran past ``timeout`` seconds (it was killed).
        """
        with self._lock, tempfile.TemporaryDirectory() as streams:
            out, err = Path(streams, "stdout"), Path(streams, "stderr")
            out.touch()
            err.touch()
            request = {"module": module, "args": list(args), "cwd": str(cwd), "env": env, "timeout": timeout}
            self._proc.stdin.write(json.dumps({**request, "stdout": str(out), "stderr": str(err)}) + "\n")
            self._proc.stdin.flush()
            reply = self._proc.stdout.readline()
            assert reply, f"the fork server ended (exit status {self._proc.wait()})"
            returncode = json.loads(reply)["returncode"]
            stdout, stderr = out.read_text(), err.read_text()
        command = [sys.executable, "-m", module, *args]
        if returncode is None:
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(command, returncode, stdout, stderr)


if __name__ == "__main__":
    serve()
