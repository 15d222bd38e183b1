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
    ATTEMPT_ENDED,
    ATTEMPT_STARTED,
    CANCEL_REQUESTED,
    HANDLE_RECORDED,
    LOG_LINES,
    LOGS_ARCHIVED,
    LOGS_DELETED,
    PHASE_CHANGED,
    PROGRESS,
    PROJECTED_TYPES,
    STAGING_STEP,
    SUBMITTED,
    SWEEP_SUBMITTED,
)

__all__ = [
    "ADMITTED",
    "ATTEMPT_ENDED",
    "ATTEMPT_STARTED",
    "CANCEL_FAILED",
    "CANCEL_REQUESTED",
    "CATALOG",
    "CLEANUP_FAILED",
    "CONFIG_RELOADED",
    "CONTAINER_TIMES",
    "HANDLE_RECORDED",
    "HELD",
    "HOLD_RELEASED",
    "HOOK_DELIVERED",
    "HOOK_FAILED",
    "LEADER_POD_CHANGED",
    "LOGS_ARCHIVED",
    "LOGS_DELETED",
    "LOGS_TRUNCATED",
    "LOG_INGEST_DONE",
    "LOG_INGEST_PENDING",
    "LOG_LINES",
    "OBJECT_CREATED",
    "OBJECT_DELETED",
    "OUTPUTS_RECORDED",
    "PAUSED",
    "PHASE_CHANGED",
    "PROGRESS",
    "QUEUE_CHANGED",
    "RESOURCES_FREED",
    "RESOURCE_USAGE",
    "RESUMED",
    "RUN_DIR_REMOVED",
    "RUN_UPDATED",
    "STAGING_STEP",
    "STORAGE_TROUBLE",
    "SUBMITTED",
    "SWEEP_SUBMITTED",
    "EventType",
    "define",
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
        "backend": "*required* str: local | kubernetes | slurm",
        "command": "str: the bash text",
        "timeout_s": "int: wall-clock limit in seconds",
        "source": "{repo, rev, commit, snapshot_sha256, snapshot_size}",
        "env": "{NAME: 'hmac-sha256:<hex>'}: keyed digests (supervisord.secret), never values",
        "config": "the effective config, secrets redacted with the same keyed digest",
        "task_file": "str | None: the task file's path",
        "manifest": "str | None: the Kubernetes manifest path given at submit",
        "slurm": "{gpus: int > 0}: a Slurm run's --gpus (sbatch --gpus; the local scheduler then counts 0)",
        "cwd": "str: the client's working directory",
        "submitted_by_uid": "int: the daemon's uid (the API peer's when over the Unix socket)",
        "submitted_by_pid": "int: the API peer's pid (over the Unix socket)",
        "umask": "str: the submitting shell's umask, 4 octal digits; a local run's files get it",
        "request_id": "str: the client's random id for this submit (1-64 chars), to find it after a lost connection",
        "on_done": "[str]: `submit --on-done` argv, run by the on-done hook when the run ends",
        "scheduling": "{gpus: int, queue: str, priority: int -1000..1000, after: [run id], after_any: [run id], hold: bool,"
        " memory_bytes: int | None, cpus: float | None} (supervisord.scheduler.options)",
        "rerun_of": "str: the run id this run reruns (`jobsup rerun`, the UI)",
        "env_from": "str: local runs, submitter | daemon: whose environment the job starts from (supervisord.shellenv)",
        "shell_env": "{NAME: 'hmac-sha256:<hex>'}: env_from submitter, the submitting shell's variables; never values",
        "outputs_root": "str: local runs, the outputs dir (the run's folder is <outputs_root>/<project>/<run id>)",
        "links": "{path: target}: task key links, targets resolved at submit (supervisord.links)",
        "labels": "{str: str}: `--label K=V` / task `labels:`",
        "sweep_id": "str: the sweep ('s' + 11 hex) this run belongs to (its SweepSubmitted precedes it)",
        "sweep_index": "int: its place in the sweep's grid, 0-based (JOBSUP_SWEEP_INDEX)",
        "params": "{KEY: str}: the sweep's values for this run (JOBSUP_PARAM_<KEY>)",
        "sweep_max_parallel": "int: the sweep's max_parallel (at most that many of its runs admitted at once)",
    },
)
define(
    SWEEP_SUBMITTED,
    writer="supervisor, at a sweep's submit, on the sweep's own stream, in one transaction with its runs' Submitted",
    data={
        "grid": "*required* {KEY: [str]}: the values of each key, in order",
        "count": "*required* int: its runs (the grid's product, at most 10,000)",
        "max_parallel": "int | None: at most this many of its runs admitted at once",
        "project": "str",
        "name": "str: the runs' base name (each is NAME[k=v,...])",
        "command": "str: the command template with its {KEY} placeholders",
        "labels": "{str: str}",
        "request_id": "str: the client's id for this submit",
    },
)
define(
    PROGRESS,
    writer="local backend (JOBSUP_PROGRESS_FILE) or supervisor (a `JOBSUP_PROGRESS {json}` log line): at most once "
    "per local.progress_interval_s, once more at the run's end, only when it changed",
    data={
        "step": "number",
        "total": "number",
        "message": "str: at most 500 characters (a plain-text report is its first line)",
        "metrics": "{name: number | str}: at most 64",
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
        "source": "*required* str: where positions are measured (a local run: output.log:stdout / output.log:stderr, offsets in its output record; pod/container)",
        "lines": "*required* [[pos: str, text: str], ...]: pos unique within (run, source)",
    },
)
define(
    CANCEL_REQUESTED,
    writer="supervisor, when a cancel starts",
    data={
        "requested_by_uid": "int: the API peer's uid (over the Unix socket)",
        "requested_by_pid": "int: the API peer's pid (over the Unix socket)",
    },
)
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
CONTAINER_TIMES: Final = define(
    "ContainerTimes",
    writer="kubernetes backend: when the run's script container started (once) and finished (before the terminal"
    " phase), from the pod's containerStatuses; the run's started_at/ended_at come from them",
    data={
        "pod": "*required* str: the pod",
        "container": "*required* str: the script container",
        "started_at": "str: state.running/terminated.startedAt (RFC 3339)",
        "finished_at": "str: state.terminated.finishedAt (RFC 3339)",
    },
)
CLEANUP_FAILED: Final = define(
    "CleanupFailed",
    writer="kubernetes backend, when deleting the run's objects after its end, or rolling back a failed start, "
    "failed or ran out of time (the message names what may remain: cleanup pending)",
    data={"message": "str: why"},
)

# -- the scheduler ---------------------------------------------------------------
# (folded in from the scheduler's constants in supervisord.scheduler.driver;
# shapes as the README's "Scheduling" section describes them)

ADMITTED: Final = define(
    "Admitted",
    writer="scheduler, when a queued run is admitted (with its move to SCHEDULING)",
    data={
        "queue": "str",
        "in_queue": "int: runs started in the queue, this one included",
        "max_parallel": "int | None: the queue's cap",
        "gpus": "[{index, uuid, name, memory}]: the GPUs it holds",
        "waited_s": "float: seconds since submit",
        "limits": "{memory_bytes: int | None, cpus: float | None, enforcement: systemd-scope | sampler}:"
        " a run with --memory/--cpus, and how they are enforced",
    },
)
HELD: Final = define("Held", writer="scheduler, on `jobsup hold`", data={})
HOLD_RELEASED: Final = define("HoldReleased", writer="scheduler, on `jobsup release`", data={})
RESOURCES_FREED: Final = define(
    "ResourcesFreed",
    writer="scheduler, when an admitted run ends",
    data={"queue": "str", "gpus": "[str]: the UUIDs of the GPUs it held"},
)

# -- hooks -------------------------------------------------------------------------
# (the constants live in supervisord.hooks.delivery; shapes as its docstring says)

_HOOK_DATA = {
    "hook": "*required* str: the hook's name (on-done for `submit --on-done`)",
    "kind": "*required* command | webhook",
    "event_seq": "*required* int: the PhaseChanged it ran for",
    "phase": "str: that event's phase",
    "attempt": "int: 1, 2, ...",
    "duration_s": "float",
    "exit_code": "int: command hooks (None in HookFailed when there was none)",
    "status": "int: webhooks, the HTTP status (None in HookFailed when there was none)",
    "output": "str: the first 4 KiB of the output or response body; absent when empty",
}
HOOK_DELIVERED: Final = define(
    "HookDelivered",
    writer="hooks, when a hook ran for one of the run's phase changes and succeeded",
    data=_HOOK_DATA,
)
HOOK_FAILED: Final = define(
    "HookFailed",
    writer="hooks, after each failed attempt of a hook",
    data={
        **_HOOK_DATA,
        "error": "*required* str: a short reason",
        "final": "*required* bool: no further attempt for this event",
        "retry_in_s": "float: when not final",
    },
)

# -- log ingestion ---------------------------------------------------------------

LOG_INGEST_PENDING: Final = define(
    "LogIngestPending",
    writer="local backend, when the run's process ended with output not all recorded (before its terminal phase)",
    data={"bytes": "int: the backlog's size when recorded"},
)
LOG_INGEST_DONE: Final = define(
    "LogIngestDone",
    writer="local backend, when the backlog announced by LogIngestPending is recorded",
    data={},
)
LOGS_TRUNCATED: Final = define(
    "LogsTruncated",
    writer="local backend, when local.max_log_bytes stops recording a run's output (the run goes on)",
    data={
        "max_log_bytes": "int",
        "recorded_bytes": "int",
        "dropped_bytes": "int: not recorded when the event was written",
        "final": "bool: the last one, at the run's end, with the totals",
    },
)

# -- retention (supervisord.retention; the store writes the log ones) ---------------

define(
    LOGS_ARCHIVED,
    writer="retention (store.EventStore.archive_logs): the run's log text moved into one compressed file",
    data={
        "file": "*required* str: its name under <state dir>/archive/",
        "sha256": "*required* 'sha256:<hex>' of the whole file (checked at every read)",
        "lines": "*required* int: lines 1..lines are in it",
        "bytes": "int: their text bytes",
        "file_bytes": "int: the file's size",
        "blocks": "int: log blocks moved",
        "sources": "{source: [last_pos, line_no]}: the newest line of each source",
    },
)
define(
    LOGS_DELETED,
    writer="retention (`jobsup prune --delete-archives`): the archived log text was deleted",
    data={
        "file": "*required* str: the archive's name",
        "sha256": "*required* 'sha256:<hex>': the digest the archive had",
        "lines": "int: how many lines it held",
    },
)
RUN_DIR_REMOVED: Final = define(
    "RunDirRemoved",
    writer="retention (retention.run_dirs_after, `jobsup prune --run-dirs`): the run's folder was removed",
    data={"path": "*required* str: the folder", "bytes": "int: disk space freed", "files": "int: files removed"},
)
RESOURCE_USAGE: Final = define(
    "ResourceUsage",
    writer="usage sampler (supervisord.usage.sampler): a running local run's process tree, at most once a minute"
    " and once after it ended",
    data={
        "cpu_s": "*required* float: CPU seconds of the tree so far (the processes that ended included)",
        "rss_bytes": "int: resident memory of the tree's live processes, summed, at the sample",
        "max_rss_bytes": "*required* int: the largest summed RSS sampled",
        "gpu_memory_bytes": "{index: int}: GPU memory of the tree's processes per GPU at the sample",
        "gpu_memory_max_bytes": "{index: int}: the largest sampled, per GPU",
        "processes": "int: live processes in the tree",
        "samples": "int: samples taken so far",
        "final": "bool: the record after the run ended (the last sample's figures)",
        "memory_limit_bytes": "int: its --memory, when it has one",
        "source": "runner | absent (sampler): runner -- what the local runner reaped used, at the end of a run"
        " the sampler never saw",
        "over_limit": "str: the tree passed its --memory and the daemon is stopping the run (recorded before any"
        " signal; the run ends ERROR OOMKilled with this message, across a restart too)",
    },
)
STORAGE_TROUBLE: Final = define(
    "StorageTrouble",
    writer="supervisor, after one of the run's appends waited out storage trouble (a full disk, a held lock)",
    data={
        "kind": "*required* disk full | locked | I/O error",
        "message": "str: the store's error",
        "since": "str: UTC, when writing stopped",
        "resumed_at": "str: UTC, when it worked again",
    },
)

# -- control while it runs (`jobsup update`, `queue set`, `pause`/`resume`) --------

RUN_UPDATED: Final = define(
    "RunUpdated",
    writer="scheduler, on `jobsup update` of a QUEUED run (supervisord.scheduler.update)",
    data={
        "old": "*required* {key: value}: the values before, of the keys that changed",
        "new": "*required* {key: value}: the values after; keys among priority, gpus, queue, timeout_s, memory_bytes, cpus",
    },
)
QUEUE_CHANGED: Final = define(
    "QueueChanged",
    writer="scheduler, on `jobsup queue set` (stream `daemon`, not a run's)",
    data={
        "queue": "*required* str: the queue's name",
        "max_parallel": "*required* int | None: the cap in force from now (None: no cap)",
        "source": "*required* runtime | config: set at runtime, or the runtime cap dropped (the config's again)",
        "old": "int | None: the cap in force before",
        "source_before": "str: where that cap came from (config | runtime | none)",
    },
)
PAUSED: Final = define(
    "Paused",
    writer="supervisor, on `jobsup pause` (the run's process group got SIGSTOP)",
    data={
        "requested_by_uid": "int: the API peer's uid",
        "requested_by_pid": "int: the API peer's pid",
    },
)
RESUMED: Final = define(
    "Resumed",
    writer="supervisor, on `jobsup resume` (the run's process group got SIGCONT)",
    data={
        "paused_s": "*required* float: how long it was paused",
        "requested_by_uid": "int: the API peer's uid",
        "requested_by_pid": "int: the API peer's pid",
    },
)
define(
    ATTEMPT_ENDED,
    writer="supervisor, when an attempt of a run with a retry policy failed in a way the policy retries and "
    "retries are left (with PhaseChanged RUNNING reason Retrying; supervisord.retry)",
    data={
        "attempt": "*required* int: the attempt that ended, 1, 2, ...",
        "reason": "*required* str | None: its reason (Lost, Evicted, OOMKilled, NonZeroExit...)",
        "message": "str | None: its outcome's message",
        "exit_code": "int | None: the command's exit code, when it has one",
        "retry_in_s": "*required* float: seconds until the next attempt starts (the backoff)",
        "last_line": "int: the run's last log line this attempt wrote (`logs --attempt N`)",
    },
)
define(
    ATTEMPT_STARTED,
    writer="supervisor, when the backoff after an AttemptEnded is over, before the backend starts the attempt",
    data={
        "attempt": "*required* int: the attempt starting, 2, 3, ...",
        "of": "int: the most attempts the policy allows",
    },
)
CONFIG_RELOADED: Final = define(
    "ConfigReloaded",
    writer="daemon, on `jobsup daemon reload` (stream `daemon`, not a run's)",
    data={
        "changed": "*required* [str]: the config keys that changed (section.key; names only, never values)",
        "hooks": "*required* {added, removed, changed: [hook name]}",
        "restart_needed": "[str]: changed keys that take effect only at the next daemon start",
    },
)

# -- outputs (supervisord.outputs) ---------------------------------------------------

OUTPUTS_RECORDED: Final = define(
    "OutputsRecorded",
    writer="the daemon's outputs recorder, after a local run's terminal phase (also at start for a run "
    "whose list a stop cut short)",
    data={
        "dir": "*required* str: the run's outputs folder",
        "files": "*required* [{path, bytes, sha256 (hex), mtime (UTC)}]: every regular file, sorted",
        "total_bytes": "*required* int",
        "total_files": "*required* int",
        "skipped": "[{path, kind}]: symlinks (never followed), special files, unreadable entries",
        "vanished": "[str]: files deleted while the list was made",
        "omitted": "int: files past the cap (supervisord.outputs.manifest.MAX_FILES), counted only",
        "elapsed_s": "float: seconds the listing took",
    },
)
