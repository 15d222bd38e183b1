"""The Backend protocol: how the supervisor drives one kind of compute.

A backend turns a :class:`RunSpec` into something running (a local process
group, a Kubernetes Job) and reports what happens through a
:class:`RunReporter`, which the supervisor turns into events. Every backend
passes the same conformance suite (``tests/supervisord/backends/``).

Everything a backend needs arrives through its constructor (settings that
hold for every run) or the :class:`RunSpec` (the run); what it learns
leaves through return values or the reporter. A backend reads no config
file itself and keeps no cache between ``preflight`` and ``start``.

Life of a run, as the supervisor calls it::

    tg.start_soon(backend.serve)                  # once, at daemon start
    checks = await backend.doctor()               # on `jobsup doctor`
    warnings = await backend.preflight(spec)      # nothing created; PreflightError
    await backend.start(spec, reporter)           # stage + launch; records the handle
    await backend.supervise(spec, handle, reporter)   # until a terminal phase
    # on cancel, from another task:
    await backend.cancel(spec, handle)            # returns once nothing remains

After a daemon restart the supervisor calls ``supervise`` again with the
recorded handle (``spec.env`` is then empty: env values are never stored);
``supervise`` must resume log ingestion from ``reporter.log_position`` so no
line is lost or doubled, and report the outcome if the run ended while the
daemon was down.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from store import LogBlock
from supervisord.shared.events import Event

__all__ = ["PAUSED", "Backend", "Pausable", "RunReporter", "RunSpec", "paused_message"]

#: The reason of a RUNNING run whose processes are stopped (``jobsup pause``).
PAUSED = "Paused"


def paused_message(run_id: str) -> str:
    """The message of a paused run (the supervisor and the backend record
    the same text, so neither records it twice)."""
    return f"paused: `jobsup resume {run_id}` lets it go on"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything a backend needs to run one run.

    ``timeout_s``: wall-clock limit in seconds. ``env``: the task's env
    values, in memory only (empty when reattaching). ``config``: the
    effective config recorded at submit. ``snapshot``: the source tar (``git
    archive`` of ``commit``), whose sha256 is ``snapshot_sha256``.
    ``run_dir``: a private folder for this run under the state dir.
    ``env_digests``: NAME -> the keyed digest the run recorded for each env
    value (:func:`supervisord.shared.secret.env_digest`), for a backend that records
    what it did with the env. ``manifest``: the Kubernetes manifest path in
    the repository given at submit (None: the backend's default).
    ``submitted``: the run's Submitted event data. Deprecated: a backend
    reads the fields above instead; it goes once the Kubernetes backend does.
    """

    run_id: str
    project: str
    name: str
    backend: str
    command: str
    timeout_s: int
    env: Mapping[str, str]
    config: Mapping[str, Any]
    snapshot: Path
    snapshot_sha256: str
    commit: str
    repo: str
    run_dir: Path
    submitted: Mapping[str, Any]
    manifest: str | None = None
    """The task's Kubernetes manifest path (``--manifest``/``manifest:``), if it set one."""
    env_digests: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    """NAME -> the keyed digest the Submitted event recorded for each env value
    (never a value), for backends that record which env a run got."""
    memory_bytes: int | None = None
    """The run's ``--memory`` limit in bytes (None: none), for a backend that
    enforces it (the local backend's systemd scope, Slurm's ``--mem``)."""
    cpus: float | None = None
    """The run's ``--cpus`` limit (None: none), as ``memory_bytes``."""
    umask: str | None = None
    """The submitting shell's umask as octal text (``"0022"``), for backends
    whose jobs create files on this machine; None: keep the daemon's."""
    env_from: str = "daemon"
    """``submitter``: ``env`` is the whole environment the job starts from
    (the submitting shell's, the run's env on top); ``daemon``: ``env`` goes
    on top of the daemon's environment (supervisord.shared.shellenv)."""
    outputs_dir: Path | None = None
    """The run's outputs folder (``JOBSUP_OUTPUT_DIR``), to create 0700 before
    it starts; None: the run has none (supervisord.daemon.outputs)."""
    links: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Symlinks to make in the source folder: relative path -> absolute
    target, checked at submit (supervisord.shared.links)."""
    jobsup_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Variables jobsup sets for a local job (no secrets): JOBSUP_SUBMIT_DIR,
    JOBSUP_REPO_DIR, JOBSUP_OUTPUT_DIR, JOBSUP_AFTER_OUTPUTS."""
    attempt: int = 1
    """Which attempt of the run this is (1, 2, ...: supervisord.shared.retry). A
    backend keeps what it creates for attempt N > 1 apart from the earlier
    attempts' (the local backend: ``run_dir/a<N>`` and log sources
    ``a<N>/...``; Kubernetes: Job ``<name>-a<N>``), so a retried run never
    meets its previous attempt's objects, files or log positions."""


@runtime_checkable
class RunReporter(Protocol):
    """The supervisor's side: each call appends events to the run's stream."""

    async def phase(
        self,
        phase: str,
        *,
        reason: str | None = None,
        message: str | None = None,
        exit_code: int | None = None,
        final: bool = False,
    ) -> bool:
        """Record a phase change; returns False when it was dropped because
        the run is already terminal, the phase would go backwards, or a cancel
        owns the outcome. ``final``: a terminal phase that is the run's own
        final word (the local runner's final status, a Job's terminal
        condition), which a cancel in progress does not override."""
        ...

    async def handle(self, handle: Mapping[str, Any]) -> None:
        """Record how to find the run again (HandleRecorded)."""
        ...

    async def record(self, event: Event) -> None:
        """Record any other event, made through the catalog
        (``reporter.record(STAGING_STEP({"step": "staged"}))``: see
        :mod:`supervisord.shared.events`)."""
        ...

    async def log_lines(self, stream: str, source: str, lines: Sequence[tuple[str, str]]) -> None:
        """Record ``(pos, text)`` lines read from ``source``; lines at or
        before the newest recorded position add nothing (see
        :mod:`store.logblocks`). The per-line form (Kubernetes)."""
        ...

    async def log_block(self, block: LogBlock) -> None:
        """Record a block of lines (:class:`store.LogBlock`); lines at or
        before the newest recorded position of its source add nothing. The
        bulk form (local files): one event and one transaction per block."""
        ...

    async def log_blocks(self, blocks: Sequence[LogBlock]) -> None:
        """Record ``blocks`` (one event each, in order) in one transaction:
        the local backend's blocks of one read of its output record, which
        alternate between stdout and stderr as the job wrote them."""
        ...

    async def log_position(self, source: str) -> str | None:
        """The position of the newest recorded line from ``source``."""
        ...


@runtime_checkable
class Backend(Protocol):
    """One kind of compute. Implementations: ``local``, ``kubernetes``."""

    #: The name tasks use in ``backend:``.
    name: str

    async def preflight(self, spec: RunSpec) -> list[str]:
        """Check the run can start; return warnings. Raises PreflightError
        (one line per problem). Creates nothing."""
        ...

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        """Stage the source and launch the run; return the handle, which it
        has already recorded through ``reporter.handle`` before returning.
        Raises BackendError after undoing what it created."""
        ...

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        """Follow the run until it is terminal: phases and logs through
        ``reporter``; return after reporting the terminal phase."""
        ...

    async def cancel(self, spec: RunSpec, handle: Mapping[str, Any]) -> None:
        """Stop the run and return once nothing of it remains. Idempotent."""
        ...

    async def doctor(self) -> list[dict[str, Any]]:
        """Checks for ``jobsup doctor``, each ``{"name": str, "ok": bool,
        "detail": str}`` (the API's wire shape). Never raises for a failed
        check: it is an item with ``ok`` False."""
        ...

    async def serve(self) -> None:
        """Background work shared by all runs (e.g. one watch per namespace).

        The daemon runs this in its task group for the daemon's lifetime and
        cancels it at shutdown; a backend with nothing shared returns at once.
        """
        ...

    async def aclose(self) -> None:
        """Release clients and threads (not the runs: they keep running)."""
        ...


@runtime_checkable
class Pausable(Protocol):
    """A backend whose runs can be paused (``jobsup pause``/``resume``): the
    local one. While paused, ``supervise`` reports RUNNING with reason
    :data:`PAUSED` and :func:`paused_message`."""

    async def pause(self, spec: RunSpec, handle: Mapping[str, Any]) -> dict[str, Any]:
        """Stop the run's processes (it keeps its resources) and return once
        they are stopped, with the backend's status of the run. Raises
        BackendError (one line) when it cannot."""
        ...

    async def resume(self, spec: RunSpec, handle: Mapping[str, Any]) -> dict[str, Any]:
        """Let a paused run's processes go on and return once they do, with
        the backend's status (``last_pause_s``: how long that pause was).
        Raises BackendError (one line) when it cannot."""
        ...
