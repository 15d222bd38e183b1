"""The workstation scheduler's policy: a pure function from "who waits, who
holds what" to "who starts now, who ends, and why the others wait".

Nothing here does I/O or reads a clock: :func:`decide` gets a
:class:`Situation` (waiting runs, active runs with their GPUs and deadlines,
the machine's GPUs, queue caps, dependency phases, ``now``) and returns a
:class:`Decision`. The driver (:mod:`supervisord.daemon.scheduler.driver`) records
each decision as events and acts on it.

Rules (README.md, "Scheduling"):

* Start order: higher ``priority`` first, then oldest (submit order).
* A run waits, with the first reason that applies: ``Held``;
  ``WaitingForDependency`` (an ``after`` run not yet COMPLETED or an
  ``after_any`` run not yet terminal, an ``after_failed`` run not yet
  terminal; a dependency that is itself held says ``(held)``);
  ``WaitingForSlot`` (its queue already runs ``max_parallel`` runs);
  ``WaitingForMemory`` / ``WaitingForCPUs`` (its ``--memory`` /
  ``--cpus`` is more than the machine's capacity left unclaimed by admitted
  runs: ``scheduler.memory`` / ``scheduler.cpus``; first fit, no
  reservation); ``WaitingForGPUs``.
* ``after`` a run that ended other than COMPLETED: the run ends CANCELED,
  reason ``DependencyFailed``; so, transitively and in the same pass, do the
  runs that depend on it. ``after_failed`` (``submit --after-failed``) is
  the mirror: the run starts only if that run ended ERROR, and ends
  CANCELED ``DependencyFailed`` when it ended any other way.
* Backfill without starvation, EASY backfilling (D. Lifka, "The ANL/IBM SP
  scheduling system", JSSPP 1995; A. Mu'alem and D. Feitelson, IEEE TPDS
  12(6), 2001). The first run in start order that cannot get its GPUs is the
  *head*. It reserves the GPUs that will be free at its *shadow time*: the
  moment enough GPUs are free for it if every GPU holder ran to its deadline
  (admission time + timeout + :data:`DEADLINE_SLACK_S`; jobsup enforces
  timeouts, so deadlines are real upper bounds). A run behind the head may
  start now on free GPUs only if it is sure to end before the shadow time
  (its own timeout) or uses only GPUs the head will not need then (the
  *extra* GPUs). So a 4-GPU run behind a stream of 1-GPU runs starts no
  later than its shadow time, while short runs still fill idle GPUs. Runs
  that ask for no GPU are never held back by the head. Runs behind the head
  that cannot start get a message that does not change while they wait
  (it names no run and no time), so 1,000 waiting runs do not each get a new
  event whenever a GPU changes hands; the live details of the reservation
  (which GPUs, from when, the longest timeout that could start now) are
  :attr:`Decision.reservation`, which ``jobsup queue`` and the page show.
* GPUs are whole and exclusive; a run gets the free GPUs with the lowest
  indices.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Mapping, Sequence

__all__ = [
    "DEADLINE_SLACK_S",
    "DEPENDENCY_FAILED",
    "HELD",
    "TERMINAL",
    "WAITING_FOR_CPUS",
    "WAITING_FOR_DEPENDENCY",
    "WAITING_FOR_GPUS",
    "WAITING_FOR_MEMORY",
    "WAITING_FOR_SLOT",
    "Active",
    "Admission",
    "Decision",
    "Failure",
    "Gpu",
    "Pending",
    "Reservation",
    "Situation",
    "Waiting",
    "decide",
    "find_cycle",
    "start_order",
]

#: Seconds added to ``admitted_at + timeout`` for a run's deadline: the
#: runner's start, the kill grace after a timeout, the last log drain.
DEADLINE_SLACK_S = 60.0
TERMINAL = frozenset({"COMPLETED", "ERROR", "CANCELED", "DELETED"})

HELD = "Held"
WAITING_FOR_DEPENDENCY = "WaitingForDependency"
WAITING_FOR_SLOT = "WaitingForSlot"
WAITING_FOR_GPUS = "WaitingForGPUs"
WAITING_FOR_MEMORY = "WaitingForMemory"
WAITING_FOR_CPUS = "WaitingForCPUs"
DEPENDENCY_FAILED = "DependencyFailed"


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of the machine: ``index`` (nvidia-smi's), ``uuid`` (what
    ``CUDA_VISIBLE_DEVICES`` gets; the index as text when unknown), ``name``
    and ``memory`` as nvidia-smi prints them (may be empty)."""

    index: int
    uuid: str
    name: str = ""
    memory: str = ""

    def to_json(self) -> dict[str, object]:
        """``{"index", "uuid", "name", "memory"}``."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class Waiting:
    """A run in QUEUED that has not been admitted.

    ``order``: its Submitted event's seq (smaller = older). ``priority``:
    -1000..1000. ``gpus``: whole GPUs it needs (0 = none). ``after`` /
    ``after_any``: full run ids. ``timeout_s``: its wall-clock limit in
    seconds (> 0). ``memory_bytes`` / ``cpus``: what it claims of the
    machine (0: nothing).
    """

    run_id: str
    order: int
    priority: int = 0
    queue: str = "default"
    gpus: int = 0
    after: tuple[str, ...] = ()
    after_any: tuple[str, ...] = ()
    held: bool = False
    timeout_s: int = 4 * 3600
    #: Its sweep and that sweep's ``max_parallel`` (None: no sweep cap).
    sweep: str | None = None
    sweep_cap: int | None = None
    after_failed: tuple[str, ...] = ()
    memory_bytes: int = 0
    cpus: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Active:
    """An admitted run that is not terminal yet: it holds ``gpus`` (uuids)
    and one slot of ``queue`` until it ends by ``deadline`` (seconds since
    the epoch); it claims ``memory_bytes`` and ``cpus`` of the machine."""

    run_id: str
    queue: str
    gpus: tuple[str, ...]
    deadline: float
    memory_bytes: int = 0
    cpus: float = 0.0
    sweep: str | None = None


@dataclasses.dataclass(frozen=True)
class Situation:
    """Everything :func:`decide` looks at.

    ``phases``: the phase of every run some waiting run depends on (a
    dependency missing here counts as still QUEUED). ``caps``: queue name ->
    ``max_parallel`` (absent or None: no limit). ``now``: seconds since the
    epoch. ``memory`` (bytes) / ``cpus``: the machine's capacity that
    admitted runs' claims come out of (None: not counted).
    """

    waiting: Sequence[Waiting]
    active: Sequence[Active]
    gpus: Sequence[Gpu]
    caps: Mapping[str, int | None]
    phases: Mapping[str, str]
    now: float
    memory: int | None = None
    cpus: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Admission:
    """Start ``run_id`` now on ``gpus`` (lowest indices first) in a slot of
    ``queue``; ``in_queue`` counts the queue's started runs with this one."""

    run_id: str
    queue: str
    gpus: tuple[Gpu, ...]
    in_queue: int
    max_parallel: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """End ``run_id`` CANCELED with reason ``DependencyFailed`` and ``message``."""

    run_id: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Pending:
    """Why a run still waits: ``reason`` (one of the four) and ``message``."""

    reason: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Reservation:
    """The backfill reservation of one pass: the head ``run_id`` needs
    ``needs`` GPUs and gets ``gpus`` (indices: the free ones and those of
    the holders it waits for) by ``shadow`` (epoch seconds) at the latest;
    until then a run whose timeout is under ``backfill_s`` seconds could
    start now on a free GPU (``free``: how many; 0 when none is free)."""

    run_id: str
    needs: int
    gpus: tuple[int, ...]
    shadow: float
    backfill_s: float
    free: int
    #: The holders it waits for are past their deadlines: no time to name.
    overdue: bool = False

    def sentence(self, *, own: bool = False) -> str:
        """``GPUs 0-3 reserved for run X (needs 4) from about 14:05 UTC``
        (``own``: the head's own message, ``GPUs 0-3 reserved for it from
        about 14:05 UTC``): what does not change while the same runs hold
        the same GPUs (the QUEUED messages carry it, recorded only when it
        changes)."""
        whom = "it" if own else f"run {self.run_id} (needs {self.needs})"
        head = f"{_gpu_list(self.gpus)} reserved for {whom}"
        if self.overdue:
            return f"{head} from when their holders, past their timeouts, end"
        return f"{head} from about {time.strftime('%H:%M UTC', time.gmtime(self.shadow))}"

    def describe(self) -> str:
        """``GPUs 0-3 reserved for run X (needs 4) from about 14:05 UTC; a
        run with --timeout under 1h20m could start now`` (what ``jobsup
        queue`` shows: the second part changes as time passes)."""
        text = self.sentence()
        if self.free and self.backfill_s >= 60:
            text += f"; a run with --timeout under {_duration(self.backfill_s)} could start now"
        return text


def _gpu_list(indices: Sequence[int]) -> str:
    """``GPU 2``, ``GPUs 0-3``, ``GPUs 0, 2, 5``."""
    xs = sorted(indices)
    if len(xs) == 1:
        return f"GPU {xs[0]}"
    if xs and xs == list(range(xs[0], xs[-1] + 1)):
        return f"GPUs {xs[0]}-{xs[-1]}"
    return "GPUs " + ", ".join(str(x) for x in xs)


def _duration(seconds: float) -> str:
    """Whole minutes, down: ``45m``, ``1h20m``, ``3d2h``."""
    m = int(seconds // 60)
    if m < 60:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d{h}h" if h else f"{d}d"


def format_bytes(n: float) -> str:
    """``16G``, ``1.5G``, ``512M`` (binary units)."""
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f}".rstrip("0").rstrip(".") + unit
    return f"{int(n)}B"


@dataclasses.dataclass
class Decision:
    """What one pass decided. ``order``: every still-waiting run id in start
    order (what ``jobsup queue`` lists). ``reservation``: the backfill
    reservation, when a run waits for GPUs others hold."""

    admit: list[Admission] = dataclasses.field(default_factory=list)
    fail: list[Failure] = dataclasses.field(default_factory=list)
    pending: dict[str, Pending] = dataclasses.field(default_factory=dict)
    order: list[str] = dataclasses.field(default_factory=list)
    reservation: Reservation | None = None


def start_order(waiting: Sequence[Waiting]) -> list[Waiting]:
    """``waiting`` sorted by priority (highest first), then oldest first."""
    return sorted(waiting, key=lambda w: (-w.priority, w.order))


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A dependency cycle in ``edges`` (run id -> the ids it waits for), as
    the list of ids along it with the first repeated at the end, or None."""
    state: dict[str, int] = {}  # 1 = on the path, 2 = done
    for root in edges:
        if state.get(root):
            continue
        path: list[str] = []
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if i == 0:
                state[node] = 1
                path.append(node)
            nexts = list(edges.get(node, ()))
            if i < len(nexts):
                stack.append((node, i + 1))
                nxt = nexts[i]
                if state.get(nxt) == 1:
                    return [*path[path.index(nxt) :], nxt]
                if not state.get(nxt):
                    stack.append((nxt, 0))
            else:
                state[node] = 2
                path.pop()
    return None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _dependency_state(
    w: Waiting, phases: Mapping[str, str], held: frozenset[str] = frozenset()
) -> tuple[str | None, list[str]]:
    """(failure message or None, what it still waits for as "id (PHASE)",
    or "id (QUEUED, held)" for a dependency in ``held``)."""
    waits: list[str] = []
    for dep in w.after:
        phase = phases.get(dep, "QUEUED")
        if phase in TERMINAL:
            if phase != "COMPLETED":
                return f"run {dep}, which this run waits for with --after, ended {phase}", []
        else:
            waits.append(f"{dep} ({phase}, held)" if dep in held else f"{dep} ({phase})")
    for dep in w.after_any:
        phase = phases.get(dep, "QUEUED")
        if phase not in TERMINAL:
            waits.append(f"{dep} ({phase}, held)" if dep in held else f"{dep} ({phase})")
    for dep in w.after_failed:
        phase = phases.get(dep, "QUEUED")
        if phase in TERMINAL:
            if phase != "ERROR":
                return f"run {dep}, which this run waits for with --after-failed, ended {phase}, not ERROR", []
        else:
            waits.append(f"{dep} ({phase}, held)" if dep in held else f"{dep} ({phase})")
    return None, waits


def _failed_dependencies(s: Situation) -> tuple[dict[str, str], dict[str, str]]:
    """(run id -> failure message, the phases with those runs CANCELED):
    dependency failures, transitively: a run canceled in this pass fails
    its own dependents in the same pass."""
    phases = dict(s.phases)
    failed: dict[str, str] = {}
    with_deps = [w for w in s.waiting if w.after or w.after_any or w.after_failed]
    changed = bool(with_deps)
    while changed:
        changed = False
        for w in with_deps:
            if w.run_id in failed:
                continue
            message, _ = _dependency_state(w, phases)
            if message is not None:
                failed[w.run_id] = message
                phases[w.run_id] = "CANCELED"
                changed = True
    return failed, phases


class _Pass:
    """What one :func:`decide` pass has left to give as it goes down the
    start order (GPUs, queue and sweep slots, memory, CPUs), and the head's
    reservation once there is one."""

    def __init__(self, s: Situation, phases: Mapping[str, str], out: Decision) -> None:
        self.s, self.phases, self.out = s, phases, out
        self.by_index = {g.uuid: g for g in s.gpus}
        self.holder_of: dict[str, str] = {}
        for a in s.active:
            for uuid in a.gpus:
                self.holder_of[uuid] = a.run_id
        self.free = [g for g in sorted(s.gpus, key=lambda g: g.index) if g.uuid not in self.holder_of]
        self.total = len(s.gpus)
        self.running = Counter(a.queue for a in s.active)
        self.in_sweep = Counter(a.sweep for a in s.active if a.sweep is not None)
        # (deadline, GPUs held) of every holder, this pass's admissions included.
        self.holders: list[tuple[float, int]] = [(a.deadline, len(a.gpus)) for a in s.active if a.gpus]
        self.held = frozenset(w.run_id for w in s.waiting if w.held)
        self.deadline_of = {a.run_id: a.deadline for a in s.active}
        self.memory_left = None if s.memory is None else s.memory - sum(a.memory_bytes for a in s.active)
        self.cpus_left = None if s.cpus is None else s.cpus - sum(a.cpus for a in s.active)
        self.head: Waiting | None = None
        self.behind: dict[tuple[int, bool], Pending] = {}  # the stable messages of runs behind the head
        self.shadow = 0.0
        self.extra = 0

    def admit(self, w: Waiting, gpus: list[Gpu]) -> None:
        """Admit ``w`` on ``gpus``: count what it takes."""
        if self.memory_left is not None:
            self.memory_left -= w.memory_bytes
        if self.cpus_left is not None:
            self.cpus_left -= w.cpus
        self.running[w.queue] += 1
        if w.sweep is not None:
            self.in_sweep[w.sweep] += 1
        self.out.admit.append(
            Admission(w.run_id, w.queue, tuple(gpus), self.running[w.queue], self.s.caps.get(w.queue))
        )
        for g in gpus:
            self.holder_of[g.uuid] = w.run_id
        if gpus:
            deadline = self.s.now + w.timeout_s + DEADLINE_SLACK_S
            self.holders.append((deadline, len(gpus)))
            self.deadline_of[w.run_id] = deadline

    def _admit_on_free(self, w: Waiting) -> None:
        self.admit(w, self.free[: w.gpus])
        del self.free[: w.gpus]

    def blocker(self, w: Waiting) -> Pending | None:
        """Why ``w`` waits whatever the GPUs (the first reason that applies,
        in the module docstring's order), or None."""
        s = self.s
        if w.held:
            return Pending(HELD, f"held: `jobsup release {w.run_id}` lets it start")
        waits = _dependency_state(w, self.phases, self.held)[1] if (w.after or w.after_any or w.after_failed) else None
        if waits:
            return Pending(WAITING_FOR_DEPENDENCY, f"waits for run{'s' if len(waits) > 1 else ''} {', '.join(waits)}")
        cap = s.caps.get(w.queue)
        if cap is not None and self.running[w.queue] >= cap:
            return Pending(
                WAITING_FOR_SLOT, f"queue {w.queue!r} already runs {_plural(cap, 'run')} (max_parallel {cap})"
            )
        if w.sweep is not None and w.sweep_cap is not None and self.in_sweep[w.sweep] >= w.sweep_cap:
            return Pending(
                WAITING_FOR_SLOT,
                f"sweep {w.sweep} already runs {_plural(w.sweep_cap, 'run')} (max_parallel {w.sweep_cap})",
            )
        if w.memory_bytes and self.memory_left is not None and w.memory_bytes > self.memory_left:
            return Pending(
                WAITING_FOR_MEMORY,
                f"needs {format_bytes(w.memory_bytes)} of memory, {format_bytes(max(0, self.memory_left))} of "
                f"{format_bytes(s.memory or 0)} unclaimed (scheduler.memory)",
            )
        if w.cpus and self.cpus_left is not None and w.cpus > self.cpus_left + 1e-9:
            return Pending(
                WAITING_FOR_CPUS,
                f"needs {w.cpus:g} CPUs, {max(0.0, self.cpus_left):g} of {s.cpus or 0:g} unclaimed (scheduler.cpus)",
            )
        if w.gpus > self.total:  # (never true of a run that asks for no GPU)
            return Pending(WAITING_FOR_GPUS, f"needs {_plural(w.gpus, 'GPU')}, this machine has {self.total}")
        return None

    def place(self, w: Waiting) -> bool:
        """Admit ``w`` if its GPUs allow (True); else record why it waits:
        the first such run becomes the head and reserves GPUs."""
        if w.gpus == 0:
            self.admit(w, [])
            return True
        if self.head is None:
            if w.gpus <= len(self.free):
                self._admit_on_free(w)
                return True
            self._reserve_for(w)
            return False
        return self._backfill(w)

    def _reserve_for(self, w: Waiting) -> None:
        """Make ``w`` the head: its shadow time, the GPUs it is to get, the
        extra GPUs backfill may use, and its pending message."""
        s = self.s
        self.head = w
        # The shadow time: when enough GPUs are free for the head if
        # every holder runs to its deadline.
        avail = len(self.free)
        shadow = s.now
        reserved = [g.index for g in self.free]
        for deadline, n in sorted(self.holders):
            if avail >= w.gpus:
                break
            avail += n
            shadow = max(shadow, deadline)
        # The GPUs the head is to get: the free ones and those of the
        # holders that end by the shadow time.
        reserved += [
            self.by_index[u].index
            for u, rid in self.holder_of.items()
            if u in self.by_index and self.deadline_of.get(rid, float("inf")) <= shadow
        ]
        self.shadow = shadow
        self.extra = avail - w.gpus
        self.out.reservation = Reservation(
            w.run_id,
            w.gpus,
            tuple(sorted(set(reserved))),
            shadow,
            max(0.0, shadow - s.now - DEADLINE_SLACK_S),
            len(self.free),
            overdue=shadow <= s.now,
        )
        busy = sorted((self.by_index[u] for u in self.holder_of if u in self.by_index), key=lambda g: g.index)
        held_by = ", ".join(f"GPU {g.index} held by run {self.holder_of[g.uuid]}" for g in busy)
        self.out.pending[w.run_id] = Pending(
            WAITING_FOR_GPUS,
            f"needs {_plural(w.gpus, 'GPU')}, {len(self.free)} free: {held_by}; "
            f"{self.out.reservation.sentence(own=True)}",
        )

    def _backfill(self, w: Waiting) -> bool:
        """Behind the head: admit ``w`` only without delaying the head
        (True); else give it the stable message of its kind."""
        if w.gpus <= len(self.free):
            ends_before = self.s.now + w.timeout_s + DEADLINE_SLACK_S <= self.shadow
            if ends_before or w.gpus <= self.extra:
                if not ends_before:
                    self.extra -= w.gpus
                self._admit_on_free(w)
                return True
        denied = w.gpus <= len(self.free)  # it would fit now, but not without delaying the head
        deep = self.behind.get((w.gpus, denied))
        if deep is None:
            # The same text for every run alike and from pass to pass while
            # the reservation stands (no "time left" in it): a QUEUED message
            # is recorded only when it changes.
            sentence = self.out.reservation.sentence() if self.out.reservation is not None else None
            if denied:
                text = (
                    f"needs {_plural(w.gpus, 'GPU')}; {sentence}: only a run that ends before then may start on "
                    "the free ones (a shorter --timeout could let it start now; `jobsup queue` says how short)"
                )
            else:
                text = f"needs {_plural(w.gpus, 'GPU')}; runs before it in start order get GPUs first"
                if sentence is not None:
                    text += f" ({sentence})"
            deep = self.behind[(w.gpus, denied)] = Pending(WAITING_FOR_GPUS, text)
        self.out.pending[w.run_id] = deep
        return False


def decide(s: Situation) -> Decision:
    """One scheduling pass over ``s`` (see the module docstring for the rules).

    Every waiting run ends up in exactly one of ``admit``, ``fail`` or
    ``pending``. Never admits a run onto a GPU that an active run or another
    admission of the same pass holds.
    """
    out = Decision()
    failed, phases = _failed_dependencies(s)
    out.fail = [Failure(w.run_id, failed[w.run_id]) for w in s.waiting if w.run_id in failed]
    left = _Pass(s, phases, out)
    for w in start_order([w for w in s.waiting if w.run_id not in failed]):
        pending = left.blocker(w)
        if pending is not None:
            out.order.append(w.run_id)
            out.pending[w.run_id] = pending
        elif not left.place(w):
            out.order.append(w.run_id)
    return out
