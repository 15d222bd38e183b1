"""The daemon's malloc settings (glibc): keep the memory of big, short-lived
buffers for reuse instead of mapping it afresh each time.

Ingesting a chatty job moves its output through buffers of a few MiB: each
read step of the output record (4 MiB), SQLite's copies of the block it
binds and writes. glibc serves any request of 128 KiB or more with its own
``mmap`` and gives it back with ``munmap`` on ``free``; its dynamic
threshold (mallopt(3), ``M_MMAP_THRESHOLD``) only moves above a freed
chunk's size, so a stream of same-sized 4 MiB buffers is mapped, faulted in
page by page (zeroed by the kernel) and unmapped again, every step: about
25,000 page faults and a tenth of the daemon's CPU per million logged lines
(``perf`` on ``bench/local_log_ingest.py``). Serving them from malloc's heaps
and keeping up to :data:`TRIM_THRESHOLD` of free memory there halves the
faults; the memory is reused, not grown (the daemon's peak RSS stays within
a few MB; ``tests/supervisord/test_log_flood.py`` bounds it).
"""

from __future__ import annotations

import ctypes
import os
from typing import Final

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_malloc"]

# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3

#: Requests below this many bytes come from malloc's heaps (above the
#: 4 MiB read steps and SQLite's copies of such a block; glibc allows at
#: most 32 MiB here on 64-bit).
MMAP_THRESHOLD: Final = 16 << 20
#: Free memory at the top of a heap that malloc keeps instead of returning
#: it to the system.
TRIM_THRESHOLD: Final = 32 << 20


def tune_malloc() -> bool:
    """Set :data:`MMAP_THRESHOLD` and :data:`TRIM_THRESHOLD` with glibc's
    ``mallopt`` (both fixed, so glibc's dynamic adjustment stops). Returns
    whether both took; False (and nothing changed) off glibc. Call once, at
    start-up, before threads allocate."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if not libc.startswith("glibc"):
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
