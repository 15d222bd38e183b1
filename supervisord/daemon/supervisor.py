"""The supervisor: one task per run, turning what a backend reports into events.

Every phase change goes through :class:`_Reporter.phase`, which applies the
run's rules (:func:`supervisord.shared.lifecycle.decide`: phases never go backwards,
a terminal phase is final, while a cancel is in progress the cancel owns the
terminal outcome) under the run's lock.
Appends for one run are serialised by a per-run lock and carry the run's
stream version (optimistic concurrency in the store).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, cast

import anyio
import anyio.abc
import structlog

from store import (
    TERMINAL_PHASES,
    Append,
    ConcurrencyError,
    EventStore,
    LogBlock,
    RecordedEvent,
    RunStatus,
)
from supervisord.daemon.backends.base import PAUSED, Backend, Pausable, RunSpec, paused_message
from supervisord.daemon.crashpoints import crash_point
from supervisord.daemon.readside import resolve_run_id
from supervisord.daemon.scheduler.update import apply_updates
from supervisord.daemon.world import with_after_outputs, world_fields
from supervisord.shared.events import (
    ATTEMPT_ENDED,
    ATTEMPT_STARTED,
    CANCEL_FAILED,
    CANCEL_REQUESTED,
    HANDLE_RECORDED,
    LOG_INGEST_DONE,
    LOG_INGEST_PENDING,
    LOG_LINES,
    PHASE_CHANGED,
    PROGRESS,
    RESOURCE_USAGE,
    RESUMED,
    RUN_UPDATED,
    STORAGE_TROUBLE,
    SUBMITTED,
    SWEEP_SUBMITTED,
    AttemptEndedData,
    CancelRequestedData,
    Event,
    PausedData,
    PhaseChangedData,
    ProgressData,
    ResourceUsageData,
    RunUpdatedData,
    StorageTroubleData,
    SubmittedData,
    SweepSubmittedData,
)
from supervisord.shared.events import PAUSED as PAUSED_EVENT
from supervisord.shared.exceptions import (
    BackendError,
    RunInFlightError,
    RunNotFoundError,
    UsageError,
)
from supervisord.shared.lifecycle import PHASE_RANK, RunPhase, decide, reached
from supervisord.shared.paths import Paths
from supervisord.shared.progress import LOG_PREFIX as PROGRESS_LOG_PREFIX
from supervisord.shared.progress import RateLimit, parse_progress
from supervisord.shared.progress import interval_of as progress_interval
from supervisord.shared.retry import RETRYING, RetryPolicy, policy_of
from supervisord.shared.source import SnapshotStore, disk_full, is_no_space
from supervisord.shared.sweep import param_env

__all__ = ["MAX_LINES_PER_EVENT", "OOM_KILLED", "PHASE_RANK", "LocalRunView", "SubmitResult", "Supervisor"]

log = structlog.get_logger("jobsup.supervisor")

_CANCEL_DRAIN_S = 30.0
#: The reason of a run ended for passing its memory limit.
OOM_KILLED: Final = "OOMKilled"


@dataclasses.dataclass(frozen=True)
class LocalRunView:
    """What the usage sampler reads of a running local run: its id, the
    handle (runner pid and start), its Submitted data and kill grace."""

    run_id: str
    handle: Mapping[str, Any]
    submitted: Mapping[str, Any]
    kill_grace_s: int


#: The most log lines one LogLines event holds (~400 KB of 100-byte lines).
MAX_LINES_PER_EVENT = 4000
#: The expected version of the retry after a ConcurrencyError: at the end of
#: the stream, whatever its version. The run's own appends are serialised by
#: its lock, so a stale cached version means that someone else appended an
#: event that does not bear on the supervisor's state (a hook outcome, which
#: is appended at any version; an append whose cancelled caller still
#: committed). Adopting the reported version and retrying once would lose
#: the append whenever another such event (several hooks answering one
#: phase change) lands in the same commit batch as the retry.
_AT_THE_END: Final = None


def _epoch(at: str) -> float:
    """Epoch seconds of an event's ``at`` (RFC 3339 UTC)."""
    return dt.datetime.fromisoformat(at).timestamp()


def _env_digests(submitted: Mapping[str, Any]) -> dict[str, str | None]:
    """NAME -> the digest a Submitted event recorded for it (None when it has none)."""
    recorded = submitted.get("env")
    if not isinstance(recorded, Mapping):
        return {}
    return {str(k): (str(v) if v is not None else None) for k, v in recorded.items()}


def _sweep_env(submitted: Mapping[str, Any], run_id: str) -> dict[str, str]:
    """A sweep run's own variables (JOBSUP_PARAM_*, JOBSUP_SWEEP_ID,
    JOBSUP_SWEEP_INDEX), from its Submitted data; {} for another run."""
    sweep_id, params, index = submitted.get("sweep_id"), submitted.get("params"), submitted.get("sweep_index")
    if not isinstance(sweep_id, str) or not isinstance(params, Mapping):
        return {}
    return param_env({str(k): str(v) for k, v in params.items()}, sweep_id, int(index or 0))


@dataclasses.dataclass(frozen=True)
class SubmitResult:
    """What :meth:`Supervisor.submit_run` returns: the new ``run``'s status
    and the backend preflight's ``warnings`` (one line each)."""

    run: RunStatus
    warnings: list[str]


class _RunState:
    def __init__(self, spec: RunSpec, status: RunStatus) -> None:
        self.spec = spec
        self.version = status.version
        self.phase = status.phase
        self.reason = status.reason
        self.message = status.message
        self.handle: dict[str, Any] = dict(status.handle)
        self.lock = anyio.Lock()
        self.cancel_requested = False
        self.scope: anyio.CancelScope | None = None
        self.done = anyio.Event()
        # Set once supervision offers a terminal phase (recorded or not): the
        # process has ended; what follows is only its output backlog.
        self.outcome_seen = anyio.Event()
        self.ingest_pending = status.log_ingest == "pending"
        # Scheduling: set when the run may start (admitted) or ended while
        # queued; ``extra_env`` is what admission adds (the GPUs' variables).
        self.unqueued = anyio.Event()
        self.admitted = False
        self.extra_env: dict[str, str] = {}
        # Set by the usage sampler when it stops the run for passing its
        # memory limit: the run's outcome is then ERROR OOMKilled with it.
        self.over_limit: str | None = None
        # The usage sampler recorded a ResourceUsage of this run (its own
        # final one follows the end): the runner's figures are then not recorded.
        self.sampled = False
        # Progress reports read from its log lines (Kubernetes: supervisord.shared.progress).
        self.progress: RateLimit | None = None
        # A start in flight (the backend's ``start`` has not returned): a
        # cancel then stops the run again once its handle is known.
        self.starting = False
        self.start_done = anyio.Event()
        # Where its output was last recorded, read for every run at once at
        # reattach: source -> pos, each answered once (_Reporter.log_position).
        self.resume_positions: dict[str, str] | None = None
        self.resume_asked: set[str] = set()
        self._init_retry(status.attempt)

    def _init_retry(self, attempt: int) -> None:
        """The retry bookkeeping (supervisord.shared.retry): the run's policy, the
        attempt under way, the outcome held back from the record when an
        attempt ended in a way the policy retries, and the backoff."""
        self.policy: RetryPolicy | None = policy_of(self.spec.submitted)
        self.attempt = attempt
        self.retry_outcome: tuple[str | None, str | None, int | None] | None = None
        # Seconds still to wait before the next attempt (set after an
        # AttemptEnded, or at a restart during the backoff); None: no wait.
        self.backoff_left: float | None = None
        self.backoff_scope: anyio.CancelScope | None = None

    def retries_left(self) -> bool:
        """Whether the policy allows another attempt after the current one."""
        return self.policy is not None and self.attempt <= self.policy.attempts

    @classmethod
    def queued(cls, spec: RunSpec) -> _RunState:
        """The state of a run about to be submitted (stream version 0, QUEUED)."""
        self = cls.__new__(cls)
        self.spec, self.version, self.phase, self.reason, self.message = spec, 0, "QUEUED", None, None
        self.handle = {}
        self.lock = anyio.Lock()
        self.cancel_requested = False
        self.scope = None
        self.done = anyio.Event()
        self.unqueued = anyio.Event()
        self.admitted = False
        self.extra_env = {}
        self.outcome_seen = anyio.Event()
        self.ingest_pending = False
        self.over_limit = None
        self.sampled = False
        self.progress = None
        self.starting = False
        self.start_done = anyio.Event()
        self.resume_positions = None
        self.resume_asked = set()
        self._init_retry(1)
        return self


class _Barrier:
    """Waits until each of ``count`` runs has arrived (each counted once)."""

    def __init__(self, count: int) -> None:
        self._left = count
        self._arrived: set[str] = set()
        self._all = anyio.Event()
        if count <= 0:
            self._all.set()

    def arrive(self, run_id: str) -> None:
        """``run_id`` has arrived (again: no effect)."""
        if run_id in self._arrived:
            return
        self._arrived.add(run_id)
        self._left -= 1
        if self._left <= 0:
            self._all.set()

    async def wait(self) -> None:
        """Return once every run has arrived."""
        await self._all.wait()


def _requester(requested_by: Mapping[str, int] | None) -> PausedData:
    """The ``requested_by_uid``/``requested_by_pid`` keys of a cancel, pause
    or resume from ``requested_by`` (the API peer's ``{"uid", "pid"}``)."""
    return cast(PausedData, {f"requested_by_{k}": v for k, v in (requested_by or {}).items()})


class _Reporter:
    """The :class:`~supervisord.daemon.backends.base.RunReporter` for one run."""

    def __init__(self, store: EventStore, state: _RunState) -> None:
        self._store = store
        self._state = state

    async def _append_locked(self, events: Sequence[Event], *, wait_for_storage: bool = True) -> None:
        """Append ``events`` to the run's stream (the caller holds the run's
        lock). By default storage trouble (a lock held by another process, a
        full disk) never fails it: the store retries until written, so a
        storage hiccup never decides a run's outcome. ``wait_for_storage=False``
        (a user's request that must answer) raises StoreLockedError /
        StorageFullError instead, with nothing written."""
        st = self._state
        run_id = st.spec.run_id
        incidents = self._incidents()
        try:
            recorded = await self._store.append(run_id, st.version, events, wait_for_storage=wait_for_storage)
        except ConcurrencyError:
            recorded = await self._store.append(run_id, _AT_THE_END, events, wait_for_storage=wait_for_storage)
        st.version = recorded[-1].version
        await self._note_storage_trouble(incidents)

    def _incidents(self) -> int:
        """The store's storage-trouble count, less one while trouble is on
        (an append made now waits it out)."""
        return self._store.storage_incidents()[0] - (1 if self._store.storage_problem() else 0)

    async def _note_storage_trouble(self, incidents_before: int) -> None:
        """After an append that waited out storage trouble (a full disk, a
        lock), record it in the run's stream (``StorageTrouble``): the
        daemon log said it when it began; the run's events say it too."""
        count, last = self._store.storage_incidents()
        if count == incidents_before or last is None:
            return
        st = self._state
        data = cast(StorageTroubleData, {k: last[k] for k in ("kind", "message", "since", "resumed_at") if k in last})
        recorded = await self._store.append(st.spec.run_id, None, [STORAGE_TROUBLE(data)], wait_for_storage=True)
        st.version = recorded[-1].version

    async def phase(
        self,
        phase: str,
        *,
        reason: str | None = None,
        message: str | None = None,
        exit_code: int | None = None,
        final: bool = False,
        _cancel: bool = False,
    ) -> bool:
        st = self._state
        if phase in TERMINAL_PHASES and not _cancel:
            st.outcome_seen.set()
            if st.over_limit is not None and not st.cancel_requested:
                # The usage sampler stopped it for its memory (however the
                # process ended after that signal).
                phase, reason, message = "ERROR", OOM_KILLED, st.over_limit
        async with st.lock:
            now = RunPhase(st.phase, st.reason, st.message, st.cancel_requested)
            if not decide(now, phase, reason=reason, message=message, by_cancel=_cancel, final=final).record:
                return False
            if (
                phase == "ERROR"
                and not _cancel
                and not st.cancel_requested
                and st.retries_left()
                and st.policy is not None
                and st.policy.retries(reason, exit_code)
            ):
                # An attempt the policy retries: not the run's outcome. The
                # supervisor records AttemptEnded once supervise returns.
                st.retry_outcome = (reason, message, exit_code)
                log.info("attempt failed", run=st.spec.run_id, attempt=st.attempt, reason=reason)
                return True
            data: PhaseChangedData = {"phase": phase, "reason": reason, "message": message}
            if exit_code is not None:
                data["exit_code"] = exit_code
            events = [PHASE_CHANGED(data)]
            last = st.progress.final() if st.progress is not None and phase in TERMINAL_PHASES else None
            if last is not None:  # the last report from its log lines, before the end
                events.insert(0, PROGRESS(cast(ProgressData, last)))
            await self._append_locked(events)
            st.phase, st.reason, st.message = phase, reason, message
            log.info("phase", run=st.spec.run_id, phase=phase, reason=reason)
            if phase == "RUNNING":
                crash_point("phase.running_recorded")
            elif phase in TERMINAL_PHASES:
                crash_point("terminal.recorded")
            return True

    async def handle(self, handle: Mapping[str, Any]) -> None:
        async with self._state.lock:
            await self._append_locked([HANDLE_RECORDED({"handle": dict(handle)})])
            self._state.handle = dict(handle)

    async def record(self, event: Event) -> None:
        if event.type == RESOURCE_USAGE:
            if event.data.get("source") == "runner":
                if self._state.sampled:
                    return  # the sampler saw this run: its final record (the summed tree) follows the end
            else:
                self._state.sampled = True  # before the append: a runner record racing it is dropped
        async with self._state.lock:
            await self._append_locked([event])
            if event.type in (LOG_INGEST_PENDING, LOG_INGEST_DONE):
                self._state.ingest_pending = event.type == LOG_INGEST_PENDING

    async def log_lines(self, stream: str, source: str, lines: Sequence[tuple[str, str]]) -> None:
        """Record ``lines`` as LogLines events of at most
        :data:`MAX_LINES_PER_EVENT` lines each, all in one append (one
        transaction, one fsync). The ``(pos, text)`` tuples are stored as
        they are: JSON has no tuples, so they read back as ``[pos, text]``."""
        if not lines:
            return
        events = [
            LOG_LINES({"stream": stream, "source": source, "lines": list(lines[i : i + MAX_LINES_PER_EVENT])})
            for i in range(0, len(lines), MAX_LINES_PER_EVENT)
        ]
        report = self._progress_from(lines)
        if report is not None:
            events.append(PROGRESS(cast(ProgressData, report)))
        async with self._state.lock:
            await self._append_locked(events)

    def _progress_from(self, lines: Sequence[tuple[str, str]]) -> dict[str, Any] | None:
        """The progress report to record with ``lines`` (those starting
        ``JOBSUP_PROGRESS ``: supervisord.shared.progress), at most one per
        ``local.progress_interval_s``; the rest waits for the run's end."""
        st = self._state
        for _, text in lines:
            if text.startswith(PROGRESS_LOG_PREFIX):
                if st.progress is None:
                    st.progress = RateLimit(progress_interval(st.spec.config))
                st.progress.offer(parse_progress(text[len(PROGRESS_LOG_PREFIX) :]))
        return None if st.progress is None else st.progress.take(time.monotonic())

    async def log_block(self, block: LogBlock) -> None:
        """Record ``block`` as one LogLines event (its text in ``log_blocks``)."""
        await self.log_blocks([block])

    async def log_blocks(self, blocks: Sequence[LogBlock]) -> None:
        """Record ``blocks`` as one LogLines event each, in one append."""
        if not blocks:
            return
        st = self._state
        async with st.lock:
            incidents = self._incidents()
            try:
                recorded = await self._store.append_log(st.spec.run_id, st.version, blocks, wait_for_storage=True)
            except ConcurrencyError:  # stale version: see _AT_THE_END
                recorded = await self._store.append_log(st.spec.run_id, _AT_THE_END, blocks, wait_for_storage=True)
            st.version = recorded[-1].version
            await self._note_storage_trouble(incidents)

    async def log_position(self, source: str) -> str | None:
        st = self._state
        if st.resume_positions is not None and source not in st.resume_asked:
            # Read with every other run's at reattach; nothing was recorded since.
            st.resume_asked.add(source)
            return st.resume_positions.get(source)
        return await self._store.last_log_position(st.spec.run_id, source)


class Supervisor:
    """Drives every run: submit, supervise, cancel, reattach.

    ``task_group`` owns the per-run tasks; cancelling it (daemon shutdown)
    stops supervision but never the runs themselves.
    """

    def __init__(
        self,
        store: EventStore,
        backends: Mapping[str, Backend],
        paths: Paths,
        task_group: anyio.abc.TaskGroup,
    ) -> None:
        self.store = store
        self.backends = dict(backends)
        self.paths = paths
        self.snapshots = SnapshotStore(paths.snapshots_dir)
        self._tg = task_group
        self._runs: dict[str, _RunState] = {}
        self._submit_lock = anyio.Lock()
        #: When True (the daemon's scheduler is on), a new run waits in
        #: QUEUED until :meth:`admit`; when False it starts at once.
        self.gated = False
        # Sweeps whose pending file some queued run still needs: sweep id ->
        # those runs; and run id -> its sweep (_write_sweep_pending).
        self._sweep_waiting: dict[str, set[str]] = {}
        self._sweep_of: dict[str, str] = {}

    # -- lookups -------------------------------------------------------------

    async def resolve(self, ref: str) -> str:
        """The full run id for ``ref`` (an id or a unique prefix of 4+ chars).

        Raises UsageError (too short / not hex), RunNotFoundError, AmbiguousRunError.
        """
        return await resolve_run_id(self.store, ref)

    async def get(self, run_id: str) -> RunStatus:
        """The run's status projection. Raises RunNotFoundError."""
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFoundError(f"no run {run_id}")
        return run

    # -- submit --------------------------------------------------------------

    async def submit(
        self,
        submitted: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> RunStatus:
        """:meth:`submit_run` without its warnings: the new run's status."""
        return (await self.submit_run(submitted, env=env, config=config, force=force)).run

    async def submit_run(
        self,
        submitted: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> SubmitResult:
        """Record a Submitted event with ``submitted`` as its data and start
        supervising the run; return its status and the backend's preflight
        warnings (for the user: the API sends them with the submit's answer).

        ``submitted`` holds what the run records (project, name, backend,
        command, timeout_s, source {repo, commit, snapshot_sha256}, env
        digests, redacted config...; see :mod:`store.types`); ``env`` and
        ``config`` are the values only the backend sees (env values, the
        unredacted config; default: the recorded config). Raises
        RunInFlightError when the project+name has a run in flight (unless
        ``force``), UsageError for an unknown backend, PreflightError from
        the backend. Nothing is recorded on error.
        """
        project, name = str(submitted["project"]), str(submitted["name"])
        backend = self.backends.get(str(submitted["backend"]))
        if backend is None:
            raise UsageError(
                f"backend {submitted['backend']!r} is not available on this daemon (have: {', '.join(self.backends)})"
            )
        async with self._submit_lock:
            if not force:
                busy = await self.store.list_runs(project=project, name=name, non_terminal_only=True)
                if busy:
                    raise RunInFlightError(
                        f"project {project!r} already has run {busy[0].id} named {name!r} in flight "
                        f"({busy[0].phase}); wait for it, cancel it, or submit with --force"
                    )
            run_id = secrets.token_hex(6)
            # A sweep's run submitted on its own (a rerun) gets its params' variables too.
            spec = self._spec(run_id, submitted, env={**(env or {}), **_sweep_env(submitted, run_id)}, config=config)
            warnings = list(await backend.preflight(spec))
            if self.gated:
                self._write_pending(spec)
                crash_point("submit.pending_written")
            # Known before its Submitted commits (the scheduler may admit it
            # as soon as it does), and locked until its version is known.
            state = _RunState.queued(spec)
            if not self.gated:
                state.admitted = True
                state.unqueued.set()
            async with state.lock:
                self._runs[run_id] = state
                try:
                    recorded = await self.store.append(run_id, 0, [SUBMITTED(cast(SubmittedData, submitted))])
                except BaseException:
                    self._runs.pop(run_id, None)
                    self._remove_pending(run_id)
                    raise
                state.version = max(state.version, recorded[-1].version)
            crash_point("submit.recorded")
        status = await self.get(run_id)
        self._tg.start_soon(self._drive, state, True, name=f"run-{run_id}")
        log.info("submitted", run=run_id, project=project, name=name, backend=spec.backend)
        return SubmitResult(status, warnings)

    async def submit_sweep(
        self,
        sweep_id: str,
        sweep: Mapping[str, Any],
        runs: Sequence[tuple[Mapping[str, Any], Mapping[str, str]]],
        *,
        config: Mapping[str, Any] | None = None,
    ) -> tuple[list[str], list[str]]:
        """Record a sweep in one transaction: ``SweepSubmitted`` (``sweep``,
        on the sweep's own stream ``sweep_id``), then each run's
        ``Submitted`` (``runs``: its data and env values, in sweep order);
        then supervise them all. Nothing is recorded on error. The
        one-in-flight rule of :meth:`submit_run` does not apply between the
        runs of one sweep. The backend's preflight runs once (the runs
        differ only in command and params). Returns the runs' ids in
        order and the preflight's warnings; raises UsageError (unknown backend), PreflightError, store
        errors."""
        from store import Append

        if not runs:
            raise UsageError("a sweep needs at least one run")
        backend = self.backends.get(str(runs[0][0]["backend"]))
        if backend is None:
            raise UsageError(
                f"backend {runs[0][0]['backend']!r} is not available on this daemon (have: {', '.join(self.backends)})"
            )
        async with self._submit_lock:
            states: list[_RunState] = []
            for submitted, env in runs:
                run_id = secrets.token_hex(6)
                while run_id in self._runs:
                    run_id = secrets.token_hex(6)
                spec = self._spec(run_id, submitted, env=env, config=config)
                states.append(_RunState.queued(spec))
            warnings = list(await backend.preflight(states[0].spec))
            try:
                if self.gated:
                    # One file for the whole sweep (its runs differ only in
                    # their params' variables, made again from Submitted).
                    self._write_sweep_pending(sweep_id, states)
                    crash_point("sweep.pending_written")
                for state in states:
                    if not self.gated:
                        state.admitted = True
                        state.unqueued.set()
                    # Its Submitted is the first event of a new stream: what
                    # follows it (an admission) appends at version 1. Nothing
                    # can act on the run before that commits: the scheduler
                    # and the API learn of it from the store.
                    state.version = 1
                    self._runs[state.spec.run_id] = state
                appends = [Append(sweep_id, 0, [SWEEP_SUBMITTED(cast(SweepSubmittedData, sweep))])]
                appends += [
                    Append(st.spec.run_id, 0, [SUBMITTED(cast(SubmittedData, st.spec.submitted))]) for st in states
                ]
                await self.store.append_together(appends)
                crash_point("sweep.recorded")
            except BaseException:
                for state in states:
                    if self._runs.get(state.spec.run_id) is state:
                        del self._runs[state.spec.run_id]
                self._sweep_waiting.pop(sweep_id, None)
                self._sweep_pending_path(sweep_id).unlink(missing_ok=True)
                raise
        for state in states:
            self._tg.start_soon(self._drive, state, True, name=f"run-{state.spec.run_id}")
        log.info("sweep submitted", sweep=sweep_id, runs=len(states), backend=states[0].spec.backend)
        return [st.spec.run_id for st in states], warnings

    async def _drive(self, state: _RunState, fresh: bool) -> None:
        """Supervise one run to its end: its start (``fresh``), its
        supervision, and with a retry policy each next attempt (its
        backoff, ``AttemptStarted``, a fresh start)."""
        reporter = _Reporter(self.store, state)
        try:
            with anyio.CancelScope() as scope:
                state.scope = scope
                while True:
                    if state.backoff_left is not None:
                        if not await self._next_attempt(state, reporter):
                            return
                        fresh = True
                    await self._attempt(state, fresh, reporter)
                    if state.retry_outcome is None:
                        return
                    await self._end_attempt(state, reporter)
                    if state.backoff_left is None:
                        return  # a cancel owns the outcome
        finally:
            spec = state.spec
            state.done.set()
            if state.phase in TERMINAL_PHASES:
                if state.policy is not None:
                    self._remove_pending(spec.run_id)  # kept for the attempts: none is left
                if self._runs.get(spec.run_id) is state:
                    # A terminal run is only in the store now: nothing of it stays in memory.
                    del self._runs[spec.run_id]

    async def _attempt(self, state: _RunState, fresh: bool, reporter: _Reporter) -> None:
        """One attempt: start it (``fresh``) and supervise it until the
        backend reports its end. A failure the retry policy retries leaves
        ``state.retry_outcome`` set (nothing terminal recorded)."""
        spec = state.spec
        backend = self.backends[spec.backend]
        try:
            handle: Mapping[str, Any] = state.handle
            if fresh:
                await state.unqueued.wait()
                if not state.admitted:
                    return  # ended while queued
                spec = state.spec  # `jobsup update` may have changed it while queued
                async with state.lock:
                    if state.cancel_requested:
                        # Canceled between its admission and its start:
                        # nothing was started; the cancel records the outcome.
                        self._remove_pending(spec.run_id)
                        return
                    state.starting = True
                if state.attempt > 1:
                    # The env values were dropped after the first start: the
                    # pending file keeps them for the attempts (supervisord.shared.retry).
                    pending = self._read_pending(spec.run_id) or {}
                    if not pending and spec.submitted.get("sweep_id"):
                        pending = self._read_sweep_pending(spec.run_id, spec.submitted) or {}
                    env = pending.get("env") if isinstance(pending.get("env"), dict) else {}
                    spec = state.spec = dataclasses.replace(spec, env=dict(env or {}))
                if state.extra_env:
                    spec = state.spec = dataclasses.replace(spec, env={**spec.env, **state.extra_env})
                try:
                    spec = state.spec = await with_after_outputs(self.store, spec)
                    handle = await backend.start(spec, reporter)
                finally:
                    state.starting = False
                    state.start_done.set()
                crash_point("start.handle_recorded")
                if state.policy is None:
                    self._remove_pending(spec.run_id)
                crash_point("start.pending_removed")
                # The env values were for the start only: keep none in memory.
                spec = state.spec = dataclasses.replace(spec, env={})
            await backend.supervise(spec, handle, reporter)
            if state.ingest_pending:  # resumed after a restart, and the backlog is now recorded
                await reporter.record(LOG_INGEST_DONE({}))
        except BackendError as err:
            log.warning("backend error", run=spec.run_id, error=str(err))
            await reporter.phase("ERROR", reason=err.run_reason, message=str(err))
        except Exception as err:  # recorded on the run and logged with its traceback
            log.exception("supervision failed", run=spec.run_id)
            await reporter.phase(
                "ERROR", reason="InternalError", message=f"jobsup failed supervising this run: {err!r}"
            )

    async def _end_attempt(self, state: _RunState, reporter: _Reporter) -> None:
        """After an attempt the policy retries: record ``AttemptEnded`` and
        PhaseChanged RUNNING ``Retrying`` in one append, and set the backoff
        (unless a cancel came meanwhile: it then owns the outcome)."""
        assert state.retry_outcome is not None
        assert state.policy is not None
        reason, message, exit_code = state.retry_outcome
        state.retry_outcome = None
        n, total = state.attempt, state.policy.attempts + 1
        delay = state.policy.delay_s(n)
        status = await self.store.get_run(state.spec.run_id)
        last_line = status.log_lines if status is not None else 0
        why = f"{reason or 'failed'}{f' (exit code {exit_code})' if exit_code else ''}"
        text = f"attempt {n} of {total} ended {why}; attempt {n + 1} starts in {delay:g}s"
        ended: AttemptEndedData = {
            "attempt": n,
            "reason": reason,
            "message": message,
            "exit_code": exit_code,
            "retry_in_s": delay,
            "last_line": last_line,
        }
        async with state.lock:
            if state.cancel_requested or state.phase in TERMINAL_PHASES:
                state.backoff_left = None
                return
            await reporter._append_locked(
                [
                    ATTEMPT_ENDED(ended),
                    PHASE_CHANGED({"phase": "RUNNING", "reason": RETRYING, "message": text}),
                ]
            )
            state.phase, state.reason, state.message = "RUNNING", RETRYING, text
            state.backoff_left = delay
        log.info("retrying", run=state.spec.run_id, attempt=n, reason=reason, retry_in_s=delay)
        crash_point("retry.attempt_ended")

    async def _next_attempt(self, state: _RunState, reporter: _Reporter) -> bool:
        """Wait out the backoff (a cancel cuts it short), then record
        ``AttemptStarted`` and make the run's state that of the new attempt.
        Returns False when a cancel came first (it records the outcome)."""
        assert state.policy is not None
        with anyio.CancelScope() as backoff:
            state.backoff_scope = backoff
            if state.backoff_left and not state.cancel_requested:
                await anyio.sleep(state.backoff_left)
        state.backoff_scope = None
        async with state.lock:
            if state.cancel_requested or state.phase in TERMINAL_PHASES:
                state.backoff_left = None
                state.outcome_seen.set()
                return False
            n = state.attempt + 1
            await reporter._append_locked([ATTEMPT_STARTED({"attempt": n, "of": state.policy.attempts + 1})])
            state.attempt, state.backoff_left = n, None
            state.handle = {}
            state.outcome_seen = anyio.Event()
            state.start_done = anyio.Event()
            state.over_limit = None
            state.progress = None
            state.spec = dataclasses.replace(state.spec, attempt=n)
        crash_point("retry.attempt_started")
        return True

    # -- cancel --------------------------------------------------------------

    async def cancel(self, run_id: str, *, requested_by: Mapping[str, int] | None = None) -> RunStatus:
        """Cancel a run: record CancelRequested, stop it through its backend,
        let supervision drain the last logs, then record CANCELED.

        ``requested_by``: who asked, ``{"uid", "pid"}`` of the API peer
        (SO_PEERCRED); recorded as CancelRequested's data
        ``{"requested_by_uid", "requested_by_pid"}``.

        Idempotent: a terminal run is returned unchanged. Raises
        RunNotFoundError, BackendError (the backend could not stop it).
        """
        status = await self.get(run_id)
        if status.terminal:
            return status
        state = self._runs.get(run_id)
        if state is None:
            raise RunNotFoundError(f"run {run_id} is not being supervised by this daemon")
        await self._cancel_state(state, requested_by)
        return await self.get(run_id)

    async def cancel_many(
        self, run_ids: Sequence[str], *, requested_by: Mapping[str, int] | None = None
    ) -> list[RunStatus]:
        """Cancel many runs together (:meth:`cancel` for each, all at once):
        the runs are read in one query; every cancel is requested before
        any run is stopped (queued ones end first, so none starts
        meanwhile), their CancelRequested events share the store's
        transactions, the backends get their signals at once and the
        confirmations are awaited together. Returns the runs' statuses in
        the order of ``run_ids`` (duplicates once), terminal ones unchanged.

        Every run is checked before any is touched: RunNotFoundError names
        those that do not exist or that this daemon does not supervise.
        A cancel that fails (BackendError...) does not stop the others;
        the first error is raised once all are done."""
        ids = list(dict.fromkeys(run_ids))
        statuses = await self.store.get_runs(ids)
        gone = [i for i in ids if i in statuses and not statuses[i].terminal and i not in self._runs]
        if gone:  # ended between the read and now (its state is dropped once terminal)?
            statuses.update(await self.store.get_runs(gone))
        bad = [f"no run {i}" for i in ids if i not in statuses]
        bad += [
            f"run {i} is not being supervised by this daemon"
            for i in ids
            if i in statuses and not statuses[i].terminal and i not in self._runs
        ]
        if bad:
            raise RunNotFoundError("; ".join(bad))
        states = [self._runs[i] for i in ids if not statuses[i].terminal and i in self._runs]
        errors: list[Exception] = []
        barrier = _Barrier(len(states))

        async def one(state: _RunState) -> None:
            try:
                await self._cancel_state(state, requested_by, barrier=barrier)
            except Exception as err:  # noqa: BLE001 - the others are still canceled; the first error is the answer
                errors.append(err)
            finally:
                barrier.arrive(state.spec.run_id)

        async with anyio.create_task_group() as tg:
            # Queued ones first: nothing to stop, and they must not start meanwhile.
            for state in sorted(states, key=lambda st: st.admitted):
                tg.start_soon(one, state)
        if errors:
            raise errors[0]
        final = await self.store.get_runs(ids)
        return [final[i] for i in ids]

    async def _cancel_state(
        self, state: _RunState, requested_by: Mapping[str, int] | None, *, barrier: _Barrier | None = None
    ) -> None:
        """Cancel the run of ``state`` (see :meth:`cancel`). With ``barrier``
        (:meth:`cancel_many`) the backend stops it only once every run of
        the barrier has its cancel recorded (or has failed or ended)."""
        run_id = state.spec.run_id
        reporter = _Reporter(self.store, state)
        async with state.lock:
            if state.phase in TERMINAL_PHASES:
                return
            if not state.admitted:
                # Still queued: nothing was started, so nothing to stop.
                await self._end_queued_locked(state, "Canceled", "canceled while queued", cancel_event=True)
                return
            first = not state.cancel_requested
            state.cancel_requested = True
            if first:
                who: CancelRequestedData = _requester(requested_by)
                try:
                    # A cancel that cannot be recorded is refused (nothing done)
                    # rather than left hanging on a locked or full store.
                    await reporter._append_locked([CANCEL_REQUESTED(who)], wait_for_storage=False)
                except BaseException:
                    state.cancel_requested = False
                    raise
        if barrier is not None:
            barrier.arrive(run_id)
            await barrier.wait()
        backend = self.backends[state.spec.backend]
        crash_point("cancel.requested")
        if state.backoff_scope is not None:
            # Between two attempts: nothing runs; the wait ends now and the
            # run ends CANCELED at once (supervisord.shared.retry).
            state.backoff_scope.cancel()
            with anyio.move_on_after(_CANCEL_DRAIN_S):
                await state.done.wait()
            await reporter.phase("CANCELED", reason="Canceled", message="canceled by request", _cancel=True)
            if state.done.is_set() and state.phase in TERMINAL_PHASES:
                self._remove_pending(run_id)
                if self._runs.get(run_id) is state:
                    del self._runs[run_id]
            return
        try:
            stopped = dict(state.handle)
            await backend.cancel(state.spec, stopped)
            if state.starting:
                # The start was in flight: once it returns, its handle says
                # what to stop (a start that saw the cancel returns early).
                with anyio.move_on_after(_CANCEL_DRAIN_S):
                    await state.start_done.wait()
                if state.handle and state.handle != stopped:
                    await backend.cancel(state.spec, state.handle)
        except Exception as err:
            # The run goes on: say so in its history (and to the caller), so
            # a CancelRequested is never left looking pending. Cancel again
            # once the backend is reachable.
            async with state.lock:
                state.cancel_requested = False
                await reporter._append_locked([CANCEL_FAILED({"message": str(err)})])
            if state.done.is_set():
                # Supervision ended meanwhile and its outcome was held for the
                # cancel: the run must still end in one terminal phase.
                await reporter.phase("ERROR", reason="CancelFailed", message=f"cancel failed: {err}")
            raise
        except BaseException:
            state.cancel_requested = False
            raise
        # Wait for supervision to see the process end. Its output backlog is
        # recorded after that, however long it takes: never cut it short.
        with anyio.move_on_after(_CANCEL_DRAIN_S):
            async with anyio.create_task_group() as tg:

                async def until(event: anyio.Event) -> None:
                    await event.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(until, state.done)
                tg.start_soon(until, state.outcome_seen)
        crash_point("cancel.stopped")
        if not state.done.is_set() and not state.outcome_seen.is_set() and state.scope is not None:
            state.scope.cancel()
        await reporter.phase("CANCELED", reason="Canceled", message="canceled by request", _cancel=True)

    # -- pause / resume ----------------------------------------------------------

    async def pause(self, run_id: str, *, requested_by: Mapping[str, int] | None = None) -> RunStatus:
        """Pause a RUNNING run of a backend that can (local): its processes
        stop, it stays RUNNING with reason ``Paused``, keeps its GPUs, and
        paused time does not count toward its timeout. Records ``Paused``
        (``requested_by_uid``/``_pid``). A paused run is returned unchanged.
        Raises UsageError (not RUNNING, another backend, being canceled),
        BackendError (the backend could not)."""
        return await self._pause_or_resume(run_id, True, requested_by)

    async def resume(self, run_id: str, *, requested_by: Mapping[str, int] | None = None) -> RunStatus:
        """Let a paused run go on: records ``Resumed`` (``paused_s``: that
        pause's length). A run that is not paused is returned unchanged.
        Raises as :meth:`pause`."""
        return await self._pause_or_resume(run_id, False, requested_by)

    async def _pause_or_resume(self, run_id: str, pause: bool, requested_by: Mapping[str, int] | None) -> RunStatus:
        verb = "paused" if pause else "resumed"
        status = await self.get(run_id)
        state = self._runs.get(run_id)
        backend = self.backends.get(status.backend)
        if not isinstance(backend, Pausable):
            raise UsageError(f"run {run_id} is a {status.backend} run: only local runs can be {verb}")
        if status.phase != "RUNNING" or state is None:
            raise UsageError(f"run {run_id} is {status.phase}: only a RUNNING run can be {verb}")
        if state.cancel_requested:
            raise UsageError(f"run {run_id} is being canceled")
        if state.reason == RETRYING or state.backoff_left is not None or state.starting:
            raise UsageError(f"run {run_id} is between two attempts (Retrying): nothing runs to be {verb}")
        if (state.reason == PAUSED) == pause:
            return status
        result = await (backend.pause if pause else backend.resume)(state.spec, state.handle)
        who = _requester(requested_by)
        reporter = _Reporter(self.store, state)
        if pause:
            await reporter.record(PAUSED_EVENT(who))
            await reporter.phase("RUNNING", reason=PAUSED, message=paused_message(run_id))
        else:
            await reporter.record(RESUMED({"paused_s": float(result.get("last_pause_s") or 0.0), **who}))
            await reporter.phase("RUNNING")
        log.info(verb, run=run_id)
        return await self.get(run_id)

    # -- restart ---------------------------------------------------------------

    async def reattach_all(self) -> int:
        """Resume supervising every non-terminal run recorded in the store
        (after a daemon restart). Returns how many runs were reattached."""
        runs = await self.store.list_runs(non_terminal_only=True)
        # Terminal runs whose output backlog was still being recorded.
        runs += [r for r in await self.store.list_runs(log_ingest="pending") if r.terminal]
        # One query for every run's Submitted event (not one per run: 500
        # runs then reattach in one pass; bench/local_reattach.py).
        ids = [status.id for status in runs]
        firsts = await self.store.first_events(ids)
        # Likewise the updates and where each run's output was last read.
        updated = await self.store.run_events(ids, [RUN_UPDATED])
        positions = await self.store.last_log_positions(ids)
        sampled = [s.id for s in runs if s.backend == "local" and s.phase == "RUNNING"]
        usage = await self.store.run_events(sampled, [RESOURCE_USAGE]) if sampled else {}
        for status in runs:
            first = firsts.get(status.id)
            submitted = first.data if first is not None else {}
            updates = updated.get(status.id)
            if updates:  # `jobsup update` while it was queued
                submitted = apply_updates(submitted, [e.data for e in updates])
            pending = self._read_pending(status.id) or self._read_sweep_pending(status.id, submitted) or {}
            env = pending.get("env") if isinstance(pending.get("env"), dict) else {}
            config = pending.get("config") if isinstance(pending.get("config"), dict) else None
            spec = self._spec(status.id, submitted, env=env or {}, config=config)
            state = _RunState(spec, status)
            if spec.backend == "local" and status.phase == "RUNNING":
                # Stopped by the memory watchdog before the restart: it still ends OOMKilled.
                state.sampled, state.over_limit = _usage_marks(usage.get(status.id) or [])
            self._runs[status.id] = state
            retry_fresh = await self._reattach_attempt(state, status) if state.policy is not None else None
            spec = state.spec
            if spec.backend not in self.backends:
                await _Reporter(self.store, state).phase(
                    "ERROR",
                    reason="BackendUnavailable",
                    message=f"backend {spec.backend!r} is not configured on this daemon",
                )
                continue
            fresh = retry_fresh if retry_fresh is not None else await self._never_started(status, spec)
            if not fresh:
                state.resume_positions = dict(positions.get(status.id) or {})
            if not fresh and not status.handle and state.policy is None:
                # Started, its handle not recorded (a runner spawned just
                # before a crash): its env values were for the start only.
                # (remove_orphan_pending keeps the file of an admitted run
                # with no handle, and removes those of runs with one.)
                self._remove_pending(status.id)
            if not fresh or not self.gated:
                state.admitted = True
                state.unqueued.set()
            self._tg.start_soon(self._drive, state, fresh, name=f"run-{status.id}")
        if runs:
            log.info("reattached", runs=len(runs))
        return len(runs)

    async def _reattach_attempt(self, state: _RunState, status: RunStatus) -> bool | None:
        """At a restart, a run with a retry policy: where its attempts are.
        During a backoff (its last attempt's ``AttemptEnded`` recorded), the
        wait goes on for what is left of it, then the next attempt starts.
        After an ``AttemptStarted`` with no handle recorded since, that
        attempt starts now unless its backend finds a sign of it
        (``never_started``; a backend without that probe follows it with an
        empty handle): no attempt starts twice, none is lost. Returns
        whether the current attempt is to be started (None: as for any run)."""
        if status.attempt <= 1 and status.reason != RETRYING:
            return None
        events = await self.store.read_all(
            0, limit=100_000, run_id=status.id, types=[ATTEMPT_ENDED, ATTEMPT_STARTED, HANDLE_RECORDED]
        )
        state.spec = dataclasses.replace(state.spec, attempt=status.attempt)
        ended = [e for e in events if e.type == ATTEMPT_ENDED]
        if ended and int(ended[-1].data.get("attempt") or 0) >= status.attempt:
            last = ended[-1]
            due = _epoch(last.at) + float(last.data.get("retry_in_s") or 0.0)
            state.backoff_left = max(0.0, due - time.time())
            return False
        started = [e.seq for e in events if e.type == ATTEMPT_STARTED]
        handles = [e.seq for e in events if e.type == HANDLE_RECORDED]
        if started and (not handles or handles[-1] < started[-1]):
            state.handle = {}
            probe = getattr(self.backends.get(state.spec.backend), "never_started", None)
            return probe is not None and bool(await probe(state.spec))
        return False

    def restore_admission_env(self, run_id: str, extra_env: Mapping[str, str]) -> None:
        """After a restart: what the admission of a started run with a
        retry policy adds to its environment (its GPUs' variables), for its
        next attempts."""
        state = self._runs.get(run_id)
        if state is not None and state.policy is not None:
            state.extra_env = dict(extra_env)

    async def _never_started(self, status: RunStatus, spec: RunSpec) -> bool:
        """Whether a non-terminal run found at restart was never handed to
        its backend: still QUEUED (waiting for admission), or admitted
        (SCHEDULING) with no handle recorded and, for a backend that can
        tell (``never_started``: the local one), no sign of a start the
        daemon did not record (a runner spawned just before a crash). Other
        backends' admitted runs reattach (their ``supervise`` cleans up a
        start cut short), so none runs twice."""
        if status.handle:
            return False
        if status.phase == "QUEUED":
            return True
        if status.phase != "SCHEDULING":
            return False
        probe = getattr(self.backends.get(spec.backend), "never_started", None)
        return probe is not None and bool(await probe(spec))

    def _spec(
        self, run_id: str, submitted: Mapping[str, Any], *, env: Mapping[str, str], config: Mapping[str, Any] | None
    ) -> RunSpec:
        """The RunSpec of ``run_id`` from its Submitted data: the one place
        that maps what a run records to what its backend gets (for a new run
        and after a restart, when ``env`` is empty and ``config`` the
        recorded one)."""
        source = submitted.get("source") or {}
        sha = str(source.get("snapshot_sha256") or "")
        return RunSpec(
            run_id=run_id,
            project=str(submitted["project"]),
            name=str(submitted["name"]),
            backend=str(submitted["backend"]),
            command=str(submitted.get("command") or ""),
            timeout_s=int(submitted.get("timeout_s") or 0),
            env=dict(env),
            config=dict(config if config is not None else submitted.get("config") or {}),
            snapshot=self.snapshots.path_for(sha),
            snapshot_sha256=sha,
            commit=str(source.get("commit") or ""),
            repo=str(source.get("repo") or ""),
            run_dir=self.paths.runs_dir / run_id,
            submitted=dict(submitted),
            manifest=str(submitted["manifest"]) if submitted.get("manifest") else None,
            env_digests=_env_digests(submitted),
            umask=str(submitted["umask"]) if submitted.get("umask") else None,
            **_limits_of(submitted),
            **world_fields(run_id, submitted, env),
        )

    # -- scheduling (driven by supervisord.daemon.scheduler) ------------------------------

    def _pending_path(self, run_id: str) -> Path:
        return self.paths.runs_dir / run_id / "pending.json"

    def _write_pending(self, spec: RunSpec) -> None:
        """Keep a queued run's env values and unredacted config in
        ``<run dir>/pending.json`` (mode 0600, private state dir) until it
        starts: they are never recorded in events, yet a daemon restarted
        while the run waits must still start it with them."""
        try:
            spec.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self._pending_path(spec.run_id), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"env": dict(spec.env), "config": dict(spec.config)}, f)
        except OSError as err:
            self._remove_pending(spec.run_id)
            with contextlib.suppress(OSError):
                spec.run_dir.rmdir()
            if is_no_space(err):
                raise disk_full(self.snapshots.root, "the new run's pending file could not be written") from err
            raise

    def _read_pending(self, run_id: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._pending_path(run_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("unreadable pending file", run=run_id, error=str(err))
            return None
        return data if isinstance(data, dict) else None

    def _remove_pending(self, run_id: str) -> None:
        self._pending_path(run_id).unlink(missing_ok=True)
        sweep_id = self._sweep_of.pop(run_id, None)
        if sweep_id is not None:
            waiting = self._sweep_waiting.get(sweep_id)
            if waiting is not None:
                waiting.discard(run_id)
                if not waiting:  # no run of the sweep waits for these values any more
                    del self._sweep_waiting[sweep_id]
                    self._sweep_pending_path(sweep_id).unlink(missing_ok=True)

    def _sweep_pending_path(self, sweep_id: str) -> Path:
        return self.paths.runs_dir / sweep_id / "pending.json"

    def _write_sweep_pending(self, sweep_id: str, states: Sequence[_RunState]) -> None:
        """The sweep's :meth:`_write_pending`: the env values its runs
        share (without their params' variables) and the unredacted config,
        in ``<runs dir>/<sweep id>/pending.json``, removed once none of its
        runs waits (one file, not one per run: a sweep of 1,000 runs is
        submitted in well under a second)."""
        first = states[0].spec
        own = set(_sweep_env(first.submitted, first.run_id))
        path = self._sweep_pending_path(sweep_id)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                env = {k: v for k, v in first.env.items() if k not in own}
                json.dump({"env": env, "config": dict(first.config)}, f)
        except OSError as err:
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                path.parent.rmdir()
            if is_no_space(err):
                raise disk_full(self.snapshots.root, "the new sweep's pending file could not be written") from err
            raise
        self._sweep_waiting[sweep_id] = {st.spec.run_id for st in states}
        self._sweep_of.update((st.spec.run_id, sweep_id) for st in states)

    def _read_sweep_pending(self, run_id: str, submitted: Mapping[str, Any]) -> dict[str, Any] | None:
        """After a restart: a queued sweep run's pending values (its
        sweep's file, and its params' variables), or None."""
        sweep_id = submitted.get("sweep_id")
        if not isinstance(sweep_id, str) or not sweep_id:
            return None
        try:
            data = json.loads(self._sweep_pending_path(sweep_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("unreadable sweep pending file", sweep=sweep_id, error=str(err))
            return None
        if not isinstance(data, dict) or not isinstance(data.get("env"), dict):
            return None
        self._sweep_waiting.setdefault(sweep_id, set()).add(run_id)
        self._sweep_of[run_id] = sweep_id
        return {**data, "env": {**data["env"], **_sweep_env(submitted, run_id)}}

    async def remove_orphan_pending(self) -> list[str]:
        """At daemon start, after :meth:`reattach_all` and before any submit:
        remove every ``pending.json`` no run waits on (its env values
        would otherwise stay on disk for good): one of a submit cut off
        before its Submitted committed (the run folder goes too when
        that leaves it empty), of a run that ended, or of one already
        handed to its backend. Returns the run ids whose file went."""
        runs_dir = self.paths.runs_dir

        def find() -> list[str]:
            return sorted(p.parent.name for p in runs_dir.glob("*/pending.json"))

        removed: list[str] = []
        for run_id in await anyio.to_thread.run_sync(find):
            if run_id in self._sweep_waiting:
                continue  # a sweep's file (supervisord.shared.sweep ids): a run of it is still to start
            state = self._runs.get(run_id)
            if state is not None and not state.handle and not reached(state.phase, "STAGING"):
                continue  # still to start: its values are in that file only
            if state is not None and state.policy is not None and state.phase not in TERMINAL_PHASES:
                continue  # a run with a retry policy: its next attempts start with them
            self._remove_pending(run_id)
            removed.append(run_id)
        unknown = set(removed) - set(await self.store.get_runs(removed))
        for run_id in sorted(unknown):
            with contextlib.suppress(OSError):  # not empty: leave it
                (runs_dir / run_id).rmdir()
        if removed:
            log.info("removed orphan pending files", runs=removed, never_submitted=sorted(unknown))
        return removed

    def run_state(self, run_id: str) -> tuple[str, bool] | None:
        """``(phase, admitted)`` of a run this daemon supervises, else None."""
        state = self._runs.get(run_id)
        return None if state is None else (state.phase, state.admitted)

    async def admit(self, run_id: str, admitted: Event, extra_env: Mapping[str, str], message: str) -> bool:
        """Let a queued run start: record ``admitted`` (the scheduler's
        ``Admitted`` event: the scheduler owns admission) and PhaseChanged
        SCHEDULING (``message``) in one append, then release its supervision
        task with ``extra_env`` added to its environment. Returns False
        (recording nothing) when the run is not waiting any more (ended,
        being canceled, already admitted)."""
        state = self._runs.get(run_id)
        if state is None:
            return False
        async with state.lock:
            if state.admitted or state.cancel_requested or state.phase in TERMINAL_PHASES or state.phase != "QUEUED":
                return False
            await _Reporter(self.store, state)._append_locked(
                [
                    admitted,
                    PHASE_CHANGED({"phase": "SCHEDULING", "reason": None, "message": message}),
                ]
            )
            state.phase, state.reason, state.message = "SCHEDULING", None, message
            state.admitted = True
            state.extra_env = dict(extra_env)
            crash_point("admit.recorded")
            state.unqueued.set()
        return True

    async def update_queued(self, run_id: str, data: RunUpdatedData) -> bool:
        """Record ``RunUpdated`` (``data``: ``{"old", "new"}``, see
        :mod:`supervisord.daemon.scheduler.update`) on a run that still waits for
        admission, and start it with the new values (its timeout). Returns
        False (recording nothing) when it is not waiting any more."""
        state = self._runs.get(run_id)
        if state is None:
            return False
        async with state.lock:
            if state.admitted or state.cancel_requested or state.phase != "QUEUED":
                return False
            await _Reporter(self.store, state)._append_locked([RUN_UPDATED(data)], wait_for_storage=False)
            submitted = apply_updates(state.spec.submitted, [data])
            state.spec = dataclasses.replace(
                state.spec, submitted=submitted, timeout_s=int(submitted.get("timeout_s") or 0)
            )
        return True

    def resume_admitted(self, run_id: str, extra_env: Mapping[str, str]) -> None:
        """After a restart: a run whose admission is recorded but that had
        not started may start now, with ``extra_env`` (no new event)."""
        state = self._runs.get(run_id)
        if state is not None and not state.unqueued.is_set():
            state.admitted = True
            state.extra_env = dict(extra_env)
            state.unqueued.set()

    async def set_pending(self, run_id: str, reason: str, message: str) -> bool:
        """Record why a queued run waits (PhaseChanged QUEUED with
        ``reason`` and ``message``) unless that is already what it says or
        the run is no longer waiting. Returns whether an event was recorded."""
        state = self._runs.get(run_id)
        if state is None or state.admitted:
            return False
        return await _Reporter(self.store, state).phase("QUEUED", reason=reason, message=message)

    async def set_pending_many(self, pending: Sequence[tuple[str, str, str]]) -> int:
        """:meth:`set_pending` for many runs (``(run id, reason, message)``)
        in one append of all their PhaseChanged QUEUED events: a scheduler
        pass over a 1,000-run sweep made 1,000 tasks and appends
        (bench/sweep_submit.py). A run whose lock is taken, or whose append
        fails (another event got in first, storage trouble), gets
        :meth:`set_pending` on its own, which waits. Never waits for a lock
        while it holds one. Returns how many events were recorded."""
        taken: list[tuple[_RunState, str, str]] = []
        alone: list[tuple[str, str, str]] = []
        try:
            for run_id, reason, message in pending:
                st = self._runs.get(run_id)
                if st is None or st.admitted:
                    continue
                try:
                    st.lock.acquire_nowait()
                except anyio.WouldBlock:
                    alone.append((run_id, reason, message))
                    continue
                now = RunPhase(st.phase, st.reason, st.message, st.cancel_requested)
                if decide(now, "QUEUED", reason=reason, message=message).record:
                    taken.append((st, reason, message))
                else:
                    st.lock.release()
            appends = [
                Append(
                    st.spec.run_id,
                    st.version,
                    [PHASE_CHANGED({"phase": "QUEUED", "reason": reason, "message": message})],
                )
                for st, reason, message in taken
            ]
            results = await self.store.append_many(appends) if appends else []
            recorded = 0
            for (st, reason, message), got in zip(taken, results, strict=True):
                if isinstance(got, BaseException):
                    alone.append((st.spec.run_id, reason, message))
                    continue
                st.version = got[-1].version
                st.phase, st.reason, st.message = "QUEUED", reason, message
                recorded += 1
        finally:
            for st, _, _ in taken:
                st.lock.release()
        for run_id, reason, message in alone:
            recorded += await self.set_pending(run_id, reason, message)
        return recorded

    async def end_queued(self, run_id: str, reason: str, message: str) -> bool:
        """End a queued run CANCELED with ``reason`` without starting it
        (e.g. DependencyFailed). Returns False when it was no longer waiting."""
        state = self._runs.get(run_id)
        if state is None:
            return False
        async with state.lock:
            if state.admitted or state.phase in TERMINAL_PHASES:
                return False
            await self._end_queued_locked(state, reason, message, cancel_event=False)
        return True

    async def _end_queued_locked(self, state: _RunState, reason: str, message: str, *, cancel_event: bool) -> None:
        events = [CANCEL_REQUESTED({})] if cancel_event else []
        events.append(PHASE_CHANGED({"phase": "CANCELED", "reason": reason, "message": message}))
        await _Reporter(self.store, state)._append_locked(events)
        state.phase, state.reason, state.message = "CANCELED", reason, message
        state.cancel_requested = state.cancel_requested or cancel_event
        state.unqueued.set()
        self._remove_pending(state.spec.run_id)
        log.info("phase", run=state.spec.run_id, phase="CANCELED", reason=reason)

    async def append_event(self, run_id: str, event: Event) -> None:
        """Append one event to a run's stream (Held, HoldReleased,
        ResourcesFreed...), under the run's lock when this daemon supervises
        it. Raises RunNotFoundError for an unknown run."""
        state = self._runs.get(run_id)
        if state is not None:
            await _Reporter(self.store, state).record(event)
            return
        status = await self.get(run_id)
        try:
            await self.store.append(run_id, status.version, [event])
        except ConcurrencyError:  # see _AT_THE_END
            await self.store.append(run_id, _AT_THE_END, [event])

    def sampled_local_runs(self) -> list[LocalRunView]:
        """The local runs this daemon supervises that are RUNNING with a
        recorded runner handle (what the usage sampler measures)."""
        out = []
        for rid, st in self._runs.items():
            if st.spec.backend != "local" or st.phase != "RUNNING" or "runner_pid" not in st.handle:
                continue
            local = st.spec.config.get("local") or {}
            grace = local.get("kill_grace_s") if isinstance(local, Mapping) else None
            out.append(LocalRunView(rid, dict(st.handle), st.spec.submitted, int(grace or 10)))
        return out

    async def mark_over_limit(self, run_id: str, message: str, usage: Mapping[str, Any]) -> bool:
        """The usage sampler is about to stop ``run_id`` for passing its
        memory limit: record it first (a ``ResourceUsage`` event, ``usage``
        with ``over_limit: message``), so that its terminal outcome is ERROR
        ``OOMKilled`` with ``message`` even when the daemon restarts between
        the kill and the end (:meth:`reattach_all` reads it back). Returns
        False, recording nothing, when the run is not supervised here, has
        ended, or a cancel already owns its outcome. Raises what the append
        raises (the caller then stops nothing this time)."""
        st = self._runs.get(run_id)
        if st is None or st.cancel_requested or st.phase in TERMINAL_PHASES:
            return False
        async with st.lock:
            if st.cancel_requested or st.phase in TERMINAL_PHASES:
                return False
            st.sampled = True
            await _Reporter(self.store, st)._append_locked(
                [RESOURCE_USAGE(cast(ResourceUsageData, {**usage, "over_limit": message}))]
            )
            st.over_limit = message
        return True

    def supervised(self) -> int:
        """How many runs have a live supervision task."""
        return sum(1 for s in self._runs.values() if not s.done.is_set())

    def running_local(self) -> list[str]:
        """The ids of the RUNNING local runs this daemon supervises (their
        runners write output under ``paths.runs_dir``), sorted."""
        return sorted(
            rid
            for rid, s in self._runs.items()
            if s.phase == "RUNNING" and s.spec.backend == "local" and not s.done.is_set()
        )


def _usage_marks(events: Sequence[RecordedEvent]) -> tuple[bool, str | None]:
    """From a run's ``ResourceUsage`` events: whether the usage sampler
    recorded one, and the message of the last one that marks the run stopped
    for its memory (``over_limit``; None when none does)."""
    sampled, marked = False, None
    for e in events:
        sampled = sampled or e.data.get("source") != "runner"
        if isinstance(e.data.get("over_limit"), str):
            marked = str(e.data["over_limit"])
    return sampled, marked


def _limits_of(submitted: Mapping[str, Any]) -> dict[str, Any]:
    """``memory_bytes`` and ``cpus`` of a RunSpec from the Submitted data's
    ``scheduling`` (an update applied; absent or odd values: None)."""
    sched = submitted.get("scheduling")
    sched = sched if isinstance(sched, Mapping) else {}
    memory, cpus = sched.get("memory_bytes"), sched.get("cpus")
    return {
        "memory_bytes": memory if isinstance(memory, int) and not isinstance(memory, bool) and memory > 0 else None,
        "cpus": float(cpus) if isinstance(cpus, (int, float)) and not isinstance(cpus, bool) and cpus > 0 else None,
    }
