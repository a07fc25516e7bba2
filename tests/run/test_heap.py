"""A training process keeps what a step frees for the next step: blocks of some MB allocated and freed over and
over take no fresh pages (no page faults) once the heap holds them."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

#: Ten 4 MiB blocks (a population's activations' size) written and freed, round after round, with torch loaded;
#: prints the minor page faults of rounds 4 to 13. With ``kept``, under :func:`rlchain.run.heap.keep_freed_memory`.
ROUNDS = """
import ctypes, resource, sys, torch
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
if sys.argv[1] == "kept":
    from rlchain.run.heap import keep_freed_memory
    assert keep_freed_memory()
def round_():
    blocks = [libc.malloc(4 << 20) for _ in range(10)]
    for block in blocks:
        libc.memset(block, 1, 4 << 20)
    for block in blocks:
        libc.free(block)
for _ in range(3):
    round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_blocks_freed_by_one_step_are_reused_by_the_next_without_fresh_pages():
    faults = {
        way: int(subprocess.run([sys.executable, "-c", ROUNDS, way], capture_output=True, text=True, check=True).stdout)
        for way in ("default", "kept")
    }
    pages = 10 * 10 * (4 << 20) // 4096  # every round's blocks on fresh pages
    assert faults["default"] > pages // 2, faults  # glibc's defaults hand the heap's top back every round
    assert faults["kept"] < pages // 100, faults
