"""A run's scheduling options: what ``submit`` flags and task keys ask for,
checked and normalised into the ``scheduling`` mapping of the Submitted event.

``scheduling`` (recorded with every run)::

    {"gpus": int >= 0, "queue": str, "priority": -1000..1000,
     "after": [run id], "after_any": [run id], "hold": bool,
     "after_failed": [run id],                (only when given)
     "memory_bytes": int, "cpus": float,      (the last three only when given)
     "retry": {"attempts", "on", "backoff_s"}}  (supervisord.shared.retry)

The ids are full run ids once the daemon resolved them
(:meth:`supervisord.daemon.scheduler.driver.Scheduler.prepare`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from supervisord.shared.exceptions import TaskError
from supervisord.shared.limits import parse_cpus, parse_memory
from supervisord.shared.retry import parse_retry
from supervisord.shared.runref import is_run_ref, normalize_run_ref
from supervisord.shared.sweep import is_sweep_ref

__all__ = ["DEFAULT_QUEUE", "PRIORITY_MAX", "PRIORITY_MIN", "QUEUE_NAME", "parse_scheduling", "scheduling_of"]

PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
DEFAULT_QUEUE = "default"
#: A queue name: 1-63 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or digit.
QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_MAX_GPUS = 1024
_MAX_DEPS = 1000


def _int(value: Any, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TaskError(f"{flag}: must be a whole number, got {value!r}")
    return value


def _refs(value: Any, flag: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise TaskError(f"{flag}: must be a list of run ids")
    if len(value) > _MAX_DEPS:
        raise TaskError(f"{flag}: at most {_MAX_DEPS} runs")
    out: list[str] = []
    for v in value:
        ref = normalize_run_ref(v)
        if not is_run_ref(ref) and not is_sweep_ref(ref):
            raise TaskError(
                f"{flag}: {v!r} is not a run id (12 hex characters, or a unique prefix of 4+) nor a sweep id"
                " (s and 11 hex characters, or a unique prefix of 5+)"
            )
        if ref not in out:
            out.append(ref)
    return out


def parse_scheduling(
    task: Mapping[str, Any], *, hold: bool = False, names: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``scheduling`` mapping from a submit request's ``task`` object
    (keys ``gpus``, ``queue``, ``priority``, ``after``, ``after_any``,
    ``memory`` (``16G``), ``cpus``, ``retry`` (``--retry N`` or a ``retry:``
    mapping, supervisord.shared.retry); each may be absent or null) and the
    ``--hold`` flag. Dependency refs are
    lower-cased and de-duplicated but not resolved. Raises TaskError naming
    the flag, or ``names[key]`` when given (a task file and its key)."""
    label = {
        k: (names or {}).get(k, "--" + k.replace("_", "-"))
        for k in ("gpus", "queue", "priority", "after", "after_any", "after_failed", "retry")
    }
    gpus = 0 if task.get("gpus") is None else _int(task.get("gpus"), label["gpus"])
    if gpus < 0:
        raise TaskError(f"{label['gpus']}: must be 0 or more, got {gpus}")
    if gpus > _MAX_GPUS:
        raise TaskError(f"{label['gpus']}: {gpus} is more GPUs than any machine has")
    queue = task.get("queue")
    if queue is None:
        queue = DEFAULT_QUEUE
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise TaskError(
            f"{label['queue']}: {queue!r} is not a queue name"
            " (1-63 letters, digits, '.', '_' or '-', starting with a letter or digit)"
        )
    priority = 0 if task.get("priority") is None else _int(task.get("priority"), label["priority"])
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise TaskError(f"{label['priority']}: must be in {PRIORITY_MIN}..{PRIORITY_MAX}, got {priority}")
    after = _refs(task.get("after"), label["after"])
    after_any = [r for r in _refs(task.get("after_any"), label["after_any"]) if r not in after]
    after_failed = _refs(task.get("after_failed"), label["after_failed"])
    both = sorted(set(after_failed) & set(after))
    if both:
        raise TaskError(
            f"{label['after_failed']} {both[0]}: also given with {label['after']}; a run cannot both complete and fail"
        )
    if not isinstance(hold, bool):
        raise TaskError(f"--hold: must be true or false, got {hold!r}")
    out: dict[str, Any] = {
        "gpus": gpus,
        "queue": queue,
        "priority": priority,
        "after": after,
        "after_any": after_any,
        "hold": hold,
    }
    if after_failed:
        out["after_failed"] = after_failed
    # Limits only when given: a run without them records what it did before.
    if task.get("memory") is not None:
        out["memory_bytes"] = parse_memory(task.get("memory"))
    if task.get("cpus") is not None:
        out["cpus"] = parse_cpus(task.get("cpus"))
    if task.get("retry") is not None:  # only when given, as the limits
        out["retry"] = parse_retry(task.get("retry"), label=label["retry"])
    return out


def scheduling_of(submitted: Mapping[str, Any]) -> dict[str, Any]:
    """The ``scheduling`` mapping of a Submitted event's data, with the
    defaults for a run recorded before scheduling existed."""
    raw = submitted.get("scheduling")
    sched = dict(raw) if isinstance(raw, Mapping) else {}
    return {
        "gpus": int(sched.get("gpus") or 0),
        "queue": str(sched.get("queue") or DEFAULT_QUEUE),
        "priority": int(sched.get("priority") or 0),
        "after": [str(r) for r in sched.get("after") or []],
        "after_any": [str(r) for r in sched.get("after_any") or []],
        "hold": bool(sched.get("hold")),
        "after_failed": [str(r) for r in sched.get("after_failed") or []],
        # the limits only when the run has them (as parse_scheduling records them)
        **({"memory_bytes": int(sched["memory_bytes"])} if sched.get("memory_bytes") else {}),
        **({"cpus": float(sched["cpus"])} if sched.get("cpus") else {}),
        # and its retry policy (supervisord.shared.retry), which `rerun` keeps
        **({"retry": dict(sched["retry"])} if isinstance(sched.get("retry"), Mapping) else {}),
    }
