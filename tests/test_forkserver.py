"""The suite's fork server (:mod:`tests.helpers.forkserver`) ends a command as a fresh ``python -m`` would."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from tests.helpers import forkserver
from tests.helpers.runs import fork_server, run_cli, subprocess_env

PROBE = textwrap.dedent(
    """
    import atexit, os, signal, sys, threading, time

    import torch

    atexit.register(lambda: print("atexit ran", flush=True))
    print(os.getcwd(), sys.argv[1:], os.environ.get("RLCHAIN_TEST_PROBE"), torch.get_num_threads(), __name__)
    print("to stderr", file=sys.stderr)
    threading.Thread(target=lambda: (time.sleep(0.2), print("a thread finished"))).start()
    how = sys.argv[1]
    if how == "raise":
        raise ValueError("uncaught")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "sleep":
        time.sleep(60)
    if how != "return":
        sys.exit(how if not how.isdigit() else int(how))
    """
)

pytestmark = pytest.mark.skipif(not forkserver.AVAILABLE, reason="no os.fork or os.pidfd_open here")


@pytest.mark.parametrize("how", ["return", "3", "a message", "raise", "kill"])
def test_a_forked_command_ends_as_a_fresh_interpreter_does(tmp_path, how):
    (tmp_path / "probe.py").write_text(PROBE)
    env = subprocess_env(RLCHAIN_TEST_PROBE="set")
    server = fork_server()
    assert server.serves(env)
    forked = server.run("probe", [how], tmp_path, env, timeout=60)
    fresh = subprocess.run(
        [sys.executable, "-m", "probe", how], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert f"{tmp_path} ['{how}'] set {torch.get_num_threads()} __main__" in forked.stdout
    # a traceback names the server's frames where a fresh one has runpy's: the same first and last lines
    lines, fresh_lines = forked.stderr.splitlines(), fresh.stderr.splitlines()
    assert (lines[:2], lines[-1]) == (fresh_lines[:2], fresh_lines[-1])


def test_a_forked_command_past_its_timeout_is_killed(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    server = fork_server()
    with pytest.raises(subprocess.TimeoutExpired):
        server.run("probe", ["sleep"], tmp_path, subprocess_env(), timeout=2)
    assert server.run("probe", ["0"], tmp_path, subprocess_env(), timeout=60).returncode == 0  # still serving


def test_a_command_that_sets_what_an_import_reads_starts_fresh(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    # torch's thread count comes from OMP_NUM_THREADS when torch starts: a forked child would keep the server's
    threads = 2 if torch.get_num_threads() == 1 else 1
    proc = run_cli(["0"], tmp_path, module="probe", OMP_NUM_THREADS=str(threads))
    assert proc.returncode == 0 and f"{tmp_path} ['0'] None {threads} __main__" in proc.stdout


def test_a_server_that_died_is_started_again(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    dead = fork_server()
    dead._proc.kill()
    dead._proc.wait()
    proc = run_cli(["0"], tmp_path, module="probe")
    assert proc.returncode == 0, proc.stderr
    assert fork_server() is not dead and fork_server().alive
