"""`submit --after-failed RUN`: the policy starts the run only once RUN
ended ERROR; any other end cancels it (DependencyFailed), transitively."""

from __future__ import annotations

import pytest

from supervisord.daemon.scheduler.policy import DEPENDENCY_FAILED, WAITING_FOR_DEPENDENCY, Situation, Waiting, decide
from supervisord.shared.exceptions import TaskError
from supervisord.shared.scheduling import parse_scheduling, scheduling_of

DEP = "aaaaaaaaaaaa"


def _decide(phase: str, *more: Waiting) -> tuple[list[str], dict[str, str], list[str]]:
    w = Waiting(run_id="bbbbbbbbbbbb", order=2, after_failed=(DEP,))
    d = decide(Situation([w, *more], [], [], {}, {DEP: phase}, 0.0))
    return [a.run_id for a in d.admit], {k: p.reason for k, p in d.pending.items()}, [f.run_id for f in d.fail]


def test_waits_while_the_dependency_runs_and_starts_when_it_failed() -> None:
    assert _decide("RUNNING") == ([], {"bbbbbbbbbbbb": WAITING_FOR_DEPENDENCY}, [])
    assert _decide("ERROR") == (["bbbbbbbbbbbb"], {}, [])


@pytest.mark.parametrize("phase", ["COMPLETED", "CANCELED", "DELETED"])
def test_any_other_end_cancels_it_and_its_dependents(phase: str) -> None:
    child = Waiting(run_id="cccccccccccc", order=3, after=("bbbbbbbbbbbb",))
    admitted, pending, failed = _decide(phase, child)
    assert admitted == [] and pending == {} and failed == ["bbbbbbbbbbbb", "cccccccccccc"]
    d = decide(Situation([Waiting("bbbbbbbbbbbb", 2, after_failed=(DEP,))], [], [], {}, {DEP: phase}, 0.0))
    assert f"ended {phase}, not ERROR" in d.fail[0].message and DEPENDENCY_FAILED == "DependencyFailed"


def test_options_record_after_failed_only_when_given() -> None:
    assert "after_failed" not in parse_scheduling({})
    assert parse_scheduling({"after_failed": ["ABCD"]})["after_failed"] == ["abcd"]
    assert scheduling_of({})["after_failed"] == []
    with pytest.raises(TaskError, match="--after-failed"):
        parse_scheduling({"after_failed": "not an id!"})
    with pytest.raises(TaskError, match="--after-failed abcd: also given with --after"):
        parse_scheduling({"after": ["abcd"], "after_failed": ["abcd"]})
