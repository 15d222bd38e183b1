"""The per-run reconciler: follows one run until it is terminal (the
``supervise`` of the Backend protocol, also how a restarted daemon
reattaches).

It follows the run through the namespace's shared watches
(:mod:`.client.watches`), maps Job and pod state to phases (:mod:`.phase`),
follows the leader pod's log (:mod:`.logs`), stages the source into a
replacement pod (after an eviction, or when the daemon died mid-staging),
and on the Job's end drains the logs, deletes auxiliary objects (Services,
ConfigMaps...; the Job and its Secret are left to the Job's TTL) and
reports the outcome. A Job that disappears without a cancel is DELETED,
unless it was seen finished.

:class:`RunReconciler` receives every collaborator it uses (the cluster,
the watch view, the launcher that stages, the cleanup that deletes); it
knows nothing of the backend object. :func:`supervise_run` sets it up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.backends.kubernetes.cleanup import Cleanup
from supervisord.daemon.backends.kubernetes.client.access import Cluster
from supervisord.daemon.backends.kubernetes.client.errors import KubernetesApiError
from supervisord.daemon.backends.kubernetes.client.resources import ObjectRef, ResourceResolver
from supervisord.daemon.backends.kubernetes.client.watches import RunView, job_pods
from supervisord.daemon.backends.kubernetes.connections import Connections
from supervisord.daemon.backends.kubernetes.launch import Launcher
from supervisord.daemon.backends.kubernetes.logs import ContainerState, LogFollower
from supervisord.daemon.backends.kubernetes.phase import (
    Observation,
    container_status,
    container_times,
    current_pod,
    job_outcome,
    leader_pod,
    pod_is_terminal,
    pod_progress,
)
from supervisord.daemon.backends.kubernetes.runstate import (
    RunFailed,
    RunSettings,
    RunState,
    StartCanceled,
    attempt_env_secret,
    reason_of,
    wall_to_monotonic,
)
from supervisord.shared.events import CLEANUP_FAILED, CONTAINER_TIMES, LEADER_POD_CHANGED, ContainerTimesData
from supervisord.shared.exceptions import BackendError

__all__ = ["LogSettings", "RunReconciler", "supervise_run"]

log = structlog.get_logger("jobsup.kubernetes.reconciler")


@dataclasses.dataclass(frozen=True)
class LogSettings:
    """Log follow timings in seconds: ``stall_s``/``stall_max_s`` (stall
    detection), ``final_read_s`` (the last read after the container ends)."""

    stall_s: float = 30.0
    stall_max_s: float = 300.0
    final_read_s: float = 30.0


async def supervise_run(
    spec: RunSpec,
    handle: Mapping[str, Any],
    reporter: RunReporter,
    *,
    state: RunState,
    connections: Connections,
    launcher: Launcher,
    cleanup: Cleanup,
    logs: LogSettings,
    stats: dict[str, int],
) -> None:
    """Follow the run until it is terminal. A handle without a namespace,
    or whose objects were not all created, is a submit the daemon stopped
    in the middle of: what exists is deleted and the run is ERROR."""
    if not handle or not handle.get("namespace"):
        await cleanup.abandoned_submit(None, "", spec.run_id, [], reporter)
        return
    cluster = await connections.cluster(str(handle.get("context")) if handle.get("context") else None)
    ns = str(handle["namespace"])
    resolver = connections.resolver(cluster)
    if not handle.get("created"):
        refs = [ObjectRef.from_json(o) for o in handle.get("objects") or []]
        await cleanup.abandoned_submit(resolver, ns, spec.run_id, refs, reporter)
        return
    watch = await connections.watch(cluster, ns)
    view = watch.view(spec.run_id)
    try:
        await watch.wait_synced(view, 60.0)
        run = RunReconciler(
            cluster=cluster,
            resolver=resolver,
            ns=ns,
            view=view,
            state=state,
            reporter=reporter,
            spec=spec,
            handle=dict(handle),
            launcher=launcher,
            cleanup=cleanup,
            logs=logs,
            stats=stats,
        )
        await run.run()
    finally:
        watch.forget(spec.run_id)


class RunReconciler:
    """Supervising one run: drives it to its end from what the shared
    watches show (see the module docstring).

    Collaborators, all given: ``cluster`` and ``resolver`` (the run's
    context), ``ns``, ``view`` (the run's part of the namespace's shared
    watches), ``state`` (the backend's in-memory state of the run),
    ``reporter``, ``spec``, ``handle`` (the recorded handle; updated as pods
    are staged), ``launcher`` (stages the source into replacement pods),
    ``cleanup`` (rollback and the end-of-run deletions), ``logs`` (log
    follow timings) and ``stats`` (counters for tests and benchmarks).
    """

    def __init__(
        self,
        *,
        cluster: Cluster,
        resolver: ResourceResolver,
        ns: str,
        view: RunView,
        state: RunState,
        reporter: RunReporter,
        spec: RunSpec,
        handle: dict[str, Any],
        launcher: Launcher,
        cleanup: Cleanup,
        logs: LogSettings,
        stats: dict[str, int],
    ) -> None:
        self.cluster = cluster
        self.resolver = resolver
        self.launcher = launcher
        self.cleanup = cleanup
        self.logs = logs
        self.stats = stats
        self.ns = ns
        self.view = view
        self.state = state
        self.reporter = reporter
        self.spec = spec
        self.handle = handle
        self.job_name = str(handle["job"])
        self.container = str(handle["script_container"])
        self.staged: set[str] = set(handle.get("staged_pods") or [])
        self.staging: set[str] = set()
        self.followers: dict[str, LogFollower] = {}
        self.leader: str | None = None
        self.last_job: dict[str, Any] | None = None
        self.settings = RunSettings.of(spec)
        self.failed: BackendError | None = None
        # Set while a failed staging rolls the run's objects back: the Job
        # disappearing then is jobsup's doing, not an outside delete.
        self.rolling_back = False
        # (pod, "started" | "finished") already recorded as ContainerTimes.
        self._times_noted: set[tuple[str, str]] = set()

    async def _note_times(self, pods: list[Mapping[str, Any]]) -> None:
        """Record ``ContainerTimes`` when the leader pod's script container
        shows a start or finish time not recorded yet (the run's started_at
        and ended_at come from them, not from when jobsup looked)."""
        pod = leader_pod(pods)
        if pod is None:
            return
        name = str(pod["metadata"]["name"])
        started, finished = container_times(pod, self.container)
        new = {
            key: value
            for key, value in (("started_at", started), ("finished_at", finished))
            if value is not None and (name, key) not in self._times_noted
        }
        if not new:
            return
        data: ContainerTimesData = {"pod": name, "container": self.container}
        if "started_at" in new:
            data["started_at"] = new["started_at"]
        if "finished_at" in new:
            data["finished_at"] = new["finished_at"]
        await self.reporter.record(CONTAINER_TIMES(data))
        self._times_noted.update((name, key) for key in new)

    def _container_state(self, pod_name: str) -> ContainerState:
        pod = self.view.pods.get(pod_name)
        if pod is None:
            return "gone"
        if pod_is_terminal(pod):
            return "terminated"
        state = ((container_status(pod, self.container) or {}).get("state")) or {}
        if "terminated" in state:
            return "terminated"
        if "running" in state:
            return "running"
        return "waiting"

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            await self._loop(tg)
            tg.cancel_scope.cancel()
        if self.failed is not None:
            raise self.failed

    async def _loop(self, tg: anyio.abc.TaskGroup) -> None:
        while True:
            token = self.view.token()
            if self.failed is not None:
                return
            if self.rolling_back:
                await self.view.wait(5.0, token)
                continue
            job = self.view.jobs.get(self.job_name)
            if job is None and not self.state.canceled:
                job = await self._confirm_job()
            if job is not None:
                self.last_job = job
            pods = job_pods(job or self.last_job or {"metadata": {"name": self.job_name}}, self.view.pods)
            if self.state.canceled:
                # A Job that had already finished when the cancel came keeps
                # its own outcome (the cancel deletes the Job, never adds a
                # terminal condition to it).
                seen = job or self.view.deleted_jobs.get(self.job_name) or self.last_job
                outcome = job_outcome(seen, pods, self.container) if seen else None
                if outcome is not None and outcome.terminal:
                    await self._report_outcome(outcome)
                    return
                if job is None and not pods:
                    return
                await self.view.wait(5.0, token)
                continue
            await self._ensure_followers(tg, pods)
            if job is None:
                await self._note_times(pods)
                await self._job_gone(pods)
                return
            outcome = job_outcome(job, pods, self.container)
            if outcome is not None:
                settled = await self._settled_pods(job, pods)
                if settled is not pods:
                    outcome = job_outcome(job, settled, self.container) or outcome
                await self._note_times(settled)
                await self._finish(outcome)
                return
            await self._note_times(pods)
            self._ensure_staging(tg, job, pods)
            obs = pod_progress(pods, self.container, staged=bool(self.staged))
            await self.reporter.phase(obs.phase, reason=obs.reason, message=obs.message)
            await self.view.wait(30.0, token)

    async def _settled_pods(self, job: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """``pods``, or the pods as the API server has them now when the
        cached current pod has not terminated although the Job has finished:
        the Job and Pod watches are separate streams (one may lag, e.g.
        relisting after a 410), and the failure's cause is in the pod's
        terminated state. ``pods`` itself when the list fails."""
        pod = current_pod(pods)
        if pod is None or pod_is_terminal(pod):
            return pods
        try:
            listed = await self.resolver.list_run("v1", "Pod", self.ns, self.spec.run_id)
        except KubernetesApiError as err:
            log.warning("cannot list the run's pods; using the cached ones", run=self.spec.run_id, error=str(err))
            return pods
        fresh = job_pods(job, {str(p["metadata"]["name"]): p for p in listed})
        # The log follower waits for the pod's end too: let it see it now.
        self.view.adopt_ended_pods(fresh)
        return fresh or pods

    async def _confirm_job(self) -> dict[str, Any] | None:
        """The Job is not in the watch cache: ask the API server (the cache
        may lag); None when it is really gone."""
        if self.job_name in self.view.deleted_jobs:
            return None
        try:
            return await self.resolver.get("batch/v1", "Job", self.job_name, self.ns)
        except KubernetesApiError as err:
            log.warning("cannot read the Job; waiting", run=self.spec.run_id, error=str(err))
            return self.last_job or {"metadata": {"name": self.job_name}, "status": {}}

    async def _job_gone(self, pods: list[Mapping[str, Any]]) -> None:
        last = self.view.deleted_jobs.get(self.job_name) or self.last_job
        outcome = job_outcome(last, pods, self.container) if last else None
        await self._drain_logs()
        if outcome is not None and outcome.terminal:
            await self._report_outcome(outcome)
            return
        await self.reporter.phase(
            "DELETED",
            reason="JobDeleted",
            message=f"Job {self.job_name} was deleted (not by jobsup) before it finished; the logs recorded so far are kept",
        )

    async def _ensure_followers(self, tg: anyio.abc.TaskGroup, pods: list[Mapping[str, Any]]) -> None:
        """Follow the leader pod's log; on a new leader (a replacement
        after an eviction) record ``LeaderPodChanged`` and follow it too (the
        old follower ends with its container)."""
        leader = leader_pod(pods)
        if leader is None:
            return
        name = str(leader["metadata"]["name"])
        if name == self.leader:
            return
        previous, self.leader = self.leader, name
        if previous is not None:
            await self.reporter.record(LEADER_POD_CHANGED({"from": previous, "to": name}))
        if name in self.followers:
            return
        follower = LogFollower(
            self.cluster,
            self.ns,
            name,
            self.container,
            self.reporter,
            lambda: self._container_state(name),
            self.view.token,
            stall_s=self.logs.stall_s,
            stall_max_s=self.logs.stall_max_s,
            final_read_s=self.logs.final_read_s,
            stats=self.stats,
        )
        self.followers[name] = follower
        tg.start_soon(follower.run, name=f"k8s-logs {self.spec.run_id} {name}")

    def _ensure_staging(self, tg: anyio.abc.TaskGroup, job: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> None:
        for pod in pods:
            name = str(pod["metadata"]["name"])
            if (
                name in self.staged
                or name in self.staging
                or pod_is_terminal(pod)
                or pod["metadata"].get("deletionTimestamp")
            ):
                continue
            if not self.spec.snapshot_sha256 or not Path(self.spec.snapshot).is_file():
                continue
            first = not self.staged
            start = (
                (job.get("metadata") or {}).get("creationTimestamp")
                if first
                else (pod.get("metadata") or {}).get("creationTimestamp")
            )
            deadline = wall_to_monotonic(start, self.settings.pod_ready_timeout_s)
            self.staging.add(name)
            tg.start_soon(self._stage_one, name, deadline, first)

    async def _stage_one(self, pod_name: str, deadline: float, first: bool) -> None:
        others = frozenset(p for p in self.view.pods if p != pod_name)
        try:
            staged = await self.launcher.stage(
                self.cluster,
                self.ns,
                self.view,
                self.state,
                self.reporter,
                self.handle,
                self.spec,
                deadline=deadline,
                timeout_s=self.settings.pod_ready_timeout_s,
                exclude=others,
            )
        except StartCanceled:
            return
        except BackendError as err:
            self.rolling_back = True
            try:
                refs = [ObjectRef.from_json(o) for o in self.handle.get("objects") or []]
                undone = await self.cleanup.rollback(self.resolver, self.ns, list(reversed(refs)), self.reporter)
                self.failed = RunFailed(f"{err}{undone}", reason_of(err, "StagingFailed"))
            finally:
                self.rolling_back = False
                self.view.notify()
            return
        finally:
            self.staging.discard(pod_name)
        self.staged.add(staged)
        self.handle["staged_pods"] = sorted(self.staged)
        await self.reporter.handle(self.handle)
        if not first:
            log.info("staged the source into a replacement pod", run=self.spec.run_id, pod=staged)
        self.view.notify()

    async def _drain_logs(self) -> None:
        """Let every follower finish (they end once their container has
        terminated and the final read is done), at most final_read_s + 15 s."""
        with anyio.move_on_after(self.logs.final_read_s + 15.0):
            for follower in list(self.followers.values()):
                await follower.done.wait()

    async def _finish(self, outcome: Observation) -> None:
        """The Job ended: drain the logs, delete auxiliary objects, report."""
        await self._drain_logs()
        await self._delete_auxiliary()
        await self._report_outcome(outcome)

    async def _report_outcome(self, outcome: Observation) -> None:
        if self.staged:
            # The command ran, even when no look saw it running.
            await self.reporter.phase("RUNNING")
        await self.reporter.phase(
            outcome.phase, reason=outcome.reason, message=outcome.message, exit_code=outcome.exit_code, final=True
        )

    async def _delete_auxiliary(self) -> None:
        """On the Job's end: delete the objects other than the primary Job
        and its env Secret (which the Job's TTL removes), newest first."""
        refs = [ObjectRef.from_json(o) for o in self.handle.get("objects") or []]
        aux = [
            r
            for r in refs
            if not (r.kind == "Job" and r.name == self.job_name) and r.name != attempt_env_secret(self.spec)
        ]
        if not aux:
            return
        try:
            await self.cleanup.delete_refs(self.resolver, self.ns, list(reversed(aux)), self.reporter)
        except BackendError as err:
            log.warning("cleanup of auxiliary objects failed", run=self.spec.run_id, error=str(err))
            await self.reporter.record(CLEANUP_FAILED({"message": str(err)}))
