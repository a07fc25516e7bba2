"""The host heap of a training process: what a step frees stays for the next step to reuse (glibc's malloc).

A training step allocates and frees the same tensors every minibatch. Tensors of some MB (a population's
``[P, batch_size, hidden]`` activations, a large minibatch's) meet two of glibc's defaults: a block above the
mmap threshold (which grows with the blocks freed, to at most 32 MiB) is mapped afresh for each allocation, and
free memory at the top of the heap beyond the trim threshold (twice that) is handed back to the kernel. Either
way the next step's tensors take fresh pages, each a page fault on first touch: 2.5M faults per update of a
population of four of the main job, about 40% of its CPU time (``benchmarks/README.md``). :func:`keep_freed_memory`
sets both thresholds once for the process: blocks up to 32 MiB come from the heap, and its free top is kept up
to 1 GiB (the process keeps at most what its steps already used at their peak).
"""

from __future__ import annotations

import ctypes
import platform

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

#: Blocks of up to this many bytes come from the heap (glibc's largest mmap threshold on 64-bit systems).
MMAP_THRESHOLD = 32 << 20
#: Free memory at the heap's top is handed back to the kernel beyond this many bytes.
TRIM_THRESHOLD = 1 << 30

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Set glibc's mmap threshold to :data:`MMAP_THRESHOLD` and its trim threshold to :data:`TRIM_THRESHOLD` for
    this process (see the module docstring); a no-op on another C library (returns False).

    Returns:
        True where both were set (Linux with glibc).
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
