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
from collections.abc import Mapping
from typing import Any

from store import SUBMITTED, EventStore, RunStatus
from supervisord.shared.exceptions import SourceError, TaskError, UsageError
from supervisord.shared.scheduling import scheduling_of
from supervisord.shared.secret import env_digest
from supervisord.shared.shellenv import DEFAULT_ENV_FROM, shell_env_digest

__all__ = ["DEP_KEYS", "check_dependencies_alive", "failed_dependents", "rerun_env_from", "rerun_submitted"]

#: The scheduling keys that name the runs a run starts after.
DEP_KEYS = ("after", "after_any", "after_failed")


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
        if any(d in found for key in DEP_KEYS for d in sched[key]):
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
