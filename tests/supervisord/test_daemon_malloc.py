"""The daemon keeps log-ingest buffers in malloc's heap (supervisord.daemon._tune_malloc)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

# A read step as the local tailer makes it: a 4 MiB pread, then the cut at
# the last newline (a slightly smaller copy). Prints the minor page faults
# of 20 steps after 3 to warm up.
_STEPS = """
import os, resource, sys
from supervisord.daemon import _tune_malloc
_tune_malloc()
fd = os.open(sys.argv[1], os.O_RDONLY)
def step(i):
    buf = os.pread(fd, 4 << 20, i << 16)
    return len(buf[: len(buf) - 100])
for i in range(3):
    step(i)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(20):
    step(i)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")
def test_read_steps_reuse_heap_memory_instead_of_faulting_in_fresh_pages(tmp_path: Path) -> None:
    data = tmp_path / "output.log"
    data.write_bytes((b"x" * 78 + b"\n") * ((6 << 20) // 79))
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _STEPS, str(data)], cwd=root, capture_output=True, text=True, check=True, timeout=60
    )
    faults = int(out.stdout.strip())
    # glibc's default serves each 4 MiB buffer with a fresh mmap: about 2 x
    # 1024 faults a step (40,000 for 20); reused heap memory: next to none.
    assert faults < 4000, faults
