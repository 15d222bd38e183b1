"""The run lifecycle's rules (supervisord.shared.lifecycle), table-driven, and the
event-type catalog's entries (supervisord.shared.events; the catalog against the
code and the schemas: test_event_catalog.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from store.types import PHASES, PROJECTED_TYPES, TERMINAL_PHASES
from supervisord.shared.events import CATALOG
from supervisord.shared.lifecycle import ACTIVE_PHASES, RunPhase, Verdict, decide, reached
from supervisord.shared.wire import WAIT_EXIT_CODES

ROOT = Path(__file__).resolve().parents[2]

R, FINAL, BACK, SAME, CANCEL = (
    Verdict.RECORD,
    Verdict.TERMINAL_IS_FINAL,
    Verdict.BACKWARDS,
    Verdict.UNCHANGED,
    Verdict.CANCEL_OWNS_OUTCOME,
)

# (current phase, cancel requested, proposed phase, by the cancel itself, verdict)
TABLE = [
    ("QUEUED", False, "SCHEDULING", False, R),
    ("QUEUED", False, "RUNNING", False, R),  # skipping phases is fine
    ("STAGING", False, "RUNNING", False, R),
    ("RUNNING", False, "COMPLETED", False, R),
    ("RUNNING", False, "ERROR", False, R),
    ("QUEUED", False, "ERROR", False, R),
    ("RUNNING", False, "STAGING", False, BACK),
    ("STAGING", False, "SCHEDULING", False, BACK),
    ("SCHEDULING", False, "QUEUED", False, BACK),
    ("COMPLETED", False, "ERROR", False, FINAL),
    ("ERROR", False, "COMPLETED", False, FINAL),
    ("CANCELED", False, "RUNNING", False, FINAL),
    ("DELETED", False, "CANCELED", True, FINAL),  # not even a cancel reopens a terminal run
    # An exit 0 is never the cancel's doing: the run finished first and keeps it.
    ("RUNNING", True, "COMPLETED", False, R),
    ("RUNNING", True, "ERROR", False, CANCEL),
    ("RUNNING", True, "CANCELED", True, R),
    ("STAGING", True, "RUNNING", False, R),  # a cancel only owns the terminal outcome
]


@pytest.mark.parametrize(("now", "cancel", "phase", "by_cancel", "verdict"), TABLE)
def test_rules(now: str, cancel: bool, phase: str, by_cancel: bool, verdict: Verdict) -> None:
    d = decide(RunPhase(now, cancel_requested=cancel), phase, by_cancel=by_cancel)
    assert d.verdict is verdict and d.record == (verdict is R)


@pytest.mark.parametrize("phase", ["ERROR", "CANCELED", "COMPLETED"])
def test_a_final_outcome_is_kept_through_a_cancel(phase: str) -> None:
    # The runner's final status (or a Job's terminal condition) settled the
    # outcome before the cancel reached the run (W13).
    canceling = RunPhase("RUNNING", cancel_requested=True)
    assert decide(canceling, phase, reason="NonZeroExit", final=True).record
    if phase != "COMPLETED":
        assert decide(canceling, phase, reason="Lost").verdict is Verdict.CANCEL_OWNS_OUTCOME


def test_same_phase_records_only_a_new_reason_or_message() -> None:
    now = RunPhase("SCHEDULING", reason="Unschedulable", message="0/3 nodes")
    assert decide(now, "SCHEDULING", reason="Unschedulable", message="0/3 nodes").verdict is SAME
    assert decide(now, "SCHEDULING", reason="Unschedulable", message="0/4 nodes").record
    assert decide(now, "SCHEDULING").record


def test_unknown_phase_is_refused() -> None:
    with pytest.raises(KeyError):
        decide(RunPhase("RUNNING"), "DONE")


@pytest.mark.parametrize(
    ("current", "target", "expected"),
    [
        ("QUEUED", "RUNNING", False),
        ("RUNNING", "STAGING", True),
        ("RUNNING", "RUNNING", True),
        ("ERROR", "RUNNING", True),
        ("ERROR", "COMPLETED", True),
        ("RUNNING", "CANCELED", False),
    ],
)
def test_reached(current: str, target: str, expected: bool) -> None:
    assert reached(current, target) is expected


def test_phases_are_defined_once_and_agree() -> None:
    assert ACTIVE_PHASES + tuple(p for p in PHASES if p in TERMINAL_PHASES) == PHASES
    assert set(WAIT_EXIT_CODES) == TERMINAL_PHASES
    # No other module spells out the phase list.
    pattern = re.compile(r'"QUEUED",\s*"SCHEDULING"')
    hits = [p for p in (ROOT / "supervisord").rglob("*.py") if pattern.search(p.read_text())]
    hits += [p for p in (ROOT / "store").rglob("*.py") if pattern.search(p.read_text()) and p.name != "types.py"]
    assert hits == []


def test_catalog_entries_are_documented() -> None:
    for entry in CATALOG.values():
        assert entry.writer, entry.name
        assert re.fullmatch(r"[A-Z][A-Za-z]+", entry.name)
    assert {"Submitted", "PhaseChanged", "HandleRecorded", "LogLines"} <= set(PROJECTED_TYPES)
    assert set(PROJECTED_TYPES) == {e.name for e in CATALOG.values() if e.projected}
