"""The catalog of every event type jobsup writes, each with its ``data`` shape
as a TypedDict (kopf's ``_cogs/structs/bodies.py``; pueue's shared message
types).

Each entry is one TypedDict (the ``data`` keys, :class:`typing.Required`
where the event always has the key) and one :func:`define` call, whose
result is the constant call sites use::

    class AttemptStartedData(TypedDict, total=False):
        #: what the key means
        attempt: Required[int]


    ATTEMPT_STARTED: Final = define("AttemptStarted", AttemptStartedData, writer="who appends it, when")

A constant is the type's name (a ``str``: readers compare ``ev.type ==
PHASE_CHANGED``) and makes events: ``PHASE_CHANGED({"phase": "RUNNING"})``
is an :class:`Event`, its data checked against :class:`PhaseChangedData` by
mypy. ``RunReporter.record`` and the supervisor's appends take only such
events. The JSON Schema of each type's data (``supervisord/shared/schemas/events/
<Name>.json``, what ``jobsup schema event`` publishes) is tested equal to its
TypedDict (``tests/supervisord/test_event_catalog.py``, whose failure prints
the schema file to add); no other module spells an event type as a string.

The store records any type; the ones it projects (Submitted, PhaseChanged,
HandleRecorded, LogLines, ...) are also pinned in :mod:`store.types`, which
cannot import this module; the test checks both agree.

(No ``from __future__ import annotations`` here: with it, ``Required[...]``
stays a string and the TypedDicts' ``__required_keys__`` come out empty.)
"""

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, Generic, Literal, NotRequired, Required, TypedDict, TypeVar

from store.types import PROJECTED_TYPES, NewEvent

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
    "AdmittedData",
    "AttemptEndedData",
    "AttemptStartedData",
    "CancelFailedData",
    "CancelRequestedData",
    "CleanupFailedData",
    "ConfigReloadedData",
    "ContainerTimesData",
    "Event",
    "EventType",
    "HandleRecordedData",
    "HeldData",
    "HoldReleasedData",
    "HookDeliveredData",
    "HookFailedData",
    "LeaderPodChangedData",
    "LogBlockAuditData",
    "LogIngestDoneData",
    "LogIngestPendingData",
    "LogLinesData",
    "LogsArchivedData",
    "LogsDeletedData",
    "LogsTruncatedData",
    "ObjectCreatedData",
    "ObjectDeletedData",
    "OutputsRecordedData",
    "PausedData",
    "PhaseChangedData",
    "ProgressData",
    "QueueChangedData",
    "ResourceUsageData",
    "ResourcesFreedData",
    "ResumedData",
    "RunDirRemovedData",
    "RunUpdatedData",
    "StagingStepData",
    "StorageTroubleData",
    "SubmittedData",
    "SweepSubmittedData",
    "define",
]

#: The data shape of one event type (a TypedDict).
D = TypeVar("D", bound=Mapping[str, Any])


@dataclasses.dataclass(frozen=True, slots=True)
class Event(NewEvent):
    """An event made through the catalog (``SOME_TYPE(data)``): a
    :class:`store.NewEvent` whose ``type`` is a cataloged name and whose
    ``data`` was checked against that type's TypedDict."""


class EventType(str, Generic[D]):  # noqa: SLOT000 - its attributes need a __dict__ (a str subclass has no non-empty __slots__)
    """One event type: the name itself (the ``type`` column; it compares and
    hashes as that ``str``), its ``data_type`` (a TypedDict), who ``writer``
    appends it, other data shapes the store writes under the same name
    (``variants``), and whether the store's projections read it
    (``projected``). Calling it with data makes an :class:`Event`."""

    data_type: type[D]
    variants: tuple[type[Mapping[str, Any]], ...]
    writer: str
    projected: bool

    def __new__(
        cls, name: str, data_type: type[D], *, writer: str, variants: tuple[type[Mapping[str, Any]], ...] = ()
    ) -> "EventType[D]":
        self = super().__new__(cls, name)
        self.data_type = data_type
        self.variants = variants
        self.writer = writer
        self.projected = name in PROJECTED_TYPES
        return self

    @property
    def name(self) -> str:
        """The type's name as a plain ``str``."""
        return str(self)

    def __call__(self, data: D) -> Event:
        """An event of this type with ``data`` (copied: the caller may reuse its dict)."""
        return Event(str(self), dict(data))


#: name -> its entry, in the order defined.
CATALOG: Final[dict[str, "EventType[Any]"]] = {}


def define(
    name: str, data_type: type[D], *, writer: str, variants: tuple[type[Mapping[str, Any]], ...] = ()
) -> EventType[D]:
    """Add the type ``name`` (CamelCase, as the README's "Events" section
    spells it) with its data TypedDict to :data:`CATALOG` and return its
    constant. Raises ValueError for a name defined twice."""
    if name in CATALOG:
        raise ValueError(f"event type {name!r} is defined twice")
    entry = EventType(name, data_type, writer=writer, variants=variants)
    CATALOG[name] = entry
    return entry


class SubmittedData(TypedDict, total=False):
    """First event of every run (version 1): what was submitted. Env values are never recorded, only a keyed hash."""

    project: Required[str]
    name: Required[str]
    #: local | kubernetes | slurm
    backend: Required[str]
    #: the bash text
    command: Required[str]
    #: wall-clock limit in seconds
    timeout_s: Required[int]
    source: Required[dict[str, Any]]
    #: NAME -> 'hmac-sha256:<hex>': keyed digests (supervisord.shared.secret), never values
    env: Required[dict[str, str | None]]
    #: effective config, secrets redacted
    config: Required[dict[str, Any]]
    #: the task file's path
    task_file: str | None
    #: the Kubernetes manifest path given at submit
    manifest: str | None
    #: {gpus: int > 0}: a Slurm run's --gpus (sbatch --gpus; the local scheduler then counts 0)
    slurm: dict[str, Any]
    #: the client's working directory
    cwd: str
    #: the daemon's uid (the API peer's when over the Unix socket)
    submitted_by_uid: int
    #: the API peer's pid (over the Unix socket)
    submitted_by_pid: int
    #: the submitting shell's umask, 4 octal digits; a local run's files get it
    umask: str
    #: the client's random id for this submit (1-64 chars), to find it after a lost connection
    request_id: str
    #: `submit --on-done` argv, run by the on-done hook when the run ends
    on_done: list[str]
    #: the run id this run reruns (`jobsup rerun`, the UI)
    rerun_of: str
    #: {gpus, queue, priority -1000..1000, after, after_any, hold, memory_bytes, cpus} (supervisord.shared.scheduling)
    scheduling: dict[str, Any]
    #: local runs, submitter | daemon: whose environment the job starts from (supervisord.shared.shellenv)
    env_from: str
    #: NAME -> 'hmac-sha256:<hex>': env_from submitter, the submitting shell's variables; never values
    shell_env: dict[str, str | None]
    #: local runs, the outputs dir (the run's folder is <outputs_root>/<project>/<run id>)
    outputs_root: str
    #: path -> target: task key links, targets resolved at submit (supervisord.shared.links)
    links: dict[str, str]
    #: `--label K=V` / task `labels:`
    labels: dict[str, str]
    #: the sweep ('s' + 11 hex) this run belongs to (its SweepSubmitted precedes it)
    sweep_id: str
    #: its place in the sweep's grid, 0-based (JOBSUP_SWEEP_INDEX)
    sweep_index: int
    #: KEY -> value: the sweep's values for this run (JOBSUP_PARAM_<KEY>)
    params: dict[str, str]
    #: the sweep's max_parallel (at most that many of its runs admitted at once)
    sweep_max_parallel: int


SUBMITTED: Final = define(
    "Submitted",
    SubmittedData,
    writer="supervisor, at submit (first event of every run, version 1)",
)


class SweepSubmittedData(TypedDict, total=False):
    """A sweep (`submit --sweep`), on the sweep's own stream (its id, s + 11 hex): recorded in the same transaction as, and before, the Submitted of each of its runs."""

    project: str
    #: the runs' base name (each is NAME[k=v,...])
    name: str
    #: the command template with its {KEY} placeholders
    command: str
    #: KEY -> the values of each key, in order
    grid: Required[dict[str, list[str]]]
    #: its runs (the grid's product, at most 10,000)
    count: Required[int]
    #: at most this many of its runs admitted at once
    max_parallel: int | None
    labels: dict[str, str]
    #: the client's id for this submit
    request_id: str


SWEEP_SUBMITTED: Final = define(
    "SweepSubmitted",
    SweepSubmittedData,
    writer="supervisor, at a sweep's submit, on the sweep's own stream, in one transaction with its runs' Submitted",
)


class ProgressData(TypedDict, total=False):
    """What the run reported of its progress (JOBSUP_PROGRESS_FILE, or a `JOBSUP_PROGRESS {json}` log line): at most once per local.progress_interval_s, and once at its end; only when it changed."""

    step: float
    total: float
    #: at most 500 characters (a plain-text report is its first line)
    message: str
    #: name -> number | str: at most 64
    metrics: dict[str, float | str]


PROGRESS: Final = define(
    "Progress",
    ProgressData,
    writer="local backend (JOBSUP_PROGRESS_FILE) or supervisor (a `JOBSUP_PROGRESS {json}` log line): at most once per local.progress_interval_s, once more at the run's end, only when it changed",
)


class PhaseChangedData(TypedDict, total=False):
    """The run's phase changed; each PhaseChanged states the whole outcome (absent keys are null)."""

    phase: Required[str]
    #: one CamelCase word (README 'Phases and reasons')
    reason: str | None
    #: human text
    message: str | None
    #: the command's exit code, when it has one
    exit_code: int | None


PHASE_CHANGED: Final = define(
    "PhaseChanged",
    PhaseChangedData,
    writer="supervisor (what a backend reports, through supervisord.shared.lifecycle's rules)",
)


class HandleRecordedData(TypedDict, total=False):
    """How the backend finds the run again."""

    #: local {runner_pid, runner_start, run_dir}; kubernetes {namespace, ...}
    handle: Required[dict[str, Any]]


HANDLE_RECORDED: Final = define(
    "HandleRecorded",
    HandleRecordedData,
    writer="backend, through the reporter (how to find the run again)",
)


class LogLinesData(TypedDict, total=False):
    """store schema 2: the lines"""

    stream: Required[str]
    #: where positions are measured (a local run: output.log:stdout / output.log:stderr, offsets in its output record; pod/container)
    source: Required[str]
    #: [[pos, text], ...]: pos unique within (run, source)
    lines: Required[list[Any]]


class LogBlockAuditData(TypedDict, total=False):
    """store schema 3 (logs branch): the audit record of a block whose text is in log_blocks; first_pos..sha256 only when line_count > 0"""

    stream: Required[str]
    #: where positions are measured (a local run: output.log:stdout / output.log:stderr, offsets in its output record; pod/container)
    source: Required[str]
    first_line: Required[int]
    line_count: Required[int]
    first_pos: str
    last_pos: str
    bytes: int
    sha256: str
    #: offered lines dropped as already recorded
    replayed: int


LOG_LINES: Final = define(
    "LogLines",
    LogLinesData,
    writer="backend, through the reporter",
    variants=(LogBlockAuditData,),
)


class CancelRequestedData(TypedDict, total=False):
    """A cancel was asked for; over the API socket, who asked."""

    #: the API peer's uid (over the Unix socket)
    requested_by_uid: int
    #: the API peer's pid (over the Unix socket)
    requested_by_pid: int


CANCEL_REQUESTED: Final = define(
    "CancelRequested",
    CancelRequestedData,
    writer="supervisor, when a cancel starts",
)


class CancelFailedData(TypedDict, total=False):
    """Stopping the run failed."""

    #: why
    message: Required[str]


CANCEL_FAILED: Final = define(
    "CancelFailed",
    CancelFailedData,
    writer="supervisor, when the backend could not stop the run (the run goes on; cancel again)",
)


class StagingStepData(TypedDict, total=False):
    """A step of copying the source into the pod."""

    #: e.g. staged
    step: Required[str]
    pod: str
    container: str


STAGING_STEP: Final = define(
    "StagingStep",
    StagingStepData,
    writer="kubernetes backend, while staging the source into the pod",
)


class ObjectCreatedData(TypedDict, total=False):
    """jobsup created a Kubernetes object for the run (the env Secret also records NAME -> digest of each value, never a value)."""

    apiVersion: Required[str]
    kind: Required[str]
    name: Required[str]
    uid: str | None
    #: NAME -> digest | None: on the env Secret only; keyed digests, never values
    env: dict[str, str | None]


OBJECT_CREATED: Final = define(
    "ObjectCreated",
    ObjectCreatedData,
    writer="kubernetes backend, for each object it creates",
)


class ObjectDeletedData(TypedDict, total=False):
    """jobsup deleted a Kubernetes object of the run."""

    apiVersion: Required[str]
    kind: Required[str]
    name: Required[str]
    uid: str | None


OBJECT_DELETED: Final = define(
    "ObjectDeleted",
    ObjectDeletedData,
    writer="kubernetes backend, for each object it deletes (cancel, rollback, cleanup)",
)


#: The pod whose logs and status stand for the run changed (``from`` is a
#: keyword, hence the functional form).
LeaderPodChangedData = TypedDict(
    "LeaderPodChangedData",
    {
        #: the previous pod's name
        "from": NotRequired[str | None],
        #: the new pod's name
        "to": str,
    },
)


LEADER_POD_CHANGED: Final = define(
    "LeaderPodChanged",
    LeaderPodChangedData,
    writer="kubernetes backend, when the pod it follows is replaced (eviction, retry)",
)


class ContainerTimesData(TypedDict, total=False):
    """When the run's script container started and finished, from the pod's containerStatuses (Kubernetes): the run's started_at and ended_at come from them."""

    #: the pod
    pod: Required[str]
    #: the script container
    container: Required[str]
    #: state.running/terminated.startedAt (RFC 3339)
    started_at: str
    #: state.terminated.finishedAt (RFC 3339)
    finished_at: str


CONTAINER_TIMES: Final = define(
    "ContainerTimes",
    ContainerTimesData,
    writer="kubernetes backend: when the run's script container started (once) and finished (before the terminal"
    " phase), from the pod's containerStatuses",
)


class CleanupFailedData(TypedDict, total=False):
    """Deleting the run's Kubernetes objects after it ended, or rolling back a failed start, failed or ran out of time; the message names what may remain (cleanup pending)."""

    #: why
    message: Required[str]


CLEANUP_FAILED: Final = define(
    "CleanupFailed",
    CleanupFailedData,
    writer="kubernetes backend, when deleting the run's objects after its end, or rolling back a failed start, failed or ran out of time (the message names what may remain: cleanup pending)",
)


class AdmittedData(TypedDict, total=False):
    """The scheduler admitted a queued run (recorded with its PhaseChanged SCHEDULING in one append)."""

    queue: Required[str]
    #: runs started in the queue, this one included
    in_queue: int
    #: the queue's cap
    max_parallel: int | None
    #: the GPUs it holds
    gpus: Required[list[Any]]
    #: seconds since submit
    waited_s: float
    #: {memory_bytes, cpus, enforcement: systemd-scope | sampler}: a run with --memory/--cpus, and how they are enforced
    limits: dict[str, Any]


ADMITTED: Final = define(
    "Admitted",
    AdmittedData,
    writer="scheduler, when a queued run is admitted (with its move to SCHEDULING)",
)


class HeldData(TypedDict, total=False):
    """`jobsup hold`: the queued run waits until released."""


HELD: Final = define(
    "Held",
    HeldData,
    writer="scheduler, on `jobsup hold`",
)


class HoldReleasedData(TypedDict, total=False):
    """`jobsup release`: a held run may start."""


HOLD_RELEASED: Final = define(
    "HoldReleased",
    HoldReleasedData,
    writer="scheduler, on `jobsup release`",
)


class ResourcesFreedData(TypedDict, total=False):
    """An admitted run ended: its GPUs and queue slot are free."""

    queue: Required[str]
    #: the UUIDs of the GPUs it held
    gpus: Required[list[str]]


RESOURCES_FREED: Final = define(
    "ResourcesFreed",
    ResourcesFreedData,
    writer="scheduler, when an admitted run ends",
)


class HookDeliveredData(TypedDict, total=False):
    """A hook ran for one of the run's phase changes and succeeded."""

    #: the hook's name (on-done for `submit --on-done`)
    hook: Required[str]
    kind: Required[str]
    #: the PhaseChanged it ran for
    event_seq: Required[int]
    #: that event's phase
    phase: Required[str]
    #: 1, 2, ...
    attempt: Required[int]
    duration_s: float
    #: the first 4 KiB of the output or response body; absent when empty
    output: str
    #: command hooks (None in HookFailed when there was none)
    exit_code: int
    #: webhooks, the HTTP status (None in HookFailed when there was none)
    status: int


HOOK_DELIVERED: Final = define(
    "HookDelivered",
    HookDeliveredData,
    writer="hooks, when a hook ran for one of the run's phase changes and succeeded",
)


class HookFailedData(TypedDict, total=False):
    """An attempt of a hook failed; `final` says whether it will be tried again."""

    #: the hook's name (on-done for `submit --on-done`)
    hook: Required[str]
    kind: Required[str]
    #: the PhaseChanged it ran for
    event_seq: Required[int]
    #: that event's phase
    phase: Required[str]
    #: 1, 2, ...
    attempt: Required[int]
    duration_s: float
    #: the first 4 KiB of the output or response body; absent when empty
    output: str
    #: command hooks (None in HookFailed when there was none)
    exit_code: int | None
    #: webhooks, the HTTP status (None in HookFailed when there was none)
    status: int | None
    #: a short reason
    error: Required[str]
    #: no further attempt for this event
    final: Required[bool]
    #: when not final
    retry_in_s: float


HOOK_FAILED: Final = define(
    "HookFailed",
    HookFailedData,
    writer="hooks, after each failed attempt of a hook",
)


class LogIngestPendingData(TypedDict, total=False):
    """(logs branch) The run's process ended but its output backlog is not all recorded yet: the terminal phase comes first, the backlog after it."""

    #: the backlog's size when recorded
    bytes: int


LOG_INGEST_PENDING: Final = define(
    "LogIngestPending",
    LogIngestPendingData,
    writer="local backend, when the run's process ended with output not all recorded (before its terminal phase)",
)


class LogIngestDoneData(TypedDict, total=False):
    """(logs branch) The backlog announced by LogIngestPending is recorded."""


LOG_INGEST_DONE: Final = define(
    "LogIngestDone",
    LogIngestDoneData,
    writer="local backend, when the backlog announced by LogIngestPending is recorded",
)


class LogsTruncatedData(TypedDict, total=False):
    """(logs branch) local.max_log_bytes reached: output past it is not recorded (the run goes on); the last one has final: true."""

    max_log_bytes: Required[int | None]
    recorded_bytes: Required[int]
    #: not recorded when the event was written
    dropped_bytes: Required[int]
    #: the last one, at the run's end, with the totals
    final: bool


LOGS_TRUNCATED: Final = define(
    "LogsTruncated",
    LogsTruncatedData,
    writer="local backend, when local.max_log_bytes stops recording a run's output (the run goes on)",
)


class LogsArchivedData(TypedDict, total=False):
    """Retention moved the run's log text (lines 1..lines) into one compressed file under <state dir>/archive/; the sha256 is checked at every read."""

    #: its name under <state dir>/archive/
    file: Required[str]
    sha256: Required[str]
    #: lines 1..lines are in it
    lines: Required[int]
    #: their text bytes
    bytes: int
    #: the file's size
    file_bytes: int
    #: log blocks moved
    blocks: int
    #: source -> [last_pos, line_no]: the newest line of each source
    sources: dict[str, list[Any]]


LOGS_ARCHIVED: Final = define(
    "LogsArchived",
    LogsArchivedData,
    writer="retention (store.EventStore.archive_logs): the run's log text moved into one compressed file",
)


class LogsDeletedData(TypedDict, total=False):
    """Retention deleted the run's archived log text; the digest the archive had is kept here."""

    #: the archive's name
    file: Required[str]
    #: the digest the archive had
    sha256: Required[str]
    #: how many lines it held
    lines: int


LOGS_DELETED: Final = define(
    "LogsDeleted",
    LogsDeletedData,
    writer="retention (`jobsup prune --delete-archives`): the archived log text was deleted",
)


class RunDirRemovedData(TypedDict, total=False):
    """Retention removed the run's folder (its extracted source and what the job wrote there)."""

    #: the folder
    path: Required[str]
    #: disk space freed
    bytes: int
    #: files removed
    files: int


RUN_DIR_REMOVED: Final = define(
    "RunDirRemoved",
    RunDirRemovedData,
    writer="retention (retention.run_dirs_after, `jobsup prune --run-dirs`): the run's folder was removed",
)


class ResourceUsageData(TypedDict, total=False):
    """What a running local run's process tree used (usage sampler): at most once a minute while it runs and once after it ended."""

    #: CPU seconds of the tree so far (the processes that ended included)
    cpu_s: Required[float]
    #: resident memory of the tree's live processes, summed, at the sample
    rss_bytes: int
    #: the largest summed RSS sampled
    max_rss_bytes: Required[int]
    #: GPU index -> GPU memory of the tree's processes per GPU at the sample
    gpu_memory_bytes: dict[str, int]
    #: GPU index -> the largest sampled
    gpu_memory_max_bytes: dict[str, int]
    #: live processes in the tree
    processes: int
    #: samples taken so far
    samples: int
    #: the record after the run ended (the last sample's figures)
    final: bool
    #: its --memory, when it has one
    memory_limit_bytes: int
    #: sampler | runner: runner -- what the local runner reaped used, at the end of a run the sampler never saw
    source: Literal["sampler", "runner"]
    #: the tree passed its --memory and the daemon is stopping the run (recorded before any signal)
    over_limit: str


RESOURCE_USAGE: Final = define(
    "ResourceUsage",
    ResourceUsageData,
    writer="usage sampler (supervisord.daemon.usage.sampler): a running local run's process tree, at most once a minute and once after it ended",
)


class StorageTroubleData(TypedDict, total=False):
    """One of the run's appends (log lines, a phase) waited out storage trouble: nothing was lost, it was recorded once writing worked again."""

    kind: Required[str]
    #: the store's error
    message: str
    #: UTC, when writing stopped
    since: str
    #: UTC, when it worked again
    resumed_at: str


STORAGE_TROUBLE: Final = define(
    "StorageTrouble",
    StorageTroubleData,
    writer="supervisor, after one of the run's appends waited out storage trouble (a full disk, a held lock)",
)


class RunUpdatedData(TypedDict, total=False):
    """`jobsup update`: a QUEUED run's priority, GPUs, queue or timeout changed (only the keys that changed)."""

    #: key -> the values before, of the keys that changed
    old: Required[dict[str, Any]]
    #: key -> the values after; keys among priority, gpus, queue, timeout_s, memory_bytes, cpus
    new: Required[dict[str, Any]]


RUN_UPDATED: Final = define(
    "RunUpdated",
    RunUpdatedData,
    writer="scheduler, on `jobsup update` of a QUEUED run (supervisord.daemon.scheduler.update)",
)


class QueueChangedData(TypedDict, total=False):
    """`jobsup queue set`: a queue's cap set at runtime (on the stream `daemon`); it beats the daemon config until set again."""

    #: the queue's name
    queue: Required[str]
    #: the cap in force from now (None: no cap)
    max_parallel: Required[int | None]
    #: the cap in force before
    old: int | None
    #: where that cap came from (config | runtime | none)
    source_before: str
    #: set at runtime, or the runtime cap dropped (the config's again)
    source: Required[str]


QUEUE_CHANGED: Final = define(
    "QueueChanged",
    QueueChangedData,
    writer="scheduler, on `jobsup queue set` (stream `daemon`, not a run's)",
)


class PausedData(TypedDict, total=False):
    """`jobsup pause`: the run's process group got SIGSTOP; it stays RUNNING with reason Paused and keeps its GPUs."""

    #: the API peer's uid
    requested_by_uid: int
    #: the API peer's pid
    requested_by_pid: int


PAUSED: Final = define(
    "Paused",
    PausedData,
    writer="supervisor, on `jobsup pause` (the run's process group got SIGSTOP)",
)


class ResumedData(TypedDict, total=False):
    """`jobsup resume`: the run's process group got SIGCONT; the paused time does not count toward its timeout."""

    #: how long it was paused
    paused_s: Required[float]
    #: the API peer's uid
    requested_by_uid: int
    #: the API peer's pid
    requested_by_pid: int


RESUMED: Final = define(
    "Resumed",
    ResumedData,
    writer="supervisor, on `jobsup resume` (the run's process group got SIGCONT)",
)


class AttemptEndedData(TypedDict, total=False):
    """An attempt of a run with a retry policy ended with a failure the policy retries, and retries are left: the run stays RUNNING (reason Retrying) until AttemptStarted."""

    #: the attempt that ended: 1, 2, ...
    attempt: Required[int]
    #: why it ended (a run reason: Lost, Evicted, OOMKilled, NonZeroExit...)
    reason: Required[str | None]
    #: the attempt's outcome as the backend reported it
    message: str | None
    #: the command's exit code, when it has one
    exit_code: int | None
    #: seconds until the next attempt starts (the backoff)
    retry_in_s: Required[float]
    #: the run's last log line written by this attempt (0: none; `logs --attempt N`)
    last_line: int


ATTEMPT_ENDED: Final = define(
    "AttemptEnded",
    AttemptEndedData,
    writer="supervisor, when an attempt of a run with a retry policy failed in a way the policy retries and "
    "retries are left (with PhaseChanged RUNNING reason Retrying; supervisord.shared.retry)",
)


class AttemptStartedData(TypedDict, total=False):
    """The next attempt of a retried run is being started (its backend's objects or runner are created after this event)."""

    #: the attempt starting: 2, 3, ...
    attempt: Required[int]
    #: the most attempts the policy allows (retries + 1)
    of: int


ATTEMPT_STARTED: Final = define(
    "AttemptStarted",
    AttemptStartedData,
    writer="supervisor, when the backoff after an AttemptEnded is over, before the backend starts the attempt",
)


class ConfigReloadedData(TypedDict, total=False):
    """`jobsup daemon reload`: the daemon and user config were read again and applied (on the stream `daemon`). Key names only, never values."""

    #: the config keys that changed (section.key; names only, never values)
    changed: Required[list[str]]
    #: {added, removed, changed: [hook name]}
    hooks: Required[dict[str, Any]]
    #: changed keys that take effect only at the next daemon start
    restart_needed: list[str]


CONFIG_RELOADED: Final = define(
    "ConfigReloaded",
    ConfigReloadedData,
    writer="daemon, on `jobsup daemon reload` (stream `daemon`, not a run's)",
)


class OutputsRecordedData(TypedDict, total=False):
    """A local run's outputs folder as it was after the run ended: every file with its size, sha256 and mtime (recorded after the terminal phase; symlinks and special files are listed as skipped, never followed)."""

    #: the run's outputs folder
    dir: Required[str]
    #: every regular file, sorted
    files: Required[list[Any]]
    total_bytes: Required[int]
    total_files: Required[int]
    #: symlinks (never followed), special files, unreadable entries
    skipped: list[Any]
    #: files deleted while the list was made
    vanished: list[str]
    #: files past the cap (supervisord.shared.outputscan.MAX_FILES), counted only
    omitted: int
    #: seconds the listing took
    elapsed_s: float


OUTPUTS_RECORDED: Final = define(
    "OutputsRecorded",
    OutputsRecordedData,
    writer="the daemon's outputs recorder, after a local run's terminal phase (also at start for a run whose list a stop cut short)",
)
