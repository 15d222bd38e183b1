"""Event-driven wake-ups for the local backend's supervise loops.

A supervise loop has three things to notice: the runner's exit, a change of
the runner's status file and new output. Instead of polling each run's files
(500 idle runs polled every second are 500 wake-ups a second), the daemon
waits for the kernel to say so:

* the runner's exit: a pidfd (``pidfd_open(2)``, readable once the process
  has exited; the daemon is not the runner's parent, a pidfd works all the
  same), opened only after checking the pid still is the runner (its start
  time), waited on in the loop's nap (:meth:`RunWatch.nap`);
* status and output: ONE inotify descriptor for the whole backend
  (:class:`Wakeups`), read by :meth:`Wakeups.serve` (the backend's shared
  task), with one watch on each runs' status folder (``<runs dir>/.status``:
  an event there names the run) and one on each supervised run's folder
  (``output.log``, ``output.idx``; the ``stdout.log``/``stderr.log`` and
  ``status.json`` of runners from before). Each event wakes that run's loop
  (:meth:`RunWatch.nap` returns early).

A loop uses it as: :meth:`RunWatch.begin` before it looks at the files (an
event from then on cuts the next nap short: nothing is lost between the look
and the nap), then :meth:`RunWatch.nap`. New output wakes only an idle nap
(one with nothing unread): while output is waiting to be recorded the loop
already naps briefly, and a flood would otherwise wake it at every write.

While everything is in place (:attr:`RunWatch.event_driven`) an idle run
naps up to :data:`SWEEP_S` (a safety net, not the way changes are seen).
When something is missing -- inotify cannot be had (the per-user limit of
instances or watches), the serving task is not running, or the runner's
pidfd could not be opened -- the loop polls (naps capped by the caller,
1 s).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
from pathlib import Path

import anyio
import structlog
from inotify_simple import INotify, flags, parse_events

from supervisord.daemon.backends.local.protocol import OUTPUT_DATA, OUTPUT_INDEX
from supervisord.daemon.backends.local.runner import proc_start_time
from supervisord.shared.progress import PROGRESS_FILE

__all__ = ["SWEEP_S", "RunWatch", "Wakeups", "open_pidfd"]

log = structlog.get_logger("jobsup.local")

#: The longest nap of an idle run whose every change wakes it (a safety sweep).
SWEEP_S = 30.0

_STATUS_MASK = flags.MODIFY | flags.CLOSE_WRITE | flags.CREATE | flags.MOVED_TO | flags.ATTRIB | flags.ONLYDIR
_RUN_MASK = flags.MODIFY | flags.CLOSE_WRITE | flags.CREATE | flags.MOVED_TO | flags.ONLYDIR
# Files in a run's folder whose changes concern the loop; True: output (wakes idle naps only).
_RUN_FILES = {
    OUTPUT_DATA: True,
    OUTPUT_INDEX: True,
    "stdout.log": True,
    "stderr.log": True,
    "status.json": False,
}
_READ_BYTES = 1 << 16


class RunWatch:
    """One supervised run's wake-ups (see the module docstring). Made by
    :meth:`Wakeups.watch`; :meth:`close` when the loop ends."""

    def __init__(self, owner: Wakeups, key: str, pidfd: int | None) -> None:
        self._owner = owner
        self.key = key  # the run folder's name (the status file's name)
        self._pidfd = pidfd
        self._exited = False  # the pidfd was readable: no use waiting on it again
        self._dirs: list[Path] = []  # folders watched for this run (released at close)
        self._status = False  # a status change or an exit since begin()
        self._output = False  # new output since begin()
        self._scope: anyio.CancelScope | None = None
        self._idle = False
        #: Set by the loop once the run writes progress reports: changes of
        #: its progress file no longer wake the loop (it bounds its naps by
        #: the progress interval instead).
        self.progress_seen = False
        #: Naps taken (for tests and benches: idle runs take almost none).
        self.naps = 0

    @property
    def event_driven(self) -> bool:
        """Whether every change of this run wakes it (then an idle nap may
        last :data:`SWEEP_S`); False: the caller keeps polling."""
        return self._owner.serving and len(self._dirs) == 2 and (self._pidfd is not None or self._exited)

    def begin(self) -> None:
        """Forget earlier events: call just before looking at the run's files."""
        self._status = self._output = False

    async def nap(self, seconds: float, *, idle: bool) -> None:
        """Sleep up to ``seconds``, or until the runner exits, its status
        changes or (``idle``: nothing is waiting to be read) new output
        arrives -- since :meth:`begin`, so an event that came while the
        caller looked is not missed."""
        if self._status or (idle and self._output):
            return
        self.naps += 1
        with anyio.CancelScope() as scope:
            self._scope, self._idle = scope, idle
            try:
                with anyio.move_on_after(seconds):
                    if self._pidfd is not None and not self._exited:
                        await anyio.wait_readable(self._pidfd)
                        self._exited = True
                    else:
                        await anyio.sleep(math.inf)
            finally:
                self._scope = None

    def wake(self, *, output: bool = False) -> None:
        """An event for this run: cut its nap short (an ``output`` event
        only an idle nap), or the next one if it is not napping."""
        if output:
            self._output = True
        else:
            self._status = True
        if self._scope is not None and (not output or self._idle):
            self._scope.cancel()

    def close(self) -> None:
        """Release the pidfd and the run folder's watch (idempotent)."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._owner._forget(self)


class _Dir:
    """A watched folder: the runs it concerns (a status folder: many; a run folder: one)."""

    def __init__(self, path: Path, wd: int, status: bool) -> None:
        self.path = path
        self.wd = wd
        self.status = status
        self.runs: dict[str, RunWatch] = {}


class Wakeups:
    """The local backend's wake-up service: one inotify descriptor, read by
    :meth:`serve`, dispatching events to the runs' :class:`RunWatch`."""

    def __init__(self) -> None:
        self._inotify: INotify | None = None
        self._unavailable = False
        self.serving = False
        self._dirs: dict[Path, _Dir] = {}
        self._by_wd: dict[int, _Dir] = {}
        self._runs: dict[str, RunWatch] = {}

    def _notifier(self) -> INotify | None:
        if self._inotify is None and not self._unavailable:
            try:
                self._inotify = INotify(nonblocking=True)
            except OSError as err:
                self._unavailable = True
                log.warning("local.inotify_unavailable", error=str(err), hint="local runs are polled (up to 1 s)")
        return self._inotify

    def watch(self, run_dir: Path, status_dir: Path, pid: object, start: object) -> RunWatch:
        """Start watching a run: its folder ``run_dir``, its status folder
        ``status_dir`` (where its status file is named as its folder), and the
        runner ``pid`` if it still is the process that started at ``start``
        (clock ticks, ``/proc/PID/stat``). Never raises for what cannot be
        watched: the watch is then not :attr:`~RunWatch.event_driven`."""
        watch = RunWatch(self, run_dir.name, open_pidfd(pid, start))
        self._runs[watch.key] = watch
        for path, status in ((status_dir, True), (run_dir, False)):
            if self._add(path, status, watch):
                watch._dirs.append(path)
        return watch

    def _add(self, path: Path, status: bool, watch: RunWatch) -> bool:
        entry = self._dirs.get(path)
        if entry is None:
            notifier = self._notifier()
            if notifier is None:
                return False
            try:
                wd = notifier.add_watch(path, _STATUS_MASK if status else _RUN_MASK)
            except OSError as err:
                if err.errno not in (errno.ENOENT, errno.ENOTDIR):
                    log.warning("local.inotify_watch_failed", path=str(path), error=str(err))
                return False
            entry = self._dirs[path] = self._by_wd[wd] = _Dir(path, wd, status)
        entry.runs[watch.key] = watch
        return True

    def _forget(self, watch: RunWatch) -> None:
        if self._runs.get(watch.key) is watch:
            del self._runs[watch.key]
        for path in watch._dirs:
            entry = self._dirs.get(path)
            if entry is None or entry.runs.get(watch.key) is not watch:
                continue
            del entry.runs[watch.key]
            if not entry.runs:
                self._drop(entry)
                if self._inotify is not None:
                    with contextlib.suppress(OSError):  # the folder is gone (the kernel dropped the watch)
                        self._inotify.rm_watch(entry.wd)
        watch._dirs = []

    def _drop(self, entry: _Dir) -> None:
        self._dirs.pop(entry.path, None)
        if self._by_wd.get(entry.wd) is entry:
            del self._by_wd[entry.wd]

    async def serve(self) -> None:
        """Read the inotify descriptor and wake the runs concerned, until
        cancelled. Returns at once when inotify is unavailable (runs are
        then polled). While it is not running no watch is event-driven."""
        notifier = self._notifier()
        if notifier is None:
            return
        fd = notifier.fileno()
        self.serving = True
        try:
            while True:
                await anyio.wait_readable(fd)
                try:
                    data = os.read(fd, _READ_BYTES)
                except BlockingIOError:
                    continue
                self.dispatch(parse_events(data))
        finally:
            self.serving = False
            for watch in list(self._runs.values()):
                watch.wake()  # back to polling

    def dispatch(self, events: list[tuple[int, int, int, str]]) -> None:
        """Wake the runs that ``events`` (inotify ``(wd, mask, cookie, name)``) concern."""
        for wd, mask, _cookie, name in events:
            if mask & flags.Q_OVERFLOW:
                for watch in list(self._runs.values()):
                    watch.wake()
                continue
            entry = self._by_wd.get(wd)
            if entry is None:
                continue
            if mask & flags.IGNORED:  # the folder is gone
                self._drop(entry)
                for watch in list(entry.runs.values()):
                    if entry.path in watch._dirs:
                        watch._dirs.remove(entry.path)
                    watch.wake()
                continue
            if entry.status:
                named = entry.runs.get(name)
                if named is not None:
                    named.wake()
                continue
            if name == PROGRESS_FILE:
                # The job's first progress report wakes the loop; from then
                # on the loop looks at the file once per interval itself
                # (a file rewritten every 10 ms must not wake it each time).
                for watch in entry.runs.values():
                    if not watch.progress_seen:
                        watch.wake(output=True)
                continue
            output = _RUN_FILES.get(name)
            if output is not None:
                for watch in entry.runs.values():
                    watch.wake(output=output)

    def close(self) -> None:
        """Close the inotify descriptor (the daemon is stopping)."""
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._dirs.clear()
        self._by_wd.clear()


def open_pidfd(pid: object, start: object) -> int | None:
    """A pidfd of ``pid`` if it is the process that started at ``start``
    (checked after opening: the pidfd then refers to that process even if
    the pid is reused later), else None."""
    if not isinstance(pid, int) or not hasattr(os, "pidfd_open"):
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if proc_start_time(pid) != start:
        os.close(fd)
        return None
    return fd
