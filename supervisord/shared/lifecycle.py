"""The run lifecycle as pure code: which phase changes a run accepts.

The phases and their order are defined once, in :mod:`store.types`
(:data:`PHASES`, :data:`TERMINAL_PHASES`, :data:`PHASE_RANK`), re-exported
here. This module holds the rules (README "Phases and reasons"):

1. a terminal phase is final: nothing changes a terminal run;
2. phases never go backwards (a lower rank is dropped);
3. while a cancel is in progress it owns the outcome: only the cancel itself
   records the terminal phase (so a cancel racing completion ends in exactly
   one terminal phase, CANCELED) -- except the run's own final word: its
   runner's final status (or a Kubernetes Job's terminal condition), which
   the backend reports as ``final``, and COMPLETED. That outcome was
   settled before the cancel reached the run (a runner that acted on the
   cancel says ``Canceled`` itself), so the run keeps it: phase, reason and
   exit code, however much output was still being recorded;
4. repeating the current phase with the same reason and message records
   nothing (a backend may report what it sees as often as it likes).

No I/O, no clock, no store: :func:`decide` takes the run's current
:class:`RunPhase` and a proposed change and returns a :class:`Decision`.
The supervisor applies it under the run's lock.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Final

from store.types import INITIAL_PHASE, PHASE_RANK, PHASES, TERMINAL_PHASES

__all__ = [
    "ACTIVE_PHASES",
    "INITIAL_PHASE",
    "PHASES",
    "PHASE_RANK",
    "TERMINAL_PHASES",
    "Decision",
    "RunPhase",
    "Verdict",
    "decide",
    "is_terminal",
    "reached",
]

#: The phases a run passes through before a terminal one, in order.
ACTIVE_PHASES: Final[tuple[str, ...]] = tuple(p for p in PHASES if p not in TERMINAL_PHASES)


def is_terminal(phase: str) -> bool:
    """Whether ``phase`` is terminal (COMPLETED, ERROR, CANCELED, DELETED)."""
    return phase in TERMINAL_PHASES


def reached(current: str, target: str) -> bool:
    """Whether a run at ``current`` has reached ``target`` (``wait --for
    PHASE``): at or past it, since phases never go backwards; for a terminal
    ``target``, any terminal phase counts (the exit code then tells which).
    Raises KeyError for an unknown phase."""
    if is_terminal(target):
        return is_terminal(current)
    return PHASE_RANK[current] >= PHASE_RANK[target]


@dataclasses.dataclass(frozen=True)
class RunPhase:
    """What the rules look at: the run's ``phase``, ``reason`` and
    ``message`` now, and whether a cancel is in progress."""

    phase: str
    reason: str | None = None
    message: str | None = None
    cancel_requested: bool = False


class Verdict(enum.Enum):
    """Why a proposed phase change is recorded or dropped."""

    RECORD = "record"
    TERMINAL_IS_FINAL = "the run is already terminal"
    BACKWARDS = "phases never go backwards"
    UNCHANGED = "same phase, reason and message"
    CANCEL_OWNS_OUTCOME = "a cancel is in progress and owns the terminal phase"


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of :func:`decide`: ``record`` is True when the change is
    to be recorded; ``verdict`` says why (for logs and tests)."""

    verdict: Verdict

    @property
    def record(self) -> bool:
        """True when the change is to be recorded."""
        return self.verdict is Verdict.RECORD


def decide(
    current: RunPhase,
    phase: str,
    *,
    reason: str | None = None,
    message: str | None = None,
    by_cancel: bool = False,
    final: bool = False,
) -> Decision:
    """Whether a run at ``current`` records a change to ``phase`` (with
    ``reason`` and ``message``); ``by_cancel``: the change is the cancel's
    own outcome; ``final``: it is the run's own final outcome as its
    backend observed it (rule 3). The rules, in the order they apply, are
    the module's.
    Raises KeyError for a phase not in :data:`PHASES`."""
    rank, now = PHASE_RANK[phase], PHASE_RANK[current.phase]
    if is_terminal(current.phase):
        return Decision(Verdict.TERMINAL_IS_FINAL)
    if rank < now:
        return Decision(Verdict.BACKWARDS)
    if phase == current.phase and (reason, message) == (current.reason, current.message):
        return Decision(Verdict.UNCHANGED)
    if is_terminal(phase) and current.cancel_requested and not (by_cancel or final) and phase != "COMPLETED":
        return Decision(Verdict.CANCEL_OWNS_OUTCOME)
    return Decision(Verdict.RECORD)
