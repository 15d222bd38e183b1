"""supervisord.daemon.malloc: buffers of a few MiB are reused, not mapped afresh."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = """
import resource, sys
from supervisord.daemon.malloc import tune_malloc
tuned = tune_malloc() if sys.argv[1] == "tune" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for k in range(24):  # read steps of slightly different sizes, as a flood's are
    buf = b"x" * ((4 << 20) + k * 8192)
    del buf
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, cwd=os.getcwd()
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"), reason="glibc's mallopt")
def test_tuned_malloc_reuses_big_buffers_instead_of_faulting_them_in() -> None:
    tuned, faults = _faults("tune")
    _, default = _faults("default")
    assert tuned == "True"
    # Default glibc maps each bigger buffer afresh (1,024+ page faults per
    # 4 MiB); tuned, the heap's pages are reused.
    assert default > 24 * 1000, default
    assert faults < default / 4, (faults, default)
