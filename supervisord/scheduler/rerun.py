"""``jobsup rerun RUN``: submit a recorded run's task again as a new run.

The new run gets the recorded run's task (command, name, backend, timeout,
manifest), source (commit and snapshot), effective config and scheduling
options. Env values are never recorded: the client sends values for the
names it could fill (from its environment or ``--env``); a name without a
value is left out of the new run and reported back. A local run that
started from the submitting shell's environment (``local.env_from:
submitter``) reruns from the environment of the shell that runs
``rerun`` (``shell_env``), or from the daemon's when the caller sent none
(the web page).

``rerun RUN --rev REV`` runs another commit of the same repository (a new
snapshot), ``-- CMD…`` another command, and ``--with-dependents`` submits
again, after the new run, the runs that ended CANCELED ``DependencyFailed``
because of RUN (transitively): each with its dependencies on the old runs
pointing at their reruns.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store import SUBMITTED, EventStore, RunStatus
from supervisord.exceptions import SourceError, TaskError, UsageError
from supervisord.scheduler.options import scheduling_of
from supervisord.secret import env_digest
from supervisord.shellenv import DEFAULT_ENV_FROM, check_shell_env, shell_env_digest
from supervisord.supervisor import Supervisor

if TYPE_CHECKING:
    from supervisord.scheduler.driver import Scheduler

__all__ = ["check_dependencies_alive", "failed_dependents", "rerun_env_from", "rerun_run", "rerun_submitted"]

_DEP_KEYS = ("after", "after_any", "after_failed")
#: ``(repo, rev) -> a Submitted source`` (supervisord.submit.Planner.source_at).
SourceAt = Callable[[Path, str], Awaitable[dict[str, Any]]]


def rerun_submitted(
    old_id: str,
    old: Mapping[str, Any],
    env: Mapping[str, str],
    *,
    digest_key: bytes,
    snapshot_exists: bool,
    hold: bool = False,
    source: Mapping[str, Any] | None = None,
    command: str | None = None,
    shell_env: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The Submitted data of a rerun of ``old_id`` (whose Submitted data is
    ``old``) with ``env`` values, and the recorded env names that ``env``
    does not fill. ``source`` (another commit, ``--rev``) and ``command``
    (``-- CMD…``) replace the recorded ones. Raises TaskError for env values
    that are not strings or an empty command, and SourceError when the
    recorded snapshot is gone (and no ``source`` is given)."""
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TaskError("rerun: env must map names to string values")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise TaskError("rerun: the command after `--` is empty")
    if source is None and not snapshot_exists:
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
    new.pop("shell_env", None)
    if old.get("backend") == "local":
        from_shell = rerun_env_from(old) == "submitter" and shell_env is not None
        new["env_from"] = "submitter" if from_shell else "daemon"
        if from_shell and shell_env is not None:
            new["shell_env"] = shell_env_digest(shell_env, digest_key)
    new["rerun_of"] = old_id
    new["submitted_by_uid"] = os.getuid()
    if source is not None:
        new["source"] = dict(source)
    if command is not None:
        new["command"] = command
    return new, missing


async def failed_dependents(store: EventStore, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The runs that ended CANCELED ``DependencyFailed`` because of
    ``run_id``, directly or through one another: ``(id, Submitted data)``
    in submit order."""
    canceled = [r.id for r in await store.list_runs(phases=["CANCELED"]) if r.reason == "DependencyFailed"]
    firsts = sorted(
        (e for e in (await store.first_events(canceled)).values() if e.type == SUBMITTED), key=lambda e: e.seq
    )
    found = {run_id}
    out: list[tuple[str, dict[str, Any]]] = []
    for e in firsts:  # submit order: a dependent comes after what it depends on
        sched = scheduling_of(e.data)
        if any(d in found for key in _DEP_KEYS for d in sched[key]):
            found.add(e.run_id)
            out.append((e.run_id, dict(e.data)))
    return out


def rerun_env_from(old: Mapping[str, Any]) -> str:
    """``local.env_from`` of a recorded run's effective config (its default
    for a run recorded before the key)."""
    local = (old.get("config") or {}).get("local") or {}
    return str(local.get("env_from") or DEFAULT_ENV_FROM) if isinstance(local, Mapping) else DEFAULT_ENV_FROM


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
    rev: str | None = None,
    command: str | None = None,
    source_at: SourceAt | None = None,
    renamed: Mapping[str, str] | None = None,
    shell_env: Any = None,
) -> tuple[RunStatus, list[str]]:
    """Submit a rerun of ``run_id`` (a full id) with the ``env`` values the
    caller could fill and the caller's ``shell_env`` (a local run's
    environment when it started from the submitting shell's; None: the
    daemon's): ``(the new run, the env names left without a value)``.
    ``rev``: run that commit of the run's repository instead (snapshotted
    with ``source_at``); ``command``: run this instead; ``renamed``: old
    run id -> its rerun, for the dependencies (``rerun --with-dependents``).
    Raises UsageError when a run it starts after ended other than
    COMPLETED (:func:`check_dependencies_alive`), and what
    :func:`rerun_submitted`, ``source_at``,
    :meth:`~supervisord.scheduler.driver.Scheduler.prepare` and
    :meth:`~supervisord.supervisor.Supervisor.submit` raise (nothing is
    recorded then)."""
    first = await supervisor.store.read_all(0, limit=1, run_id=run_id)
    old = first[0].data if first else {}
    sha = str((old.get("source") or {}).get("snapshot_sha256") or "")
    source = None
    if rev is not None:
        if source_at is None:
            raise TaskError("--rev: this daemon cannot snapshot another commit here")
        source = await source_at(Path(str((old.get("source") or {}).get("repo") or "")), rev)
    shell = check_shell_env(shell_env) if shell_env is not None else None
    new, missing = rerun_submitted(
        run_id,
        old,
        env,
        digest_key=digest_key,
        snapshot_exists=bool(sha) and supervisor.snapshots.path_for(sha).exists(),
        hold=hold,
        source=source,
        command=command,
        shell_env=shell,
    )
    if renamed:
        sched = dict(new["scheduling"])
        for key in _DEP_KEYS:
            sched[key] = [renamed.get(d, d) for d in sched.get(key) or []]
        new["scheduling"] = sched
    after = list(new["scheduling"]["after"])
    check_dependencies_alive(run_id, after, await supervisor.store.get_runs(after))
    if scheduler is not None:
        new = await scheduler.prepare(new)
    values = {k: v for k, v in env.items() if k in (old.get("env") or {})}
    if new.get("env_from") == "submitter" and shell is not None:
        values = {**shell, **values}
    run = await supervisor.submit(new, env=values, config=None, force=force)
    return run, missing
