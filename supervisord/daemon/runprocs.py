"""Which runs have live processes on this machine.

Every process of a local run's job carries ``JOBSUP_RUN_ID=<id>`` in its
environment (the runner sets it; children inherit it, including those that
left the job's process group or were re-parented to init), so one pass over
``/proc/PID/environ`` (proc(5)) tells whose each process is. The scheduler
uses it so a GPU is never handed out while any process of a run that held
it lives.
"""

from __future__ import annotations

from supervisord.daemon.procenv import own_environs

__all__ = ["live_run_ids"]

_MARKER = b"JOBSUP_RUN_ID="


def live_run_ids() -> dict[str, list[int]]:
    """Run id -> pids of this user's live (not zombie) processes whose
    environment carries ``JOBSUP_RUN_ID`` (never this process). Blocking (a
    read of ``/proc``): call it from a worker thread. Processes that vanish
    or cannot be read during the pass are skipped."""
    found: dict[str, list[int]] = {}
    for pid, env in own_environs():
        if _MARKER not in env:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rindex(b")") + 2 :].startswith(b"Z"):
            continue
        for item in env.split(b"\0"):
            if item.startswith(_MARKER):
                found.setdefault(item[len(_MARKER) :].decode(errors="replace"), []).append(pid)
                break
    return found
