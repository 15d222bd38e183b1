"""Delivering hooks from the event log: one subscription per hook, each with
a checkpoint in the store.

Each hook is a :class:`HookRunner` task reading ``PhaseChanged`` events after
its checkpoint, in seq order (a store subscription: it sleeps until a commit
brings one, it does not poll). For an event it wants it runs the command or
POSTs the webhook, then appends the outcome (``HookDelivered`` or
``HookFailed``) to the run's stream with the hook's checkpoint moved to that
event *in the same transaction*. So after ``kill -9`` the hook resumes at
the first event whose outcome was not recorded: that event may be delivered
twice (at least once), none is missed. Events it does not want move the
checkpoint lazily (after :data:`FLUSH_S` without a wanted event), which
never skips one: the position only passes events already looked at.

Hooks are independent tasks: a slow or failing hook delays only its own
later events (in order per hook), never other hooks, run supervision or
appends (their attempts run in child processes or as async HTTP requests;
nothing blocks the event loop).

"In order per hook", exactly: deliveries *start* in event seq order. With
``in_flight`` 1 (command hooks, and webhooks by default) one delivery is
under way at a time, so a receiver sees a hook's events strictly in order.
A webhook with ``webhook.in_flight`` N > 1 keeps up to N deliveries under
way at once, each for a different run: a run's next event starts only once
its previous delivery ended (final outcome or given up), so a receiver sees
``X-Jobsup-Event`` increasing per run, while events of different runs may
arrive out of order; no new delivery starts while one of the hook's waits
for a retry. Either way the checkpoint moves only past events whose final
outcome is committed (see :meth:`HookRunner._safe`): the outcome of the
earliest unfinished event carries it forward, in its own transaction.
After a restart the hook resumes at the checkpoint; events after it whose
final outcome was already recorded (a window finishes out of order) are not
delivered again, and attempt numbers go on from the recorded ones.

Run objects (the ``run`` of a webhook body) are read for a batch of events
in two queries (:meth:`store.EventStore.get_runs`,
:meth:`store.EventStore.first_events`), again when older than
:data:`_RUNS_FRESH_S`; a run's Submitted data is read once for all the hooks
of the service (:class:`SubmittedCache`). Webhooks go out through the lean kept-alive client of
:mod:`supervisord.daemon.hooks.http1`. Webhook failures worth retrying are tried
again after capped exponential back-off (:func:`backoff_s`, or the server's
``Retry-After`` when longer) until ``webhook.retry_for_s`` has passed since
the first attempt; every attempt is an event.

A hook with no checkpoint yet (new in the config) starts at the current end
of the log, unless ``backfill: true`` (then at the beginning). The
``on-done`` hook runs the ``on_done`` argv a run recorded at submit
(``submit --on-done``) when that run reaches a terminal phase, from the
folder the submit ran in.

Outcome events (data shapes; both are events of the run whose phase change
they answer):

``HookDelivered``
    ``hook`` str, ``kind`` ``"command"`` | ``"webhook"``, ``event_seq`` int
    (the ``PhaseChanged`` it ran for), ``phase`` str, ``attempt`` int (1, 2,
    ...), ``duration_s`` float, ``exit_code`` int (command) or ``status``
    int (webhook), ``output`` str (the first 4 KiB of the command's output
    or of the response body; absent when empty).
``HookFailed``
    The same keys (``exit_code`` / ``status`` null when there was none),
    plus ``error`` str (a short reason: ``"exit code 3"``, ``"HTTP 500"``,
    ``"timed out after 30 s; ..."``), ``final`` bool (no further attempt
    for this event: the checkpoint moved past it) and, when not final,
    ``retry_in_s`` float.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, cast

import anyio
import anyio.abc
import httpx
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from store import (
    PHASE_CHANGED,
    TERMINAL_PHASES,
    Append,
    Checkpoint,
    EventStore,
    LogArchiveError,
    LogTextDeletedError,
    RecordedEvent,
    RunStatus,
    StoreClosedError,
    StoreError,
)
from supervisord.daemon.hooks.attempt import Attempt
from supervisord.daemon.hooks.command import hook_env, run_command
from supervisord.daemon.hooks.http1 import Http1Client, proxied
from supervisord.daemon.hooks.match import is_candidate, matches
from supervisord.daemon.hooks.webhook import post_event
from supervisord.daemon.readside import ReadSide
from supervisord.shared.events import HOOK_DELIVERED, HOOK_FAILED, Event, HookDeliveredData, HookFailedData
from supervisord.shared.hooksconfig import ON_DONE_HOOK, HookSpec, on_done_spec

__all__ = [
    "FLUSH_S",
    "HOOK_DELIVERED",
    "HOOK_FAILED",
    "STDIN_LINES",
    "HookRunner",
    "HookService",
    "SubmittedCache",
    "backoff_s",
    "run_object",
]

log = structlog.get_logger("jobsup.hooks")

#: Seconds without a wanted event before a hook's checkpoint catches up
#: with the events it passed over.
FLUSH_S: Final = 2.0
#: How many of the run's last log lines a command hook gets on stdin.
STDIN_LINES: Final = 50
#: Back-off between webhook attempts: 1 s, 2 s, 4 s ... at most 5 minutes.
BACKOFF_BASE_S: Final = 1.0
BACKOFF_CAP_S: Final = 300.0
#: A busy hook (phase changes keep coming) saves its position at most this often.
_FLUSH_EVERY_S: Final = 10.0
#: The most outcome events of one hook waiting to be appended.
_OUTBOX: Final = 256
#: The recorder appends a group of outcomes once this long passed without
#: a new one (seconds)...
_GATHER_S: Final = 0.02
#: ...or this long after the group's first: the most a burst's outcomes
#: wait (an outcome not yet appended when the daemon dies is delivered
#: again after a restart: at least once).
_GATHER_MAX_S: Final = 0.25
#: A hook task that fails unexpectedly starts again from its checkpoint after this.
_RESTART_S: Final = 5.0
_SUBMITTED_CACHE: Final = 1024
#: Run objects read for a batch of events are read again when older than this (seconds).
_RUNS_FRESH_S: Final = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class _Outcome:
    event: RecordedEvent
    new: Event
    final: bool


def _store_closed(exc: BaseException) -> bool:
    """Whether ``exc`` is (a group of nothing but) StoreClosedError."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_store_closed(e) for e in exc.exceptions)
    return isinstance(exc, StoreClosedError)


def _fields(obj: RunStatus | RecordedEvent) -> dict[str, Any]:
    """``obj.to_json()`` without its deep copy (``dataclasses.asdict``
    copies every nested value; the result here is only read or serialised)."""
    names = _FIELD_NAMES.get(type(obj))
    if names is None:
        names = _FIELD_NAMES[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    return {name: getattr(obj, name) for name in names}


#: Field names per dataclass (dataclasses.fields() builds its tuple on every call).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def backoff_s(attempt: int, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S) -> float:
    """The pause after failed attempt number ``attempt`` (1-based):
    ``base_s * 2 ** (attempt - 1)``, at most ``cap_s``."""
    return float(min(cap_s, base_s * 2 ** min(attempt - 1, 60)))


def run_object(status: Mapping[str, Any], submitted: Mapping[str, Any]) -> dict[str, Any]:
    """The run object of ``jobsup show -o json``: the run-status fields and,
    from the Submitted data, command, timeout_s, source, env (digests) and
    config (redacted)."""
    return {
        **status,
        "command": submitted.get("command"),
        "timeout_s": submitted.get("timeout_s"),
        "source": submitted.get("source"),
        "env": submitted.get("env"),
        "config": submitted.get("config"),
    }


class SubmittedCache:
    """The Submitted data of runs (the ``run`` object's command, source,
    env and config; ``on_done``, ``cwd``), shared by the hooks of a
    service: hooks woken by the same phase changes wait for one read of
    those runs instead of each reading them. At most :data:`_SUBMITTED_CACHE`
    runs are kept (the oldest go first); a run without a Submitted event
    reads as ``{}``."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._data: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._reading: dict[str, anyio.Event] = {}  # run id -> set when the read under way ended

    def holds(self, run_ids: Collection[str]) -> bool:
        """Whether every one of ``run_ids`` is kept (:meth:`get` reads nothing)."""
        return all(r in self._data for r in run_ids)

    async def get(self, run_ids: Collection[str]) -> dict[str, dict[str, Any]]:
        """run id -> Submitted data for each of ``run_ids``: the kept ones,
        those another hook is reading (once read), the others in one query
        (:meth:`store.EventStore.first_events`; its errors are raised; a
        hook that waited for a read that failed reads for itself)."""
        out: dict[str, dict[str, Any]] = {}
        todo = set(run_ids)
        while True:
            for run_id in list(todo):
                data = self._data.get(run_id)
                if data is not None:
                    out[run_id] = data
                    todo.discard(run_id)
            if not todo:
                return out
            waits = {self._reading[r] for r in todo if r in self._reading}
            mine = [r for r in todo if r not in self._reading]
            if mine:
                done = anyio.Event()
                for run_id in mine:
                    self._reading[run_id] = done
                try:
                    firsts = await self.store.first_events(mine)
                finally:
                    for run_id in mine:
                        del self._reading[run_id]
                    done.set()
                for run_id in mine:
                    first = firsts.get(run_id)
                    out[run_id] = self._data[run_id] = first.data if first is not None else {}
                    todo.discard(run_id)
                while len(self._data) > _SUBMITTED_CACHE:
                    self._data.popitem(last=False)
            for event in waits:
                await event.wait()


class HookRunner:
    """The subscription of one hook (see the module doc). ``run()`` loops
    until cancelled; ``position`` (the last event looked at), ``saved`` (the
    stored checkpoint as this runner knows it), ``delivering`` (the first
    event seq under way, or None) and ``last_outcome`` (the data of the
    last outcome event this daemon recorded) are for listings.

    ``on_done``: this is the ``on-done`` hook (``spec`` is then a stand-in
    whose target comes from each run's Submitted data). ``in_flight``: how
    many deliveries may be under way at once (a webhook's
    ``webhook.in_flight``; 1 for command hooks).
    """

    def __init__(
        self,
        spec: HookSpec,
        store: EventStore,
        *,
        env: Mapping[str, str],
        http: Http1Client | httpx.AsyncClient | None = None,
        on_done: bool = False,
        user_agent: str = "jobsup",
        submitted: SubmittedCache | None = None,
    ) -> None:
        self.spec = spec
        self.store = store
        self.env = dict(env)
        self.http = http
        self.on_done = on_done
        self.user_agent = user_agent
        self.in_flight = spec.webhook.in_flight if spec.webhook is not None else 1
        self.position = 0
        self.saved = 0
        self.last_outcome: dict[str, Any] | None = None
        self._submitted = submitted if submitted is not None else SubmittedCache(store)
        self._outbox: MemoryObjectSendStream[_Outcome] | None = None
        self._pending = 0
        self._drained = anyio.Event()
        self._drained.set()
        self._reset()

    def _reset(self) -> None:
        # Deliveries started and not yet finished with (their final outcome
        # not committed), in seq order: seq -> finished.
        self._ledger: dict[int, bool] = {}
        # run id -> set when that run's delivery under way has ended.
        self._busy: dict[str, anyio.Event] = {}
        self._slots = anyio.Semaphore(self.in_flight)
        self._backing_off = 0
        self._calm = anyio.Event()
        self._calm.set()
        # Outcomes recorded before this start, of events after the checkpoint:
        # event seq -> (attempts, final).
        self._recorded: dict[int, tuple[int, bool]] = {}

    @property
    def delivering(self) -> int | None:
        """The first event seq whose delivery is under way, or None."""
        return next((seq for seq, done in self._ledger.items() if not done), None)

    def _safe(self, finishing: int | None = None) -> int:
        """The furthest the checkpoint may move now: before the first event
        under way (or whose final outcome is not committed), else to
        ``position``. ``finishing``: an event whose final outcome goes into
        the transaction this checkpoint moves in (it counts as finished; the
        events before it have all been looked at, even if ``position`` does
        not say so yet)."""
        while self._ledger:
            seq, done = next(iter(self._ledger.items()))
            if not done:
                break
            del self._ledger[seq]
        for seq, done in self._ledger.items():
            if not done and seq != finishing:
                return seq - 1
        return max(self.position, finishing or 0)

    # -- the loop ------------------------------------------------------------

    async def run_forever(self) -> None:
        """:meth:`run`, started again from the stored checkpoint after an
        unexpected error (logged); returns when the store closes."""
        while True:
            try:
                await self.run()
            except Exception as exc:
                if _store_closed(exc):
                    return
                log.exception("hook.failed", hook=self.spec.name, restart_in_s=_RESTART_S)
                await anyio.sleep(_RESTART_S)

    async def run(self) -> None:
        """Deliver every wanted event after the checkpoint, forever.

        Outcome events are appended by a recorder task, in order, while the
        next event is delivered (a commit's fsync does not hold up the next
        delivery), a burst's outcomes together once it pauses (at most
        :data:`_GATHER_MAX_S` later, see :meth:`_recorder`); at most
        :data:`_OUTBOX` outcomes wait. Outcomes still waiting when the task
        stops are not recorded: their events are delivered again after a
        restart (at least once)."""
        send, receive = anyio.create_memory_object_stream[_Outcome](max_buffer_size=_OUTBOX)
        self._outbox, self._pending = send, 0
        self._drained = anyio.Event()
        self._drained.set()
        self._reset()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._recorder, receive)
            try:
                async with anyio.create_task_group() as deliveries:
                    await self._follow(deliveries)
            finally:
                tg.cancel_scope.cancel()

    async def _load_recorded(self, after_seq: int) -> None:
        """Note this hook's outcomes recorded after ``after_seq`` (before a
        restart): attempts so far and whether one was final, per event."""
        cursor = after_seq
        while True:
            page = await self.store.read_all(cursor, limit=1000, types=[HOOK_DELIVERED, HOOK_FAILED])
            for e in page:
                if e.data.get("hook") != self.spec.name or not isinstance(e.data.get("event_seq"), int):
                    continue
                attempts, final = self._recorded.get(e.data["event_seq"], (0, False))
                done = e.type == HOOK_DELIVERED or e.data.get("final") is True
                self._recorded[e.data["event_seq"]] = (attempts + 1, final or done)
            if len(page) < 1000:
                return
            cursor = page[-1].seq

    async def _follow(self, deliveries: anyio.abc.TaskGroup) -> None:
        name = self.spec.checkpoint_name
        stored = await self.store.get_checkpoint(name)
        if stored is None:
            stored = 0 if self.spec.backfill else await self.store.last_seq()
            await self.store.save_checkpoint(Checkpoint(name, stored))
            log.info("hook.new", hook=self.spec.name, starts_after_seq=stored, backfill=self.spec.backfill)
        else:
            await self._load_recorded(stored)
        self.position = self.saved = stored
        saved_at = time.monotonic()
        while True:
            # The last seq this store published (no query): every event up
            # to it is one wait_for_events sees, so passing over (position,
            # end] below never skips one (an event another process appended
            # is seen, and passed, only once a local commit published it).
            end = self.store.published_seq
            if end <= self.saved:
                # Caught up: sleep until anything is appended (no polling),
                # then look again, so the checkpoint also passes over the
                # events after it that this hook does not want (other
                # hooks' outcomes, output records...): an idle hook's lag
                # goes back to 0 instead of staying at their count.
                await self.store.wait_for_events(max(self.position, end), limit=1)
                if self.store.published_seq <= self.saved:
                    # Seen in the file before this store published it
                    # (another process appended it): not a busy loop.
                    await anyio.sleep(FLUSH_S)
                continue
            events = await self.store.wait_for_events(
                self.position,
                types=[PHASE_CHANGED],
                limit=256,
                timeout_s=FLUSH_S,
            )
            if not events:
                # No PhaseChanged in (position, end]: pass over those events
                # (once the outcomes of the events before are recorded).
                self.position = max(self.position, end)
                await self._drained.wait()
                safe = self._safe()
                if safe > self.saved:
                    await self.store.save_checkpoint(Checkpoint(name, safe))
                    self.saved = max(self.saved, safe)
                continue
            await self._dispatch(events, deliveries)
            # While phase changes keep coming, a hook that wants none of them
            # still moves its checkpoint now and then.
            if self.position > self.saved and time.monotonic() - saved_at > _FLUSH_EVERY_S:
                await self._drained.wait()
                safe = self._safe()
                if safe > self.saved:
                    await self.store.save_checkpoint(Checkpoint(name, safe))
                    self.saved = max(self.saved, safe)
                saved_at = time.monotonic()

    async def _dispatch(self, events: Sequence[RecordedEvent], deliveries: anyio.abc.TaskGroup) -> None:
        """Start the deliveries ``events`` call for, in seq order (each
        waits for a free slot, for the end of its run's delivery under way,
        and while a delivery of this hook waits to be retried). An event
        whose final outcome was recorded before a restart is not delivered
        again. Run objects are read for several events at once, again when
        older than :data:`_RUNS_FRESH_S`."""
        wanted = [e for e in events if is_candidate(self.spec, e) and not self._recorded.get(e.seq, (0, False))[1]]
        wanted_seqs = {e.seq for e in wanted}
        runs: dict[str, tuple[RunStatus, dict[str, Any]]] = {}
        loaded_at: float | None = None
        for event in events:
            if event.seq in wanted_seqs:
                if loaded_at is None or time.monotonic() - loaded_at > _RUNS_FRESH_S:
                    runs = await self._run_objects({e.run_id for e in wanted if e.seq >= event.seq})
                    loaded_at = time.monotonic()
                target = self._target(event, runs.get(event.run_id))
                if target is not None:
                    await self._start(deliveries, *target, event)
            self.position = event.seq

    async def _start(
        self,
        deliveries: anyio.abc.TaskGroup,
        spec: HookSpec,
        run: Mapping[str, Any],
        cwd: str | None,
        event: RecordedEvent,
    ) -> None:
        if self.in_flight == 1:
            # One at a time: the previous delivery ended (its final outcome
            # handed to the recorder) before this call; no slot, run or
            # back-off to wait for, no task to spawn.
            self._ledger[event.seq] = False
            await self._deliver(spec, event, run, cwd)
            return
        await self._slots.acquire()
        try:
            previous = self._busy.get(event.run_id)
            if previous is not None:
                await previous.wait()
            while self._backing_off:
                await self._calm.wait()
        except BaseException:
            self._slots.release()
            raise
        ended = anyio.Event()
        self._busy[event.run_id] = ended
        self._ledger[event.seq] = False

        async def deliver() -> None:
            try:
                await self._deliver(spec, event, run, cwd)
            finally:
                ended.set()
                if self._busy.get(event.run_id) is ended:
                    del self._busy[event.run_id]
                self._slots.release()

        deliveries.start_soon(deliver)

    # -- what to deliver ------------------------------------------------------

    async def _run_objects(self, run_ids: set[str]) -> dict[str, tuple[RunStatus, dict[str, Any]]]:
        """run id -> (its run status, its Submitted data) for those of
        ``run_ids`` that exist, in two queries at most, at once (the
        Submitted data from the service's :class:`SubmittedCache`)."""
        submitted: dict[str, dict[str, Any]] = {}

        async def read_submitted() -> None:
            submitted.update(await self._submitted.get(run_ids))

        if self.on_done:  # the statuses of the runs submitted with --on-done only: after the Submitted data
            await read_submitted()
            statuses = await self.store.get_runs({r for r in run_ids if submitted[r].get("on_done")})
        elif self._submitted.holds(run_ids):
            await read_submitted()  # no query
            statuses = await self.store.get_runs(run_ids)
        else:  # both at once (the store has two read connections); this task's at once
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_submitted)
                statuses = await self.store.get_runs(run_ids)
        return {r: (status, submitted[r]) for r, status in statuses.items()}

    def _target(
        self, event: RecordedEvent, found: tuple[RunStatus, dict[str, Any]] | None
    ) -> tuple[HookSpec, dict[str, Any], str | None] | None:
        """(the hook to run, the run object, the working folder) for an
        event this hook wants, else None. ``found``: (run status, Submitted
        data), None for a run that does not exist."""
        if found is None or not is_candidate(self.spec, event):
            return None
        status, submitted = found
        if self.on_done:
            argv = submitted.get("on_done")
            if not isinstance(argv, list) or not argv or not all(isinstance(w, str) and w for w in argv):
                return None
            cwd = submitted.get("cwd")
            return on_done_spec(argv), run_object(_fields(status), submitted), cwd if isinstance(cwd, str) else None
        run = run_object(_fields(status), submitted)
        if not matches(self.spec, event, run):
            return None
        return self.spec, run, None

    # -- delivering one event -------------------------------------------------

    async def _attempt(
        self, spec: HookSpec, event: RecordedEvent, run: Mapping[str, Any], cwd: str | None, body: bytes
    ) -> Attempt:
        if spec.command is not None:
            fields = {**run, **{k: event.data.get(k) for k in ("phase", "reason", "exit_code")}}
            reads = ReadSide(self.store)
            after = await reads.tail_line_no(event.run_id, STDIN_LINES)
            try:
                lines = await reads.log_lines(event.run_id, after, STDIN_LINES)
            except (LogArchiveError, LogTextDeletedError) as err:  # retention: the hook still runs
                log.warning("hook.log_unavailable", hook=spec.name, run_id=event.run_id, error=str(err))
                lines = []
            stdin = "".join(line.text + "\n" for line in lines).encode("utf-8", errors="replace")
            return await run_command(
                spec.command,
                env=hook_env(self.env, fields, event.seq, spec.name),
                stdin=stdin,
                timeout_s=spec.timeout_s,
                cwd=cwd,
            )
        assert spec.webhook is not None
        assert self.http is not None
        secret_env = spec.webhook.secret_env
        secret = self.env.get(secret_env, "").encode() if secret_env else None
        return await post_event(self.http, spec.webhook, body, event.seq, secret or None, self.user_agent)

    async def _deliver(self, spec: HookSpec, event: RecordedEvent, run: Mapping[str, Any], cwd: str | None) -> None:
        attempt_no = 1 + self._recorded.pop(event.seq, (0, False))[0]
        retry_for_s = spec.webhook.retry_for_s if spec.webhook is not None else 0.0
        body = json.dumps({"event": _fields(event), "run": run}, ensure_ascii=False, separators=(",", ":")).encode()
        first_at = time.monotonic()
        while True:
            result = await self._attempt(spec, event, run, cwd, body)
            final = result.ok or not result.retry
            delay = 0.0
            error = result.error
            if not final:
                delay = max(backoff_s(attempt_no), result.retry_after_s or 0.0)
                if time.monotonic() - first_at + delay > retry_for_s:
                    final = True
                    error = f"{error}; gave up (the next attempt would be after retry_for_s={retry_for_s:g})"
            data: dict[str, Any] = {
                "hook": spec.name,
                "kind": spec.kind,
                "event_seq": event.seq,
                "phase": event.data.get("phase"),
                "attempt": attempt_no,
                "duration_s": round(result.duration_s, 3),
            }
            if spec.kind == "command":
                data["exit_code"] = result.exit_code
            else:
                data["status"] = result.status
            if result.output:
                data["output"] = result.output
            if not result.ok:
                data["error"] = error
                data["final"] = final
                if not final:
                    data["retry_in_s"] = round(delay, 3)
            outcome = (
                HOOK_DELIVERED(cast(HookDeliveredData, data)) if result.ok else HOOK_FAILED(cast(HookFailedData, data))
            )
            await self._record(event, outcome, final=final)
            log.info(
                "hook.delivered" if result.ok else "hook.failed_attempt",
                hook=spec.name, run=event.run_id, event_seq=event.seq, attempt=attempt_no, error=error,
            )  # fmt: skip
            if final:
                return
            self._backing_off += 1
            if self._calm.is_set():
                self._calm = anyio.Event()
            try:
                await anyio.sleep(delay)
            finally:
                self._backing_off -= 1
                if not self._backing_off:
                    self._calm.set()
            attempt_no += 1

    async def _record(self, event: RecordedEvent, new: Event, *, final: bool) -> None:
        """Hand the outcome to the recorder (waits while :data:`_OUTBOX`
        outcomes are pending)."""
        assert self._outbox is not None
        self._pending += 1
        self._drained = anyio.Event() if self._drained.is_set() else self._drained
        self.last_outcome = {"type": new.type, **new.data}
        outcome = _Outcome(event, new, final)
        try:
            self._outbox.send_nowait(outcome)  # no pass through the event loop while there is room
        except anyio.WouldBlock:
            await self._outbox.send(outcome)

    async def _recorder(self, receive: MemoryObjectReceiveStream[_Outcome]) -> None:
        """Append the outcomes in the order they were handed over, in
        groups queued together (:meth:`store.EventStore.append_many`: they
        share a transaction): a group takes what is handed over until
        :data:`_GATHER_S` passes without a new outcome, at most
        :data:`_GATHER_MAX_S` after its first (or :data:`_OUTBOX` outcomes);
        the next group after the last one is recorded."""
        async with receive:
            async for first in receive:
                # A lone outcome is appended _GATHER_S after it came; a
                # burst's outcomes share one transaction, appended once the
                # burst paused (or after _GATHER_MAX_S), out of the way of
                # its deliveries: a commit's round trips to the database
                # thread slow every delivery they overlap. (A sleep per
                # _GATHER_S, then take what came: not a wake-up per outcome.)
                group = [first]
                deadline = anyio.current_time() + _GATHER_MAX_S
                while len(group) < _OUTBOX:
                    await anyio.sleep(min(_GATHER_S, max(0.0, deadline - anyio.current_time())))
                    before = len(group)
                    with contextlib.suppress(anyio.WouldBlock, anyio.EndOfStream):
                        while len(group) < _OUTBOX:
                            group.append(receive.receive_nowait())
                    if len(group) == before or anyio.current_time() >= deadline:
                        break
                await self._append_outcomes(group)
                self._pending -= len(group)
                if self._pending == 0:
                    self._drained.set()

    async def _append_outcomes(self, group: list[_Outcome]) -> None:
        """Append each outcome to its run's stream, in order, queued
        together; a final one moves the checkpoint in the same transaction,
        as far as :meth:`_safe` allows counting its event as finished (not
        past an earlier event still under way or whose outcome is not
        committed yet, which includes the earlier outcomes of this group:
        that one's outcome moves it later, or the idle flush does). An
        outcome that a store failure (disk full, lock) did not record is
        appended again after a pause: the attempt happened and must be
        recorded."""
        checkpoints: list[Checkpoint | None] = []
        for outcome in group:
            checkpoint = None
            if outcome.final:
                safe = self._safe(finishing=outcome.event.seq)
                if safe > self.saved:
                    checkpoint = Checkpoint(self.spec.checkpoint_name, safe)
            checkpoints.append(checkpoint)
        todo = list(zip(group, checkpoints, strict=True))
        pause = 1.0
        while True:
            results = await self.store.append_many(
                [Append(o.event.run_id, None, [o.new], checkpoint=c) for o, c in todo]
            )
            failed = []
            for (outcome, checkpoint), result in zip(todo, results, strict=True):
                if isinstance(result, StoreClosedError):
                    raise result
                if isinstance(result, StoreError):
                    log.error(
                        "hook.record_failed", hook=self.spec.name, event_seq=outcome.event.seq,
                        error=str(result), retry_in_s=pause,
                    )  # fmt: skip
                    failed.append((outcome, checkpoint))
                    continue
                if outcome.final:
                    if outcome.event.seq in self._ledger:
                        self._ledger[outcome.event.seq] = True
                    if checkpoint is not None:
                        self.saved = max(self.saved, checkpoint.seq)
            if not failed:
                return
            todo = failed
            await anyio.sleep(pause)
            pause = min(pause * 2, 30.0)


class HookService:
    """Every hook of the daemon (the configured ones and ``on-done``) as
    tasks: ``await service.run()`` in the daemon's task group (cancel it to
    stop). ``env`` is the daemon's environment (command hooks' base
    environment; webhook secrets are read from it)."""

    def __init__(
        self,
        store: EventStore,
        hooks: Sequence[HookSpec],
        *,
        env: Mapping[str, str] | None = None,
        user_agent: str = "jobsup",
    ) -> None:
        self.store = store
        base = dict(os.environ if env is None else env)
        stand_in = HookSpec(name=ON_DONE_HOOK, when=TERMINAL_PHASES, command=(), source="submit --on-done")
        submitted = SubmittedCache(store)  # one read of a run's Submitted data for every hook
        self.runners = [HookRunner(spec, store, env=base, user_agent=user_agent, submitted=submitted) for spec in hooks]
        self.runners.append(
            HookRunner(stand_in, store, env=base, on_done=True, user_agent=user_agent, submitted=submitted)
        )

    async def run(self) -> None:
        """Run every hook until cancelled (or the store closes). The HTTP
        clients are made only when a webhook needs them: the lean
        :class:`~supervisord.daemon.hooks.http1.Http1Client` (kept-alive connections,
        shared by every webhook), httpx for URLs an environment proxy applies
        to."""
        async with contextlib.AsyncExitStack() as stack:
            lean: Http1Client | None = None
            proxy: httpx.AsyncClient | None = None
            for runner in self.runners:
                if runner.spec.webhook is None:
                    continue
                if proxied(runner.spec.webhook.url):
                    if proxy is None:
                        proxy = await stack.enter_async_context(httpx.AsyncClient(follow_redirects=False))
                    runner.http = proxy
                else:
                    if lean is None:
                        lean = await stack.enter_async_context(Http1Client())
                    runner.http = lean
            tg = await stack.enter_async_context(anyio.create_task_group())
            for runner in self.runners:
                tg.start_soon(runner.run_forever, name=f"hook-{runner.spec.name}")

    async def status(self) -> list[dict[str, Any]]:
        """One object per hook: its :meth:`HookSpec.describe` fields and
        ``checkpoint`` (stored seq, or null before the hook started),
        ``position`` (the last event it looked at), ``lag`` (events after
        the checkpoint), ``delivering`` (an event seq or null) and
        ``last_outcome`` (the data of the last HookDelivered/HookFailed
        this daemon recorded, with its ``type``; null before one)."""
        last = await self.store.last_seq()
        stored = await self.store.checkpoints()
        out = []
        for runner in self.runners:
            checkpoint = stored.get(runner.spec.checkpoint_name)
            described = runner.spec.describe()
            if runner.on_done:
                described["target"] = "the run's own command (submit --on-done)"
            out.append(
                {
                    **described,
                    "checkpoint": checkpoint,
                    "position": runner.position,
                    "lag": None if checkpoint is None else max(0, last - checkpoint),
                    "delivering": runner.delivering,
                    "last_outcome": runner.last_outcome,
                }
            )
        return out
