"""Launching a run: create its objects, stage its source, roll back on
failure (the ``start`` of the Backend protocol), and staging the source
into a replacement pod later (:meth:`Launcher.stage`, which the reconciler
receives).

``start``: record the handle (the planned objects), server-side dry-run
every object, create the per-run env Secret ``jobsup-env-<run id>`` and
then the manifest's objects in order, recording each as ``ObjectCreated``
before the next; give the Secret an ownerReference to the primary Job;
wait (``kubernetes.pod_ready_timeout_s``, counted from the Job's creation)
for the script container to run, reporting SCHEDULING with the pod's reason
meanwhile, and stage the source (:mod:`.staging`). Any failure deletes what
was created, newest first (:mod:`.cleanup`), and raises BackendError (the
run becomes ERROR with that message). The whole start has one budget
(``start_timeout_s``): when it runs out the run is ERROR ``StartTimeout``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping
from typing import Any

import anyio
import structlog

from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.backends.kubernetes.cleanup import Cleanup, object_data
from supervisord.daemon.backends.kubernetes.client.access import Cluster
from supervisord.daemon.backends.kubernetes.client.errors import KubernetesApiError
from supervisord.daemon.backends.kubernetes.client.resources import (
    ObjectRef,
    ResourceResolver,
    env_secret,
    owner_reference,
)
from supervisord.daemon.backends.kubernetes.client.watches import RunView, job_pods
from supervisord.daemon.backends.kubernetes.connections import Connections
from supervisord.daemon.backends.kubernetes.phase import (
    PERMANENT_WAITING_REASONS,
    container_status,
    current_pod,
    describe_pod,
    job_outcome,
    pod_is_terminal,
    pod_progress,
    terminated_state,
    waiting_failure_reason,
)
from supervisord.daemon.backends.kubernetes.runstate import (
    RunFailed,
    RunSettings,
    RunState,
    StartCanceled,
    attempt_env_secret,
    env_digests,
    reason_of,
    render_spec,
)
from supervisord.daemon.backends.kubernetes.staging import StagingError, stage_source, upload_timeout_s
from supervisord.daemon.crashpoints import crash_point
from supervisord.shared.events import OBJECT_CREATED, STAGING_STEP
from supervisord.shared.exceptions import BackendError
from supervisord.shared.manifest.inject import run_labels
from supervisord.shared.manifest.render import RenderedRun

__all__ = ["START_API_BUDGET_S", "Launcher", "StartProgress"]

log = structlog.get_logger("jobsup.kubernetes.launch")

#: Seconds a start may spend on API calls (dry runs, creates), on top of the
#: pod-ready wait and the upload, before it gives up (``start_timeout_s``).
START_API_BUDGET_S = 120.0


@dataclasses.dataclass
class StartProgress:
    """How far a start got: the ``step`` under way (for the timeout's
    message) and the objects whose create was sent (``attempted``: what a
    timed-out start rolls back, an object whose answer never came
    included)."""

    step: str = "render the manifest"
    attempted: list[ObjectRef] = dataclasses.field(default_factory=list)


class Launcher:
    """Starts runs and stages sources. Collaborators: ``connections``
    (clusters, resolvers, watches), ``cleanup`` (rollback); ``files``
    limits the worker threads reading the manifest from git;
    ``start_timeout_s``: start's budget in all (None: :data:`START_API_BUDGET_S`
    plus the run's ``pod_ready_timeout_s`` plus the upload's budget)."""

    def __init__(
        self,
        connections: Connections,
        cleanup: Cleanup,
        *,
        files: anyio.CapacityLimiter,
        start_timeout_s: float | None = None,
    ) -> None:
        self.connections = connections
        self.cleanup = cleanup
        self.files = files
        self.start_timeout_s = start_timeout_s

    def _start_budget(self, spec: RunSpec, settings: RunSettings) -> float:
        """Seconds ``start`` may take in all (see ``start_timeout_s``)."""
        if self.start_timeout_s is not None:
            return self.start_timeout_s
        try:
            size = spec.snapshot.stat().st_size
        except OSError:
            size = 0
        return START_API_BUDGET_S + settings.pod_ready_timeout_s + upload_timeout_s(size)

    async def start(self, spec: RunSpec, reporter: RunReporter, state: RunState) -> Mapping[str, Any]:
        """Create the run's objects and stage the source; return the handle
        ``{"context", "namespace", "job", "script_container", "objects",
        "created", "staged_pods"}`` (recorded before any object is created,
        and again as objects and staging complete). Raises BackendError
        after deleting what it created; reason ``StartTimeout`` when the
        whole start outlived its budget (an API server that accepts
        connections and never answers), after a rollback with its own
        budget (what it could not delete is recorded as ``CleanupFailed``:
        cleanup pending)."""
        settings = RunSettings.of(spec)
        # Rendered again from the recorded commit: what start needs comes
        # from the RunSpec, never from a cache filled by preflight.
        rendered = await render_spec(spec, settings, limiter=self.files)
        cluster = await self.connections.cluster(settings.context)
        resolver = self.connections.resolver(cluster)
        ns = settings.namespace
        labels = run_labels(run_id=spec.run_id, project=spec.project, name=spec.name)
        secret = env_secret(spec.run_id, ns, labels, spec.env)
        secret["metadata"]["name"] = attempt_env_secret(spec)  # a retry's own (supervisord.shared.retry)
        planned = [ObjectRef.of(secret)] + [ObjectRef.of(o) for o in rendered.objects]
        handle: dict[str, Any] = {
            "context": cluster.context,
            "namespace": ns,
            "job": rendered.primary_job_name,
            "script_container": rendered.script_container,
            "objects": [r.to_json() for r in planned],
            "created": False,
            "staged_pods": [],
        }
        await reporter.handle(handle)
        crash_point("k8s.handle_planned")
        budget = self._start_budget(spec, settings)
        progress = StartProgress()
        # One budget for the whole start: an API server that hangs (accepts
        # connections, never answers) must not hold it in retries for minutes.
        try:
            with anyio.fail_after(budget):
                return await self._launch(spec, reporter, state, settings, rendered, cluster, secret, handle, progress)
        except TimeoutError:
            pass
        undone = await self.cleanup.rollback(resolver, ns, list(reversed(progress.attempted)), reporter)
        raise RunFailed(
            f"the run did not start within {budget:g}s (while jobsup tried to {progress.step}): the Kubernetes "
            f"API server at {cluster.host} does not answer in time{undone}",
            "StartTimeout",
        )

    async def _launch(
        self,
        spec: RunSpec,
        reporter: RunReporter,
        state: RunState,
        settings: RunSettings,
        rendered: RenderedRun,
        cluster: Cluster,
        secret: dict[str, Any],
        handle: dict[str, Any],
        progress: StartProgress,
    ) -> dict[str, Any]:
        """The body of :meth:`start`, within its budget: dry runs, creates
        (each object is in ``progress.attempted`` before its create is
        sent), staging. Rolls back and raises BackendError on a failure."""
        resolver = self.connections.resolver(cluster)
        ns = settings.namespace
        progress.step = "start watching the namespace"
        watch = await self.connections.watch(cluster, ns)

        for obj in [secret, *rendered.objects]:
            progress.step = f"dry-run {ObjectRef.of(obj)}"
            try:
                await resolver.dry_run(obj, ns)
            except KubernetesApiError as err:
                raise RunFailed(
                    f"the API server refused {ObjectRef.of(obj)} (server-side dry run; nothing was created): {err}",
                    reason_of(err, "DryRunFailed"),
                ) from None

        created: list[tuple[ObjectRef, dict[str, Any]]] = []
        job_deadline = 0.0
        try:
            progress.step = f"create {ObjectRef.of(secret)}"
            progress.attempted.append(ObjectRef.of(secret))
            stored_secret = await self._create(resolver, state, secret, ns, spec.run_id)
            created.append((ObjectRef.of(stored_secret), stored_secret))
            await reporter.record(
                OBJECT_CREATED({**object_data(ObjectRef.of(stored_secret)), "env": env_digests(spec)})
            )
            job_obj: dict[str, Any] | None = None
            for obj in rendered.objects:
                progress.step = f"create {ObjectRef.of(obj)}"
                progress.attempted.append(ObjectRef.of(obj))
                stored = await self._create(resolver, state, obj, ns, spec.run_id)
                ref = ObjectRef.of(stored)
                created.append((ref, stored))
                await reporter.record(OBJECT_CREATED(object_data(ref)))
                if obj is rendered.primary_job:
                    job_obj = stored
                    job_deadline = time.monotonic() + settings.pod_ready_timeout_s
            assert job_obj is not None
            progress.step = f"give {ObjectRef.of(stored_secret)} its owner"
            stored_secret.setdefault("metadata", {})["ownerReferences"] = [owner_reference(job_obj)]
            stored_secret.pop("stringData", None)
            await resolver.replace(stored_secret, ns)
            crash_point("k8s.objects_created")
        except (KubernetesApiError, StartCanceled) as err:
            undone = await self.cleanup.rollback(resolver, ns, [r for r, _ in reversed(created)], reporter)
            progress.attempted.clear()
            if isinstance(err, StartCanceled):
                raise
            raise RunFailed(f"{err}{undone}", reason_of(err, "CreateFailed")) from None

        handle.update(objects=[r.to_json() for r, _ in created], created=True)
        await reporter.handle(handle)
        await reporter.phase("SCHEDULING", message="waiting for the Job's pod")
        view = watch.view(spec.run_id)
        progress.step = "stage the source into the Job's pod"
        try:
            pod = await self.stage(
                cluster,
                ns,
                view,
                state,
                reporter,
                handle,
                spec,
                deadline=job_deadline,
                timeout_s=settings.pod_ready_timeout_s,
            )
        except BackendError as err:
            undone = await self.cleanup.rollback(resolver, ns, [r for r, _ in reversed(created)], reporter)
            progress.attempted.clear()
            if isinstance(err, StartCanceled):
                raise
            raise RunFailed(f"{err}{undone}", reason_of(err, "StagingFailed")) from None
        handle["staged_pods"] = [pod]
        crash_point("k8s.staged")
        progress.step = "record the staged pod"
        await reporter.handle(handle)
        return handle

    async def _create(
        self, resolver: ResourceResolver, state: RunState, obj: Mapping[str, Any], ns: str, run_id: str
    ) -> dict[str, Any]:
        """Create ``obj`` unless the run was canceled (StartCanceled), under
        the run's lock, adding it to ``state.created``."""
        async with state.lock:
            if state.canceled:
                raise StartCanceled("the run was canceled while its objects were being created")
            stored = await resolver.create(obj, ns, run_id)
            stored.setdefault("apiVersion", obj.get("apiVersion"))
            stored.setdefault("kind", obj.get("kind"))
            state.created.append(ObjectRef.of(stored))
            return stored

    async def stage(
        self,
        cluster: Cluster,
        ns: str,
        view: RunView,
        state: RunState,
        reporter: RunReporter,
        handle: Mapping[str, Any],
        spec: RunSpec,
        *,
        deadline: float,
        timeout_s: int,
        exclude: frozenset[str] = frozenset(),
    ) -> str:
        """Wait for a pod of the Job (not in ``exclude``) whose script
        container runs, stage the source into it, return its name. Reports
        SCHEDULING (with the pod's reason) and STAGING meanwhile. Raises
        StagingError at ``deadline`` (monotonic) saying where the pod was,
        or at once when the container exits first or the Job ends."""
        job_name, container = str(handle["job"]), str(handle["script_container"])
        last_error: str | None = None
        last_pod: Mapping[str, Any] | None = None
        while True:
            token = view.token()
            if state.canceled:
                raise StartCanceled("the run was canceled while its source was being staged")
            job = view.jobs.get(job_name)
            pods = job_pods(job, view.pods) if job is not None else []
            live = [p for p in pods if p["metadata"]["name"] not in exclude]
            pod = current_pod(live)
            outcome = job_outcome(job, pods, container) if job is not None else None
            if pod is not None:
                last_pod = pod
                name = str(pod["metadata"]["name"])
                term = terminated_state(pod, container)
                evicted = (pod.get("status") or {}).get("reason") == "Evicted"
                if term is not None and not evicted and not pod["metadata"].get("deletionTimestamp"):
                    lines = await self.last_lines(cluster, ns, name, container)
                    raise StagingError(
                        f"pod {name} exited (exit code {term.get('exitCode')}, {term.get('reason') or 'no reason'}) "
                        "before jobsup could stage the source. Last log lines:\n" + (lines or "(none)"),
                        "ExitedBeforeStaging",
                    )
            if outcome is not None and outcome.terminal:
                raise StagingError(
                    f"the Job ended before jobsup could stage the source: {outcome.message}",
                    outcome.reason or "JobEnded",
                )
            if pod is not None:
                running = "running" in ((container_status(pod, container) or {}).get("state") or {})
                if running and not pod_is_terminal(pod):
                    await reporter.phase("STAGING", message=f"copying the source into pod {name}")
                    if deadline - time.monotonic() > 0:
                        try:
                            # The deadline bounds the wait for the pod; an
                            # upload that started gets the time its size needs.
                            budget = upload_timeout_s(spec.snapshot.stat().st_size)
                            await cluster.call_in_thread(
                                functools.partial(
                                    stage_source,
                                    cluster,
                                    ns,
                                    name,
                                    container,
                                    spec.snapshot,
                                    spec.snapshot_sha256,
                                    timeout_s=budget,
                                ),
                                exec_session=True,
                            )
                            await reporter.record(STAGING_STEP({"step": "staged", "pod": name, "container": container}))
                            return name
                        except StagingError as err:
                            last_error = str(err)
                            log.info("staging attempt failed", run=spec.run_id, pod=name, error=last_error)
                        except OSError as err:
                            raise StagingError(
                                f"cannot read the source snapshot {spec.snapshot}: {err}", "SnapshotMissing"
                            ) from None
                        await anyio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                        continue
                else:
                    obs = pod_progress(live, container, staged=False)
                    if obs.phase == "SCHEDULING":
                        await reporter.phase("SCHEDULING", reason=obs.reason, message=obs.message)
                        if obs.reason in PERMANENT_WAITING_REASONS:
                            # The kubelet never retries its way out of these.
                            raise StagingError(f"the pod cannot start: {describe_pod(pod, container)}", str(obs.reason))
            left = deadline - time.monotonic()
            if left <= 0:
                obs = pod_progress([last_pod] if last_pod else [], container, staged=False)
                raise StagingError(
                    f"the pod was not ready for the source within kubernetes.pod_ready_timeout_s={timeout_s}s "
                    f"(counted from the Job's creation): {describe_pod(last_pod, container)}"
                    + (f"; last staging error: {last_error}" if last_error else ""),
                    (waiting_failure_reason(obs.reason) if obs.phase == "SCHEDULING" else None) or "PodReadyTimeout",
                )
            await view.wait(min(left, 5.0), token)

    async def last_lines(self, cluster: Cluster, ns: str, pod: str, container: str, count: int = 20) -> str:
        try:
            data: bytes = await cluster.request(
                "GET",
                f"/api/v1/namespaces/{ns}/pods/{pod}/log",
                query=[("container", container), ("tailLines", count)],
                what=f"read the last log lines of {pod}",
                raw=True,
            )
        except KubernetesApiError as err:
            return f"(could not read the log: {err})"
        return data.decode("utf-8", "replace").rstrip("\n")
