"""The local backend: each run is a process group on this machine, driven by
its own detached runner (:mod:`supervisord.backends.local.runner`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import anyio
import structlog

from store import LOG_INGEST_DONE, LOG_INGEST_PENDING
from supervisord.backends.base import RunReporter, RunSpec
from supervisord.backends.local.runner import group_alive, proc_start_time
from supervisord.backends.local.tail import FileTailer
from supervisord.exceptions import BackendError, PreflightError

__all__ = ["LocalBackend"]

log = structlog.get_logger("jobsup.local")

_STREAMS = ("stdout", "stderr")
# One drain step reads at most this much of a file and records it as one
# block (one append: one transaction and fsync).
_READ_BYTES = 4 << 20
# After the process ends, its outcome waits at most this long for the
# output backlog to be recorded (then: LogIngestPending, see _finish).
_EXIT_DRAIN_S = 2.0
_POLL_MIN_S = 0.02
_POLL_MAX_S = 1.0

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

    def _settings(self, spec: RunSpec) -> tuple[str, int]:
        local = spec.config.get("local") or {}
        return str(local.get("shell") or self.shell), int(local.get("kill_grace_s") or self.kill_grace_s)

    async def preflight(self, spec: RunSpec) -> list[str]:
        """Check the shell exists. Raises PreflightError naming it."""
        shell, _ = self._settings(spec)
        if shutil.which(shell) is None:
            raise PreflightError(f"local.shell {shell!r} is not on PATH")
        return []

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        """Start the detached runner and record its handle
        ``{"runner_pid", "runner_start", "run_dir"}``. Raises BackendError."""
        shell, grace = self._settings(spec)
        spec.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        payload = json.dumps(
            {
                "command": spec.command,
                "env": dict(spec.env),
                "timeout_s": spec.timeout_s,
                "kill_grace_s": grace,
                "shell": shell,
                "snapshot": str(spec.snapshot),
            }
        ).encode()

        def launch() -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(
                [sys.executable, "-m", "supervisord.backends.local.runner", str(spec.run_dir)],
                input=payload,
                capture_output=True,
                start_new_session=True,
                timeout=30,
                check=False,
            )

        try:
            proc = await anyio.to_thread.run_sync(launch, limiter=self._limiter)
        except subprocess.TimeoutExpired:
            raise BackendError("the local runner did not start within 30s") from None
        if proc.returncode != 0:
            raise BackendError(
                f"the local runner failed to start: {proc.stderr.decode('utf-8', 'replace').strip()}"
            )
        info = json.loads(proc.stdout.decode().splitlines()[0])
        handle = {"runner_pid": info["pid"], "runner_start": info["start"], "run_dir": str(spec.run_dir)}
        await reporter.handle(handle)
        return handle

    @staticmethod
    def _runner_alive(handle: Mapping[str, Any]) -> bool:
        pid = handle.get("runner_pid")
        if not isinstance(pid, int):
            return False
        start = proc_start_time(pid)
        return start is not None and start == handle.get("runner_start")

    @staticmethod
    def _read_status(run_dir: Path) -> dict[str, Any]:
        try:
            data = json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        """Tail the output files into log events and report phases until the
        runner writes its final status (or is found gone: ERROR ``Lost``)."""
        run_dir = Path(str(handle.get("run_dir") or spec.run_dir))
        if "runner_pid" not in handle:
            # The daemon died between starting the runner and recording its
            # handle: the runner wrote its identity into its status file.
            status = self._read_status(run_dir)
            if "runner_pid" in status:
                handle = {"runner_pid": status["runner_pid"], "runner_start": status.get("runner_start"),
                          "run_dir": str(run_dir)}
                await reporter.handle(handle)
        tailers: dict[str, FileTailer] = {}
        for stream in _STREAMS:
            pos = await reporter.log_position(stream)
            tailers[stream] = FileTailer(run_dir / f"{stream}.log", int(pos) if pos else 0)
        local = spec.config.get("local") or {}
        tailers = _Outputs(tailers)
        tailers.cap = _LogCap(
            max_bytes=int(local.get("max_log_bytes") or 0) or None, keep_files=bool(local.get("keep_log_files"))
        )
        delay = _POLL_MIN_S
        status_file = _StatusFile(run_dir)
        try:
            while True:
                status = status_file.read()
                state = status.get("state")
                if state != "exited" and not self._runner_alive(handle):
                    # Read again: the runner may have finished between the two checks.
                    status = self._read_status(run_dir)
                    state = status.get("state")
                    if state != "exited":
                        await self._drain(tailers, reporter, final=True)
                        await self._report_outcome(status, reporter)
                        return
                # Phases first, then the output they explain: the audit trail
                # never shows a line before the RUNNING that produced it.
                if state in ("staging", "running") or status.get("started_at"):
                    await reporter.phase("STAGING")
                if state == "running" or status.get("started_at"):
                    await reporter.phase("RUNNING")
                if state == "exited":
                    await self._finish(tailers, status, reporter)
                    return
                got = await self._drain(tailers, reporter, final=False) if state == "running" else 0
                delay = _POLL_MIN_S if got else min(delay * 2, _POLL_MAX_S)
                if spec.run_id in self._woken:
                    self._woken.discard(spec.run_id)
                    continue
                with anyio.CancelScope() as nap:
                    self._naps[spec.run_id] = nap
                    await anyio.sleep(delay)
        finally:
            self._naps.pop(spec.run_id, None)
            self._woken.discard(spec.run_id)
            for t in tailers.values():
                t.close()

    @staticmethod
    async def _drain(tailers: Mapping[str, FileTailer], reporter: RunReporter, *, final: bool) -> int:
        """Record what each output file holds past its tailer's offset, one
        block (one append: a transaction and fsync) per read of up to
        ``_READ_BYTES``; reading waits for each commit, so a flood is read
        no faster than it is recorded (and memory holds one block). Past
        ``local.max_log_bytes`` nothing more is recorded (see
        :class:`_LogCap`); committed ranges are freed from the files unless
        ``local.keep_log_files``. Returns the bytes recorded."""
        cap = tailers.cap if isinstance(tailers, _Outputs) else _LogCap(max_bytes=None, keep_files=True)
        total = 0
        for stream, tailer in tailers.items():
            while True:
                if cap.truncated:
                    cap.dropped += tailer.skip_to_end()
                    break
                before = tailer.offset
                block = tailer.read_block(stream, final=final, max_bytes=_READ_BYTES)
                if block is None:
                    break
                if not cap.allows(len(block.text), tailers):
                    cap.truncated = True
                    cap.dropped += len(block.text)
                    continue
                try:
                    await reporter.log_block(block)
                except BaseException:
                    tailer.rewind(before)
                    raise
                total += len(block.text)
                if not cap.keep_files:
                    tailer.release()
            if cap.truncated and not cap.reported:
                cap.reported = True
                await reporter.record(LOGS_TRUNCATED, cap.event_data(tailers))
        return total

    async def _finish(self, tailers: Mapping[str, FileTailer], status: Mapping[str, Any], reporter: RunReporter) -> None:
        """The process has ended: record the rest of its output and its outcome.

        A small backlog is recorded before the outcome (so once ``wait``
        returns, ``logs`` shows everything). If it takes longer than
        ``_EXIT_DRAIN_S``, the outcome does not wait for it: a
        ``LogIngestPending`` event, the terminal phase, the rest of the
        backlog, then ``LogIngestDone`` (after a daemon restart the
        supervisor resumes runs whose ingest is pending)."""
        drained = False
        with anyio.move_on_after(_EXIT_DRAIN_S):
            await self._drain(tailers, reporter, final=True)
            drained = True
        if drained:
            await self._report_truncation(tailers, reporter)
            await self._report_outcome(status, reporter)
            return
        backlog = sum(max(0, _file_size(t.path) - t.offset) for t in tailers.values())
        await reporter.record(LOG_INGEST_PENDING, {"bytes": backlog})
        await self._report_outcome(status, reporter)
        await self._drain(tailers, reporter, final=True)
        await self._report_truncation(tailers, reporter)
        await reporter.record(LOG_INGEST_DONE, {})

    @staticmethod
    async def _report_truncation(tailers: Mapping[str, FileTailer], reporter: RunReporter) -> None:
        """At the end of a truncated run: a last ``LogsTruncated`` with the totals (``"final": true``)."""
        if isinstance(tailers, _Outputs) and tailers.cap.truncated:
            await reporter.record(LOGS_TRUNCATED, {**tailers.cap.event_data(tailers), "final": True})

    @staticmethod
    async def _report_outcome(status: Mapping[str, Any], reporter: RunReporter) -> None:
        if status.get("state") != "exited":
            _kill_orphaned_group(status)
            await reporter.phase(
                "ERROR",
                reason="Lost",
                message="the run's local runner is gone without a final status (was the machine restarted?)",
            )
            return
        reason = str(status.get("reason") or "Unknown")
        phase = _OUTCOMES.get(reason, "ERROR")
        await reporter.phase(
            phase,
            reason=None if phase == "COMPLETED" else reason,
            message=status.get("message"),
            exit_code=status.get("exit_code"),
        )

    async def cancel(self, spec: RunSpec, handle: Mapping[str, Any]) -> None:
        """SIGTERM the runner (it stops the whole group: SIGTERM, grace,
        SIGKILL) and return once the runner and every process of the group
        are gone. Idempotent."""
        run_dir = Path(str(handle.get("run_dir") or spec.run_dir))
        _, grace = self._settings(spec)
        if self._runner_alive(handle):
            try:
                os.kill(int(handle["runner_pid"]), signal.SIGTERM)
            except ProcessLookupError:
                pass
        with anyio.move_on_after(grace + 30):
            while self._runner_alive(handle):
                await anyio.sleep(0.05)
        # The runner is gone. If it died without a final status (killed with
        # -9), nothing reaped its group: stop what is left. (After a final
        # status the group was already empty and its pgid may be reused.)
        status = self._read_status(run_dir)
        pgid = status.get("pgid")
        if status.get("state") == "running" and isinstance(pgid, int):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            with anyio.fail_after(30):
                while group_alive(pgid):
                    await anyio.sleep(0.02)
        # Let supervise see the final status now, not at its next poll (up
        # to 0.5 s later): a cancel of many runs waits for each in turn.
        nap = self._naps.get(spec.run_id)
        if nap is not None:
            self._woken.add(spec.run_id)
            nap.cancel()

    async def serve(self) -> None:
        """Nothing shared between local runs."""

    async def aclose(self) -> None:
        """Nothing to release: runners are detached and keep running."""


LOGS_TRUNCATED = "LogsTruncated"


@dataclasses.dataclass
class _LogCap:
    """A run's ``local.max_log_bytes`` (None: no cap) and ``keep_log_files``.

    The bytes recorded are the tailers' committed offsets (byte offsets of
    the files: what a restart resumes from), so the cap holds across
    restarts. Once a block would pass the cap, nothing more is recorded:
    the run goes on, and one ``LogsTruncated`` event says so::

        {"max_log_bytes": int, "recorded_bytes": int, "dropped_bytes": int}

    (``dropped_bytes``: what was not recorded when the event was written;
    the job may write more after it.)
    """

    max_bytes: int | None
    keep_files: bool
    truncated: bool = False
    reported: bool = False
    dropped: int = 0

    def allows(self, size: int, tailers: Mapping[str, FileTailer]) -> bool:
        if self.max_bytes is None:
            return True
        # The committed offsets: each tailer's offset before this block was read.
        recorded = sum(t.offset for t in tailers.values()) - size
        return recorded + size <= self.max_bytes

    def event_data(self, tailers: Mapping[str, FileTailer]) -> dict[str, Any]:
        recorded = sum(t.offset for t in tailers.values()) - self.dropped
        return {"max_log_bytes": self.max_bytes, "recorded_bytes": recorded, "dropped_bytes": self.dropped}


class _Outputs(dict[str, FileTailer]):
    """A run's tailers by stream, with its :class:`_LogCap`."""

    cap: _LogCap


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


class _StatusFile:
    """``RUN_DIR/status.json``, read again only when it changed.

    The runner replaces the file by rename at each step, and each step's
    status is longer than the one before (it adds fields), so an unchanged
    (inode, mtime, ctime, size) means unchanged content: most polls cost a
    ``stat`` instead of an open, read and JSON parse.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._key: tuple[int, int, int, int] | None = None
        self._data: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        """The status as :meth:`LocalBackend._read_status` reads it ({} when missing)."""
        try:
            st = os.stat(self.run_dir / "status.json")
        except FileNotFoundError:
            self._key, self._data = None, {}
            return {}
        key = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if key != self._key:
            self._data = LocalBackend._read_status(self.run_dir)
            self._key = key
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
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass

