"""The read side: every query the API answers from the store's projections,
and the streaming loops (page, wait, heartbeat) of ``wait`` and ``events``.

Reads only: nothing here appends an event or knows the supervisor. The API
handlers and the page parse a request, call one method here and encode what
it returns (:mod:`supervisord.daemon.api.server`, :mod:`supervisord.daemon.ui.app`); no
handler reads the store or the supervisor itself. Run objects are
:meth:`store.RunStatus.to_json` dicts. The ``logs`` stream's reads are the
log methods here (its encoding lives with its endpoint,
:mod:`supervisord.daemon.api.logs_route`).

Every stream is an async iterator of JSON-able dicts, one per NDJSON line.
A stream that has nothing to say for :data:`HEARTBEAT_S` sends
``{"heartbeat": seq}``: the client takes a silent stream for a dead daemon
(its read timeout is a few heartbeats).
"""

from __future__ import annotations

import fnmatch
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import anyio

from store import LOG_LINES, PHASE_CHANGED, EventStore, LogLine, RecordedEvent, RunStatus
from store.eventstore import LogReplay
from store.types import PHASES, TERMINAL_PHASES
from supervisord.daemon.health import storage_json
from supervisord.daemon.outputs.query import run_outputs, which
from supervisord.daemon.sweepread import expand_refs, resolve_sweep_id, sweep_document
from supervisord.shared.events import ATTEMPT_ENDED, ATTEMPT_STARTED, HOOK_DELIVERED, HOOK_FAILED, RUN_UPDATED
from supervisord.shared.exceptions import AmbiguousRunError, RunNotFoundError, UsageError
from supervisord.shared.lifecycle import reached
from supervisord.shared.retry import attempts_of
from supervisord.shared.runref import check_run_ref

__all__ = ["HEARTBEAT_S", "RECENT_RUNS", "WAIT_CONDITIONS", "LogReplay", "OutputSpace", "ReadSide", "resolve_run_id"]

#: The hook outcome events `show` lists (supervisord.daemon.hooks.delivery).
_HOOK_OUTCOMES = (HOOK_DELIVERED, HOOK_FAILED)

#: Seconds a stream may stay silent before it sends a heartbeat.
HEARTBEAT_S: Final = 5.0
#: ``runs`` without ``--all``: in-flight runs and this many newest.
RECENT_RUNS: Final = 20
#: ``wait --for`` conditions besides a phase name.
WAIT_CONDITIONS: Final = ("terminal", "change")


async def resolve_run_id(store: EventStore, ref: str) -> str:
    """The full run id for ``ref`` (an id or a unique prefix of 4+ hex
    characters, any case: :mod:`supervisord.shared.runref`). Raises UsageError
    (not 4 to 12 hex characters),
    RunNotFoundError, AmbiguousRunError."""
    ref = check_run_ref(ref)
    ids = await store.match_run_ids(ref, limit=10)
    if not ids:
        raise RunNotFoundError(f"no run matches {ref!r} (see `jobsup runs --all`)")
    if len(ids) > 1:
        raise AmbiguousRunError(f"run id prefix {ref!r} matches several runs: {', '.join(ids)}; give more characters")
    return ids[0]


def all_labels(have: Mapping[str, str], want: Mapping[str, str]) -> bool:
    """Whether every label of ``want`` is in ``have`` with the same value."""
    return all(have.get(k) == v for k, v in want.items())


#: What the daemon says of its local runs' output disk (``"output"`` in
#: ``/health`` and ``GET /runs``: :func:`supervisord.daemon.health.output_space`).
OutputSpace = Callable[[], Awaitable[dict[str, Any] | None]]


async def _no_output_problem() -> dict[str, Any] | None:
    return None


class ReadSide:
    """Queries and streams over one open :class:`~store.EventStore`
    (``output``: the daemon's view of its local runs' output disk)."""

    def __init__(self, store: EventStore, output: OutputSpace = _no_output_problem) -> None:
        self.store = store
        self._output = output

    # -- the daemon's storage ------------------------------------------------------

    def storage(self) -> dict[str, Any] | None:
        """The store's write problem for the user (:func:`supervisord.daemon.health.storage_json`), None when fine."""
        return storage_json(self.store)

    async def output(self) -> dict[str, Any] | None:
        """The local runs' output disk problem (``OutputSpace``), None when fine."""
        return await self._output()

    async def last_seq(self) -> int:
        """The seq of the newest recorded event (0: none)."""
        return await self.store.last_seq()

    # -- queries ---------------------------------------------------------------

    async def resolve(self, ref: str) -> str:
        """:func:`resolve_run_id` on this store."""
        return await resolve_run_id(self.store, ref)

    async def get(self, run_id: str) -> RunStatus:
        """The run's status projection. Raises RunNotFoundError."""
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFoundError(f"no run {run_id}")
        return run

    async def list_runs(
        self,
        *,
        all: bool = False,
        project: str | None = None,
        phase: str | None = None,
        labels: Mapping[str, str] | None = None,
        name: str | None = None,
        sweep: str | None = None,
    ) -> list[RunStatus]:
        """Runs newest first: with ``phase``, those in it; else every run
        when ``all``, or the in-flight ones and the :data:`RECENT_RUNS`
        newest. ``labels`` (each must match), ``name`` (a glob, ``*?[]``)
        and ``sweep`` (a sweep id or prefix: all its runs, in sweep order)
        filter first. Raises UsageError for an unknown phase (any case) or
        a malformed sweep id, RunNotFoundError for no such sweep."""
        if phase and phase.upper() not in PHASES:
            raise UsageError(f"--phase {phase!r}: use one of {', '.join(PHASES)}")
        if sweep:
            runs = await self.store.sweep_runs(await resolve_sweep_id(self.store, sweep))
            all = True
            if project:
                runs = [r for r in runs if r.project == project]
            if phase:
                runs = [r for r in runs if r.phase == phase.upper()]
        else:
            runs = await self.store.list_runs(project=project or None, phases=[phase.upper()] if phase else None)
        if labels:
            want = dict(labels)
            runs = [r for r in runs if all_labels(r.labels, want)]
        if name:
            runs = [r for r in runs if fnmatch.fnmatchcase(r.name, name)]
        if not all and not phase:
            recent = {r.id for r in runs[:RECENT_RUNS]}
            runs = [r for r in runs if not r.terminal or r.id in recent]
        return runs

    async def show(self, ref: str) -> dict[str, Any]:
        """``{"run": Run, "submitted": the Submitted event's data, "hooks":
        the run's hook outcome events (HookDelivered, HookFailed),
        "updates": its RunUpdated events (``jobsup update``), "attempts": a
        retried run's attempts (supervisord.shared.retry.attempts_of; else [])}``."""
        run_id = await self.resolve(ref)
        run = await self.get(run_id)
        first = await self.store.read_all(0, limit=1, run_id=run_id)  # Submitted, not the whole stream
        hooks = await self.store.read_all(0, limit=1000, run_id=run_id, types=_HOOK_OUTCOMES)
        updates = await self.store.read_all(0, limit=1000, run_id=run_id, types=[RUN_UPDATED])
        tried = await self.store.read_all(0, limit=1000, run_id=run_id, types=[ATTEMPT_ENDED, ATTEMPT_STARTED])
        return {
            "attempts": attempts_of(tried, run.to_json()),
            "run": run.to_json(),
            "submitted": first[0].data if first else {},
            "hooks": [e.to_json() for e in hooks],
            "updates": [e.to_json() for e in updates],
        }

    async def submitted(self, run_id: str) -> dict[str, Any]:
        """The run's Submitted event's data ({} when it has none)."""
        first = await self.store.read_all(0, limit=1, run_id=run_id)
        return dict(first[0].data) if first else {}

    async def page_runs(self, **query: Any) -> tuple[list[RunStatus], int | None]:
        """A page of runs newest first and the cursor of the next
        (:meth:`store.EventStore.page_runs`: ``limit``, ``before``,
        ``project``, ``name``, ``backend``, ``phases``)."""
        return await self.store.page_runs(**query)

    async def runs_by_id(self, run_ids: Sequence[str]) -> list[RunStatus]:
        """The runs of ``run_ids`` that exist, in that order."""
        found = [await self.store.get_run(rid) for rid in run_ids]
        return [r for r in found if r is not None]

    async def timeline(self, run_id: str, *, after: int = 0, limit: int = 100) -> list[RecordedEvent]:
        """The run's PhaseChanged events with seq > ``after``, oldest first
        (at most ``limit``: page on with the last one's seq)."""
        return await self.store.read_all(after, limit=limit, run_id=run_id, types=[PHASE_CHANGED])

    async def has_logs(self, run_id: str) -> bool:
        """Whether the run recorded any log line."""
        return bool(await self.store.read_all(0, limit=1, run_id=run_id, types=[LOG_LINES]))

    async def events_page(
        self, *, after: int = 0, limit: int = 1000, run_id: str | None = None, types: Sequence[str] | None = None
    ) -> list[RecordedEvent]:
        """Recorded events with seq > ``after`` (of ``run_id``, of ``types``), oldest first."""
        return await self.store.read_all(after, limit=limit, run_id=run_id, types=list(types) if types else None)

    async def recent_events(
        self,
        *,
        before: int | None = None,
        limit: int = 100,
        run_id: str | None = None,
        types: Sequence[str] | None = None,
        exclude_types: Sequence[str] | None = None,
    ) -> list[RecordedEvent]:
        """Recorded events with seq < ``before`` (None: the newest), of
        ``run_id``, of ``types``, none of ``exclude_types``: newest first."""
        return await self.store.read_recent(
            before, limit=limit, run_id=run_id, types=list(types) if types else None, exclude_types=exclude_types
        )

    async def wait_for_events(
        self,
        after: int,
        *,
        run_ids: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        limit: int = 1,
        timeout_s: float,
    ) -> list[RecordedEvent]:
        """Events after ``after`` (of ``run_ids``, ``types``), waiting up to
        ``timeout_s`` for the first; [] when none came."""
        return await self.store.wait_for_events(
            after,
            run_ids=list(run_ids) if run_ids is not None else None,
            types=list(types) if types is not None else None,
            limit=limit,
            timeout_s=timeout_s,
        )

    async def outputs(self, run_id: str) -> dict[str, Any]:
        """The run's recorded outputs (:func:`supervisord.daemon.outputs.query.run_outputs`)."""
        return await run_outputs(self.store, run_id)

    async def which(self, digests: Sequence[str]) -> dict[str, Any]:
        """Which runs wrote files with these SHA-256 digests (:func:`supervisord.daemon.outputs.query.which`)."""
        return await which(self.store, list(digests))

    async def resolve_sweep(self, ref: str) -> str:
        """The full sweep id for an id or unique prefix (:func:`supervisord.daemon.sweepread.resolve_sweep_id`)."""
        return await resolve_sweep_id(self.store, ref)

    async def sweep(self, ref: str, *, with_runs: bool = False) -> dict[str, Any]:
        """A sweep's document (:func:`supervisord.daemon.sweepread.sweep_document`)."""
        return await sweep_document(self.store, ref, with_runs=with_runs)

    # -- logs ---------------------------------------------------------------------

    async def attempts(self, run: RunStatus) -> list[dict[str, Any]]:
        """A retried run's attempts (supervisord.shared.retry.attempts_of; [] for
        a run that never retried)."""
        tried = await self.store.read_all(0, limit=1000, run_id=run.id, types=[ATTEMPT_ENDED, ATTEMPT_STARTED])
        return attempts_of(tried, run.to_json())

    async def tail_line_no(self, run_id: str, n: int) -> int:
        """The number of the line before the run's last ``n`` lines."""
        return await self.store.tail_line_no(run_id, n)

    async def log_lines(self, run_id: str, after: int, limit: int, *, replay: LogReplay | None = None) -> list[LogLine]:
        """Up to ``limit`` log lines after line ``after``. Raises LogTextDeletedError, LogArchiveError."""
        return await self.store.log_lines(run_id, after, limit, replay=replay)

    async def check_log_text(self, run_id: str, after: int, *, replay: LogReplay) -> None:
        """Check the archived text after line ``after`` before a reply starts (:meth:`store.EventStore.check_log_text`)."""
        await self.store.check_log_text(run_id, after, replay=replay)

    async def log_text(self, run_id: str, after: int, blocks: int, *, replay: LogReplay) -> tuple[int, bytes]:
        """``(last line, text)`` of up to ``blocks`` stored blocks after line ``after``."""
        return await self.store.log_text(run_id, after, blocks, replay=replay)

    async def event_times(self, seqs: set[int]) -> dict[int, str]:
        """When each event of ``seqs`` was recorded."""
        return await self.store.event_times(seqs)

    # -- wait --------------------------------------------------------------------

    async def open_wait(
        self, refs: Sequence[str], *, cond: str = "terminal", after: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Check a ``wait`` (every run exists, ``cond`` is known) and return
        its stream, before anything is streamed. Raises UsageError,
        RunNotFoundError, AmbiguousRunError.

        The stream: ``{"after": seq}`` first (the cursor to resume from),
        ``{"heartbeat": seq}`` while nothing changes, then one
        ``{"result": {"met", "timed_out", "runs": [Run]}}``; for a
        phase before the end asked of a run that ended without reaching it,
        ``{"result": {"met": False, "never": [id], ...}}``."""
        if not refs:
            raise UsageError("wait: name at least one run")
        run_ids = await expand_refs(self.store, refs, self.resolve)
        cond = cond.strip()
        if cond not in WAIT_CONDITIONS and cond.upper() not in PHASES:
            raise UsageError(f"--for {cond!r}: use terminal, change, or a phase ({', '.join(PHASES)})")
        for rid in run_ids:
            await self.get(rid)
        return self._wait(run_ids, cond, after, timeout)

    async def _wait(
        self, run_ids: list[str], cond: str, after: int | None, timeout: float | None
    ) -> AsyncIterator[dict[str, Any]]:
        store = self.store
        start_seq = after if after is not None else await store.last_seq()
        yield {"after": start_seq}
        deadline = None if timeout is None else anyio.current_time() + timeout
        target = cond.upper()
        before_end = target in PHASES and target not in TERMINAL_PHASES
        while True:
            # Read the global position first: any change after it wakes the
            # wait below, even one that lands while the runs are read.
            seq = await store.last_seq()
            runs = [await self.get(rid) for rid in run_ids]
            # `wait --for RUNNING` on a run that ended without being RUNNING
            # (canceled while queued, failed staging): it never will be.
            never = [r.id for r in runs if before_end and r.terminal and not await self._passed(r.id, target)]
            if never:
                yield {
                    "result": {"met": False, "timed_out": False, "never": never, "runs": [r.to_json() for r in runs]}
                }
                return
            if await self.condition_met(cond, runs, start_seq):
                yield {"result": {"met": True, "timed_out": False, "runs": [r.to_json() for r in runs]}}
                return
            remaining = None if deadline is None else deadline - anyio.current_time()
            if remaining is not None and remaining <= 0:
                yield {"result": {"met": False, "timed_out": True, "runs": [r.to_json() for r in runs]}}
                return
            step = HEARTBEAT_S if remaining is None else min(HEARTBEAT_S, remaining)
            got = await store.wait_for_events(seq, run_ids=run_ids, types=[PHASE_CHANGED], limit=1, timeout_s=step)
            if not got:
                yield {"heartbeat": seq}

    async def _passed(self, run_id: str, phase: str) -> bool:
        """Whether the run ever recorded ``phase`` (its PhaseChanged events)."""
        cursor = 0
        while True:
            page = await self.store.read_all(cursor, limit=1000, run_id=run_id, types=[PHASE_CHANGED])
            if any(e.data.get("phase") == phase for e in page):
                return True
            if len(page) < 1000:
                return False
            cursor = page[-1].seq

    async def condition_met(self, cond: str, runs: list[RunStatus], after_seq: int) -> bool:
        """Whether ``wait --for cond`` holds for ``runs``: ``terminal``: every
        run is terminal; ``change``: any run had a PhaseChanged with seq >
        ``after_seq``; a phase: every run reached it
        (:func:`supervisord.shared.lifecycle.reached`)."""
        if cond == "terminal":
            return all(r.terminal for r in runs)
        if cond == "change":
            for r in runs:
                if await self.store.read_all(after_seq, limit=1, run_id=r.id, types=[PHASE_CHANGED]):
                    return True
            return False
        return all(reached(r.phase, cond.upper()) for r in runs)

    # -- events ------------------------------------------------------------------

    async def events(
        self, *, run_id: str | None = None, after: int = 0, follow: bool = False, limit: int = 1000
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Recorded events with seq > ``after`` (of ``run_id`` only, when
        given), oldest first, in pages of at most ``limit``; when following,
        wait for new ones and yield ``[{"heartbeat": cursor}]`` after each
        silent :data:`HEARTBEAT_S`. Each yielded list is one page."""
        cursor = after
        while True:
            page = await self.store.read_all(cursor, limit=limit, run_id=run_id)
            if page:
                cursor = page[-1].seq
                yield [e.to_json() for e in page]
                continue
            if not follow:
                return
            got = await self.store.wait_for_events(
                cursor, run_ids=[run_id] if run_id else None, limit=1, timeout_s=HEARTBEAT_S
            )
            if not got:
                yield [{"heartbeat": cursor}]
