"""The workstation scheduler's policy: a pure function from "who waits, who
holds what" to "who starts now, who ends, and why the others wait".

Nothing here does I/O or reads a clock: :func:`decide` gets a
:class:`Situation` (waiting runs, active runs with their GPUs and deadlines,
the machine's GPUs, queue caps, dependency phases, ``now``) and returns a
:class:`Decision`. The driver (:mod:`supervisord.scheduler.driver`) records
each decision as events and acts on it.

Rules (README.md, "Scheduling"):

* Start order: higher ``priority`` first, then oldest (submit order).
* A run waits, with the first reason that applies: ``Held``;
  ``WaitingForDependency`` (an ``after`` run not yet COMPLETED or an
  ``after_any`` run not yet terminal, an ``after_failed`` run not yet
  terminal); ``WaitingForSlot`` (its queue already
  runs ``max_parallel`` runs); ``WaitingForGPUs``.
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
  that cannot start get a message that does not change while they wait, so
  1,000 waiting runs do not each get a new event whenever a GPU changes hands.
* GPUs are whole and exclusive; a run gets the free GPUs with the lowest
  indices.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

__all__ = [
    "DEADLINE_SLACK_S",
    "DEPENDENCY_FAILED",
    "HELD",
    "TERMINAL",
    "WAITING_FOR_DEPENDENCY",
    "WAITING_FOR_GPUS",
    "WAITING_FOR_SLOT",
    "Active",
    "Admission",
    "Decision",
    "Failure",
    "Gpu",
    "Pending",
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
    seconds (> 0).
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


@dataclasses.dataclass(frozen=True, slots=True)
class Active:
    """An admitted run that is not terminal yet: it holds ``gpus`` (uuids)
    and one slot of ``queue`` until it ends by ``deadline`` (seconds since
    the epoch)."""

    run_id: str
    queue: str
    gpus: tuple[str, ...]
    deadline: float
    sweep: str | None = None


@dataclasses.dataclass(frozen=True)
class Situation:
    """Everything :func:`decide` looks at.

    ``phases``: the phase of every run some waiting run depends on (a
    dependency missing here counts as still QUEUED). ``caps``: queue name ->
    ``max_parallel`` (absent or None: no limit). ``now``: seconds since the
    epoch.
    """

    waiting: Sequence[Waiting]
    active: Sequence[Active]
    gpus: Sequence[Gpu]
    caps: Mapping[str, int | None]
    phases: Mapping[str, str]
    now: float


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


@dataclasses.dataclass
class Decision:
    """What one pass decided. ``order``: every still-waiting run id in start
    order (what ``jobsup queue`` lists)."""

    admit: list[Admission] = dataclasses.field(default_factory=list)
    fail: list[Failure] = dataclasses.field(default_factory=list)
    pending: dict[str, Pending] = dataclasses.field(default_factory=dict)
    order: list[str] = dataclasses.field(default_factory=list)


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
                    return path[path.index(nxt) :] + [nxt]
                if not state.get(nxt):
                    stack.append((nxt, 0))
            else:
                state[node] = 2
                path.pop()
    return None


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _dependency_state(w: Waiting, phases: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """(failure message or None, what it still waits for as "id (PHASE)")."""
    waits: list[str] = []
    for dep in w.after:
        phase = phases.get(dep, "QUEUED")
        if phase in TERMINAL:
            if phase != "COMPLETED":
                return f"run {dep}, which this run waits for with --after, ended {phase}", []
        else:
            waits.append(f"{dep} ({phase})")
    for dep in w.after_any:
        phase = phases.get(dep, "QUEUED")
        if phase not in TERMINAL:
            waits.append(f"{dep} ({phase})")
    for dep in w.after_failed:
        phase = phases.get(dep, "QUEUED")
        if phase in TERMINAL:
            if phase != "ERROR":
                return f"run {dep}, which this run waits for with --after-failed, ended {phase}, not ERROR", []
        else:
            waits.append(f"{dep} ({phase})")
    return None, waits


def decide(s: Situation) -> Decision:
    """One scheduling pass over ``s`` (see the module docstring for the rules).

    Every waiting run ends up in exactly one of ``admit``, ``fail`` or
    ``pending``. Never admits a run onto a GPU that an active run or another
    admission of the same pass holds.
    """
    out = Decision()
    phases = dict(s.phases)
    # Dependency failures, transitively: a run canceled in this pass fails its
    # own dependents in the same pass.
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
    out.fail = [Failure(w.run_id, failed[w.run_id]) for w in s.waiting if w.run_id in failed]

    by_index = {g.uuid: g for g in s.gpus}
    holder_of: dict[str, str] = {}
    for a in s.active:
        for uuid in a.gpus:
            holder_of[uuid] = a.run_id
    free = [g for g in sorted(s.gpus, key=lambda g: g.index) if g.uuid not in holder_of]
    total = len(s.gpus)
    running = Counter(a.queue for a in s.active)
    in_sweep = Counter(a.sweep for a in s.active if a.sweep is not None)
    # (deadline, GPUs held) of every holder, this pass's admissions included.
    holders: list[tuple[float, int]] = [(a.deadline, len(a.gpus)) for a in s.active if a.gpus]
    head: Waiting | None = None
    behind: dict[int, Pending] = {}  # the stable message of runs behind the head, by GPU count
    shadow = 0.0
    extra = 0

    def admit(w: Waiting, gpus: list[Gpu]) -> None:
        running[w.queue] += 1
        if w.sweep is not None:
            in_sweep[w.sweep] += 1
        out.admit.append(Admission(w.run_id, w.queue, tuple(gpus), running[w.queue], s.caps.get(w.queue)))
        for g in gpus:
            holder_of[g.uuid] = w.run_id
        if gpus:
            holders.append((s.now + w.timeout_s + DEADLINE_SLACK_S, len(gpus)))

    for w in start_order([w for w in s.waiting if w.run_id not in failed]):
        out.order.append(w.run_id)
        if w.held:
            out.pending[w.run_id] = Pending(HELD, f"held: `jobsup release {w.run_id}` lets it start")
            continue
        waits = _dependency_state(w, phases)[1] if (w.after or w.after_any or w.after_failed) else None
        if waits:
            out.pending[w.run_id] = Pending(
                WAITING_FOR_DEPENDENCY, f"waits for run{'s' if len(waits) > 1 else ''} {', '.join(waits)}"
            )
            continue
        cap = s.caps.get(w.queue)
        if cap is not None and running[w.queue] >= cap:
            out.pending[w.run_id] = Pending(
                WAITING_FOR_SLOT, f"queue {w.queue!r} already runs {_plural(cap, 'run')} (max_parallel {cap})"
            )
            continue
        if w.sweep is not None and w.sweep_cap is not None and in_sweep[w.sweep] >= w.sweep_cap:
            out.pending[w.run_id] = Pending(
                WAITING_FOR_SLOT,
                f"sweep {w.sweep} already runs {_plural(w.sweep_cap, 'run')} (max_parallel {w.sweep_cap})",
            )
            continue
        if w.gpus == 0:
            admit(w, [])
            out.order.pop()
            continue
        if w.gpus > total:
            out.pending[w.run_id] = Pending(
                WAITING_FOR_GPUS, f"needs {_plural(w.gpus, 'GPU')}, this machine has {total}"
            )
            continue
        if head is None:
            if w.gpus <= len(free):
                admit(w, free[: w.gpus])
                del free[: w.gpus]
                out.order.pop()
                continue
            head = w
            # The shadow time: when enough GPUs are free for the head if
            # every holder runs to its deadline.
            avail = len(free)
            shadow = s.now
            for deadline, n in sorted(holders):
                if avail >= w.gpus:
                    break
                avail += n
                shadow = max(shadow, deadline)
            extra = avail - w.gpus
            busy = sorted((by_index[u] for u in holder_of if u in by_index), key=lambda g: g.index)
            held_by = ", ".join(f"GPU {g.index} held by run {holder_of[g.uuid]}" for g in busy)
            out.pending[w.run_id] = Pending(
                WAITING_FOR_GPUS, f"needs {_plural(w.gpus, 'GPU')}, {len(free)} free: {held_by}"
            )
            continue
        # Behind the head: backfill only without delaying it.
        if w.gpus <= len(free):
            ends_before = s.now + w.timeout_s + DEADLINE_SLACK_S <= shadow
            if ends_before or w.gpus <= extra:
                if not ends_before:
                    extra -= w.gpus
                admit(w, free[: w.gpus])
                del free[: w.gpus]
                out.order.pop()
                continue
        deep = behind.get(w.gpus)
        if deep is None:
            deep = behind[w.gpus] = Pending(
                WAITING_FOR_GPUS, f"needs {_plural(w.gpus, 'GPU')}; runs before it in start order get GPUs first"
            )
        out.pending[w.run_id] = deep
    return out
