"""The local backend: each run is a process group on this machine, driven by
its own detached runner (:mod:`supervisord.daemon.backends.local.runner`)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import anyio
import structlog

from store import LogBlock
from supervisord.daemon.backends.base import PAUSED, RunReporter, RunSpec, paused_message
from supervisord.daemon.backends.local import runner as _runner_module
from supervisord.daemon.backends.local.protocol import OUTPUT_DATA, decode_status
from supervisord.daemon.backends.local.runner import group_alive, proc_start_time
from supervisord.daemon.backends.local.tail import MAX_BLOCKS, FileTailer, RecordTailer, record_source
from supervisord.daemon.backends.local.wakeups import SWEEP_S, Wakeups, open_pidfd
from supervisord.daemon.crashpoints import crash_point
from supervisord.daemon.procenv import pids_with_env
from supervisord.daemon.scope import scope_argv
from supervisord.shared.events import (
    LOG_INGEST_DONE,
    LOG_INGEST_PENDING,
    LOGS_TRUNCATED,
    PROGRESS,
    RESOURCE_USAGE,
    LogsTruncatedData,
    ProgressData,
)
from supervisord.shared.exceptions import BackendError, PreflightError
from supervisord.shared.progress import PROGRESS_FILE, ProgressFile, interval_of

__all__ = ["LocalBackend", "attempt_dir", "make_outputs_dir", "run_processes"]

log = structlog.get_logger("jobsup.local")

_STREAMS = ("stdout", "stderr")
# One drain step reads at most this much of a file and records it as one
# block (one append: one transaction and fsync). Each transaction has a
# fixed cost (about 5 ms of the daemon's CPU: its statements, an fsync, a
# LogLines event, waking readers): a flood of 1M lines cost 0.56 s of CPU
# in 2 MiB steps, 0.52 s in 4 MiB and 0.47 s in 8 MiB (16 MiB: no better;
# bench/local_log_ingest.py, medians of 5-6 rounds). The writer's page
# cache holds two such blocks (store.schema.WRITER_CACHE_KIB).
_READ_BYTES = 8 << 20
# After the process ends, its outcome waits at most this long for the
# output backlog to be recorded (then: LogIngestPending, see _finish).
_EXIT_DRAIN_S = 2.0
_POLL_MIN_S = 0.02
_POLL_MAX_S = 1.0
# While output arrives, the loop still polls every _POLL_MIN_S (so the
# job's exit is seen as soon), but records it only once _DRAIN_BYTES are
# waiting or _DRAIN_EVERY_S after the last recording: a flood is then
# recorded in a few big steps (transactions) rather than one small step
# per poll. Lines show up live at most _DRAIN_EVERY_S late.
_DRAIN_BYTES = _READ_BYTES // 2
_DRAIN_EVERY_S = 0.1

# Final runner reasons -> (phase, reason recorded on the run).
_OUTCOMES: dict[str, str] = {
    "Completed": "COMPLETED",
    "Canceled": "CANCELED",
}


class LocalBackend:
    """Runs tasks as local processes.

    ``kill_grace_s``: seconds between SIGTERM and SIGKILL on cancel or timeout.
    ``shell``: the shell that runs the task's command (``bash``).
    """

    name = "local"

    def __init__(self, *, kill_grace_s: int = 10, shell: str = "bash") -> None:
        self.kill_grace_s = kill_grace_s
        self.shell = shell
        self._limiter = anyio.CapacityLimiter(8)
        # Waking a supervise loop early (cancel, once the run is stopped):
        # the run id goes into _woken, and the loop's current poll sleep,
        # if any, is cancelled (a plain sleep in a scope is cheaper per poll
        # than waiting on an event with a timeout).
        self._woken: set[str] = set()
        self._naps: dict[str, anyio.CancelScope] = {}
        # A runner's exit, status change and new output wake its loop
        # (pidfd + one inotify descriptor, read by serve()); idle loops then
        # nap up to SWEEP_S instead of polling (see wakeups.py).
        self._wakeups = Wakeups()
        #: ``systemd-run`` when the daemon found a user systemd manager at
        #: start: runs with --memory/--cpus then start in a transient scope.
        self.systemd_run: str | None = None

    def _scope(self, spec: RunSpec) -> list[str]:
        """The ``systemd-run --user --scope`` argv prefix for a run with
        limits when the daemon found a user manager (``systemd_run``); []
        otherwise (the sampler enforces)."""
        if self.systemd_run is None or (spec.memory_bytes is None and spec.cpus is None):
            return []
        return scope_argv(self.systemd_run, spec.run_id, spec.memory_bytes, spec.cpus)

    def _settings(self, spec: RunSpec) -> tuple[str, int]:
        local = spec.config.get("local") or {}
        return str(local.get("shell") or self.shell), int(local.get("kill_grace_s") or self.kill_grace_s)

    async def preflight(self, spec: RunSpec) -> list[str]:
        """Check the shell exists. Raises PreflightError naming it."""
        shell, _ = self._settings(spec)
        if shutil.which(shell) is None:
            raise PreflightError(f"local.shell {shell!r} is not on PATH")
        return []

    async def doctor(self) -> list[dict[str, Any]]:
        """One check: the default shell (``local.shell`` may name another per
        run) is on the daemon's PATH."""
        path = shutil.which(self.shell)
        if path is None:
            return [{"name": "local shell", "ok": False, "detail": f"{self.shell!r} is not on the daemon's PATH"}]
        return [{"name": "local shell", "ok": True, "detail": path}]

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        """Start the detached runner and record its handle
        ``{"runner_pid", "runner_start", "run_dir"}``. Raises BackendError."""
        shell, grace = self._settings(spec)
        run_dir = attempt_dir(spec)
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        status_path = _status_path(run_dir)
        if spec.outputs_dir is not None:
            await anyio.to_thread.run_sync(make_outputs_dir, spec.outputs_dir, limiter=self._limiter)
        key = _run_key(run_dir).hex()
        # The launch lock, taken before the runner exists and handed down to
        # it: held for as long as any process of this launch (the launcher,
        # the runner) lives, so a restarted daemon that finds no handle can
        # tell a runner it never started from one whose handle it did not
        # record (see never_started).
        lock_fd = _take_launch_lock(run_dir)
        try:
            crash_point("start.locked")
            payload = json.dumps(
                {
                    "run_id": spec.run_id,
                    "command": spec.command,
                    "env": {**spec.env, **spec.jobsup_env},
                    "env_from": spec.env_from,
                    "links": json.dumps(dict(spec.links)) if spec.links else "",
                    "scope": "\x1f".join(self._scope(spec)),
                    "timeout_s": spec.timeout_s,
                    "kill_grace_s": grace,
                    "shell": shell,
                    "snapshot": str(spec.snapshot),
                    "status_path": str(status_path),
                    "status_key": key,
                    "snapshot_sha256": spec.snapshot_sha256,
                    "umask": spec.umask,
                    "lock_fd": lock_fd,
                }
            ).encode()

            def launch() -> subprocess.CompletedProcess[bytes]:
                # Isolated (-I: no user site, no PYTHON* variables, no cwd on the
                # path; -S: no site packages): the runner needs only the standard
                # library, and each one stays small (see the runner's docstring).
                return subprocess.run(
                    [*_runner_module.command(), str(run_dir)],
                    input=payload,
                    capture_output=True,
                    start_new_session=True,
                    pass_fds=(lock_fd,),
                    timeout=30,
                    check=False,
                )

            try:
                proc = await anyio.to_thread.run_sync(launch, limiter=self._limiter)
            except subprocess.TimeoutExpired:
                raise BackendError("the local runner did not start within 30s") from None
        finally:
            os.close(lock_fd)  # the runner holds it now (or nothing does: it did not start)
        if proc.returncode != 0:
            raise BackendError(f"the local runner failed to start: {proc.stderr.decode('utf-8', 'replace').strip()}")
        crash_point("start.spawned")
        info = json.loads(proc.stdout.decode().splitlines()[0])
        handle = {
            "runner_pid": info["pid"],
            "runner_start": info["start"],
            "run_dir": str(run_dir),
            "status": str(status_path),
            "output": str(run_dir / OUTPUT_DATA),
        }
        await reporter.handle(handle)
        return handle

    async def never_started(self, spec: RunSpec) -> bool:
        """Whether no runner of ``spec`` ever ran, for a run found at a
        restart with no handle recorded: no process holds its launch lock
        (the daemon takes it before spawning, the runner holds it for life),
        the runner wrote no status, and no process carries the run's id in
        its environment. Checked in that order: once the lock is free
        nothing can start a runner of this run but this daemon."""

        run_dir = attempt_dir(spec)

        def check() -> bool:
            if _launch_lock_held(run_dir):
                return False
            if self._read_status(run_dir) or (run_dir / "status.json").exists():
                return False
            return not run_processes(spec.run_id)

        return await anyio.to_thread.run_sync(check, limiter=self._limiter)

    async def _find_runner(self, run_dir: Path, reporter: RunReporter) -> dict[str, Any] | None:
        """The handle of a runner whose handle was never recorded (the
        daemon died between spawning it and recording it), recorded now:
        the runner writes its pid into its status first thing, while it
        holds the launch lock. None when the lock is free and there is still
        no status (the runner died before writing one)."""
        while True:
            status = self._read_status(run_dir)
            if "runner_pid" in status:
                handle = {
                    "runner_pid": status["runner_pid"],
                    "runner_start": status.get("runner_start"),
                    "run_dir": str(run_dir),
                    "status": str(_status_path(run_dir)),
                    "output": str(run_dir / OUTPUT_DATA),
                }
                await reporter.handle(handle)
                return handle
            if not await anyio.to_thread.run_sync(_launch_lock_held, run_dir, limiter=self._limiter):
                if "runner_pid" in self._read_status(run_dir):
                    continue
                return None
            await anyio.sleep(_POLL_MIN_S)

    @staticmethod
    def _runner_alive(handle: Mapping[str, Any]) -> bool:
        pid = handle.get("runner_pid")
        if not isinstance(pid, int):
            return False
        start = proc_start_time(pid)
        return start is not None and start == handle.get("runner_start")

    @staticmethod
    def _read_status(run_dir: Path, signed: bool = True) -> dict[str, Any]:
        """The runner's last status ({} when there is none yet, or when what
        is there is not a status the runner wrote: see :class:`_StatusFile`)."""
        return _StatusFile(run_dir, signed).read()

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        """Tail the output files into log events and report phases until the
        runner writes its final status (or is found gone: ERROR ``Lost``)."""
        run_dir = Path(str(handle.get("run_dir") or attempt_dir(spec)))
        if "runner_pid" not in handle:
            found = await self._adopt_runner(spec, run_dir, reporter)
            if found is None:
                return
            handle = found
        signed = "status" in handle  # runners from before signed statuses wrote RUN_DIR/status.json
        local = spec.config.get("local") or {}
        cap = _LogCap(
            max_bytes=int(local.get("max_log_bytes") or 0) or None, keep_files=bool(local.get("keep_log_files"))
        )
        tailers = await _open_output(
            run_dir, handle, reporter, count_recorded=cap.max_bytes is not None, prefix=_source_prefix(run_dir)
        )
        tailers.cap = cap
        delay = _POLL_MIN_S
        drained_at = 0.0  # time.monotonic() of the last drain
        status_file = _StatusFile(run_dir, signed)
        watch = self._wakeups.watch(
            run_dir, _status_path(run_dir).parent, handle.get("runner_pid"), handle.get("runner_start")
        )
        progress = ProgressFile(run_dir / PROGRESS_FILE, interval_of(spec.config))
        try:
            while True:
                watch.begin()  # a change from here on cuts the next nap short
                status = status_file.read()
                state = status.get("state")
                if state != "exited" and not self._runner_alive(handle):
                    # Read again: the runner may have finished between the two checks.
                    status = self._read_status(run_dir, signed)
                    state = status.get("state")
                    if state != "exited":
                        await self._drain(tailers, reporter, final=True)
                        await _record_progress(reporter, progress.final())
                        await anyio.to_thread.run_sync(_kill_lost_run, spec.run_id, status, limiter=self._limiter)
                        await self._report_outcome(status, reporter)
                        return
                # Phases first, then the output they explain: the audit trail
                # never shows a line before the RUNNING that produced it.
                await _report_phase(spec.run_id, state, status, reporter)
                if state == "exited":
                    await _record_progress(reporter, progress.final())
                    await self._finish(tailers, status, reporter)
                    _launch_lock_path(run_dir).unlink(missing_ok=True)
                    return
                if state == "running":
                    await _record_progress(reporter, progress.poll(time.monotonic()))
                got = unread = 0
                if state == "running":
                    unread = tailers.unread()
                    if unread >= _DRAIN_BYTES or (unread and time.monotonic() - drained_at >= _DRAIN_EVERY_S):
                        got = await self._drain(tailers, reporter, final=False)
                        drained_at = time.monotonic()
                delay = _POLL_MIN_S if got or unread else SWEEP_S if watch.event_driven else min(delay * 2, _POLL_MAX_S)
                if state == "running" and progress.in_use:
                    # Reports are looked at once per interval (see wakeups: only the first wakes).
                    watch.progress_seen = True
                    delay = min(delay, progress.limit.interval_s)
                if spec.run_id in self._woken:
                    self._woken.discard(spec.run_id)
                    continue
                with anyio.CancelScope() as nap:
                    self._naps[spec.run_id] = nap
                    await watch.nap(delay, idle=not unread)
        finally:
            self._naps.pop(spec.run_id, None)
            self._woken.discard(spec.run_id)
            watch.close()
            tailers.close()

    async def _adopt_runner(self, spec: RunSpec, run_dir: Path, reporter: RunReporter) -> Mapping[str, Any] | None:
        """The handle of a run whose handle was never recorded (the daemon
        died between starting the runner and recording it: the runner
        writes its identity into its status file), or None after reporting
        it ERROR ``Lost`` (what is left of it killed)."""
        found = await self._find_runner(run_dir, reporter)
        if found is None:
            await anyio.to_thread.run_sync(_kill_lost_run, spec.run_id, {}, limiter=self._limiter)
            await reporter.phase(
                "ERROR",
                reason="Lost",
                message="the run's local runner ended before it wrote a status (its start was interrupted)",
            )
        return found

    @staticmethod
    async def _drain(tailers: _Output, reporter: RunReporter, *, final: bool) -> int:
        """Record what the run's output holds past the reader's position:
        each read step (up to ``_READ_BYTES`` of the record, at most
        :data:`~supervisord.daemon.backends.local.tail.MAX_BLOCKS` blocks) is one
        append (one transaction and fsync); reading waits for each commit,
        so a flood is read no faster than it is recorded (and memory holds
        one step). Unless ``final``, it stops after a step that was not
        full (what arrived while that step committed waits for the next
        poll, rather than being recorded in a string of ever smaller
        steps). Past ``local.max_log_bytes`` nothing more is recorded (see
        :class:`_LogCap`); committed ranges are freed from the record unless
        ``local.keep_log_files`` (in ranges of at least
        :data:`~supervisord.daemon.backends.local.tail.RELEASE_BYTES`; the rest by
        the ``final`` drain). Returns the bytes recorded."""
        cap = tailers.cap
        total = 0
        while True:
            if cap.truncated:
                cap.dropped += tailers.skip_to_end()
                break
            mark = tailers.mark()
            items = tailers.read_blocks(final=final, max_bytes=_READ_BYTES)
            if not items:
                break
            blocks = []
            if cap.max_bytes is not None:
                recorded = tailers.recorded - sum(raw for _, raw in items)
                for block, raw in items:
                    if recorded + raw > cap.max_bytes:
                        cap.truncated = True
                        break
                    blocks.append(block)
                    recorded += raw
                if cap.truncated:
                    cap.dropped += tailers.recorded - recorded
                    tailers.recorded = recorded
            else:
                blocks = [block for block, _ in items]
            if blocks:
                try:
                    await reporter.log_blocks(blocks)
                except BaseException:
                    tailers.rewind(mark)
                    raise
                total += sum(len(b.text) for b in blocks)
                if not cap.keep_files:
                    tailers.release()
            if not final and len(items) < MAX_BLOCKS and sum(raw for _, raw in items) < _DRAIN_BYTES:
                break  # caught up: the rest is for a later poll
        if final and not cap.keep_files and not cap.truncated:
            tailers.release(force=True)  # what earlier drains left for a bigger range
        if cap.truncated and not cap.reported:
            cap.reported = True
            await reporter.record(LOGS_TRUNCATED(cap.event_data(tailers)))
        return total

    async def _finish(self, tailers: _Output, status: Mapping[str, Any], reporter: RunReporter) -> None:
        """The process has ended: record the rest of its output and its outcome.

        A small backlog is recorded before the outcome (so once ``wait``
        returns, ``logs`` shows everything). If it takes longer than
        ``_EXIT_DRAIN_S``, the outcome does not wait for it: a
        ``LogIngestPending`` event, the terminal phase, the rest of the
        backlog, then ``LogIngestDone`` (after a daemon restart the
        supervisor resumes runs whose ingest is pending)."""
        crash_point("final.status_seen")
        drained = False
        with anyio.move_on_after(_EXIT_DRAIN_S):
            await self._drain(tailers, reporter, final=True)
            drained = True
        if drained:
            crash_point("final.lines_recorded")
            await self._report_truncation(tailers, reporter)
            await self._report_outcome(status, reporter)
            return
        backlog = tailers.backlog()
        await reporter.record(LOG_INGEST_PENDING({"bytes": backlog}))
        await self._report_outcome(status, reporter)
        await self._drain(tailers, reporter, final=True)
        await self._report_truncation(tailers, reporter)
        await reporter.record(LOG_INGEST_DONE({}))

    @staticmethod
    async def _report_truncation(tailers: _Output, reporter: RunReporter) -> None:
        """At the end of a truncated run: a last ``LogsTruncated`` with the totals (``"final": true``)."""
        if tailers.cap.truncated:
            await reporter.record(LOGS_TRUNCATED({**tailers.cap.event_data(tailers), "final": True}))

    @staticmethod
    async def _report_outcome(status: Mapping[str, Any], reporter: RunReporter) -> None:
        if status.get("state") != "exited":
            await reporter.phase(
                "ERROR",
                reason="Lost",
                message="the run's local runner is gone without a final status (was the machine restarted?)",
            )
            return
        cpu_ms, rss = status.get("usage_cpu_ms"), status.get("usage_max_rss_bytes")
        if isinstance(cpu_ms, int) and isinstance(rss, int):
            # What the runner reaped used: the usage of a run too short for
            # the daemon's sampler to see (the supervisor records it only then).
            await reporter.record(
                RESOURCE_USAGE(
                    {"cpu_s": max(0, cpu_ms) / 1000, "max_rss_bytes": max(0, rss), "final": True, "source": "runner"}
                )
            )
        reason = str(status.get("reason") or "Unknown")
        phase = _OUTCOMES.get(reason, "ERROR")
        await reporter.phase(
            phase,
            reason=None if phase == "COMPLETED" else reason,
            message=status.get("message"),
            exit_code=status.get("exit_code"),
            final=True,
        )

    async def cancel(self, spec: RunSpec, handle: Mapping[str, Any]) -> None:
        """SIGTERM the runner (it stops the whole group: SIGTERM, grace,
        SIGKILL) and return once the runner and every process of the group
        are gone. Idempotent."""
        run_dir = Path(str(handle.get("run_dir") or attempt_dir(spec)))
        _, grace = self._settings(spec)
        if self._runner_alive(handle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(handle["runner_pid"]), signal.SIGTERM)
        with anyio.move_on_after(grace + 30):
            await _runner_gone(handle)
        # The runner is gone. If it died without a final status (killed with
        # -9), nothing reaped its group: stop what is left. (After a final
        # status the group was already empty and its pgid may be reused.)
        status = self._read_status(run_dir, "status" in handle)
        pgid = status.get("pgid")
        if status.get("state") == "running" and isinstance(pgid, int):
            await anyio.to_thread.run_sync(_kill_lost_run, spec.run_id, status, limiter=self._limiter)
            with anyio.fail_after(30):
                while group_alive(pgid):  # noqa: ASYNC110 - a process group's life: nothing tells its end
                    await anyio.sleep(0.02)
        # Let supervise see the final status now, not at its next poll (up
        # to 0.5 s later): a cancel of many runs waits for each in turn.
        nap = self._naps.get(spec.run_id)
        if nap is not None:
            self._woken.add(spec.run_id)
            nap.cancel()

    async def pause(self, spec: RunSpec, handle: Mapping[str, Any]) -> dict[str, Any]:
        """SIGUSR1 to the runner, which stops the job's process group and
        every descendant (SIGSTOP) and keeps recording; returns its status
        once it says paused. Raises BackendError."""
        return await self._signal_runner(spec, handle, signal.SIGUSR1, paused=True)

    async def resume(self, spec: RunSpec, handle: Mapping[str, Any]) -> dict[str, Any]:
        """SIGUSR2 to the runner, which continues the job (SIGCONT) and moves
        its deadline by the pause's length; returns its status once it says
        so. Raises BackendError."""
        return await self._signal_runner(spec, handle, signal.SIGUSR2, paused=False)

    async def _signal_runner(
        self, spec: RunSpec, handle: Mapping[str, Any], sig: int, *, paused: bool
    ) -> dict[str, Any]:
        run_dir = Path(str(handle.get("run_dir") or attempt_dir(spec)))
        signed = "status" in handle
        status = self._read_status(run_dir, signed)
        if status.get("state") != "running" or not self._runner_alive(handle):
            raise BackendError(f"run {spec.run_id} is not running")
        if not status.get("pausable"):
            raise BackendError(f"run {spec.run_id} was started by an older jobsup whose runner cannot pause")
        try:
            os.kill(int(handle["runner_pid"]), sig)
        except ProcessLookupError:
            raise BackendError(f"run {spec.run_id}: its runner is gone") from None
        with anyio.move_on_after(10):
            while True:
                status = self._read_status(run_dir, signed)
                if bool(status.get("paused")) == paused or status.get("state") != "running":
                    break
                await anyio.sleep(0.02)
        if status.get("state") != "running":
            if not paused and status.get("state") == "exited":
                return status  # resumed, and it ended at once (its work was done)
            raise BackendError(f"run {spec.run_id} ended meanwhile")
        if bool(status.get("paused")) != paused:
            raise BackendError(f"run {spec.run_id}: its runner did not confirm within 10s")
        nap = self._naps.get(spec.run_id)  # let supervise record the reason now
        if nap is not None:
            self._woken.add(spec.run_id)
            nap.cancel()
        return status

    async def serve(self) -> None:
        """Read the inotify descriptor that wakes the runs' loops (see
        :mod:`~supervisord.daemon.backends.local.wakeups`) until cancelled."""
        await self._wakeups.serve()

    async def aclose(self) -> None:
        """Close the inotify descriptor; runners are detached and keep running."""
        self._wakeups.close()


async def _runner_gone(handle: Mapping[str, Any]) -> None:
    """Return once the runner of ``handle`` has exited: waits on its pidfd
    (no polling: a cancel of 500 runs waits for all of them at once), or
    polls every 50 ms where no pidfd can be had."""
    fd = open_pidfd(handle.get("runner_pid"), handle.get("runner_start"))
    if fd is not None:
        try:
            await anyio.wait_readable(fd)
        finally:
            os.close(fd)
        return
    while LocalBackend._runner_alive(handle):  # noqa: ASYNC110 (no pidfd: nothing tells)
        await anyio.sleep(0.05)


@dataclasses.dataclass
class _LogCap:
    """A run's ``local.max_log_bytes`` (None: no cap) and ``keep_log_files``.

    The bytes recorded are counted in the output record (at a resume: each
    stream's bytes below its newest recorded position), so the cap holds
    across restarts. Once a block would pass the cap, nothing more is
    recorded: the run goes on, and one ``LogsTruncated`` event says so::

        {"max_log_bytes": int, "recorded_bytes": int, "dropped_bytes": int}

    (``dropped_bytes``: what was not recorded when the event was written;
    the job may write more after it.)
    """

    max_bytes: int | None
    keep_files: bool
    truncated: bool = False
    reported: bool = False
    dropped: int = 0

    def event_data(self, tailers: _Output) -> LogsTruncatedData:
        return {"max_log_bytes": self.max_bytes, "recorded_bytes": tailers.recorded, "dropped_bytes": self.dropped}


class _Output(RecordTailer):
    """A run's output reader, with its :class:`_LogCap`."""

    cap: _LogCap


class _LegacyOutput(_Output):
    """The output of a run whose runner predates the output record (in
    flight across an upgrade): ``stdout.log`` and ``stderr.log``, each read
    by a :class:`FileTailer` (sources ``stdout`` and ``stderr``; positions
    are offsets in each file), stdout's lines first in each step."""

    def __init__(self, run_dir: Path, positions: dict[str, int]) -> None:
        super().__init__(run_dir, {})
        self.files = {s: FileTailer(run_dir / f"{s}.log", positions[s]) for s in _STREAMS}
        self.path = run_dir / "stdout.log"

    def read_blocks(self, *, final: bool = False, max_bytes: int = 4 << 20) -> list[tuple[LogBlock, int]]:
        out = []
        for stream, tailer in self.files.items():
            before = tailer.offset
            block = tailer.read_block(stream, final=final, max_bytes=max_bytes)
            if block is not None:
                out.append((block, tailer.offset - before))
        return out

    def mark(self) -> Any:
        return {s: t.offset for s, t in self.files.items()}

    def rewind(self, mark: Any) -> None:
        for s, t in self.files.items():
            t.rewind(mark[s])

    @property
    def recorded(self) -> int:
        return sum(t.offset for t in self.files.values()) - self.cap.dropped

    @recorded.setter
    def recorded(self, value: int) -> None:
        pass  # derived from the offsets

    def backlog(self) -> int:
        return sum(max(0, _file_size(t.path) - t.offset) for t in self.files.values())

    def unread(self) -> int:
        return self.backlog()

    def release(self, *, force: bool = False) -> None:
        for t in self.files.values():
            t.release()

    def skip_to_end(self) -> int:
        return sum(t.skip_to_end() for t in self.files.values())

    def close(self) -> None:
        for t in self.files.values():
            t.close()


async def _open_output(
    run_dir: Path, handle: Mapping[str, Any], reporter: RunReporter, *, count_recorded: bool, prefix: str = ""
) -> _Output:
    """The reader of a run's output, resuming after what is recorded: the
    output record (``output.log``/``output.idx``), or for a run started by
    a runner from before it, the two plain files."""
    if "output" not in handle and (run_dir / "stdout.log").exists() and not (run_dir / OUTPUT_DATA).exists():
        legacy = {}
        for stream in _STREAMS:
            pos = await reporter.log_position(stream)
            legacy[stream] = int(pos) if pos else 0
        return _LegacyOutput(run_dir, legacy)
    positions: dict[str, int | None] = {}
    for stream in _STREAMS:
        pos = await reporter.log_position(prefix + record_source(stream))
        positions[stream] = int(pos) if pos else None
    return _Output(run_dir, positions, count_recorded=count_recorded, source_prefix=prefix)


async def _report_phase(run_id: str, state: Any, status: Mapping[str, Any], reporter: RunReporter) -> None:
    """Report the phase the runner's ``status`` (its ``state``) shows:
    STAGING, then RUNNING (with reason Paused while it is paused)."""
    if state in ("staging", "running") or status.get("started_at"):
        await reporter.phase("STAGING")
    if state == "running" and status.get("paused"):
        await reporter.phase("RUNNING", reason=PAUSED, message=paused_message(run_id))
    elif state == "running" or status.get("started_at"):
        await reporter.phase("RUNNING")


async def _record_progress(reporter: RunReporter, data: Mapping[str, Any] | None) -> None:
    """Record a progress report (supervisord.shared.progress) as a Progress event."""
    if data is not None:
        await reporter.record(PROGRESS(cast(ProgressData, data)))


def make_outputs_dir(path: Path) -> None:
    """Create a run's outputs folder ``path`` (and its parents) mode 0700,
    before the run starts; an existing one is kept as it is if it is a
    folder of this user's. Raises BackendError naming it (the run ends
    ERROR: it never starts without the folder its JOBSUP_OUTPUT_DIR names)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                raise BackendError(f"the outputs folder {path} exists and is not a folder of yours") from None
        os.chmod(path, 0o700)
    except OSError as err:
        raise BackendError(f"cannot create the outputs folder {path}: {err.strerror or err}") from None


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


_KEY_FILE = "key"


_ATTEMPT_DIR = re.compile(r"^a([0-9]+)$")


def attempt_dir(spec: RunSpec) -> Path:
    """The folder of the run's current attempt: ``spec.run_dir`` for the
    first, ``spec.run_dir/a<N>`` for attempt N > 1 (supervisord.shared.retry): its
    own snapshot, output record and status, none of the earlier attempt's."""
    return spec.run_dir if spec.attempt <= 1 else spec.run_dir / f"a{spec.attempt}"


def _source_prefix(run_dir: Path) -> str:
    """``a<N>/`` for an attempt's folder (its log sources are its own: the
    positions start again at 0), else ``""``."""
    return f"{run_dir.name}/" if _ATTEMPT_DIR.match(run_dir.name) else ""


def _status_place(run_dir: Path) -> tuple[Path, str]:
    """The status folder (``<runs dir>/.status``) and the name of ``run_dir``
    in it: the run id, or ``<run id>.a<N>`` for an attempt's folder."""
    if _ATTEMPT_DIR.match(run_dir.name):
        return run_dir.parent.parent / ".status", f"{run_dir.parent.name}.{run_dir.name}"
    return run_dir.parent / ".status", run_dir.name


def _launch_lock_path(run_dir: Path) -> Path:
    """The run's launch lock: ``<runs dir>/.status/<run id>.lock`` (next to its status)."""
    folder, name = _status_place(run_dir)
    return folder / f"{name}.lock"


def _take_launch_lock(run_dir: Path) -> int:
    """Open and lock (flock, exclusive) the run's launch lock; return the
    descriptor (close-on-exec: only the runner's launcher gets it, through
    ``pass_fds``). Raises BackendError when a process already holds it: a
    runner of this run is alive."""
    path = _launch_lock_path(run_dir)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise BackendError(f"a runner of run {run_dir.name} is already running (it holds {path})") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _launch_lock_held(run_dir: Path) -> bool:
    """Whether a process (a runner of the run, or its launcher) holds the
    run's launch lock. A free lock is not kept."""
    try:
        fd = os.open(_launch_lock_path(run_dir), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _status_path(run_dir: Path) -> Path:
    """Where the runner of ``run_dir`` keeps its status: ``<runs dir>/.status/<run id>``,
    outside the job's working tree (``RUN_DIR/repo``), so nothing the job
    does in or around its own folder reaches it."""
    folder, name = _status_place(run_dir)
    return folder / name


def _run_key(run_dir: Path) -> bytes:
    """The run's status key: HMAC-SHA256 of the run id under the local
    backend's key (``<runs dir>/.status/key``, 32 random bytes, mode 0600,
    created on first use). The runner gets it on stdin; a status without a
    valid MAC under it is not taken (see the runner's threat model)."""
    folder, name = _status_place(run_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / _KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        master = path.read_bytes()
        if len(master) != 32:
            raise BackendError(f"{path} is damaged ({len(master)} bytes, expected 32)") from None
    else:
        master = secrets.token_bytes(32)
        with os.fdopen(fd, "wb") as f:
            f.write(master)
            f.flush()
            os.fsync(f.fileno())
    return hmac.new(master, name.encode(), hashlib.sha256).digest()


class _StatusFile:
    """The runner's status, read again only when the file changed.

    Signed (the runner's current format, see
    :mod:`supervisord.daemon.backends.local.runner`): ``<runs dir>/.status/<id>``,
    rewritten in place and verified with the run's key; a record that is not
    valid (torn by a concurrent rewrite, or not written by the runner) is
    ignored and the last valid status kept. Unsigned (``signed=False``): the
    plain ``RUN_DIR/status.json`` of runners from before, replaced by rename.
    An unchanged (inode, mtime, ctime, size) means unchanged content: most
    polls cost a ``stat`` instead of an open, read and parse.
    """

    def __init__(self, run_dir: Path, signed: bool = True) -> None:
        self.run_dir = run_dir
        self.path = _status_path(run_dir) if signed else run_dir / "status.json"
        self._mac_key = _run_key(run_dir) if signed else None
        self._key: tuple[int, int, int, int] | None = None
        self._rejected: tuple[int, int, int, int] | None = None
        self._data: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        """The last valid status ({} when there is none)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._key, self._data = None, {}
            return {}
        key = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if key != self._key:
            try:
                raw = self.path.read_bytes()
            except FileNotFoundError:
                return self._data
            data = decode_status(raw, self._mac_key)
            if data is not None:
                self._data = data
                self._key = key
            elif raw.strip() and key != self._rejected:  # once per version of the file
                self._rejected = key
                log.warning(
                    "local.status_rejected",
                    run=self.run_dir.name,
                    path=str(self.path),
                    hint="not a status the runner wrote (torn, or written by something else); ignored",
                )
        return self._data


def _kill_orphaned_group(status: Mapping[str, Any]) -> None:
    """The runner died without a final status: SIGKILL what is left of its
    job's process group, so a Lost run leaves nothing running.

    A pgid stays reserved while any member lives, so a live group is the
    job's; if a process now has the leader's pid, it must also have the
    leader's recorded start time (else the pid was reused: leave it alone).
    """
    pgid = status.get("pgid")
    if not isinstance(pgid, int):
        return
    start = proc_start_time(pgid)
    if start is not None and start != status.get("child_start"):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def run_processes(run_id: str) -> list[int]:
    """Pids of this user's live processes whose environment carries
    ``JOBSUP_RUN_ID=<run_id>`` (``/proc/PID/environ``, proc(5)): every
    process of the run's job, including those that left its process group
    (setsid, double fork) and were re-parented to init when the runner died.
    Never this process."""
    return [pid for pid in pids_with_env("JOBSUP_RUN_ID", run_id) if proc_start_time(pid) is not None]


def _kill_lost_run(run_id: str, status: Mapping[str, Any]) -> None:
    """The runner died without a final status: SIGKILL its job's process
    group and every process that carries the run's id in its environment
    (the runner is no longer there to reap those that left the group), until
    none is left (at most ~5 s: a process could keep forking)."""
    _kill_orphaned_group(status)
    for _ in range(250):
        pids = run_processes(run_id)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    log.warning("local.lost_run_survivors", run=run_id, pids=run_processes(run_id))
