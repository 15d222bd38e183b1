"""This user's processes found by a marker in their environment.

jobsup marks what it starts with an environment variable (a run's
``JOBSUP_RUN_ID``, a hook attempt's ``JOBSUP_HOOK_ATTEMPT``): a process
that left its process group (``setsid``, a double fork) and was
re-parented to init still carries it, so it can be found and stopped.
Read from ``/proc/PID/environ`` (proc(5)); a process that clears its
environment escapes (README says so).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

__all__ = ["own_environs", "pids_with_env"]


def own_environs() -> Iterator[tuple[int, bytes]]:
    """(pid, raw ``/proc/PID/environ``) of this user's processes, never this
    one (proc(5)). Blocking (reads ``/proc``): call it from a worker thread in
    the daemon. Processes that vanish or cannot be read are skipped."""
    uid, me = os.getuid(), os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        yield int(entry), env


def pids_with_env(name: str, value: str) -> list[int]:
    """Pids of this user's processes (never this one) whose environment
    holds ``name=value`` exactly. Blocking, as :func:`own_environs`."""
    marker = f"{name}={value}".encode()
    return [pid for pid, env in own_environs() if marker in env.split(b"\0")]
