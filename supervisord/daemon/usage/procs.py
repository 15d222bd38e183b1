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

One read of ``/proc/PID/stat`` per process and pass gives its parent, CPU
times, RSS and start time (proc(5)): several times cheaper than a psutil
object per process, which is what keeps sampling hundreds of runs under
1% of a core (``bench/usage_sampling.py``). Processes that vanish between
listing and reading are skipped; each process is identified by ``(pid,
start time)``, so a reused pid is a new process, never counted or
signalled as the old one (:func:`signal_process` checks it again, through
psutil, right before the signal). The environment of a process is read
once per process and remembered (:class:`ProcessScanner`). Blocking
(reads ``/proc``): call from a worker thread.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Final

import psutil

__all__ = ["Proc", "ProcessScanner", "RunTree", "TreeSpec", "signal_process", "start_ticks"]

_CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_MARKER: Final = b"JOBSUP_RUN_ID="


@dataclasses.dataclass(frozen=True, slots=True)
class TreeSpec:
    """What the scanner needs of one run: its id and its runner's pid and
    start time (clock ticks since boot, as the handle records it)."""

    run_id: str
    runner_pid: int | None
    runner_start: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class Proc:
    """One process as one read of its ``stat`` showed it: ``start`` in clock
    ticks since boot (with ``pid``, its identity), CPU seconds of its own
    (``cpu_s``) and of its reaped children (``children_cpu_s``), ``rss_bytes``."""

    pid: int
    ppid: int
    start: int
    cpu_s: float
    children_cpu_s: float
    rss_bytes: int


@dataclasses.dataclass(slots=True)
class RunTree:
    """One run's processes in one pass: ``cpu_s`` (cumulative, the reaped
    ones included), ``rss_bytes`` (summed over the live ones), the live
    processes and the runner (None when it is gone)."""

    run_id: str
    cpu_s: float = 0.0
    rss_bytes: int = 0
    procs: list[Proc] = dataclasses.field(default_factory=list)
    runner: Proc | None = None

    @property
    def pids(self) -> set[int]:
        """The pids of the live processes."""
        return {p.pid for p in self.procs}


def _read_stat(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    try:
        # Fields after "(comm)": state is field 3, so field N is at N - 3.
        f = raw[raw.rindex(b")") + 2 :].split()
        return Proc(
            pid,
            int(f[1]),
            int(f[19]),
            (int(f[11]) + int(f[12])) / _CLK_TCK,
            (int(f[13]) + int(f[14])) / _CLK_TCK,
            int(f[21]) * _PAGE,
        )
    except (ValueError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks since boot), or None."""
    proc = _read_stat(pid)
    return None if proc is None else proc.start


def signal_process(proc: Proc, sig: int) -> bool:
    """Send ``sig`` to ``proc`` unless it ended or its pid now names another
    process: its start time is compared right before (and psutil checks
    its own record of the process again when sending). Returns whether it
    was sent."""
    if start_ticks(proc.pid) != proc.start:
        return False
    try:
        psutil.Process(proc.pid).send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return False
    return True


class ProcessScanner:
    """Attributes this user's processes to runs, one :meth:`scan` per
    sampling interval. Keeps, per process ``(pid, start)``, the run id its
    environment names (read once)."""

    def __init__(self) -> None:
        self._uid = os.getuid()
        self._me = os.getpid()
        self._marker: dict[tuple[int, int], str | None] = {}

    def _run_of(self, proc: Proc) -> str | None:
        key = (proc.pid, proc.start)
        if key in self._marker:
            return self._marker[key]
        run_id: str | None = None
        try:
            if os.stat(f"/proc/{proc.pid}").st_uid == self._uid:
                with open(f"/proc/{proc.pid}/environ", "rb") as f:
                    env = f.read()
                at = env.find(_MARKER)
                while at > 0 and env[at - 1] != 0:  # only at the start of an entry
                    at = env.find(_MARKER, at + 1)
                if at >= 0:
                    end = env.find(b"\0", at)
                    run_id = env[at + len(_MARKER) : end if end >= 0 else len(env)].decode(errors="replace")
        except OSError:
            return None  # vanished (or unreadable): not remembered
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
        procs: dict[int, Proc] = {}
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            proc = _read_stat(int(entry))
            if proc is None or proc.pid == self._me:
                continue
            procs[proc.pid] = proc
            children.setdefault(proc.ppid, []).append(proc.pid)
        # Forget processes that are gone (their pids may come back as others).
        self._marker = {k: v for k, v in self._marker.items() if k[0] in procs and procs[k[0]].start == k[1]}
        owner: dict[int, str] = {}
        runner_pids: set[int] = set()
        for spec in specs.values():
            runner = procs.get(spec.runner_pid) if spec.runner_pid is not None else None
            if runner is None or runner.start != spec.runner_start:
                continue  # the runner is gone (or its pid is another process now)
            runner_pids.add(runner.pid)
            trees[spec.run_id].runner = runner
            trees[spec.run_id].cpu_s += runner.children_cpu_s
            stack = list(children.get(runner.pid, ()))
            while stack:
                child = stack.pop()
                if child in owner:
                    continue
                owner[child] = spec.run_id
                stack.extend(children.get(child, ()))
        for pid, proc in procs.items():
            if pid in owner or pid in runner_pids:
                continue
            run_id = self._run_of(proc)
            if run_id in specs:
                owner[pid] = run_id
        for pid, rid in owner.items():
            proc = procs[pid]
            tree = trees[rid]
            tree.cpu_s += proc.cpu_s + proc.children_cpu_s
            tree.rss_bytes += proc.rss_bytes
            tree.procs.append(proc)
        return trees

    def known_pids(self) -> Mapping[int, str | None]:
        """pid -> the run id its environment names (None: none), for every
        process whose environment was read and that still lives."""
        return {pid: rid for (pid, _), rid in self._marker.items()}
