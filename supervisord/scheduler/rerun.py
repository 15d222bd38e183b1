"""``jobsup rerun RUN``: submit a recorded run's task again as a new run.

The new run gets the recorded run's task (command, name, backend, timeout,
manifest), source (commit and snapshot), effective config and scheduling
options. Env values are never recorded: the client sends values for the
names it could fill (from its environment or ``--env``); a name without a
value is left out of the new run and reported back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from store import RunStatus
from supervisord.exceptions import SourceError, TaskError, UsageError
from supervisord.scheduler.options import scheduling_of
from supervisord.secret import env_digest
from supervisord.supervisor import Supervisor

if TYPE_CHECKING:
    from supervisord.scheduler.driver import Scheduler

__all__ = ["check_dependencies_alive", "rerun_run", "rerun_submitted"]


def rerun_submitted(
    old_id: str,
    old: Mapping[str, Any],
    env: Mapping[str, str],
    *,
    digest_key: bytes,
    snapshot_exists: bool,
    hold: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """The Submitted data of a rerun of ``old_id`` (whose Submitted data is
    ``old``) with ``env`` values, and the recorded env names that ``env``
    does not fill. Raises TaskError for env values that are not strings and
    SourceError when the recorded snapshot is gone."""
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TaskError("rerun: env must map names to string values")
    if not snapshot_exists:
        sha = str((old.get("source") or {}).get("snapshot_sha256") or "?")
        raise SourceError(f"rerun {old_id}: its source snapshot {sha[:12]} is no longer in the state dir")
    names = sorted((old.get("env") or {}).keys())
    values = {k: env[k] for k in names if k in env}
    missing = [k for k in names if k not in env]
    # What belonged to the old submit request, not to the task: a rerun is
    # its own request (a reused request_id would make a client that lost its
    # connection find the old run).
    new = {k: v for k, v in old.items() if k not in ("request_id", "submitted_by_pid")}
    sched = scheduling_of(old)
    sched["hold"] = hold
    new["scheduling"] = sched
    new["env"] = env_digest(values, digest_key)
    new["rerun_of"] = old_id
    new["submitted_by_uid"] = os.getuid()
    return new, missing


def check_dependencies_alive(old_id: str, after: list[str], statuses: Mapping[str, RunStatus]) -> None:
    """Refuse a rerun of ``old_id`` that would end ``DependencyFailed`` at
    once: one of the runs in its ``after`` (full ids; ``statuses`` their
    run statuses) ended other than COMPLETED. Raises UsageError naming that
    run and how it ended, with what to do instead."""
    for dep in after:
        status = statuses.get(dep)
        if status is None or not status.terminal or status.phase == "COMPLETED":
            continue
        how = status.phase + (f" ({status.reason})" if status.reason else "")
        raise UsageError(
            f"rerun {old_id}: it starts after run {dep}, which ended {how}: the new run would end "
            "CANCELED (DependencyFailed) at once; rerun "
            f"{dep} first, then submit this task again with --after <that run's id>"
        )


async def rerun_run(
    supervisor: Supervisor,
    scheduler: Scheduler | None,
    digest_key: bytes,
    run_id: str,
    env: Mapping[str, str],
    *,
    hold: bool = False,
    force: bool = False,
) -> tuple[RunStatus, list[str]]:
    """Submit a rerun of ``run_id`` (a full id) with the ``env`` values the
    caller could fill: ``(the new run, the env names left without a
    value)``. Raises UsageError when a run it starts after ended other
    than COMPLETED (:func:`check_dependencies_alive`), and what :func:`rerun_submitted`,
    :meth:`~supervisord.scheduler.driver.Scheduler.prepare` and
    :meth:`~supervisord.supervisor.Supervisor.submit` raise (nothing is
    recorded then)."""
    first = await supervisor.store.read_all(0, limit=1, run_id=run_id)
    old = first[0].data if first else {}
    sha = str((old.get("source") or {}).get("snapshot_sha256") or "")
    new, missing = rerun_submitted(
        run_id,
        old,
        env,
        digest_key=digest_key,
        snapshot_exists=bool(sha) and supervisor.snapshots.path_for(sha).exists(),
        hold=hold,
    )
    after = list(new["scheduling"]["after"])
    check_dependencies_alive(run_id, after, await supervisor.store.get_runs(after))
    if scheduler is not None:
        new = await scheduler.prepare(new)
    values = {k: v for k, v in env.items() if k in (old.get("env") or {})}
    run = await supervisor.submit(new, env=values, config=None, force=force)
    return run, missing
