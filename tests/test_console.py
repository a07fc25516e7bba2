"""What a run shows on its console: the progress line keeps its numbers readable on an 80-column terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from rlchain.console import progress_info
from tests.helpers.runs import subprocess_env

ROW = {"charts/SPS": 45616.0, "charts/episodic_return": 12.345, "charts/success_rate": 0.95, "eval/success_rate": 0.992}


def test_the_progress_numbers_leave_out_the_least_important_first_to_fit():
    assert progress_info(5_120_000, ROW) == (
        "5.12M steps | 45.6k SPS | return 12.35 | success 0.95 | eval success 0.99"
    )
    assert progress_info(5_120_000, ROW, 60) == "5.12M steps | 45.6k SPS | success 0.95 | eval success 0.99"
    assert progress_info(5_120_000, ROW, 54) == "45.6k SPS | success 0.95 | eval success 0.99"
    assert progress_info(5_120_000, ROW, 10) == "45.6k SPS | eval success 0.99"  # what always stays


@pytest.mark.slow
def test_a_run_on_an_80_column_terminal_shows_its_counter_and_numbers_whole(tmp_path):
    """A real run on a pseudo-terminal of 80 columns: the bar's last frame holds the iteration counter, the SPS and
    the evaluation's success rate whole (it had shown ``eval success 0…`` and lost the counter)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = subprocess_env(COLUMNS="80", TERM="xterm")
    args = ["debug=tiny", "trainer.progress=true", "trainer.fresh_eval=false", "hydra.run.dir=run"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlchain", *args],
        cwd=tmp_path,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    frames = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip().startswith("iter ")]
    assert frames, text
    last = frames[-1]
    assert re.fullmatch(r"iter 2/2 .*\d(\.\d+)?k? SPS \| .*eval success \d\.\d\d ETA \d:\d\d:\d\d", last), last
    assert "…" not in last and len(last) <= 80
