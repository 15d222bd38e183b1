"""The scheduler's driver: keeps the scheduling state as a projection of the
event log, runs :func:`~supervisord.daemon.scheduler.policy.decide` whenever a
commit changes it, and records and carries out each decision.

Events it reads (and what it records, on the run's own stream):

``Submitted``
    ``scheduling`` (see :mod:`supervisord.shared.scheduling`): a new waiting run.
``Held`` (data ``{}``) / ``HoldReleased`` (data ``{}``)
    ``jobsup hold`` / ``jobsup release`` (``submit --hold`` records
    ``scheduling.hold: true`` in Submitted instead).
``Admitted``
    ``{"queue": str, "in_queue": int, "max_parallel": int | None,
    "gpus": [{"index", "uuid", "name", "memory"}], "waited_s": float}``,
    recorded with a PhaseChanged SCHEDULING in one append: the run may start.
``ResourcesFreed``
    ``{"queue": str, "gpus": [uuid]}``: an admitted run reached a terminal
    phase, its GPUs and queue slot are free (recorded after that phase).
``RunUpdated``
    ``{"old": {...}, "new": {...}}`` (``jobsup update``, see
    :mod:`supervisord.daemon.scheduler.update`): a waiting run's priority, GPUs,
    queue, timeout, memory or CPUs changed; the next pass decides with the new values.
``QueueChanged`` (on the stream :data:`DAEMON_STREAM`, not a run's)
    ``{"queue", "max_parallel", "source", "old", "source_before"}``
    (``jobsup queue set``): a queue's cap set at runtime; it beats the
    daemon config's cap until set again (``source: config`` drops it).
``Resumed`` (``jobsup resume``)
    ``{"paused_s": float}``: an admitted run's deadline moves by its pause
    (a paused run keeps its GPUs and queue slot).
``PhaseChanged`` QUEUED
    ``reason`` Held | WaitingForDependency | WaitingForSlot | WaitingForGPUs
    and ``message``: recorded only when they change.
``PhaseChanged`` CANCELED, reason ``DependencyFailed``
    an ``after`` dependency ended other than COMPLETED.

Admission has one owner, this driver: it decides which run starts, builds
the ``Admitted`` event and hands it to the supervisor's gate
(:class:`RunGate`), which appends it under the run's lock and lets the run
go on. The supervisor never decides an admission, names the event or calls
the scheduler; requests reach the scheduler only through
:class:`supervisord.daemon.commands.Commands`.

Wake-ups: :meth:`EventStore.wait_for_events` on those types (no polling;
idle, the driver waits on a future). After ``kill -9`` the state is rebuilt
from the log (:meth:`Scheduler.load`): a non-terminal run with an
``Admitted`` event holds its GPUs; a run that ended holds nothing; a queued
run waits again with the order it had.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio
import structlog

from store import (
    TERMINAL_PHASES,
    ConcurrencyError,
    EventStore,
    RecordedEvent,
    RunStatus,
    StoreError,
)
from supervisord.daemon.crashpoints import crash_point
from supervisord.daemon.runprocs import live_run_ids
from supervisord.daemon.scheduler.gpus import Inventory, gpu_env
from supervisord.daemon.scheduler.policy import (
    DEADLINE_SLACK_S,
    DEPENDENCY_FAILED,
    Active,
    Decision,
    Gpu,
    Situation,
    Waiting,
    decide,
    find_cycle,
    format_bytes,
)
from supervisord.daemon.scheduler.update import LIMIT_FLAGS, RUN_UPDATED, changed_values
from supervisord.daemon.sweepread import expand_refs
from supervisord.shared.events import (
    ADMITTED,
    CONFIG_RELOADED,
    HOLD_RELEASED,
    PHASE_CHANGED,
    QUEUE_CHANGED,
    RESOURCES_FREED,
    RESUMED,
    SUBMITTED,
    AdmittedData,
    Event,
    QueueChangedData,
    RunUpdatedData,
)
from supervisord.shared.events import HELD as HELD_EVENT
from supervisord.shared.exceptions import (
    AmbiguousRunError,
    ConfigError,
    RunNotFoundError,
    TaskError,
    UsageError,
)
from supervisord.shared.limits import ENFORCE_SAMPLER, machine_cpus, machine_memory, parse_cpus, parse_memory
from supervisord.shared.scheduling import DEFAULT_QUEUE, QUEUE_NAME, scheduling_of

__all__ = [
    "ADMITTED",
    "DAEMON_STREAM",
    "HELD_EVENT",
    "HOLD_RELEASED",
    "RESOURCES_FREED",
    "Scheduler",
    "SchedulerSettings",
    "with_capacity",
]

log = structlog.get_logger("jobsup.scheduler")

_TYPES = (
    SUBMITTED,
    PHASE_CHANGED,
    ADMITTED,
    HELD_EVENT,
    HOLD_RELEASED,
    RUN_UPDATED,
    QUEUE_CHANGED,
    RESUMED,
    CONFIG_RELOADED,
)
#: The stream of the daemon's own events (``QueueChanged``): not a run's, so
#: no run row is ever made of it (a stream without Submitted has none).
DAEMON_STREAM = "daemon"
_RETRY_S = 1.0
#: While an ended run's processes keep its GPUs, how often to look again (seconds).
_LINGER_POLL_S = 0.5


@dataclasses.dataclass(frozen=True)
class SchedulerSettings:
    """The daemon config's ``scheduler`` section: queue caps (``queues.<Q>.
    max_parallel``; ``daemon.max_running`` is the ``default`` queue's cap
    when that queue sets none), ``cpu_runs_see_gpus``, and the capacity
    ``--memory`` / ``--cpus`` claims come out of (``scheduler.memory`` /
    ``scheduler.cpus``, default what the machine has); ``enforcement``: how
    limits are enforced (recorded in Admitted)."""

    caps: Mapping[str, int | None]
    cpu_runs_see_gpus: bool = False
    memory: int | None = None
    cpus: float | None = None
    enforcement: str = ENFORCE_SAMPLER

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> SchedulerSettings:
        """From the daemon's effective config document."""
        sched = data.get("scheduler") or {}
        caps: dict[str, int | None] = {}
        for name, q in (sched.get("queues") or {}).items():
            caps[str(name)] = (q or {}).get("max_parallel")
        max_running = (data.get("daemon") or {}).get("max_running")
        if caps.get(DEFAULT_QUEUE) is None and max_running is not None:
            caps[DEFAULT_QUEUE] = int(max_running)
        return cls(caps=caps, cpu_runs_see_gpus=bool(sched.get("cpu_runs_see_gpus")))


def with_capacity(settings: SchedulerSettings, data: Mapping[str, Any], *, enforcement: str) -> SchedulerSettings:
    """``settings`` with the capacity ``--memory``/``--cpus`` claims come out
    of (``scheduler.memory`` / ``scheduler.cpus`` from the daemon's config
    ``data``, default what the machine has) and the limits' ``enforcement``.
    Raises ConfigError naming the key for a value that is not a size or a
    number of CPUs."""
    sched = data.get("scheduler") or {}
    try:
        memory = parse_memory(sched["memory"], "scheduler.memory") if sched.get("memory") is not None else None
        cpus = parse_cpus(sched["cpus"], "scheduler.cpus") if sched.get("cpus") is not None else None
    except TaskError as err:
        raise ConfigError(str(err)) from None
    return dataclasses.replace(
        settings,
        memory=memory if memory is not None else machine_memory(),
        cpus=cpus if cpus is not None else float(machine_cpus()),
        enforcement=enforcement,
    )


@dataclasses.dataclass
class _Run:
    run_id: str
    order: int
    project: str
    name: str
    backend: str
    created_at: str
    timeout_s: int
    sched: dict[str, Any]
    held: bool
    phase: str = "QUEUED"
    reason: str | None = None
    message: str | None = None
    gpus: tuple[str, ...] = ()
    queue: str = DEFAULT_QUEUE
    admitted_at: str | None = None
    deadline: float = 0.0
    sweep: str | None = None  # its sweep's id, when the sweep has max_parallel
    sweep_cap: int | None = None
    cached: Waiting | None = None  # what decide() gets; rebuilt when ``held`` changes

    def current(self) -> dict[str, Any]:
        """The values ``jobsup update`` may change (supervisord.daemon.scheduler.update.UPDATABLE)."""
        return {
            "priority": int(self.sched["priority"]),
            "gpus": int(self.sched["gpus"]),
            "queue": self.queue,
            "timeout_s": self.timeout_s,
            "memory_bytes": self.sched.get("memory_bytes"),
            "cpus": self.sched.get("cpus"),
        }

    def fold_update(self, new: Mapping[str, Any]) -> bool:
        """Take a RunUpdated's ``new`` values; returns whether any differed."""
        before = self.current()
        for key in ("priority", "gpus"):
            if key in new:
                self.sched[key] = int(new[key])
        if "queue" in new:
            self.queue = self.sched["queue"] = str(new["queue"])
        if "timeout_s" in new:
            self.timeout_s = int(new["timeout_s"])
        if new.get("memory_bytes") is not None:
            self.sched["memory_bytes"] = int(new["memory_bytes"])
        if new.get("cpus") is not None:
            self.sched["cpus"] = float(new["cpus"])
        self.cached = None
        return self.current() != before

    def waiting(self) -> Waiting:
        if self.cached is None or self.cached.held != self.held:
            s = self.sched
            self.cached = Waiting(
                run_id=self.run_id,
                order=self.order,
                priority=int(s["priority"]),
                queue=self.queue,
                gpus=int(s["gpus"]),
                after=tuple(s["after"]),
                after_any=tuple(s["after_any"]),
                held=self.held,
                timeout_s=self.timeout_s,
                sweep=self.sweep,
                sweep_cap=self.sweep_cap,
                after_failed=tuple(s["after_failed"]),
                memory_bytes=int(s.get("memory_bytes") or 0),
                cpus=float(s.get("cpus") or 0.0),
            )
        return self.cached


def _sweep_cap(data: Mapping[str, Any]) -> dict[str, Any]:
    """``{"sweep", "sweep_cap"}`` of a sweep run whose sweep has a
    ``max_parallel`` (Submitted ``sweep_id``, ``sweep_max_parallel``), else {}."""
    cap = data.get("sweep_max_parallel")
    sweep = data.get("sweep_id")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 and isinstance(sweep, str):
        return {"sweep": sweep, "sweep_cap": cap}
    return {}


def _epoch(at: str) -> float:
    return dt.datetime.fromisoformat(at).timestamp()


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class RunGate(Protocol):
    """What the scheduler needs of the supervisor: the gate in front of each
    queued run's supervision. The scheduler owns admission (it decides, and
    builds the ``Admitted`` event); the gate appends what it is given under
    the run's lock and lets the run go on. Nothing else of the supervisor is
    the scheduler's business, and the supervisor never calls the scheduler."""

    async def resolve(self, ref: str) -> str:
        """The full run id for ``ref``; raises RunNotFoundError, AmbiguousRunError, UsageError."""

    async def get(self, run_id: str) -> RunStatus:
        """The run's status; raises RunNotFoundError."""

    def run_state(self, run_id: str) -> tuple[str, bool] | None:
        """``(phase, admitted)`` of a run the daemon supervises, else None."""

    async def admit(self, run_id: str, admitted: Event, extra_env: Mapping[str, str], message: str) -> bool:
        """Record ``admitted`` and PhaseChanged SCHEDULING (``message``) and
        let the run start with ``extra_env``; False when it no longer waits."""

    def resume_admitted(self, run_id: str, extra_env: Mapping[str, str]) -> None:
        """After a restart: let a run whose admission is recorded start."""

    def restore_admission_env(self, run_id: str, extra_env: Mapping[str, str]) -> None:
        """After a restart: what a started run's admission adds to its
        environment (its GPUs' variables), for its next attempts (supervisord.shared.retry)."""

    async def set_pending(self, run_id: str, reason: str, message: str) -> bool:
        """Record why a queued run waits; whether an event was recorded."""

    async def set_pending_many(self, pending: Sequence[tuple[str, str, str]]) -> int:
        """``set_pending`` for many ``(run id, reason, message)`` in one append; how many were recorded."""

    async def end_queued(self, run_id: str, reason: str, message: str) -> bool:
        """End a queued run CANCELED with ``reason``; False when it no longer waits."""

    async def update_queued(self, run_id: str, data: RunUpdatedData) -> bool:
        """Record RunUpdated on a waiting run; False when it no longer waits."""

    async def append_event(self, run_id: str, event: Event) -> None:
        """Append one event to a run's stream."""


class Scheduler:
    """Decides when each queued run starts and on which GPUs.

    Use: ``sched = Scheduler(store, supervisor, inventory, settings)``;
    ``await sched.load()`` after ``supervisor.reattach_all()`` and before
    serving; ``tg.start_soon(sched.run)`` for the daemon's life.
    """

    def __init__(
        self, store: EventStore, supervisor: RunGate, inventory: Inventory, settings: SchedulerSettings
    ) -> None:
        self.store = store
        self.supervisor = supervisor
        self.inventory = inventory
        self.settings = settings
        self._gpus = {g.uuid: g for g in inventory.gpus}
        self._waiting: dict[str, _Run] = {}
        self._active: dict[str, _Run] = {}
        self._dep_phase: dict[str, str] = {}
        self._to_free: list[_Run] = []
        self._lingering: set[str] = set()  # runs in _to_free already logged as lingering
        self._cursor = 0
        self._last = Decision()
        self._lock = anyio.Lock()
        self._dirty = True  # something may have changed since the last pass
        #: Queue caps set at runtime (``jobsup queue set``): they beat ``settings.caps``.
        self._runtime_caps: dict[str, int | None] = {}
        self._daemon_version = 0  # of DAEMON_STREAM
        self.passes = 0
        #: Lines about the GPUs for ``jobsup queue`` (the usage sampler's:
        #: a GPU busy with a process jobsup did not start); set by the daemon.
        self.gpu_notes: Callable[[], list[str]] | None = None
        #: GPU index -> (utilisation %, memory used bytes) now, from the usage sampler; set by the daemon.
        self.gpu_usage: Callable[[], Mapping[int, tuple[int | None, int | None]]] | None = None

    # -- state from the log -----------------------------------------------------

    def _new_run(self, event: RecordedEvent) -> _Run:
        data = event.data
        sched = scheduling_of(data)
        return _Run(
            run_id=event.run_id,
            order=event.seq,
            project=str(data.get("project") or ""),
            name=str(data.get("name") or ""),
            backend=str(data.get("backend") or ""),
            created_at=event.at,
            timeout_s=int(data.get("timeout_s") or 4 * 3600),
            sched=sched,
            held=bool(sched["hold"]),
            queue=str(sched["queue"]),
            # A Slurm sweep is one array job: Slurm keeps its max_parallel (%N).
            **(_sweep_cap(data) if data.get("backend") != "slurm" else {}),
        )

    def _admitted(self, run: _Run, at: str, data: Mapping[str, Any]) -> None:
        run.gpus = tuple(str(g.get("uuid")) for g in data.get("gpus") or [] if isinstance(g, Mapping))
        run.queue = str(data.get("queue") or run.queue)
        run.admitted_at = at
        run.deadline = _epoch(at) + run.timeout_s + DEADLINE_SLACK_S
        self._waiting.pop(run.run_id, None)
        self._active[run.run_id] = run

    async def _watch_deps(self, run: _Run) -> None:
        for dep in [*run.sched["after"], *run.sched["after_any"], *run.sched["after_failed"]]:
            if dep not in self._dep_phase:
                status = await self.store.get_run(dep)
                self._dep_phase[dep] = status.phase if status is not None else "QUEUED"

    async def load(self) -> None:
        """Rebuild the state from the log: every non-terminal run's
        Submitted, Admitted, Held and HoldReleased events. Admitted runs
        hold their GPUs again; one that was admitted but never handed to its
        backend is let start (with its GPUs)."""
        self._cursor = await self.store.last_seq()
        self._runtime_caps.clear()
        for e in await self.store.read_stream(DAEMON_STREAM):
            self._daemon_version = e.version
            if e.type == QUEUE_CHANGED:
                self._fold_queue_changed(e.data)
        live = list(reversed(await self.store.list_runs(non_terminal_only=True)))
        # Every live run's events in one query (not one per run: a restart with 500 runs).
        of_run = await self.store.run_events(
            [status.id for status in live], [SUBMITTED, ADMITTED, HELD_EVENT, HOLD_RELEASED, RUN_UPDATED]
        )
        for status in live:
            events = of_run.get(status.id) or []
            if not events or events[0].type != SUBMITTED:
                continue
            run = self._new_run(events[0])
            run.phase, run.reason, run.message = status.phase, status.reason, status.message
            self._waiting[run.run_id] = run
            admitted: RecordedEvent | None = None
            for e in events[1:]:
                if e.type == HELD_EVENT:
                    run.held = True
                elif e.type == HOLD_RELEASED:
                    run.held = False
                elif e.type == ADMITTED:
                    admitted = e
                elif e.type == RUN_UPDATED and admitted is None:
                    run.fold_update(e.data.get("new") or {})
            if admitted is not None:
                self._admitted(run, admitted.at, admitted.data)
                state = self.supervisor.run_state(run.run_id)
                env = self._env_for(run, [self._gpus[u] for u in run.gpus if u in self._gpus])
                if state is not None and not state[1]:
                    self.supervisor.resume_admitted(run.run_id, env)
                elif state is not None:  # started: a retried run's next attempts get them again
                    self.supervisor.restore_admission_env(run.run_id, env)
            else:
                await self._watch_deps(run)
        await self._load_lingering()
        log.info(
            "scheduler loaded", waiting=len(self._waiting), active=len(self._active), gpus=len(self.inventory.gpus)
        )

    async def _load_lingering(self) -> None:
        """Ended runs that held GPUs and of which a process still lives
        (e.g. a daemon killed before it could see them end) hold those GPUs
        again, until their processes are gone (:meth:`_release`)."""
        if not self._gpus:
            return
        for rid in await anyio.to_thread.run_sync(live_run_ids):
            if rid in self._active or rid in self._waiting:
                continue
            status = await self.store.get_run(rid)
            if status is None or not status.terminal:
                continue
            events = await self.store.read_all(0, limit=1_000_000, run_id=rid, types=[SUBMITTED, ADMITTED])
            admitted = [e for e in events if e.type == ADMITTED]
            if not events or events[0].type != SUBMITTED or not admitted or not admitted[-1].data.get("gpus"):
                continue
            run = self._new_run(events[0])
            run.phase = status.phase
            self._admitted(run, admitted[-1].at, admitted[-1].data)
            self._to_free.append(run)

    async def _apply(self, e: RecordedEvent) -> bool:
        """Fold one event into the state; returns whether it can change a
        decision (a new run, a run that ended, a hold or release, a
        dependency's phase), so the driver's own QUEUED reasons and the
        phases of started runs do not cost a pass."""
        rid = e.run_id
        if e.type == CONFIG_RELOADED:
            return True  # the settings changed (Daemon reload)
        if e.type == QUEUE_CHANGED:
            if rid == DAEMON_STREAM:
                self._daemon_version = max(self._daemon_version, e.version)
            return self._fold_queue_changed(e.data)
        if e.type == SUBMITTED:
            if rid in self._waiting or rid in self._active:
                return False
            new = self._new_run(e)
            self._waiting[rid] = new
            await self._watch_deps(new)
            return True
        run = self._waiting.get(rid) or self._active.get(rid)
        if e.type == PHASE_CHANGED:
            phase = str(e.data.get("phase"))
            relevant = False
            if rid in self._dep_phase and self._dep_phase[rid] != phase:
                self._dep_phase[rid] = phase
                relevant = True
            if run is None:
                return relevant
            run.phase = phase
            if phase == "QUEUED" and rid in self._waiting:
                run.reason, run.message = e.data.get("reason"), e.data.get("message")
            if phase in TERMINAL_PHASES:
                self._waiting.pop(rid, None)
                if rid in self._active and all(r.run_id != rid for r in self._to_free):
                    # Still holds its GPUs until _release sees none of its processes left.
                    self._to_free.append(run)
                return True
            return relevant
        if run is None:
            return False
        if e.type in (HELD_EVENT, HOLD_RELEASED):
            held = e.type == HELD_EVENT
            changed = run.held != held
            run.held = held
            return changed
        if e.type == RESUMED and rid in self._active:
            # Paused time does not count toward its timeout: its deadline moves.
            run.deadline += float(e.data.get("paused_s") or 0.0)
            return False
        if e.type == RUN_UPDATED and rid in self._waiting:
            return run.fold_update(e.data.get("new") or {})
        if e.type == ADMITTED and rid in self._waiting:
            self._admitted(run, e.at, e.data)
            return True
        return False

    # -- the loop -----------------------------------------------------------------

    async def run(self) -> None:
        """Pass once, then wait for commits of the scheduling event types
        and pass again after each batch; for the daemon's life."""
        stale = False
        while True:
            try:
                if stale:
                    await self._resync()
                    stale = False
                if self._dirty:
                    async with self._lock:
                        self._dirty = False
                        await self._pass()
                # While an ended run's processes hold its GPUs, look again
                # every _LINGER_POLL_S (else: no timeout, no polling).
                events = await self.store.wait_for_events(
                    self._cursor, types=_TYPES, limit=5000, timeout_s=_LINGER_POLL_S if self._to_free else None
                )
                self._dirty = self._dirty or bool(self._to_free)
                for e in events:
                    if await self._apply(e):
                        self._dirty = True
                if events:
                    self._cursor = events[-1].seq
            except* StoreError as group:
                # A storage hiccup never decides anything: try again shortly
                # (a decision whose append failed was not acted on).
                log.warning("scheduler pass failed; retrying", error=str(group.exceptions[0]))
                stale = self._dirty = True
            if stale:
                await anyio.sleep(_RETRY_S)

    async def _resync(self) -> None:
        """Rebuild the state from the log after a failed pass (its in-memory
        admissions may not have been recorded)."""
        self._waiting.clear()
        self._active.clear()
        self._dep_phase.clear()
        self._to_free = []
        await self.load()

    def _env_for(self, run: _Run, gpus: list[Gpu]) -> dict[str, str]:
        if run.backend != "local":
            return {}
        return dict(gpu_env(gpus, managed=bool(self._gpus), cpu_runs_see_gpus=self.settings.cpu_runs_see_gpus))

    def situation(self) -> Situation:
        """What :func:`decide` gets now."""
        waiting = [r.waiting() for r in self._waiting.values()]
        active = [
            Active(
                r.run_id,
                r.queue,
                r.gpus,
                r.deadline,
                int(r.sched.get("memory_bytes") or 0),
                float(r.sched.get("cpus") or 0.0),
                sweep=r.sweep,
            )
            for r in self._active.values()
        ]
        st = self.settings
        return Situation(
            waiting, active, self.inventory.gpus, self.caps(), self._dep_phase, time.time(), st.memory, st.cpus
        )

    # -- queue caps ---------------------------------------------------------------

    def caps(self) -> dict[str, int | None]:
        """Each queue's cap in force: the daemon config's, with those set at runtime over them."""
        return {**self.settings.caps, **self._runtime_caps}

    def cap_source(self, queue: str) -> str:
        """Where ``queue``'s cap comes from: ``runtime`` (``jobsup queue
        set``), ``config`` (the daemon config) or ``none`` (no cap)."""
        if queue in self._runtime_caps:
            return "runtime"
        return "config" if self.settings.caps.get(queue) is not None else "none"

    def _fold_queue_changed(self, data: Mapping[str, Any]) -> bool:
        """Take a QueueChanged; returns whether the cap in force changed."""
        queue = str(data.get("queue") or "")
        before = self.caps().get(queue)
        if data.get("source") == "config":
            self._runtime_caps.pop(queue, None)
        else:
            cap = data.get("max_parallel")
            self._runtime_caps[queue] = None if cap is None else int(cap)
        return self.caps().get(queue) != before

    async def set_cap(self, queue: str, max_parallel: int | None, *, from_config: bool = False) -> dict[str, Any]:
        """``jobsup queue set Q --max-parallel N|none|config``: record
        QueueChanged (on :data:`DAEMON_STREAM`) and decide again at once
        with the new cap; it outlives restarts and beats the daemon config
        until set again (``from_config``: drop the runtime cap, the config's
        is in force again). Returns ``{"queue": the queue's row as
        :meth:`view` shows it, "new": whether no config, run or earlier
        ``queue set`` named the queue}``. Raises TaskError naming
        ``--max-parallel`` or the queue name."""
        if not QUEUE_NAME.match(queue):
            raise TaskError(
                f"queue {queue!r}: not a queue name (1-63 letters, digits, '.', '_' or '-', starting with a letter or digit)"
            )
        if max_parallel is not None and (
            isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or not 1 <= max_parallel <= 100_000
        ):
            raise TaskError(f"--max-parallel: {max_parallel!r} is not a whole number 1..100000 (or none)")
        async with self._lock:
            new = queue not in self._queue_names()
            data: QueueChangedData = {
                "queue": queue,
                "max_parallel": self.settings.caps.get(queue) if from_config else max_parallel,
                "source": "config" if from_config else "runtime",
                "old": self.caps().get(queue),
                "source_before": self.cap_source(queue),
            }
            await self._append_daemon_event(QUEUE_CHANGED(data))
            if self._fold_queue_changed(data):
                self._dirty = True
        return {"queue": self._queue_row(queue), "new": new}

    async def _append_daemon_event(self, new: Event) -> None:
        event = [new]
        try:
            recorded = await self.store.append(DAEMON_STREAM, self._daemon_version, event)
        except ConcurrencyError:
            self._daemon_version = (await self.store.read_stream(DAEMON_STREAM))[-1].version
            recorded = await self.store.append(DAEMON_STREAM, self._daemon_version, event)
        self._daemon_version = recorded[-1].version

    async def record_daemon_event(self, event: Event) -> None:
        """Record an event of the daemon's own (ConfigReloaded) on
        :data:`DAEMON_STREAM` and decide again (the caller changed
        :attr:`settings` first)."""
        async with self._lock:
            await self._append_daemon_event(event)
            self._dirty = True

    def _queue_row(self, queue: str) -> dict[str, Any]:
        """One queue as :meth:`view` shows it."""
        return {
            "name": queue,
            "max_parallel": self.caps().get(queue),
            "source": self.cap_source(queue),
            "running": sum(1 for r in self._active.values() if r.queue == queue),
            "waiting": sum(1 for r in self._waiting.values() if r.queue == queue),
        }

    def _queue_names(self) -> set[str]:
        return {
            *self.settings.caps,
            *self._runtime_caps,
            DEFAULT_QUEUE,
            *(r.queue for r in self._active.values()),
            *(r.queue for r in self._waiting.values()),
        }

    async def _release(self) -> list[_Run]:
        """The ended runs whose GPUs and queue slots are free now: all of
        them but those with GPUs of which a process still lives (one that
        carries the run's id, ``JOBSUP_RUN_ID``): those stay in ``_active``
        (their GPUs held) and in ``_to_free`` until a later pass."""
        if not self._to_free:
            return []
        live = await anyio.to_thread.run_sync(live_run_ids) if any(r.gpus for r in self._to_free) else {}
        freed, keep = [], []
        for run in self._to_free:
            if run.gpus and run.run_id in live:
                if run.run_id not in self._lingering:
                    self._lingering.add(run.run_id)
                    log.warning(
                        "an ended run's processes still live: its GPUs stay held",
                        run=run.run_id,
                        pids=live[run.run_id],
                        gpus=list(run.gpus),
                    )
                keep.append(run)
                continue
            self._lingering.discard(run.run_id)
            self._active.pop(run.run_id, None)
            freed.append(run)
        self._to_free = keep
        return freed

    async def _pass(self) -> None:
        self.passes += 1
        freed = await self._release()
        decision = decide(self.situation())
        async with anyio.create_task_group() as tg:
            # Frees and admissions in one group commit.
            for run in freed:
                tg.start_soon(self._free, run)
            for f in decision.fail:
                tg.start_soon(self._fail, f.run_id, f.message)
            for a in decision.admit:
                run = self._waiting[a.run_id]
                # Taken now, so nothing else can be given these GPUs even if
                # the append is still committing.
                self._admitted(run, _now_rfc3339(), {"queue": a.queue, "gpus": [g.to_json() for g in a.gpus]})
                tg.start_soon(self._admit, run, a.queue, a.gpus, a.in_queue, a.max_parallel)
        changed: list[tuple[str, str, str]] = []
        for rid, p in decision.pending.items():
            w = self._waiting.get(rid)
            if w is not None and (w.reason, w.message) != (p.reason, p.message):
                w.reason, w.message = p.reason, p.message
                changed.append((rid, p.reason, p.message))
        if changed:  # one append for all (a sweep: 1,000 runs at once)
            await self.supervisor.set_pending_many(changed)
        self._last = decision

    async def _free(self, run: _Run) -> None:
        await self.supervisor.append_event(run.run_id, RESOURCES_FREED({"queue": run.queue, "gpus": list(run.gpus)}))
        crash_point("resources.freed")

    async def _fail(self, run_id: str, message: str) -> None:
        if await self.supervisor.end_queued(run_id, DEPENDENCY_FAILED, message):
            self._waiting.pop(run_id, None)
            if run_id in self._dep_phase:
                self._dep_phase[run_id] = "CANCELED"

    async def _admit(self, run: _Run, queue: str, gpus: tuple[Gpu, ...], in_queue: int, cap: int | None) -> None:
        waited = max(0.0, time.time() - _epoch(run.created_at))
        data: AdmittedData = {
            "queue": queue,
            "in_queue": in_queue,
            "max_parallel": cap,
            "gpus": [g.to_json() for g in gpus],
            "waited_s": round(waited, 3),
        }
        memory, cpus = run.sched.get("memory_bytes"), run.sched.get("cpus")
        if memory or cpus:
            data["limits"] = {"memory_bytes": memory, "cpus": cpus, "enforcement": self.settings.enforcement}
        where = f"GPU {', '.join(str(g.index) for g in gpus)}" if gpus else "no GPU"
        message = f"admitted in queue {queue!r} ({in_queue}{'/' + str(cap) if cap else ''} started) on {where}"
        admitted = ADMITTED(data)
        if not await self.supervisor.admit(run.run_id, admitted, self._env_for(run, list(gpus)), message):
            # Ended or canceled meanwhile: nothing was started on these GPUs,
            # which another run may get at once.
            self._active.pop(run.run_id, None)
            self._dirty = True
            log.info("admission dropped", run=run.run_id)

    # -- requests -----------------------------------------------------------------

    async def prepare(self, submitted: Mapping[str, Any]) -> dict[str, Any]:
        """Check a submit's scheduling against this daemon and return the
        Submitted data with dependency ids resolved to full ids. Raises
        TaskError naming the flag: more GPUs than the daemon has, an unknown
        or ambiguous run id, a dependency cycle. Records nothing."""
        out = dict(submitted)
        sched = scheduling_of(submitted)
        total = len(self.inventory.gpus)
        if sched["gpus"] > total:
            why = f" ({self.inventory.note})" if self.inventory.note else ""
            raise TaskError(
                f"--gpus: asks for {sched['gpus']} GPU{'s' if sched['gpus'] != 1 else ''}, "
                f"this machine has {total} for jobsup{why}"
            )
        for key, flag in (("after", "--after"), ("after_any", "--after-any"), ("after_failed", "--after-failed")):
            ids: list[str] = []
            for ref in sched[key]:
                try:
                    # A sweep id stands for all of its runs.
                    rids = await expand_refs(self.store, [ref], self.supervisor.resolve)
                except (RunNotFoundError, AmbiguousRunError, UsageError) as err:
                    raise TaskError(f"{flag} {ref}: {err}") from None
                ids.extend(rid for rid in rids if rid not in ids)
            sched[key] = ids
        sched["after_any"] = [r for r in sched["after_any"] if r not in sched["after"]]
        self._check_capacity(sched)
        if not sched["after_failed"]:
            del sched["after_failed"]  # recorded only when given
        edges = {
            r.run_id: [*r.sched["after"], *r.sched["after_any"], *r.sched["after_failed"]]
            for r in self._waiting.values()
        }
        edges["(new run)"] = [*sched["after"], *sched["after_any"], *sched.get("after_failed", [])]
        cycle = find_cycle(edges)
        if cycle is not None:
            raise TaskError(f"--after: the dependencies form a cycle: {' -> '.join(cycle)}")
        out["scheduling"] = sched
        return out

    def _check_capacity(self, limits: Mapping[str, Any]) -> None:
        """Raise TaskError naming ``--memory`` / ``--cpus`` when ``limits``
        (``memory_bytes``, ``cpus``; each optional) ask for more than this
        daemon has (``scheduler.memory`` / ``scheduler.cpus``)."""
        st = self.settings
        memory, cpus = limits.get("memory_bytes"), limits.get("cpus")
        if memory and st.memory is not None and memory > st.memory:
            raise TaskError(
                f"--memory: asks for {format_bytes(memory)}, this machine has "
                f"{format_bytes(st.memory)} for jobsup (scheduler.memory)"
            )
        if cpus and st.cpus is not None and cpus > st.cpus:
            raise TaskError(f"--cpus: asks for {cpus:g}, this machine has {st.cpus:g} for jobsup (scheduler.cpus)")

    async def hold(self, run_id: str) -> bool:
        """Hold a queued run (record ``Held``) and decide at once; a no-op
        for a held one. Returns whether it was not held before. Raises
        UsageError when the run is not waiting to start."""
        async with self._lock:
            run = self._waiting.get(run_id)
            if run is None:
                status = await self.supervisor.get(run_id)
                raise UsageError(f"run {run_id} is {status.phase}: only a queued run can be held")
            if not run.held:
                await self.supervisor.append_event(run_id, HELD_EVENT({}))
                crash_point("hold.recorded")
                run.held = True
                await self._pass_now()
                return True
            return False

    async def release(self, run_id: str) -> bool:
        """Release a held run (record ``HoldReleased``); a no-op for a queued
        run that is not held. Returns whether it was held. Raises UsageError
        when the run is not queued."""
        async with self._lock:
            run = self._waiting.get(run_id)
            if run is None:
                status = await self.supervisor.get(run_id)
                raise UsageError(f"run {run_id} is {status.phase}: only a queued run can be released")
            if run.held:
                await self.supervisor.append_event(run_id, HOLD_RELEASED({}))
                crash_point("release.recorded")
                run.held = False
                await self._pass_now()
                return True
            return False

    async def _pass_now(self) -> None:
        """Decide at once (the caller holds the lock), so that what a
        request answers is the state after its change (``hold`` answers
        QUEUED Held, not the reason from before)."""
        self._dirty = False
        try:
            await self._pass()
        except BaseException:
            self._dirty = True  # the loop tries again
            raise

    async def update(self, run_ids: list[str], changes: Mapping[str, Any]) -> dict[str, RunUpdatedData]:
        """Change queued runs (``changes``: what
        :func:`~supervisord.daemon.scheduler.update.parse_changes` returns) and
        return the RunUpdated data (``{"old", "new"}``) of each run that
        changed, by id (a run already at those values records nothing). All or nothing: every run is checked before any
        is touched, under the scheduler's lock, so none is admitted
        meanwhile. Raises UsageError naming each run that is not waiting to
        start (or, for ``--memory``/``--cpus``, is not a local run),
        TaskError for more GPUs, memory or CPUs than this daemon has;
        nothing is recorded then. The next pass (at once) decides with the new values."""
        total = len(self.inventory.gpus)
        if changes.get("gpus", 0) > total:
            why = f" ({self.inventory.note})" if self.inventory.note else ""
            n = changes["gpus"]
            raise TaskError(
                f"--gpus: asks for {n} GPU{'s' if n != 1 else ''}, this machine has {total} for jobsup{why}"
            )
        self._check_capacity(changes)
        async with self._lock:
            bad = []
            for rid in run_ids:
                if rid not in self._waiting:
                    status = await self.supervisor.get(rid)
                    bad.append(f"run {rid} is {status.phase}: only a queued run can be updated")
                elif self._waiting[rid].backend != "local":
                    flags = " and ".join(flag for key, flag in LIMIT_FLAGS.items() if key in changes)
                    if flags:
                        bad.append(
                            f"{flags}: run {rid} is a {self._waiting[rid].backend} run; only local runs take "
                            "limits from jobsup"
                        )
            if bad:
                raise UsageError("; ".join(bad) + ("; nothing was changed" if len(run_ids) > 1 else ""))
            changed: dict[str, RunUpdatedData] = {}
            for rid in run_ids:
                run = self._waiting[rid]
                data = changed_values(run.current(), changes)
                if data is None:
                    continue
                if await self.supervisor.update_queued(rid, data):
                    run.fold_update(data["new"])
                    changed[rid] = data
                    self._dirty = True
            return changed

    def doctor(self) -> dict[str, Any]:
        """The ``gpus`` check of ``jobsup doctor`` (always ok: no GPU is not an error)."""
        gpus = self.inventory.gpus
        if gpus:
            detail = (
                f"{len(gpus)} GPU(s) from {'nvidia-smi' if self.inventory.source == 'auto' else 'scheduler.gpus'}: "
                + ", ".join(f"{g.index} {g.name or g.uuid}".strip() for g in gpus)
            )
        else:
            detail = self.inventory.note or "no GPUs configured (scheduler.gpus is empty)"
        return {"name": "gpus", "ok": True, "detail": detail}

    def view(self) -> dict[str, Any]:
        """What ``jobsup queue`` shows: ``waiting`` (start order: id,
        project, name, queue, priority, gpus, after, after_any, held,
        reason, message, created_at), ``gpus`` (index, uuid, name, memory,
        holder: {id, project, name, since} or None, since), ``queues`` (name,
        max_parallel, source: runtime | config | none, running, waiting;
        ``default`` always), ``reservation`` (the backfill reservation:
        run_id, needs, gpus, from, backfill_timeout_s, message; None) and
        ``notes`` (e.g. a GPU busy with a process jobsup did not start)."""
        waiting = []
        order = [rid for rid in self._last.order if rid in self._waiting]
        order += sorted((r for r in self._waiting if r not in set(order)), key=lambda r: self._waiting[r].order)
        for pos, rid in enumerate(order, 1):
            r = self._waiting[rid]
            waiting.append(
                {
                    "position": pos,
                    "id": rid,
                    "project": r.project,
                    "name": r.name,
                    "queue": r.queue,
                    "priority": r.sched["priority"],
                    "gpus": r.sched["gpus"],
                    "after": r.sched["after"],
                    "after_any": r.sched["after_any"],
                    "held": r.held,
                    "reason": r.reason,
                    "message": r.message,
                    "created_at": r.created_at,
                }
            )
        holder: dict[str, _Run] = {u: r for r in self._active.values() for u in r.gpus}
        used = self.gpu_usage() if self.gpu_usage is not None else {}
        gpus = []
        for g in self.inventory.gpus:
            h = holder.get(g.uuid)
            util, mem = used.get(g.index, (None, None))
            gpus.append(
                {
                    **g.to_json(),
                    "utilization": util,
                    "memory_used_bytes": mem,
                    "holder": None
                    if h is None
                    else {"id": h.run_id, "project": h.project, "name": h.name, "since": h.admitted_at},
                    "since": None if h is None else h.admitted_at,
                }
            )
        queues = [self._queue_row(q) for q in sorted(self._queue_names())]
        res = self._last.reservation
        reservation = None
        if res is not None and res.run_id in self._waiting:
            reservation = {
                "run_id": res.run_id,
                "needs": res.needs,
                "gpus": list(res.gpus),
                "from": dt.datetime.fromtimestamp(res.shadow, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "backfill_timeout_s": round(res.backfill_s),
                "message": res.describe(),
            }
        notes = self.gpu_notes() if self.gpu_notes is not None else []
        return {"waiting": waiting, "gpus": gpus, "queues": queues, "reservation": reservation, "notes": notes}
