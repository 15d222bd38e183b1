"""The daemon's storage health, as `jobsup doctor` and `jobsup runs` show it.

The store reports what keeps it from writing (:meth:`store.EventStore.storage_problem`):
``{"kind": "locked"|"disk full"|"I/O error", "message", "since", "waiting"}``.
The daemon keeps serving reads and supervising runs meanwhile; the runs'
output files are the buffer, ingested once writing works again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from store import EventStore

__all__ = ["output_space", "output_space_check", "storage_check", "storage_json", "storage_warning"]


def storage_warning(problem: Mapping[str, Any] | None) -> str | None:
    """One human line for a storage problem (None when there is none), e.g.
    ``storage: disk full since 2026-…Z: new events wait (3 appends); runs go on
    and their output is recorded once space returns (…)``."""
    if not problem:
        return None
    kind = str(problem.get("kind") or "trouble")
    cause = {
        "disk full": "free some space; runs go on and their output is recorded once space returns",
        "locked": "another process holds the database's write lock (a VACUUM, a backup?); runs go on",
        "I/O error": "the database cannot be written; runs go on and are recorded once writes work",
    }.get(kind, "runs go on and are recorded once writes work")
    return (
        f"storage: {kind} since {problem.get('since')}: {problem.get('waiting', 0)} appends waiting; "
        f"{cause} ({problem.get('message')})"
    )


def storage_check(store: EventStore, last_seq: int) -> dict[str, Any]:
    """The doctor check ``{"name": "store", "ok", "detail"}``: not ok while
    the store cannot write (the detail names the problem, e.g. "disk full")."""
    problem = store.storage_problem()
    if problem is None:
        return {"name": "store", "ok": True, "detail": f"{store.path}, last seq {last_seq}"}
    return {"name": "store", "ok": False, "detail": f"{store.path}: {storage_warning(problem)}"}


def storage_json(store: EventStore) -> dict[str, Any] | None:
    """What the API reports under ``"storage"`` (in ``/health`` and ``GET
    /runs``): None while writes succeed, else the store's problem plus
    ``"summary"``, the line the CLI prints."""
    problem = store.storage_problem()
    if problem is None:
        return None
    return {**problem, "summary": storage_warning(problem)}


def disk_full_hint(folder: Path) -> str:
    """``" (the disk holding FOLDER is full: free some space)"`` when the
    file system of ``folder`` (or its nearest existing parent) has no free
    block for us (statvfs(3) ``f_bavail``), else ``""``."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return ""
    if st.f_bavail * st.f_frsize < 64 * 1024:
        return f" (the disk holding {folder} is full: free some space)"
    return ""


def output_space(runs_dir: Path, running: Sequence[str]) -> dict[str, Any] | None:
    """What the API reports under ``"output"`` (``/health``, ``GET /runs``)
    while the disk of ``runs_dir`` is full and local runs are running
    (``running``: their ids), else None: ``{"kind": "disk full", "where",
    "runs", "summary"}``. Their runners cannot write the output files there:
    each stops reading its job's pipes (nothing is lost) and the job blocks
    on its next write, until there is space (the store may be on another
    disk and never notice). Blocking: statvfs(3)."""
    if not running or not disk_full_hint(runs_dir):
        return None
    shown = ", ".join(running[:5]) + (f" and {len(running) - 5} more" if len(running) > 5 else "")
    summary = (
        f"output: the disk of {runs_dir} is full: {len(running)} running local run(s) ({shown}) cannot write "
        "their output there; each job blocks when it next writes, until there is space "
        "(free some; nothing is lost)"
    )
    return {"kind": "disk full", "where": str(runs_dir), "runs": list(running), "summary": summary}


def output_space_check(runs_dir: Path, running: Sequence[str]) -> dict[str, Any]:
    """The doctor check ``{"name": "outputs", "ok", "detail"}``: not ok
    while :func:`output_space` reports a problem. Blocking: statvfs(3)."""
    problem = output_space(runs_dir, running)
    if problem is None:
        return {"name": "outputs", "ok": True, "detail": f"{runs_dir}: {len(running)} running local run(s) writing"}
    return {"name": "outputs", "ok": False, "detail": str(problem["summary"])}
