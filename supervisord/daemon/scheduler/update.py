"""``jobsup update RUN… [--priority P] [--gpus N] [--queue Q] [--timeout DUR]
[--memory M] [--cpus N]``:
what may change in a run that is still QUEUED, checked and recorded as a
``RunUpdated`` event on the run's stream::

    {"old": {key: value}, "new": {key: value}}

with the keys that changed among ``priority``, ``gpus``, ``queue``,
``memory_bytes``, ``cpus`` (the run's ``scheduling``) and ``timeout_s``. The Submitted event is never
rewritten: a run's effective task is its Submitted data with every
RunUpdated's ``new`` folded in, in order (:func:`apply_updates`).

``--memory`` and ``--cpus`` are limits of local runs only (the scheduler
refuses them for another backend's run, as submit does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from supervisord.shared.events import RUN_UPDATED, RunUpdatedData
from supervisord.shared.exceptions import TaskError, UsageError
from supervisord.shared.limits import parse_cpus, parse_memory
from supervisord.shared.scheduling import PRIORITY_MAX, PRIORITY_MIN, QUEUE_NAME
from supervisord.shared.task import MAX_TIMEOUT_S, parse_duration

__all__ = ["LIMIT_FLAGS", "RUN_UPDATED", "UPDATABLE", "apply_updates", "changed_values", "parse_changes"]

#: The keys ``update`` may change, in the order they are reported.
UPDATABLE: Final = ("priority", "gpus", "queue", "timeout_s", "memory_bytes", "cpus")
#: The flags of the keys that are limits (local runs only).
LIMIT_FLAGS: Final = {"memory_bytes": "--memory", "cpus": "--cpus"}
_FLAGS: Final = "--priority, --gpus, --queue, --timeout, --memory, --cpus"
_MAX_GPUS = 1024


def _whole(value: Any, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TaskError(f"{flag}: must be a whole number, got {value!r}")
    return value


def parse_changes(body: Mapping[str, Any]) -> dict[str, Any]:
    """The changes an update request asks for: ``{"priority": int,
    "gpus": int, "queue": str, "timeout": "30m" | seconds, "memory": "16G" |
    bytes, "cpus": number}`` (each may be absent or null) -> ``{key: value}``
    with the keys of :data:`UPDATABLE` (``timeout_s`` in whole seconds,
    ``memory_bytes`` in bytes). Raises TaskError naming the flag for a bad
    value and UsageError when nothing is asked (or an unknown key)."""
    unknown = sorted(set(body) - {"priority", "gpus", "queue", "timeout", "memory", "cpus"})
    if unknown:
        raise UsageError(
            f"update: unknown key(s) {', '.join(unknown)} (use priority, gpus, queue, timeout, memory, cpus)"
        )
    out: dict[str, Any] = {}
    if body.get("priority") is not None:
        priority = _whole(body["priority"], "--priority")
        if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            raise TaskError(f"--priority: must be in {PRIORITY_MIN}..{PRIORITY_MAX}, got {priority}")
        out["priority"] = priority
    if body.get("gpus") is not None:
        gpus = _whole(body["gpus"], "--gpus")
        if not 0 <= gpus <= _MAX_GPUS:
            raise TaskError(f"--gpus: must be 0..{_MAX_GPUS}, got {gpus}")
        out["gpus"] = gpus
    if body.get("queue") is not None:
        queue = body["queue"]
        if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
            raise TaskError(
                f"--queue: {queue!r} is not a queue name (1-63 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit)"
            )
        out["queue"] = queue
    if body.get("timeout") is not None:
        timeout = body["timeout"]
        if isinstance(timeout, int) and not isinstance(timeout, bool):
            if not 0 < timeout <= MAX_TIMEOUT_S:
                raise TaskError(f"--timeout: {timeout} must be 1..{MAX_TIMEOUT_S} seconds")
            out["timeout_s"] = timeout
        else:
            out["timeout_s"] = parse_duration(str(timeout), what="--timeout")
    if body.get("memory") is not None:
        out["memory_bytes"] = parse_memory(body["memory"])
    if body.get("cpus") is not None:
        out["cpus"] = parse_cpus(body["cpus"])
    if not out:
        raise UsageError(f"update: give at least one of {_FLAGS}")
    return out


def changed_values(current: Mapping[str, Any], changes: Mapping[str, Any]) -> RunUpdatedData | None:
    """The RunUpdated data for ``changes`` to a run whose values are
    ``current`` (keys of :data:`UPDATABLE`): ``{"old": {...}, "new": {...}}``
    with only the keys whose value differs; None when none does."""
    keys = [k for k in UPDATABLE if k in changes and current.get(k) != changes[k]]
    if not keys:
        return None
    return {"old": {k: current.get(k) for k in keys}, "new": {k: changes[k] for k in keys}}


def apply_updates(submitted: Mapping[str, Any], updates: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``submitted`` (a Submitted event's data) with the ``new`` values of
    each RunUpdated data in ``updates`` folded in, in order: ``timeout_s``
    at the top, the others in ``scheduling``. A copy; ``submitted`` is not
    changed."""
    out = dict(submitted)
    sched = dict(out.get("scheduling") or {})
    touched = False
    for data in updates:
        new = data.get("new") if isinstance(data, Mapping) else None
        if not isinstance(new, Mapping):
            continue
        for key, value in new.items():
            if key == "timeout_s":
                out["timeout_s"] = value
            elif key in UPDATABLE:
                sched[key] = value
                touched = True
    if touched:
        out["scheduling"] = sched
    return out
