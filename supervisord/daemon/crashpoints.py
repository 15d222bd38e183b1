"""The durable steps of the run protocol, by name, and a test-only crash at each.

Every step after which a daemon killed with ``kill -9`` leaves a different
state on disk is named in :data:`POINTS`, in protocol order, and the code
calls :func:`crash_point` with that name right after the step (a test in
``tests/supervisord/crashpoints/`` checks that the calls in the source are
exactly these names, so a new step cannot be added without one).

``JOBSUP_TEST_CRASH_AT=<name>`` in the daemon's environment makes the daemon
SIGKILL itself the first time it reaches that point; the crash-point tests
then start a daemon without it and check that every run still executes at
most once, ends with its runner's outcome, shares no GPU and leaves no
pending file. The variable is read once, at import; when it is unset (in
production) a call is one global lookup and a comparison.
"""

from __future__ import annotations

import os
import signal
from typing import Final

__all__ = ["ENV_VAR", "POINTS", "crash_point"]

#: The environment variable that names the point to crash at (tests only).
ENV_VAR: Final = "JOBSUP_TEST_CRASH_AT"

#: Every durable step, in protocol order, with what is on disk right after it.
POINTS: Final[tuple[str, ...]] = (
    # submit -> pending file -> Submitted
    "submit.pending_written",  # <run dir>/pending.json (env values) written; no Submitted yet
    "submit.recorded",  # Submitted committed; the client has no answer yet
    # sweep submit -> one pending file -> SweepSubmitted and every Submitted in one transaction
    "sweep.pending_written",  # <runs dir>/<sweep id>/pending.json written; nothing of the sweep recorded
    "sweep.recorded",  # SweepSubmitted and its runs' Submitted committed; the client has no answer yet
    # admission
    "admit.recorded",  # Admitted + PhaseChanged SCHEDULING committed; nothing started
    # spawn -> handle (local)
    "start.locked",  # the run's launch lock is taken; no runner yet
    "start.spawned",  # the runner is running; its handle is not recorded
    # handle (any backend)
    "start.handle_recorded",  # HandleRecorded committed; pending.json still there
    "start.pending_removed",  # pending.json removed: the start is complete
    # Kubernetes start
    "k8s.handle_planned",  # the planned objects are recorded; none created yet
    "k8s.objects_created",  # the Job and its Secret exist; "created" not recorded
    "k8s.staged",  # the source is in the pod; the staged pod not recorded
    # RUNNING
    "phase.running_recorded",  # PhaseChanged RUNNING committed
    # status final -> last lines -> terminal event -> resources freed
    "final.status_seen",  # the runner's final status is read; its last lines not recorded
    "final.lines_recorded",  # the last lines are recorded; the terminal phase is not
    "terminal.recorded",  # the terminal PhaseChanged committed; the GPUs not freed
    "resources.freed",  # ResourcesFreed committed
    # the memory watchdog (usage sampler)
    "usage.over_limit_stopping",  # ResourceUsage with over_limit committed, the run signalled; its end not recorded
    # retries (supervisord.shared.retry): attempt ended -> backoff -> attempt started -> start
    "retry.attempt_ended",  # AttemptEnded + PhaseChanged RUNNING Retrying committed; the backoff begins
    "retry.attempt_started",  # AttemptStarted committed; the attempt's backend start not begun
    # cancel
    "cancel.requested",  # CancelRequested committed; the backend not asked to stop
    "cancel.stopped",  # the backend stopped the run; the outcome not recorded
    # hold / release
    "hold.recorded",  # Held committed
    "release.recorded",  # HoldReleased committed
    # retention
    "retention.archived",  # a run's log text is in its archive file and LogsArchived committed
    "retention.archive_deleted",  # an archive's text is deleted and recorded
    "retention.run_dir_removed",  # a run's folder is removed
)

_TARGET: Final[str | None] = os.environ.get(ENV_VAR) or None


def crash_point(name: str) -> None:
    """The daemon has just completed the durable step ``name`` (one of
    :data:`POINTS`): SIGKILL this process when ``JOBSUP_TEST_CRASH_AT``
    names it, else do nothing."""
    if _TARGET is not None and name == _TARGET:
        os.kill(os.getpid(), signal.SIGKILL)
