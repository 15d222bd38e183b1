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
nothing blocks the event loop). Webhook failures worth retrying are tried
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
from collections.abc import Mapping, Sequence
from typing import Any, Final

import anyio
import httpx
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from store import (
    PHASE_CHANGED,
    TERMINAL_PHASES,
    Checkpoint,
    EventStore,
    LogArchiveError,
    LogTextDeletedError,
    NewEvent,
    RecordedEvent,
    StoreClosedError,
    StoreError,
)
from supervisord.hooks.attempt import Attempt
from supervisord.hooks.command import hook_env, run_command
from supervisord.hooks.config import ON_DONE_HOOK, HookSpec, on_done_spec
from supervisord.hooks.match import is_candidate, matches
from supervisord.hooks.webhook import post_event

__all__ = [
    "FLUSH_S",
    "HOOK_DELIVERED",
    "HOOK_FAILED",
    "STDIN_LINES",
    "HookRunner",
    "HookService",
    "backoff_s",
    "run_object",
]

log = structlog.get_logger("jobsup.hooks")

HOOK_DELIVERED: Final = "HookDelivered"
HOOK_FAILED: Final = "HookFailed"
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
#: A hook task that fails unexpectedly starts again from its checkpoint after this.
_RESTART_S: Final = 5.0
_SUBMITTED_CACHE: Final = 1024


@dataclasses.dataclass(frozen=True, slots=True)
class _Outcome:
    event: RecordedEvent
    type: str
    data: dict[str, Any]
    final: bool


def _store_closed(exc: BaseException) -> bool:
    """Whether ``exc`` is (a group of nothing but) StoreClosedError."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_store_closed(e) for e in exc.exceptions)
    return isinstance(exc, StoreClosedError)


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


class HookRunner:
    """The subscription of one hook (see the module doc). ``run()`` loops
    until cancelled; ``position`` (the last event looked at), ``saved`` (the
    stored checkpoint as this runner knows it), ``delivering`` (the event
    seq being delivered, or None) and ``last_outcome`` (the data of the
    last outcome event this daemon recorded) are for listings.

    ``on_done``: this is the ``on-done`` hook (``spec`` is then a stand-in
    whose target comes from each run's Submitted data).
    """

    def __init__(
        self,
        spec: HookSpec,
        store: EventStore,
        *,
        env: Mapping[str, str],
        http: httpx.AsyncClient | None = None,
        on_done: bool = False,
        user_agent: str = "jobsup",
    ) -> None:
        self.spec = spec
        self.store = store
        self.env = dict(env)
        self.http = http
        self.on_done = on_done
        self.user_agent = user_agent
        self.position = 0
        self.saved = 0
        self.delivering: int | None = None
        self.last_outcome: dict[str, Any] | None = None
        self._submitted: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._outbox: MemoryObjectSendStream[_Outcome] | None = None
        self._pending = 0
        self._drained = anyio.Event()
        self._drained.set()

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
                self.delivering = None
                await anyio.sleep(_RESTART_S)

    async def run(self) -> None:
        """Deliver every wanted event after the checkpoint, forever.

        Outcome events are appended by a recorder task, in order, while the
        next event is delivered (a commit's fsync does not hold up the next
        delivery); at most :data:`_OUTBOX` outcomes wait. Outcomes still
        waiting when the task stops are not recorded: their events are
        delivered again after a restart (at least once)."""
        send, receive = anyio.create_memory_object_stream[_Outcome](max_buffer_size=_OUTBOX)
        self._outbox, self._pending = send, 0
        self._drained = anyio.Event()
        self._drained.set()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._recorder, receive)
            try:
                await self._follow()
            finally:
                tg.cancel_scope.cancel()

    async def _follow(self) -> None:
        name = self.spec.checkpoint_name
        stored = await self.store.get_checkpoint(name)
        if stored is None:
            stored = 0 if self.spec.backfill else await self.store.last_seq()
            await self.store.save_checkpoint(Checkpoint(name, stored))
            log.info("hook.new", hook=self.spec.name, starts_after_seq=stored, backfill=self.spec.backfill)
        self.position = self.saved = stored
        saved_at = time.monotonic()
        resume = True
        while True:
            end = await self.store.last_seq()
            events = await self.store.wait_for_events(
                self.position,
                types=[PHASE_CHANGED],
                limit=256,
                timeout_s=FLUSH_S if end > self.saved else None,
            )
            if not events:
                # No PhaseChanged in (position, end]: pass over those events
                # (once the outcomes of the events before are recorded).
                self.position = max(self.position, end)
                await self._drained.wait()
                if self.position > self.saved:
                    await self.store.save_checkpoint(Checkpoint(name, self.position))
                    self.saved = self.position
                continue
            for event in events:
                target = await self._target(event)
                if target is not None:
                    spec, run, cwd = target
                    await self._deliver(spec, event, run, cwd, resume=resume)
                    resume = False
                self.position = event.seq
            # While phase changes keep coming, a hook that wants none of them
            # still moves its checkpoint now and then.
            if self.position > self.saved and time.monotonic() - saved_at > _FLUSH_EVERY_S:
                await self._drained.wait()
                await self.store.save_checkpoint(Checkpoint(name, self.position))
                self.saved = max(self.saved, self.position)
                saved_at = time.monotonic()

    # -- what to deliver ------------------------------------------------------

    async def _submitted_data(self, run_id: str) -> dict[str, Any]:
        data = self._submitted.get(run_id)
        if data is None:
            first = await self.store.read_all(0, limit=1, run_id=run_id)
            data = first[0].data if first else {}
            self._submitted[run_id] = data
            if len(self._submitted) > _SUBMITTED_CACHE:
                self._submitted.popitem(last=False)
        return data

    async def _run_object(self, run_id: str) -> dict[str, Any] | None:
        status = await self.store.get_run(run_id)
        if status is None:
            return None
        return run_object(status.to_json(), await self._submitted_data(run_id))

    async def _target(self, event: RecordedEvent) -> tuple[HookSpec, dict[str, Any], str | None] | None:
        """(the hook to run, the run object, the working folder) for an
        event this hook wants, else None."""
        if not is_candidate(self.spec, event):
            return None
        if self.on_done:
            submitted = await self._submitted_data(event.run_id)
            argv = submitted.get("on_done")
            if not isinstance(argv, list) or not argv or not all(isinstance(w, str) and w for w in argv):
                return None
            run = await self._run_object(event.run_id)
            if run is None:
                return None
            cwd = submitted.get("cwd")
            return on_done_spec(argv), run, cwd if isinstance(cwd, str) else None
        run = await self._run_object(event.run_id)
        if run is None or not matches(self.spec, event, run):
            return None
        return self.spec, run, None

    # -- delivering one event -------------------------------------------------

    async def _prior_attempts(self, event: RecordedEvent) -> int:
        """Attempts at ``event`` recorded before a restart."""
        stream = await self.store.read_stream(event.run_id, from_version=event.version + 1)
        return sum(
            1
            for e in stream
            if e.type == HOOK_FAILED and e.data.get("hook") == self.spec.name and e.data.get("event_seq") == event.seq
        )

    async def _attempt(
        self, spec: HookSpec, event: RecordedEvent, run: Mapping[str, Any], cwd: str | None, body: bytes
    ) -> Attempt:
        if spec.command is not None:
            fields = {**run, **{k: event.data.get(k) for k in ("phase", "reason", "exit_code")}}
            after = await self.store.tail_line_no(event.run_id, STDIN_LINES)
            try:
                lines = await self.store.log_lines(event.run_id, after, STDIN_LINES)
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
        assert spec.webhook is not None and self.http is not None
        secret_env = spec.webhook.secret_env
        secret = self.env.get(secret_env, "").encode() if secret_env else None
        return await post_event(self.http, spec.webhook, body, event.seq, secret or None, self.user_agent)

    async def _deliver(
        self, spec: HookSpec, event: RecordedEvent, run: Mapping[str, Any], cwd: str | None, *, resume: bool
    ) -> None:
        attempt_no = 1 + (await self._prior_attempts(event) if resume else 0)
        retry_for_s = spec.webhook.retry_for_s if spec.webhook is not None else 0.0
        body = json.dumps({"event": event.to_json(), "run": run}, ensure_ascii=False, separators=(",", ":")).encode()
        first_at = time.monotonic()
        self.delivering = event.seq
        try:
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
                await self._record(event, HOOK_DELIVERED if result.ok else HOOK_FAILED, data, final=final)
                log.info(
                    "hook.delivered" if result.ok else "hook.failed_attempt",
                    hook=spec.name, run=event.run_id, event_seq=event.seq, attempt=attempt_no, error=error,
                )  # fmt: skip
                if final:
                    return
                await anyio.sleep(delay)
                attempt_no += 1
        finally:
            self.delivering = None

    async def _record(self, event: RecordedEvent, etype: str, data: dict[str, Any], *, final: bool) -> None:
        """Hand the outcome to the recorder (waits while :data:`_OUTBOX`
        outcomes are pending)."""
        assert self._outbox is not None
        self._pending += 1
        self._drained = anyio.Event() if self._drained.is_set() else self._drained
        self.last_outcome = {"type": etype, **data}
        await self._outbox.send(_Outcome(event, etype, data, final))

    async def _recorder(self, receive: MemoryObjectReceiveStream[_Outcome]) -> None:
        """Append the outcomes in the order they were handed over: all those
        waiting at once, concurrently (they share the store's transactions);
        the next group after the last one is recorded."""
        async with receive:
            async for first in receive:
                group = [first]
                while True:
                    try:
                        group.append(receive.receive_nowait())
                    except anyio.WouldBlock:
                        break
                async with anyio.create_task_group() as tg:
                    for outcome in group:
                        tg.start_soon(self._append_outcome, outcome)
                self._pending -= len(group)
                if self._pending == 0:
                    self._drained.set()

    async def _append_outcome(self, outcome: _Outcome) -> None:
        """Append one outcome to the run's stream; a final one moves the
        checkpoint to its event in the same transaction. A store failure
        (disk full, lock) is retried: the attempt happened and must be
        recorded."""
        event = outcome.event
        checkpoint = Checkpoint(self.spec.checkpoint_name, event.seq) if outcome.final else None
        pause = 1.0
        while True:
            try:
                await self.store.append(
                    event.run_id, None, [NewEvent(outcome.type, outcome.data)], checkpoint=checkpoint
                )
                break
            except StoreClosedError:
                raise
            except StoreError as err:
                log.error(
                    "hook.record_failed", hook=self.spec.name, event_seq=event.seq, error=str(err), retry_in_s=pause
                )
                await anyio.sleep(pause)
                pause = min(pause * 2, 30.0)
        if outcome.final:
            self.saved = max(self.saved, event.seq)


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
        self.runners = [HookRunner(spec, store, env=base, user_agent=user_agent) for spec in hooks]
        self.runners.append(HookRunner(stand_in, store, env=base, on_done=True, user_agent=user_agent))

    async def run(self) -> None:
        """Run every hook until cancelled (or the store closes). The HTTP
        client (and its TLS context) is made only when a webhook is configured."""
        async with contextlib.AsyncExitStack() as stack:
            http = None
            if any(runner.spec.webhook is not None for runner in self.runners):
                http = await stack.enter_async_context(httpx.AsyncClient(follow_redirects=False))
            tg = await stack.enter_async_context(anyio.create_task_group())
            for runner in self.runners:
                runner.http = http
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
