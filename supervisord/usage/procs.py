"""One pass over this machine's process table: which processes belong to
which run, and what each uses.

A run's process tree (README, "What a run used"): every descendant of its
runner (the runner is its job's child subreaper, so processes that left
the job's group with ``setsid`` or a double fork stay below it), plus any
process of this user whose environment carries ``JOBSUP_RUN_ID=<id>``
(processes re-parented to init when the runner died). The runner itself
is jobsup's, not the job's: its own CPU and memory are not counted, but
the CPU of the processes it reaped is (its children's times, ``cutime`` +
``cstime``), so CPU seconds include every process of the run that ended.

Processes that vanish between listing and reading are skipped; each
process is identified by ``(pid, create_time)``, so a reused pid is a new
process (never counted or signalled as the old one). The environment of a
process is read once per process and remembered (:class:`ProcessScanner`).
Blocking (reads ``/proc``): call from a worker thread.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

import psutil

__all__ = ["ProcessScanner", "RunTree", "TreeSpec"]


@dataclasses.dataclass(frozen=True, slots=True)
class TreeSpec:
    """What the scanner needs of one run: its id and its runner's pid and
    start time (clock ticks since boot, as the handle records it)."""

    run_id: str
    runner_pid: int | None
    runner_start: int | None


@dataclasses.dataclass(slots=True)
class RunTree:
    """One run's processes in one pass: ``cpu_s`` (cumulative, the reaped
    ones included), ``rss_bytes`` (summed over the live ones), and the live
    processes themselves (psutil objects: signalling one checks it is still
    the same process)."""

    run_id: str
    cpu_s: float = 0.0
    rss_bytes: int = 0
    procs: list[Any] = dataclasses.field(default_factory=list)
    runner: Any = None

    @property
    def pids(self) -> set[int]:
        """The pids of the live processes."""
        return {int(p.pid) for p in self.procs}


def _ticks_start(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks since boot), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    try:
        return int(raw[raw.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


class ProcessScanner:
    """Attributes this user's processes to runs, one :meth:`scan` per
    sampling interval. Keeps, per process ``(pid, create_time)``, the run
    id its environment names (read once)."""

    def __init__(self) -> None:
        self._uid = os.getuid()
        self._me = os.getpid()
        self._marker: dict[tuple[int, float], str | None] = {}
        #: Processes whose environment could not be read (vanished, or not ours) this pass.
        self.unreadable = 0

    def _run_of(self, proc: Any, key: tuple[int, float]) -> str | None:
        if key in self._marker:
            return self._marker[key]
        run_id: str | None = None
        try:
            if proc.uids().real == self._uid:
                with open(f"/proc/{proc.pid}/environ", "rb") as f:
                    for entry in f.read().split(b"\0"):
                        if entry.startswith(b"JOBSUP_RUN_ID="):
                            run_id = entry[len(b"JOBSUP_RUN_ID=") :].decode(errors="replace")
                            break
        except (OSError, psutil.Error):
            self.unreadable += 1
            return None  # not remembered: maybe readable next time
        self._marker[key] = run_id
        return run_id

    def scan(self, runs: Iterable[TreeSpec]) -> dict[str, RunTree]:
        """The process tree of each of ``runs`` now (run id -> RunTree; a
        run with no live process still gets one, with its runner's reaped
        CPU when the runner lives)."""
        specs = {s.run_id: s for s in runs}
        trees = {rid: RunTree(rid) for rid in specs}
        if not specs:
            return trees
        self.unreadable = 0
        procs: dict[int, Any] = {}
        children: dict[int, list[int]] = {}
        seen: set[tuple[int, float]] = set()
        for proc in psutil.process_iter(["ppid", "create_time"]):
            info = proc.info
            ppid, ctime = info.get("ppid"), info.get("create_time")
            if ppid is None or ctime is None or proc.pid == self._me:
                continue
            procs[proc.pid] = proc
            children.setdefault(int(ppid), []).append(proc.pid)
            seen.add((proc.pid, float(ctime)))
        # Forget processes that are gone (their pids may come back as others).
        self._marker = {k: v for k, v in self._marker.items() if k in seen}
        owner: dict[int, str] = {}
        runners: dict[str, int] = {}
        for spec in specs.values():
            pid = spec.runner_pid
            if pid is None or pid not in procs or _ticks_start(pid) != spec.runner_start:
                continue  # the runner is gone (or its pid is another process now)
            runners[spec.run_id] = pid
            stack = list(children.get(pid, ()))
            while stack:
                child = stack.pop()
                if child in owner:
                    continue
                owner[child] = spec.run_id
                stack.extend(children.get(child, ()))
        for pid, proc in procs.items():
            if pid in owner or pid in runners.values():
                continue
            ctime = proc.info.get("create_time")
            run_id = self._run_of(proc, (pid, float(ctime)))
            if run_id in specs:
                owner[pid] = run_id
        for rid, pid in runners.items():
            runner = procs[pid]
            trees[rid].runner = runner
            try:
                t = runner.cpu_times()
                trees[rid].cpu_s += float(t.children_user + t.children_system)
            except psutil.Error:
                pass
        for pid, rid in owner.items():
            proc = procs[pid]
            try:
                with proc.oneshot():
                    t = proc.cpu_times()
                    rss = int(proc.memory_info().rss)
            except psutil.Error:
                continue  # ended between listing and reading
            tree = trees[rid]
            tree.cpu_s += float(t.user + t.system + t.children_user + t.children_system)
            tree.rss_bytes += rss
            tree.procs.append(proc)
        return trees

    def known_pids(self) -> Mapping[int, str | None]:
        """pid -> the run id its environment names (None: none), for every
        process whose environment was read and that still lives."""
        return {pid: rid for (pid, _), rid in self._marker.items()}
