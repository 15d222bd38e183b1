"""The catalog of every event type jobsup writes, with its ``data`` shape.

One :func:`define` call per type: to add a type, add one entry here (its
name in CamelCase as the README's "Events" section spells it, who writes it, and its data keys)
and use the returned constant at the call site instead of a string literal.
``tests/supervisord/test_lifecycle.py`` checks that every type written
anywhere in the source is in the catalog.

The store records any type; the four it projects (Submitted, PhaseChanged,
HandleRecorded, LogLines) are pinned in :mod:`store.types`, whose constants
these entries reuse. Keys are optional unless marked *required*.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from store.types import (
    CANCEL_REQUESTED,
    HANDLE_RECORDED,
    LOG_LINES,
    PHASE_CHANGED,
    PROJECTED_TYPES,
    STAGING_STEP,
    SUBMITTED,
)

__all__ = [
    "EventType",
    "CATALOG",
    "define",
    "SUBMITTED",
    "PHASE_CHANGED",
    "HANDLE_RECORDED",
    "LOG_LINES",
    "CANCEL_REQUESTED",
    "CANCEL_FAILED",
    "STAGING_STEP",
    "OBJECT_CREATED",
    "OBJECT_DELETED",
    "LEADER_POD_CHANGED",
    "CLEANUP_FAILED",
    "ADMITTED",
    "HELD",
    "HOLD_RELEASED",
    "RESOURCES_FREED",
]


@dataclasses.dataclass(frozen=True)
class EventType:
    """One event type: its ``name`` (the ``type`` column), who ``writer``
    appends it, its ``data`` keys (key -> type and meaning), and whether the
    store's projections read it (``projected``)."""

    name: str
    writer: str
    data: dict[str, str]
    projected: bool = False


#: name -> its entry, in the order defined.
CATALOG: Final[dict[str, EventType]] = {}


def define(name: str, *, writer: str, data: dict[str, str]) -> str:
    """Add ``name`` to :data:`CATALOG` and return it (the constant to use at
    call sites). Raises ValueError for a name defined twice."""
    if name in CATALOG:
        raise ValueError(f"event type {name!r} is defined twice")
    CATALOG[name] = EventType(name, writer, dict(data), projected=name in PROJECTED_TYPES)
    return name


# -- the run's life (supervisor) ------------------------------------------------

define(
    SUBMITTED,
    writer="supervisor, at submit (first event of every run, version 1)",
    data={
        "project": "*required* str",
        "name": "*required* str",
        "backend": "*required* str: local | kubernetes",
        "command": "str: the bash text",
        "timeout_s": "int: wall-clock limit in seconds",
        "source": "{repo, rev, commit, snapshot_sha256, snapshot_size}",
        "env": "{NAME: 'hmac-sha256:<hex>'}: keyed digests (supervisord.secret), never values",
        "config": "the effective config, secrets redacted with the same keyed digest",
        "task_file": "str | None: the task file's path",
        "manifest": "str | None: the Kubernetes manifest path given at submit",
        "cwd": "str: the client's working directory",
        "submitted_by_uid": "int",
    },
)
define(
    PHASE_CHANGED,
    writer="supervisor (what a backend reports, through supervisord.lifecycle's rules)",
    data={
        "phase": "*required* one of store.types.PHASES",
        "reason": "str | None: one CamelCase word (README 'Phases and reasons')",
        "message": "str | None: human text",
        "exit_code": "int: the command's exit code, when it has one",
    },
)
define(
    HANDLE_RECORDED,
    writer="backend, through the reporter (how to find the run again)",
    data={"handle": "*required* mapping: local {runner_pid, runner_start, run_dir}; kubernetes {namespace, ...}"},
)
define(
    LOG_LINES,
    writer="backend, through the reporter",
    data={
        "stream": "*required* stdout | stderr",
        "source": "*required* str: where positions are measured (a file, or pod/container)",
        "lines": "*required* [[pos: str, text: str], ...]: pos unique within (run, source)",
    },
)
define(CANCEL_REQUESTED, writer="supervisor, when a cancel starts", data={})
CANCEL_FAILED: Final = define(
    "CancelFailed",
    writer="supervisor, when the backend could not stop the run (the run goes on; cancel again)",
    data={"message": "str: why"},
)

# -- the Kubernetes backend -------------------------------------------------------

define(
    STAGING_STEP,
    writer="kubernetes backend, while staging the source into the pod",
    data={"step": "str: e.g. staged", "pod": "str", "container": "str"},
)
OBJECT_CREATED: Final = define(
    "ObjectCreated",
    writer="kubernetes backend, for each object it creates",
    data={
        "apiVersion": "str",
        "kind": "str",
        "name": "str",
        "uid": "str | None",
        "env": "{NAME: digest | None}: on the env Secret only; keyed digests, never values",
    },
)
OBJECT_DELETED: Final = define(
    "ObjectDeleted",
    writer="kubernetes backend, for each object it deletes (cancel, rollback, cleanup)",
    data={"apiVersion": "str", "kind": "str", "name": "str", "uid": "str | None"},
)
LEADER_POD_CHANGED: Final = define(
    "LeaderPodChanged",
    writer="kubernetes backend, when the pod it follows is replaced (eviction, retry)",
    data={"from": "str: the previous pod's name", "to": "str: the new pod's name"},
)
CLEANUP_FAILED: Final = define(
    "CleanupFailed",
    writer="kubernetes backend, when deleting the run's objects after its end failed",
    data={"message": "str: why"},
)

# -- the scheduler ---------------------------------------------------------------
# (folded in from the scheduler's constants in supervisord.scheduler.driver;
# shapes as the README's "Scheduling" section describes them)

ADMITTED: Final = define(
    "Admitted",
    writer="scheduler, when a queued run is admitted (with its move to SCHEDULING)",
    data={"queue": "str", "slot": "the admission slot", "gpus": "[str]: the GPUs it holds", "waited_s": "time waited"},
)
HELD: Final = define("Held", writer="scheduler, on `jobsup hold`", data={})
HOLD_RELEASED: Final = define("HoldReleased", writer="scheduler, on `jobsup release`", data={})
RESOURCES_FREED: Final = define(
    "ResourcesFreed",
    writer="scheduler, when an admitted run ends",
    data={"queue": "str", "gpus": "[str]: the GPUs it held"},
)
