"""Retries: a run's retry policy and its attempts (backend-neutral).

A run submitted with ``--retry N`` or ``retry: {attempts: N, on: [...],
backoff: DUR}`` (task file, config) records the policy in its Submitted
``scheduling.retry``::

    {"attempts": N,            # retries after the first attempt, 1..100
     "on": ["Lost", ...],      # failure reasons (or "exit:CODE") that retry
     "backoff_s": float}       # the first wait; doubled for each later one

When an attempt ends ERROR with a reason the policy lists (or with exit code
CODE for ``exit:CODE``, or any non-zero code for ``NonZeroExit``), and
retries are left, the supervisor records ``AttemptEnded`` and the run stays
RUNNING with reason :data:`RETRYING` until the next attempt starts
(``AttemptStarted``). Any backend fits: the supervisor starts attempt N
with a :class:`~supervisord.daemon.backends.base.RunSpec` whose ``attempt`` is N,
and the backend keeps what it creates for that attempt apart (the local
backend: folder ``<run dir>/a<N>``, log sources ``a<N>/...``; Kubernetes:
Job ``<name>-a<N>``; Slurm would submit a new ``sbatch`` job).

:func:`attempts_of` folds a run's events into the attempt list that
``show``, ``-o json`` and ``logs --attempt`` read.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from supervisord.shared.events import ATTEMPT_ENDED, ATTEMPT_STARTED
from supervisord.shared.exceptions import TaskError

__all__ = [
    "DEFAULT_BACKOFF_S",
    "DEFAULT_ON",
    "MAX_ATTEMPTS",
    "RETRYABLE_REASONS",
    "RETRYING",
    "RetryPolicy",
    "attempt_of_line",
    "attempts_of",
    "parse_retry",
    "policy_of",
]

#: The reason of a RUNNING run between two attempts.
RETRYING: Final = "Retrying"
#: What ``--retry N`` retries on: failures that say nothing about the job itself.
DEFAULT_ON: Final[tuple[str, ...]] = ("Lost", "Evicted", "Preempted", "NodeFailure", "OOMKilled")
#: The reasons ``on:`` may name (the failure reasons of README "Phases and reasons").
RETRYABLE_REASONS: Final[frozenset[str]] = frozenset(
    {
        *DEFAULT_ON,
        "NonZeroExit",
        "Signaled",
        "DeadlineExceeded",
        "StagingFailed",
        "StartTimeout",
        "StartFailed",
        "RunnerFailed",
        "BackendError",
        "InternalError",
        "ImagePullBackOff",
        "CreateContainerConfigError",
        "Unschedulable",
        "BackoffLimitExceeded",
        "CreateFailed",
        "DryRunFailed",
        "Error",
        "Unknown",
    }
)
#: The most retries a policy may ask for.
MAX_ATTEMPTS: Final = 100
#: The first wait between attempts when ``backoff`` is not given.
DEFAULT_BACKOFF_S: Final = 10.0
#: The longest wait between two attempts (the doubling stops there), and the longest ``backoff``.
MAX_BACKOFF_S: Final = 3600.0
_TERMINAL: Final = frozenset({"COMPLETED", "ERROR", "CANCELED", "DELETED"})
_EXIT = re.compile(r"^exit:([0-9]{1,3})$")
_BACKOFF = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """A run's retry policy: ``attempts`` retries at most (so ``attempts +
    1`` attempts in all), on the reasons / ``exit:CODE`` in ``on``, waiting
    ``backoff_s`` before the first retry and twice as long before each next
    one (at most :data:`MAX_BACKOFF_S`)."""

    attempts: int
    on: tuple[str, ...]
    backoff_s: float

    def retries(self, reason: str | None, exit_code: int | None) -> bool:
        """Whether an attempt that ended ERROR with ``reason`` and
        ``exit_code`` is one this policy retries (attempts left aside)."""
        if reason is not None and reason in self.on:
            return True
        if exit_code is not None and exit_code != 0:
            return f"exit:{exit_code}" in self.on
        return False

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after attempt ``attempt`` (1, 2, ...) ended before the next starts."""
        return float(min(self.backoff_s * (2 ** max(0, attempt - 1)), max(self.backoff_s, MAX_BACKOFF_S)))

    def to_json(self) -> dict[str, Any]:
        """The recorded form (Submitted ``scheduling.retry``)."""
        return {"attempts": self.attempts, "on": list(self.on), "backoff_s": self.backoff_s}


def _backoff_s(value: Any, label: str) -> float:
    if isinstance(value, bool):
        raise TaskError(f"{label}: must be a duration like 30s, 5m or 0s, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _BACKOFF.match(str(value))
        if not match:
            hint = "; a wait cannot be negative" if str(value).strip().startswith("-") else ""
            raise TaskError(f"{label}: {value!r} is not a duration; use e.g. 30s, 5m, 1h or 0s{hint}")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds < 0:
        raise TaskError(f"{label}: {value!r} must not be negative")
    if seconds > MAX_BACKOFF_S:
        raise TaskError(f"{label}: {value!r} is longer than the maximum of 1h")
    return seconds


def _attempts(value: Any, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TaskError(f"{label}: must be a whole number of retries in 1..{MAX_ATTEMPTS}, got {value!r}")
    if not 1 <= value <= MAX_ATTEMPTS:
        raise TaskError(f"{label}: must be in 1..{MAX_ATTEMPTS} (retries after the first attempt), got {value}")
    return value


def _on(value: Any, label: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{label}: must be a non-empty list of reasons (e.g. [Lost, OOMKilled]) or exit:CODE")
    out: list[str] = []
    for item in value:
        word = item.strip()
        match = _EXIT.match(word)
        if match is not None:
            code = int(match.group(1))
            if not 1 <= code <= 255:
                raise TaskError(f"{label}: {item!r}: an exit code to retry on is 1..255")
        elif word not in RETRYABLE_REASONS:
            raise TaskError(
                f"{label}: {item!r} is not a failure reason; use exit:CODE or one of "
                f"{', '.join(sorted(RETRYABLE_REASONS))}"
            )
        if word not in out:
            out.append(word)
    return tuple(out)


def parse_retry(value: Any, *, label: str = "retry") -> dict[str, Any]:
    """The recorded retry policy (:meth:`RetryPolicy.to_json`) from
    ``--retry N`` (an int: N retries on :data:`DEFAULT_ON`) or a ``retry:``
    mapping ``{attempts: N, on: [REASON | exit:CODE, ...], backoff: DUR}``
    (``backoff_s`` is accepted too: the recorded form, as ``rerun`` sends
    it). Raises TaskError naming ``label`` (``--retry``, or the file and
    key) and the sub-key at fault."""
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in ("attempts", "on", "backoff", "backoff_s"))
        if unknown:
            raise TaskError(f"{label}: unknown key(s) {', '.join(unknown)}; allowed: attempts, on, backoff")
        if "attempts" not in value:
            raise TaskError(f"{label}: needs `attempts` (how many times to retry, 1..{MAX_ATTEMPTS})")
        attempts = _attempts(value["attempts"], f"{label}.attempts")
        on = _on(value["on"], f"{label}.on") if value.get("on") is not None else DEFAULT_ON
        raw = value.get("backoff", value.get("backoff_s"))
        backoff = _backoff_s(raw, f"{label}.backoff") if raw is not None else DEFAULT_BACKOFF_S
        return RetryPolicy(attempts, on, backoff).to_json()
    return RetryPolicy(_attempts(value, label), DEFAULT_ON, DEFAULT_BACKOFF_S).to_json()


def policy_of(submitted: Mapping[str, Any]) -> RetryPolicy | None:
    """The retry policy a run recorded at submit (None: it has none)."""
    sched = submitted.get("scheduling")
    raw = sched.get("retry") if isinstance(sched, Mapping) else None
    if not isinstance(raw, Mapping) or not raw.get("attempts"):
        return None
    return RetryPolicy(
        int(raw["attempts"]),
        tuple(str(r) for r in raw.get("on") or DEFAULT_ON),
        float(raw.get("backoff_s") or 0.0),
    )


def attempts_of(events: Iterable[Any], run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A run's attempts from its ``AttemptEnded`` / ``AttemptStarted``
    events (``RecordedEvent``-like: ``type``, ``at``, ``data``, in order)
    and its run object ``run`` (``attempt``, ``phase``, ``reason``,
    ``exit_code``, ``started_at``, ``ended_at``, ``log_lines``), each
    ``{"attempt", "started_at", "ended_at", "reason", "exit_code",
    "message", "retry_in_s", "first_line", "last_line"}``: the last one's
    outcome is the run's (None while it runs). ``[]`` for a run that never
    retried (one attempt: the run itself says it all)."""
    out: list[dict[str, Any]] = []
    for e in events:
        data = e.data
        if e.type not in (ATTEMPT_ENDED, ATTEMPT_STARTED):
            continue
        n = int(data.get("attempt") or len(out) + 1)
        while len(out) < n:
            out.append(_attempt(len(out) + 1, out))
        if e.type == ATTEMPT_ENDED:
            out[n - 1].update(
                ended_at=e.at,
                reason=data.get("reason"),
                exit_code=data.get("exit_code"),
                retry_in_s=data.get("retry_in_s"),
                last_line=data.get("last_line"),
                message=data.get("message"),
            )
        else:
            out[n - 1]["started_at"] = e.at
    if not out:
        return []
    current = max(int(run.get("attempt") or 1), len(out))
    while len(out) < current:
        out.append(_attempt(len(out) + 1, out))
    if out[0]["started_at"] is None:
        out[0]["started_at"] = run.get("started_at")
    last = out[-1]
    if last["ended_at"] is None and run.get("phase") in _TERMINAL:
        last.update(
            ended_at=run.get("ended_at"),
            reason=run.get("reason"),
            exit_code=run.get("exit_code"),
            message=run.get("message"),
            last_line=run.get("log_lines"),
        )
    return out


def _attempt(n: int, before: Sequence[dict[str, Any]]) -> dict[str, Any]:
    prev = before[-1] if before else None
    first = int(prev["last_line"] or 0) + 1 if prev is not None and prev.get("last_line") is not None else 1
    return {
        "attempt": n,
        "started_at": None,
        "ended_at": None,
        "reason": None,
        "exit_code": None,
        "message": None,
        "retry_in_s": None,
        "first_line": first,
        "last_line": None,
    }


def attempt_of_line(attempts: Sequence[Mapping[str, Any]], line_no: int) -> int:
    """The attempt (1, 2, ...) that wrote log line ``line_no``, given
    :func:`attempts_of` (each ended attempt records its last line)."""
    for a in attempts:
        last = a.get("last_line")
        if last is None or line_no <= int(last):
            return int(a["attempt"])
    return len(attempts) + 1 if attempts else 1
