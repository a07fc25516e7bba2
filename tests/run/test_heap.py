"""A training process keeps what a step frees for the next step: tensors of some MB allocated and freed over and
over take no fresh pages (no page faults) once the heap has settled."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

#: Rounds of tensors of 4 to 16 MiB written and freed in a step's pattern (some freed before others are made);
#: prints the minor page faults of rounds 11 to 40. glibc's defaults fault on most of their pages in some
#: processes and on none in others, as the heap happens to lie.
ROUNDS = """
import resource, torch
from rlchain.run.heap import keep_freed_memory
assert keep_freed_memory()
def round_():
    a, b, c = (torch.empty(n << 20).fill_(1.0) for n in (1, 2, 4))
    del b
    d, e = torch.empty(3 << 20).fill_(1.0), torch.empty(4 << 20).fill_(1.0)
    del a, c, d, e
for _ in range(10):
    round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(30):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_tensors_freed_by_one_step_are_reused_by_the_next_without_fresh_pages():
    for _ in range(3):  # three processes, three layouts of the heap
        done = subprocess.run([sys.executable, "-c", ROUNDS], capture_output=True, text=True, check=True)
        assert int(done.stdout) < 1000  # a round writes 14M floats: 14,336 pages
