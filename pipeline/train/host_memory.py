"""Host allocator tuning for training on the CPU.

glibc's malloc serves large blocks with mmap and trims the top of its heap once enough is free, both with
thresholds it adjusts from the process's history. A training step allocates and frees the same activation
buffers every step; when they go back to the OS they are page-faulted (and zeroed) in again on the next step.
How often that happens depends on what else the process has allocated, so two loops with identical steps can
differ by 15% (measured: benchmarks/RESULTS.md). Pinning both thresholds high keeps freed memory in the heap:
the process holds on to its peak, and every step reuses it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 2**31 - 1  # mallopt takes an int; blocks above 2 GiB still get their own mapping
FALLBACK_MMAP_THRESHOLD = 32 * 2**20  # the documented ceiling, for a glibc that refuses more


def keep_freed_host_memory() -> bool:
    """Pin glibc's mmap and trim thresholds; False (and nothing changed) where malloc is not glibc's."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_ok = mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES) or mallopt(M_MMAP_THRESHOLD, FALLBACK_MMAP_THRESHOLD)
    trim_ok = mallopt(M_TRIM_THRESHOLD, THRESHOLD_BYTES)
    if not (mmap_ok and trim_ok):
        log.warning("malloc did not accept the mmap/trim thresholds; host memory is returned as usual")
        return False
    return True
