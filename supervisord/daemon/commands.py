"""The daemon's one command path: every request that changes a run.

:class:`Commands` handles submit (one run or a sweep), rerun (with its
dependents), cancel (a run or a sweep), hold, release, update, pause and
resume. The API handlers (:mod:`supervisord.daemon.api.server`), the page (through
the same service) and the MCP server (through the API) all come here; no
other module calls the supervisor's or the scheduler's write methods for a
request. Every command answers a result with ``warnings`` (one line each,
for the user; empty when there is nothing to say). On the wire a submit,
a sweep and a rerun always carry ``"warnings"``; the other answers carry it
when there are any, so that their documented shapes stay as they are.

One submit pipeline for a new run, whatever planned it::

    plan (the Planner for a submit, the recorded run for a rerun)
      -> Scheduler.prepare (scheduling checked, dependency ids resolved)
      -> Supervisor.submit_run (preflight, Submitted recorded)
      -> the planner's warnings + the preflight's

Admission has one owner, the scheduler (:mod:`supervisord.daemon.scheduler.driver`):
it decides which queued run starts, builds the ``Admitted`` event and hands
it to the supervisor's run gate (:meth:`supervisord.daemon.supervisor.Supervisor.admit`),
which appends it with the run's phase change under the run's lock and lets
the run's supervision go on. The supervisor never decides an admission nor
names the event; a command never admits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from store import RunStatus
from supervisord.daemon.scheduler.driver import Scheduler
from supervisord.daemon.scheduler.rerun import (
    DEP_KEYS,
    check_dependencies_alive,
    failed_dependents,
    rerun_submitted,
)
from supervisord.daemon.scheduler.update import parse_changes
from supervisord.daemon.submit import Planner, SubmitRequest
from supervisord.daemon.supervisor import Supervisor
from supervisord.daemon.sweepread import resolve_sweep_id
from supervisord.daemon.sweeprefs import resolve_refs
from supervisord.shared.exceptions import UsageError
from supervisord.shared.shellenv import check_shell_env

__all__ = [
    "Commands",
    "RerunRequest",
    "RerunResult",
    "RunResult",
    "RunsResult",
    "SweepResult",
    "is_sweep_request",
]

#: Runs of one sweep canceled at the same time.
Peer = Mapping[str, int]


def is_sweep_request(body: Any) -> bool:
    """Whether a ``POST /v1/runs`` body submits a sweep (its task has ``sweep``)."""
    return isinstance(body, dict) and isinstance(body.get("task"), dict) and body["task"].get("sweep") is not None


def _with_warnings(doc: dict[str, Any], warnings: Sequence[str]) -> dict[str, Any]:
    """``doc`` with ``"warnings"`` when there are any: the answers of the
    commands that had none keep their documented shapes (``-o json`` schemas)."""
    return {**doc, "warnings": list(warnings)} if warnings else doc


@dataclasses.dataclass(frozen=True)
class RunResult:
    """One run after a command, and the warnings for the user."""

    run: RunStatus
    warnings: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """``{"run": Run}``, with ``"warnings": [str]`` when there are any."""
        return _with_warnings({"run": self.run.to_json()}, self.warnings)


@dataclasses.dataclass(frozen=True)
class RunsResult:
    """Several runs after a command (update, a sweep's cancel) and, for an
    update, the RunUpdated data (``{"old", "new"}``) of each run that changed."""

    runs: list[RunStatus]
    updated: Mapping[str, Mapping[str, Any]] | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """``{"runs": [Run]}`` (and ``"updated"`` for an update), with
        ``"warnings": [str]`` when there are any."""
        out: dict[str, Any] = {"runs": [r.to_json() for r in self.runs]}
        if self.updated is not None:
            out["updated"] = self.updated
        return _with_warnings(out, self.warnings)


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """A recorded sweep: its id, its ``SweepSubmitted`` data, its runs' ids in order."""

    sweep_id: str
    sweep: Mapping[str, Any]
    run_ids: list[str]
    warnings: list[str]

    def to_json(self) -> dict[str, Any]:
        """``{"sweep": {"id", ...}, "run_ids": [id], "warnings": [str]}``."""
        return {"sweep": {"id": self.sweep_id, **self.sweep}, "run_ids": self.run_ids, "warnings": self.warnings}


@dataclasses.dataclass(frozen=True)
class RerunResult:
    """A rerun: the new run, the env names left without a value, the
    dependents submitted again (``(new run, old id)``) and the warnings."""

    run: RunStatus
    rerun_of: str
    missing_env: list[str]
    dependents: list[tuple[RunStatus, str]]
    warnings: list[str]

    def to_json(self) -> dict[str, Any]:
        """``{"run", "rerun_of", "missing_env", "dependents": [{"run", "rerun_of"}], "warnings"}``."""
        return {
            "run": self.run.to_json(),
            "rerun_of": self.rerun_of,
            "missing_env": self.missing_env,
            "dependents": [{"run": run.to_json(), "rerun_of": old} for run, old in self.dependents],
            "warnings": self.warnings,
        }


@dataclasses.dataclass(frozen=True)
class RerunRequest:
    """The body of ``POST /v1/runs/{ref}/rerun``: env values the client
    could fill, the submitting shell's environment (None: the daemon's),
    ``hold``, ``force``, another commit (``rev``) or command, and whether to
    submit the failed dependents again."""

    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    shell_env: Mapping[str, str] | None = None
    hold: bool = False
    force: bool = False
    rev: str | None = None
    command: str | None = None
    with_dependents: bool = False

    @classmethod
    def from_json(cls, body: Any) -> RerunRequest:
        """Parse a request body; raises UsageError naming the bad field."""
        if not isinstance(body, dict):
            raise UsageError("rerun: the request body must be a JSON object")
        rev, command = body.get("rev"), body.get("command")
        if rev is not None and (not isinstance(rev, str) or not rev.strip()):
            raise UsageError("--rev: give a commit, branch or tag")
        if command is not None and not isinstance(command, str):
            raise UsageError("rerun: command must be a string")
        shell_env = body.get("shell_env")
        return cls(
            env=body.get("env") or {},
            shell_env=check_shell_env(shell_env) if shell_env is not None else None,
            hold=bool(body.get("hold")),
            force=bool(body.get("force")),
            rev=rev,
            command=command,
            with_dependents=bool(body.get("with_dependents")),
        )


class Commands:
    """The one place requests change runs (module docstring), over the
    daemon's supervisor, planner and scheduler (None: a daemon without
    one; ``hold``, ``release`` and ``update`` then raise UsageError)."""

    def __init__(self, supervisor: Supervisor, planner: Planner, scheduler: Scheduler | None = None) -> None:
        self.supervisor = supervisor
        self.planner = planner
        self.scheduler = scheduler

    def _need_scheduler(self, what: str) -> Scheduler:
        if self.scheduler is None:
            raise UsageError(f"{what}: this daemon has no scheduler")
        return self.scheduler

    async def resolve(self, ref: str) -> str:
        """The full run id for ``ref``; raises UsageError, RunNotFoundError, AmbiguousRunError."""
        return await self.supervisor.resolve(ref)

    # -- new runs -------------------------------------------------------------

    async def _record(
        self,
        submitted: Mapping[str, Any],
        *,
        env: Mapping[str, str],
        config: Mapping[str, Any] | None,
        force: bool,
        warnings: Sequence[str] = (),
    ) -> RunResult:
        """The one submit pipeline's last steps: scheduling checked, then
        recorded; the planner's ``warnings`` and the preflight's."""
        prepared = await self.scheduler.prepare(submitted) if self.scheduler is not None else dict(submitted)
        result = await self.supervisor.submit_run(prepared, env=env, config=config, force=force)
        return RunResult(result.run, [*warnings, *result.warnings])

    async def submit(self, req: SubmitRequest, peer: Peer) -> RunResult:
        """Plan and record one run (``peer``: the requester's uid and pid,
        recorded as ``submitted_by_*``). Raises what the planner, the
        scheduler and the supervisor raise; nothing is recorded then."""
        plan = await self.planner.plan(req)
        who = {f"submitted_by_{k}": v for k, v in peer.items()}
        return await self._record(
            {**plan.submitted, **who}, env=plan.env, config=plan.config, force=plan.force, warnings=plan.warnings
        )

    async def submit_sweep(self, req: SubmitRequest, peer: Peer) -> SweepResult:
        """Plan a sweep, check its scheduling once (the runs share it) and
        record it in one transaction. Raises as :meth:`submit`."""
        plan = await self.planner.plan_sweep(req)
        who = {f"submitted_by_{k}": v for k, v in peer.items()}
        first = {**plan.runs[0].submitted, **who}
        prepared = await self.scheduler.prepare(first) if self.scheduler is not None else first
        sched = {"scheduling": prepared["scheduling"]} if "scheduling" in prepared else {}
        runs = [({**p.submitted, **who, **sched}, p.env) for p in plan.runs]
        run_ids, warnings = await self.supervisor.submit_sweep(
            plan.sweep_id, plan.sweep, runs, config=plan.runs[0].config
        )
        return SweepResult(plan.sweep_id, plan.sweep, run_ids, [*plan.warnings, *warnings])

    async def rerun(self, run_id: str, req: RerunRequest) -> RerunResult:
        """Submit ``run_id``'s task again as a new run, then (``with_dependents``)
        the runs that ended CANCELED ``DependencyFailed`` because of it, each
        depending on the reruns (:mod:`supervisord.daemon.scheduler.rerun`)."""
        dependents = await failed_dependents(self.supervisor.store, run_id) if req.with_dependents else []
        first, missing = await self._rerun_one(run_id, req, rev=req.rev, command=req.command, renamed=None)
        renamed = {run_id: first.run.id}
        again: list[tuple[RunStatus, str]] = []
        warnings = list(first.warnings)
        for old_id, _ in dependents:
            dep, _missing = await self._rerun_one(old_id, req, rev=None, command=None, renamed=renamed)
            renamed[old_id] = dep.run.id
            again.append((dep.run, old_id))
            warnings += [w for w in dep.warnings if w not in warnings]
        return RerunResult(first.run, run_id, missing, again, warnings)

    async def _rerun_one(
        self,
        run_id: str,
        req: RerunRequest,
        *,
        rev: str | None,
        command: str | None,
        renamed: Mapping[str, str] | None,
    ) -> tuple[RunResult, list[str]]:
        """One rerun of ``run_id`` (a full id) through the submit pipeline:
        ``(its result, the env names left without a value)``. Raises
        UsageError when a run it starts after ended other than COMPLETED,
        and what :func:`rerun_submitted`, the snapshot of ``rev`` and the
        pipeline raise (nothing is recorded then)."""
        store = self.supervisor.store
        first = await store.read_all(0, limit=1, run_id=run_id)
        old = first[0].data if first else {}
        sha = str((old.get("source") or {}).get("snapshot_sha256") or "")
        source = None
        if rev is not None:
            source = await self.planner.source_at(Path(str((old.get("source") or {}).get("repo") or "")), rev)
        shell = req.shell_env
        new, missing = rerun_submitted(
            run_id,
            old,
            req.env,
            digest_key=self.planner.digest_key,
            snapshot_exists=bool(sha) and self.supervisor.snapshots.path_for(sha).exists(),
            hold=req.hold,
            source=source,
            command=command,
            shell_env=shell,
        )
        if renamed:
            sched = dict(new["scheduling"])
            for key in DEP_KEYS:
                sched[key] = [renamed.get(d, d) for d in sched.get(key) or []]
            new["scheduling"] = sched
        after = list(new["scheduling"]["after"])
        check_dependencies_alive(run_id, after, await store.get_runs(after))
        values = {k: v for k, v in req.env.items() if k in (old.get("env") or {})}
        if new.get("env_from") == "submitter" and shell is not None:
            values = {**shell, **values}
        return await self._record(new, env=values, config=None, force=req.force), missing

    # -- runs that exist ----------------------------------------------------------

    async def cancel(self, run_id: str, peer: Peer | None = None) -> RunResult:
        """Cancel a run (idempotent). Raises as :meth:`Supervisor.cancel`."""
        return RunResult(await self.supervisor.cancel(run_id, requested_by=peer))

    async def cancel_sweep(self, ref: str, peer: Peer | None = None) -> RunsResult:
        """Cancel every run of a sweep (an id or prefix) together, the queued
        ones first (:meth:`Supervisor.cancel_many`; a Slurm sweep's cancels
        then reach its backend at once: one scancel of the array job); the
        runs in sweep order. The others are still canceled when one fails;
        the first error is raised then."""
        store = self.supervisor.store
        runs = await store.sweep_runs(await resolve_sweep_id(store, ref))
        done = {r.id: r for r in await self.supervisor.cancel_many([r.id for r in runs], requested_by=peer)}
        return RunsResult([done[r.id] for r in runs])

    async def cancel_many(self, refs: Sequence[str], peer: Peer | None = None) -> RunsResult:
        """Cancel the runs of ``refs`` (run ids, unique prefixes, sweep ids:
        all of their runs) together (:meth:`Supervisor.cancel_many`); each
        run once, in the order named. Every ref is resolved first, full ids
        in one query: UsageError names each one that names no run (or
        several), and nothing is canceled."""
        run_ids = await resolve_refs(self.supervisor.store, list(refs))
        return RunsResult(await self.supervisor.cancel_many(run_ids, requested_by=peer))

    async def pause(self, run_id: str, peer: Peer | None = None) -> RunResult:
        """Pause a running local run. Raises as :meth:`Supervisor.pause`."""
        return RunResult(await self.supervisor.pause(run_id, requested_by=peer))

    async def resume(self, run_id: str, peer: Peer | None = None) -> RunResult:
        """Resume a paused run. Raises as :meth:`Supervisor.resume`."""
        return RunResult(await self.supervisor.resume(run_id, requested_by=peer))

    async def hold(self, run_id: str) -> RunResult:
        """Hold a queued run (one already held: a warning says so, nothing
        recorded). Raises UsageError when it is not queued."""
        changed = await self._need_scheduler("hold").hold(run_id)
        notes = [] if changed else [f"run {run_id} was already held"]
        return RunResult(await self.supervisor.get(run_id), notes)

    async def release(self, run_id: str) -> RunResult:
        """Release a held run (one that is not held: a warning says so,
        nothing recorded). Raises UsageError when it is not queued."""
        changed = await self._need_scheduler("release").release(run_id)
        notes = [] if changed else [f"run {run_id} was not held: nothing to release"]
        return RunResult(await self.supervisor.get(run_id), notes)

    async def update(self, refs: Sequence[str], changes: Mapping[str, Any]) -> RunsResult:
        """``jobsup update``: change queued runs (``changes``: the request's
        ``priority``, ``gpus``, ``queue``, ``timeout``, parsed by
        :func:`~supervisord.daemon.scheduler.update.parse_changes`). All or
        nothing. Raises UsageError (no run named, a run not queued),
        TaskError (a bad value)."""
        scheduler = self._need_scheduler("update")
        if not refs or not all(isinstance(r, str) for r in refs):
            raise UsageError("update: name at least one run")
        parsed = parse_changes(changes)
        run_ids = list(dict.fromkeys([await self.supervisor.resolve(r) for r in refs]))
        updated = await scheduler.update(run_ids, parsed)
        return RunsResult([await self.supervisor.get(r) for r in run_ids], updated=updated)

    async def set_cap(self, queue: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``jobsup queue set NAME``: ``body`` ``{"max_parallel": int | null,
        "from_config"?: bool}``; the queue document. Raises UsageError."""
        if "max_parallel" not in body and not body.get("from_config"):
            raise UsageError("queue set: give --max-parallel N|none|config")
        return await self._need_scheduler("queue set").set_cap(
            queue, body.get("max_parallel"), from_config=bool(body.get("from_config"))
        )
