"""KubernetesBackend: runs tasks as Kubernetes Jobs (jobsup issue 7).

One run, as the supervisor drives it (:mod:`supervisord.backends.base`):

``preflight``
    render the manifest from the recorded commit (a broken manifest is a
    ManifestError, refused at submit), load the kubeconfig context, check
    the API server, RBAC and referenced objects (:mod:`.preflight`; cached
    for ``preflight_cache_s``). Nothing is created.
``start``
    record the handle (the planned objects), server-side dry-run every
    object, create the per-run env Secret ``jobsup-env-<run id>`` and then
    the manifest's objects in order, recording each as ``ObjectCreated``
    before the next; give the Secret an ownerReference to the primary Job;
    wait (``kubernetes.pod_ready_timeout_s``, counted from the Job's
    creation) for the script container to run, reporting SCHEDULING with
    the pod's reason meanwhile, and stage the source (:mod:`.staging`). Any
    failure deletes what was created, newest first, and raises
    BackendError (the run becomes ERROR with that message).
``supervise``
    follow the run through the namespace's shared watches (:mod:`.watch`),
    map Job and pod state to phases (:mod:`.phase`), follow the leader
    pod's log (:mod:`.logs`), stage the source into a replacement pod (after
    an eviction, or when the daemon died mid-staging), and on the Job's end
    drain the logs, delete auxiliary objects (Services, ConfigMaps...; the
    Job and its Secret are left to the Job's TTL) and report the outcome. A
    Job that disappears without a cancel is DELETED, unless it was seen
    finished.
``cancel``
    delete the run's objects newest first (Jobs with propagationPolicy
    Background; NotFound counts as gone), then wait until no pod of the run
    is left.

Per-run settings come from the effective config recorded at submit
(``spec.config["kubernetes"]``); the handle records the context and
namespace actually used, so a reattach finds the run even if the
kubeconfig's current context changed since.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from supervisord.backends.base import RunReporter, RunSpec
from supervisord.backends.kubernetes.client.access import Cluster, ClusterAccess
from supervisord.backends.kubernetes.client.errors import KubeconfigError
from supervisord.backends.kubernetes.client.resources import (
    ObjectRef,
    ResourceResolver,
    env_secret,
    owner_reference,
)
from supervisord.backends.kubernetes.client.watches import NamespaceWatch, RunView, job_pods
from supervisord.backends.kubernetes.logs import ContainerState, LogFollower
from supervisord.backends.kubernetes.manifest.inject import env_secret_name, run_labels
from supervisord.backends.kubernetes.manifest.load import load_manifest_at_commit, manifest_path_for
from supervisord.backends.kubernetes.manifest.render import DEFAULT_STAGING_TIMEOUT_S, RenderedRun, render_run
from supervisord.backends.kubernetes.phase import (
    PERMANENT_WAITING_REASONS,
    Observation,
    container_status,
    current_pod,
    describe_pod,
    job_outcome,
    leader_pod,
    pod_is_terminal,
    pod_progress,
    terminated_state,
    waiting_failure_reason,
)
from supervisord.backends.kubernetes.preflight import (
    REQUIRED_ACCESS,
    AccessCheck,
    Problem,
    check_access,
    check_api,
    check_references,
    preflight_error,
    references,
)
from supervisord.backends.kubernetes.staging import StagingError, stage_source, upload_timeout_s
from supervisord.exceptions import BackendError, ConfigError, JobsupError, KubernetesApiError, PreflightConfigError

__all__ = ["KubernetesBackend"]

log = structlog.get_logger("jobsup.kubernetes")

_DEFAULT_POD_READY_TIMEOUT_S = 90
#: Seconds a start may spend on API calls (dry runs, creates), on top of the
#: pod-ready wait and the upload, before it gives up (``start_timeout_s``).
_START_API_BUDGET_S = 120.0


def _env_digest(spec: RunSpec) -> dict[str, str | None]:
    """NAME -> the digest the Submitted event recorded for it (the daemon's
    keyed hash; None when it has none): never a value."""
    digests = spec.env_digests
    return {name: (str(digests[name]) if digests.get(name) is not None else None) for name in sorted(spec.env)}


def _wall_to_monotonic(rfc3339: str | None, plus_s: float) -> float:
    """The monotonic time of (an RFC 3339 instant + ``plus_s``); now + plus_s
    when the instant is missing."""
    now_wall, now_mono = time.time(), time.monotonic()
    if not rfc3339:
        return now_mono + plus_s
    try:
        when = dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return now_mono + plus_s
    return now_mono + (when + plus_s - now_wall)


@dataclasses.dataclass(frozen=True)
class _Settings:
    """The run's ``kubernetes:`` settings, from the recorded effective config."""

    context: str | None
    namespace: str
    pod_ready_timeout_s: int
    manifest_path: str
    kube: Mapping[str, Any]

    @classmethod
    def of(cls, spec: RunSpec) -> _Settings:
        kube = spec.config.get("kubernetes") or {}
        if not isinstance(kube, Mapping):
            raise ConfigError("kubernetes: must be a mapping in the effective config")
        timeout = kube.get("pod_ready_timeout_s") or _DEFAULT_POD_READY_TIMEOUT_S
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
            raise ConfigError(
                f"kubernetes.pod_ready_timeout_s must be a positive whole number of seconds, got {timeout!r}"
            )
        task_manifest = spec.manifest
        return cls(
            context=str(kube["context"]) if kube.get("context") else None,
            namespace=str(kube.get("namespace") or "default"),
            pod_ready_timeout_s=timeout,
            manifest_path=manifest_path_for(str(task_manifest) if task_manifest else None, kube),
            kube=kube,
        )


class _Failed(BackendError):
    """A BackendError with the run's ``reason`` (one CamelCase word)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, run_reason=reason)
        self.reason = reason


class _Canceled(_Failed):
    """A cancel arrived while the run was starting (the supervisor records CANCELED)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "Canceled")


@dataclasses.dataclass
class _StartProgress:
    """How far a start got: the ``step`` under way (for the timeout's
    message) and the objects whose create was sent (``attempted``: what a
    timed-out start rolls back, an object whose answer never came
    included)."""

    step: str = "render the manifest"
    attempted: list[ObjectRef] = dataclasses.field(default_factory=list)


def _reason(err: BaseException, default: str) -> str:
    reason = getattr(err, "reason", None)
    return reason if isinstance(reason, str) and reason else default


class _RunState:
    """What the backend keeps in memory about one run."""

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.canceled = False
        self.created: list[ObjectRef] = []


class KubernetesBackend:
    """Runs tasks as Kubernetes Jobs (see the module docstring).

    Every argument is optional (the daemon builds it with none); they exist
    for tests and benchmarks. ``kubeconfig``: path(s) to read instead of
    ``KUBECONFIG``. Seconds: ``log_stall_s``/``log_stall_max_s`` (log
    stall detection), ``final_read_s`` (last log read), ``resync_s`` and
    ``watch_timeout_s`` (watches), ``preflight_cache_s``,
    ``cancel_timeout_s`` (cancel's budget in all, and a rollback's),
    ``start_timeout_s`` (start's budget in all; None: 120 s for the API
    calls plus the run's ``pod_ready_timeout_s`` plus the upload's budget).
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        log_stall_s: float = 30.0,
        log_stall_max_s: float = 300.0,
        final_read_s: float = 30.0,
        resync_s: float = 60.0,
        watch_timeout_s: int = 290,
        preflight_cache_s: float = 30.0,
        cancel_timeout_s: float = 180.0,
        start_timeout_s: float | None = None,
    ) -> None:
        self.access = ClusterAccess(kubeconfig=kubeconfig)
        self.log_stall_s = log_stall_s
        self.log_stall_max_s = log_stall_max_s
        self.final_read_s = final_read_s
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self.preflight_cache_s = preflight_cache_s
        self.cancel_timeout_s = cancel_timeout_s
        self.start_timeout_s = start_timeout_s
        self._tg: anyio.abc.TaskGroup | None = None
        self._serving = anyio.Event()
        # git (the manifest at the recorded commit) and config files: their own threads.
        self._files = anyio.CapacityLimiter(4)
        self._watches: dict[tuple[str, str], NamespaceWatch] = {}
        self._resolvers: dict[str, ResourceResolver] = {}
        self._runs: dict[str, _RunState] = {}
        self._access_ok: dict[tuple[str, str, frozenset[AccessCheck]], float] = {}
        self._refs_ok: dict[tuple[str, str, str, str], float] = {}
        self.stats: dict[str, int] = {}
        """Counters for tests and benchmarks (log follows, stalls, cuts...)."""

    # ------------------------------------------------------------- plumbing

    def _state(self, run_id: str) -> _RunState:
        state = self._runs.get(run_id)
        if state is None:
            state = self._runs[run_id] = _RunState()
        return state

    def _resolver(self, cluster: Cluster) -> ResourceResolver:
        resolver = self._resolvers.get(cluster.context)
        if resolver is None or resolver.cluster is not cluster:
            resolver = self._resolvers[cluster.context] = ResourceResolver(cluster)
        return resolver

    async def _cluster(self, context: str | None) -> Cluster:
        try:
            return await self.access.cluster(context)
        except (KubeconfigError, KubernetesApiError) as err:
            raise BackendError(str(err)) from None

    async def _watch(self, cluster: Cluster, namespace: str) -> NamespaceWatch:
        key = (cluster.context, namespace)
        watch = self._watches.get(key)
        if watch is not None:
            return watch
        with anyio.move_on_after(30):
            await self._serving.wait()
        if self._tg is None:
            raise BackendError("the Kubernetes backend is not serving (its serve() task is not running)")
        watch = self._watches.get(key)
        if watch is None:
            watch = NamespaceWatch(cluster, namespace, resync_s=self.resync_s, watch_timeout_s=self.watch_timeout_s)
            self._watches[key] = watch
            self._tg.start_soon(watch.run, name=f"k8s-watch {cluster.context}/{namespace}")
        return watch

    async def serve(self) -> None:
        """Run the shared watches (one pair per namespace in use) until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._serving.set()
            try:
                await anyio.sleep_forever()
            finally:
                self._tg = None

    async def aclose(self) -> None:
        """Close the API clients (the runs keep running)."""
        await self.access.aclose()

    async def _render(self, spec: RunSpec, settings: _Settings) -> RenderedRun:
        text = await anyio.to_thread.run_sync(
            load_manifest_at_commit, Path(spec.repo), spec.commit, settings.manifest_path, limiter=self._files
        )
        return render_run(
            text,
            run_id=spec.run_id,
            project=spec.project,
            name=spec.name,
            command=spec.command,
            namespace=settings.namespace,
            timeout_s=spec.timeout_s,
            staging_timeout_s=max(DEFAULT_STAGING_TIMEOUT_S, settings.pod_ready_timeout_s + 60),
            kube_config=settings.kube,
            manifest_path=settings.manifest_path,
            env_secret=env_secret_name(spec.run_id),
        )

    # ------------------------------------------------------------ preflight

    async def _check_cluster(
        self, cluster: Cluster, namespace: str, rendered: RenderedRun | None, manifest_path: str = ""
    ) -> tuple[list[Problem], list[str]]:
        """(problems, warnings) for the cluster part of preflight; successes
        are cached for ``preflight_cache_s``."""
        now = time.monotonic()
        problems: list[Problem] = []
        warnings: list[str] = []
        checks = set(REQUIRED_ACCESS)
        resolver = self._resolver(cluster)
        if rendered is not None:
            for obj in rendered.objects:
                try:
                    info = await resolver.info_of(obj)
                except KubernetesApiError as err:
                    where = f" (in {manifest_path})" if manifest_path else ""
                    problems.append(
                        Problem.of_api_error(
                            f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}{where}: {err}", err
                        )
                    )
                    continue
                group = info.group_version.split("/")[0] if "/" in info.group_version else ""
                checks.add(AccessCheck("create", group, info.plural))
        key = (cluster.context, namespace, frozenset(checks))
        if self._access_ok.get(key, 0) < now:
            problem, _ = await check_api(cluster, kubeconfig=self.access.kubeconfig_paths())
            if problem is not None:
                return [problem], warnings
            try:
                results = await check_access(cluster, namespace, sorted(checks, key=lambda c: c.describe()))
            except KubernetesApiError as err:
                return problems + [
                    Problem.of_api_error(f"cannot check permissions with SelfSubjectAccessReview: {err}", err)
                ], warnings
            denied = [Problem(p) for _, p in results if p is not None]
            problems.extend(denied)
            if not denied:
                self._access_ok[key] = now + self.preflight_cache_s
        if rendered is not None:
            refs = references(rendered.objects)
            # Positive answers are cached; a missing object is asked again next time.
            for kind, table in (
                ("Secret", refs.secrets),
                ("PersistentVolumeClaim", refs.pvcs),
                ("RuntimeClass", refs.runtime_classes),
            ):
                for name in list(table):
                    if self._refs_ok.get((cluster.context, namespace, kind, name), 0) >= now:
                        del table[name]
            ref_problems, ref_warnings = await check_references(resolver, namespace, refs)
            problems.extend(ref_problems)
            warnings.extend(ref_warnings)
            if not ref_problems and not ref_warnings:
                for kind, table in (
                    ("Secret", refs.secrets),
                    ("PersistentVolumeClaim", refs.pvcs),
                    ("RuntimeClass", refs.runtime_classes),
                ):
                    for name in table:
                        self._refs_ok[(cluster.context, namespace, kind, name)] = now + self.preflight_cache_s
        return problems, warnings

    async def preflight(self, spec: RunSpec) -> list[str]:
        """Render the manifest and check the cluster; return warnings.

        Raises ManifestError (the manifest breaks the contract), ConfigError,
        PreflightConfigError (one line per problem, each the user's to fix:
        kubeconfig, context, namespace, RBAC, missing Secret/PVC/RuntimeClass,
        a kind the cluster does not have), PreflightError (the cluster itself
        failed: no answer, 5xx). Creates nothing.
        """
        settings = _Settings.of(spec)
        rendered = await self._render(spec, settings)
        try:
            cluster = await self.access.cluster(settings.context)
        except KubeconfigError as err:
            source = (
                f"kubernetes.context is {settings.context!r}"
                if settings.context
                else "kubernetes.context is not set, so the kubeconfig's current-context is used"
            )
            line = f"{err} ({source})"
            raise PreflightConfigError(f"Kubernetes preflight failed: {line}", [line]) from None
        problems, warnings = await self._check_cluster(cluster, settings.namespace, rendered, settings.manifest_path)
        if problems:
            head = f"Kubernetes preflight failed (context {cluster.context}, namespace {settings.namespace}):"
            raise preflight_error(head, problems)
        return warnings + list(rendered.notes)

    async def doctor(self) -> list[dict[str, Any]]:
        """Checks for ``jobsup doctor`` with the daemon's and user's config
        (context, namespace): kubeconfig, API server, each RBAC permission.
        Items are ``{"name", "ok", "detail"}``."""
        from supervisord import config as cfg

        items: list[dict[str, Any]] = []
        try:

            def read_config() -> Mapping[str, Any]:
                layers = cfg.load_client_layers(task=None, cli_config=[], cwd=Path.home())
                eff = cfg.effective_config(cfg.load_daemon_layer(), layers, context=cfg.current_kube_context())
                section = eff.data.get("kubernetes") or {}
                return section if isinstance(section, Mapping) else {}

            kube = await anyio.to_thread.run_sync(read_config, limiter=self._files)
        except JobsupError as err:
            return [{"name": "kubernetes config", "ok": False, "detail": str(err)}]
        namespace = str(kube.get("namespace") or "default")
        try:
            cluster = await self.access.cluster(str(kube["context"]) if kube.get("context") else None)
        except KubeconfigError as err:
            return [{"name": "kubeconfig", "ok": False, "detail": str(err)}]
        items.append(
            {"name": "kubeconfig", "ok": True, "detail": f"{self.access.kubeconfig_paths()}: context {cluster.context}"}
        )
        problem, detail = await check_api(cluster, kubeconfig=self.access.kubeconfig_paths())
        items.append({"name": "kubernetes api", "ok": problem is None, "detail": problem.text if problem else detail})
        if problem is not None:
            return items
        try:
            results = await check_access(cluster, namespace, REQUIRED_ACCESS)
        except KubernetesApiError as err:
            items.append({"name": "kubernetes rbac", "ok": False, "detail": str(err)})
            return items
        for check, denied in results:
            items.append(
                {
                    "name": f"rbac: {check.describe()}",
                    "ok": denied is None,
                    "detail": denied or f"allowed in namespace {namespace}",
                }
            )
        return items

    # ----------------------------------------------------------------- start

    def _start_budget(self, spec: RunSpec, settings: _Settings) -> float:
        """Seconds ``start`` may take in all (see ``start_timeout_s``)."""
        if self.start_timeout_s is not None:
            return self.start_timeout_s
        try:
            size = spec.snapshot.stat().st_size
        except OSError:
            size = 0
        return _START_API_BUDGET_S + settings.pod_ready_timeout_s + upload_timeout_s(size)

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        """Create the run's objects and stage the source; return the handle
        ``{"context", "namespace", "job", "script_container", "objects",
        "created", "staged_pods"}`` (recorded before any object is created,
        and again as objects and staging complete). Raises BackendError
        after deleting what it created; reason ``StartTimeout`` when the
        whole start outlived its budget (an API server that accepts
        connections and never answers), after a rollback with its own
        budget (what it could not delete is recorded as ``CleanupFailed``:
        cleanup pending)."""
        settings = _Settings.of(spec)
        # Rendered again from the recorded commit: what start needs comes
        # from the RunSpec, never from a cache filled by preflight.
        rendered = await self._render(spec, settings)
        cluster = await self._cluster(settings.context)
        resolver = self._resolver(cluster)
        ns = settings.namespace
        labels = run_labels(run_id=spec.run_id, project=spec.project, name=spec.name)
        secret = env_secret(spec.run_id, ns, labels, spec.env)
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
        budget = self._start_budget(spec, settings)
        progress = _StartProgress()
        # One budget for the whole start: an API server that hangs (accepts
        # connections, never answers) must not hold it in retries for minutes.
        try:
            with anyio.fail_after(budget):
                return await self._launch(spec, reporter, settings, rendered, cluster, secret, handle, progress)
        except TimeoutError:
            pass
        undone = await self._rollback(resolver, ns, list(reversed(progress.attempted)), reporter)
        raise _Failed(
            f"the run did not start within {budget:g}s (while jobsup tried to {progress.step}): the Kubernetes "
            f"API server at {cluster.host} does not answer in time{undone}",
            "StartTimeout",
        )

    async def _launch(
        self,
        spec: RunSpec,
        reporter: RunReporter,
        settings: _Settings,
        rendered: RenderedRun,
        cluster: Cluster,
        secret: dict[str, Any],
        handle: dict[str, Any],
        progress: _StartProgress,
    ) -> dict[str, Any]:
        """The body of :meth:`start`, within its budget: dry runs, creates
        (each object is in ``progress.attempted`` before its create is
        sent), staging. Rolls back and raises BackendError on a failure."""
        resolver = self._resolver(cluster)
        state = self._state(spec.run_id)
        ns = settings.namespace
        progress.step = "start watching the namespace"
        watch = await self._watch(cluster, ns)

        for obj in [secret, *rendered.objects]:
            progress.step = f"dry-run {ObjectRef.of(obj)}"
            try:
                await resolver.dry_run(obj, ns)
            except KubernetesApiError as err:
                raise _Failed(
                    f"the API server refused {ObjectRef.of(obj)} (server-side dry run; nothing was created): {err}",
                    _reason(err, "DryRunFailed"),
                ) from None

        created: list[tuple[ObjectRef, dict[str, Any]]] = []
        job_deadline = 0.0
        try:
            progress.step = f"create {ObjectRef.of(secret)}"
            progress.attempted.append(ObjectRef.of(secret))
            stored_secret = await self._create(resolver, state, secret, ns, spec.run_id)
            created.append((ObjectRef.of(stored_secret), stored_secret))
            await reporter.record("ObjectCreated", {**ObjectRef.of(stored_secret).to_json(), "env": _env_digest(spec)})
            job_obj: dict[str, Any] | None = None
            for obj in rendered.objects:
                progress.step = f"create {ObjectRef.of(obj)}"
                progress.attempted.append(ObjectRef.of(obj))
                stored = await self._create(resolver, state, obj, ns, spec.run_id)
                ref = ObjectRef.of(stored)
                created.append((ref, stored))
                await reporter.record("ObjectCreated", ref.to_json())
                if obj is rendered.primary_job:
                    job_obj = stored
                    job_deadline = time.monotonic() + settings.pod_ready_timeout_s
            assert job_obj is not None
            progress.step = f"give {ObjectRef.of(stored_secret)} its owner"
            stored_secret.setdefault("metadata", {})["ownerReferences"] = [owner_reference(job_obj)]
            stored_secret.pop("stringData", None)
            await resolver.replace(stored_secret, ns)
        except (KubernetesApiError, _Canceled) as err:
            undone = await self._rollback(resolver, ns, [r for r, _ in reversed(created)], reporter)
            progress.attempted.clear()
            if isinstance(err, _Canceled):
                raise
            raise _Failed(f"{err}{undone}", _reason(err, "CreateFailed")) from None

        handle.update(objects=[r.to_json() for r, _ in created], created=True)
        await reporter.handle(handle)
        await reporter.phase("SCHEDULING", message="waiting for the Job's pod")
        view = watch.view(spec.run_id)
        progress.step = "stage the source into the Job's pod"
        try:
            pod = await self._stage(
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
            undone = await self._rollback(resolver, ns, [r for r, _ in reversed(created)], reporter)
            progress.attempted.clear()
            if isinstance(err, _Canceled):
                raise
            raise _Failed(f"{err}{undone}", _reason(err, "StagingFailed")) from None
        handle["staged_pods"] = [pod]
        progress.step = "record the staged pod"
        await reporter.handle(handle)
        return handle

    async def _create(
        self, resolver: ResourceResolver, state: _RunState, obj: Mapping[str, Any], ns: str, run_id: str
    ) -> dict[str, Any]:
        async with state.lock:
            if state.canceled:
                raise _Canceled("the run was canceled while its objects were being created")
            stored = await resolver.create(obj, ns, run_id)
            stored.setdefault("apiVersion", obj.get("apiVersion"))
            stored.setdefault("kind", obj.get("kind"))
            state.created.append(ObjectRef.of(stored))
            return stored

    async def _rollback(
        self, resolver: ResourceResolver, ns: str, refs: list[ObjectRef], reporter: RunReporter | None
    ) -> str:
        """Delete ``refs`` (newest first already) after a failure, within
        ``cancel_timeout_s``; returns the text to append to the error (what
        was deleted, or what could not be). When the budget runs out, what
        may remain is recorded as ``CleanupFailed`` (cleanup pending)."""
        if not refs:
            return ""
        deleted: list[str] = []
        try:
            with anyio.fail_after(self.cancel_timeout_s):
                await self._delete_refs(resolver, ns, refs, reporter, deleted=deleted)
        except TimeoutError:
            left = [str(r) for r in refs if str(r) not in deleted]
            message = (
                f"cleanup pending: the API server did not answer within {self.cancel_timeout_s:g}s while jobsup "
                f"deleted what it had created; these may remain in namespace {ns}: {', '.join(left)} "
                f"(kubectl -n {ns} delete them once the cluster answers)"
            )
            if reporter is not None:
                await reporter.record("CleanupFailed", {"message": message})
            return f"; {message}"
        except BackendError as err:
            return f"; rolling back failed too: {err}"
        return f"; jobsup deleted what it had created ({', '.join(deleted)})" if deleted else ""

    async def _delete_refs(
        self,
        resolver: ResourceResolver,
        ns: str,
        refs: list[ObjectRef],
        reporter: RunReporter | None,
        *,
        deleted: list[str] | None = None,
    ) -> list[str]:
        """Delete ``refs`` in the order given; returns what was deleted (also
        appended to ``deleted`` as it goes, when given). Errors other than
        NotFound are collected and raised together as BackendError after
        trying every object."""
        deleted = [] if deleted is None else deleted
        errors: list[str] = []
        for ref in refs:
            try:
                if await resolver.delete(ref, ns):
                    deleted.append(str(ref))
                    if reporter is not None:
                        await reporter.record("ObjectDeleted", ref.to_json())
            except KubernetesApiError as err:
                errors.append(str(err))
        if errors:
            raise BackendError("could not delete every object of the run: " + "; ".join(errors))
        return deleted

    # -------------------------------------------------------------- staging

    async def _stage(
        self,
        cluster: Cluster,
        ns: str,
        view: RunView,
        state: _RunState,
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
                raise _Canceled("the run was canceled while its source was being staged")
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
                    lines = await self._last_lines(cluster, ns, name, container)
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
                                lambda: stage_source(
                                    cluster, ns, name, container, spec.snapshot, spec.snapshot_sha256, timeout_s=budget
                                ),
                                exec_session=True,
                            )
                            await reporter.record(
                                "StagingStep", {"step": "staged", "pod": name, "container": container}
                            )
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

    async def _last_lines(self, cluster: Cluster, ns: str, pod: str, container: str, count: int = 20) -> str:
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

    # ------------------------------------------------------------ supervise

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        """Follow the run until it is terminal (see the module docstring);
        also how a restarted daemon reattaches."""
        state = self._state(spec.run_id)
        if not handle or not handle.get("namespace"):
            await self._abandoned_submit(spec, reporter, {})
            return
        cluster = await self._cluster(str(handle.get("context")) if handle.get("context") else None)
        ns = str(handle["namespace"])
        if not handle.get("created"):
            await self._abandoned_submit(spec, reporter, handle)
            return
        watch = await self._watch(cluster, ns)
        view = watch.view(spec.run_id)
        try:
            await watch.wait_synced(view, 60.0)
            run = _Supervision(self, cluster, ns, view, state, reporter, spec, dict(handle))
            await run.run()
        finally:
            # The run is over (or the daemon stops): drop what was kept for it.
            watch.forget(spec.run_id)
            self._runs.pop(spec.run_id, None)

    async def _abandoned_submit(self, spec: RunSpec, reporter: RunReporter, handle: Mapping[str, Any]) -> None:
        """The daemon stopped while creating this run's objects: delete what
        exists (recorded in the handle, or found by the run label) and
        report ERROR."""
        deleted: list[str] = []
        if handle:
            cluster = await self._cluster(str(handle.get("context")) if handle.get("context") else None)
            ns = str(handle["namespace"])
            resolver = self._resolver(cluster)
            refs = [ObjectRef.from_json(o) for o in handle.get("objects") or []]
            found = await self._find_run_objects(resolver, ns, spec.run_id, refs)
            deleted = await self._delete_refs(resolver, ns, list(reversed(found)), reporter)
        await reporter.phase(
            "ERROR",
            reason="SubmitInterrupted",
            message="the daemon stopped while this run's objects were being created; "
            + (f"jobsup deleted them ({', '.join(deleted)})" if deleted else "nothing of it was left on the cluster"),
        )

    async def _find_run_objects(
        self, resolver: ResourceResolver, ns: str, run_id: str, refs: list[ObjectRef]
    ) -> list[ObjectRef]:
        """``refs`` plus every object of their kinds (and Jobs and Secrets)
        labelled with the run, in ``refs`` order then the others."""
        out = list(refs)
        names = {(r.kind, r.name) for r in refs}
        kinds = {(r.api_version, r.kind) for r in refs} | {("batch/v1", "Job"), ("v1", "Secret")}
        for api_version, kind in sorted(kinds):
            try:
                items = await resolver.list_run(api_version, kind, ns, run_id)
            except KubernetesApiError as err:
                log.warning("cannot list the run's objects", kind=kind, error=str(err))
                continue
            for item in items:
                ref = ObjectRef.of(item)
                if (ref.kind, ref.name) not in names:
                    names.add((ref.kind, ref.name))
                    out.append(ref)
        return out

    # ---------------------------------------------------------------- cancel

    async def cancel(self, spec: RunSpec, handle: Mapping[str, Any]) -> None:
        """Delete the run's objects newest first (Jobs with propagationPolicy
        Background; NotFound counts as gone) and return once no pod of the
        run remains. Idempotent. Raises BackendError when an object cannot
        be deleted or pods are still there after ``cancel_timeout_s``."""
        state = self._state(spec.run_id)
        async with state.lock:
            state.canceled = True
        settings = _Settings.of(spec)
        context = str(handle.get("context")) if handle.get("context") else settings.context
        ns = str(handle.get("namespace") or settings.namespace)
        cluster = await self._cluster(context)
        resolver = self._resolver(cluster)
        refs = [ObjectRef.from_json(o) for o in handle.get("objects") or []]
        known = {(r.kind, r.name) for r in refs}
        refs += [r for r in state.created if (r.kind, r.name) not in known]
        pods: list[dict[str, Any]] = []
        step = "find the run's objects"
        # One budget for the whole cancel: an API server that hangs (accepts
        # connections, never answers) must not hold it in retries for minutes.
        try:
            with anyio.fail_after(self.cancel_timeout_s):
                found = await self._find_run_objects(resolver, ns, spec.run_id, refs)
                step = "delete the run's objects"
                await self._delete_refs(resolver, ns, list(reversed(found)), None)
                step = "wait for the run's pods to go"
                while True:
                    pods = await resolver.list_run("v1", "Pod", ns, spec.run_id)
                    if not pods:
                        log.info("canceled", run=spec.run_id)
                        return
                    await anyio.sleep(0.5)
        except TimeoutError:
            pass
        if pods:
            names = ", ".join(str(p["metadata"]["name"]) for p in pods)
            raise BackendError(f"the run's pods are still terminating after {self.cancel_timeout_s:g}s: {names}")
        raise BackendError(
            f"could not {step} within {self.cancel_timeout_s:g}s: the Kubernetes API server at {cluster.host} "
            "does not answer in time"
        )


class _Supervision:
    """Supervising one run: the loop of :meth:`KubernetesBackend.supervise`."""

    def __init__(
        self,
        backend: KubernetesBackend,
        cluster: Cluster,
        ns: str,
        view: RunView,
        state: _RunState,
        reporter: RunReporter,
        spec: RunSpec,
        handle: dict[str, Any],
    ) -> None:
        self.b = backend
        self.cluster = cluster
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
        self.settings = _Settings.of(spec)
        self.failed: BackendError | None = None
        # Set while a failed staging rolls the run's objects back: the Job
        # disappearing then is jobsup's doing, not an outside delete.
        self.rolling_back = False

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
                if job is None and not pods:
                    return
                await self.view.wait(5.0, token)
                continue
            await self._ensure_followers(tg, pods)
            if job is None:
                await self._job_gone(pods)
                return
            outcome = job_outcome(job, pods, self.container)
            if outcome is not None:
                settled = await self._settled_pods(job, pods)
                if settled is not pods:
                    outcome = job_outcome(job, settled, self.container) or outcome
                await self._finish(outcome)
                return
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
            listed = await self.b._resolver(self.cluster).list_run("v1", "Pod", self.ns, self.spec.run_id)
        except KubernetesApiError as err:
            log.warning("cannot list the run's pods; using the cached ones", run=self.spec.run_id, error=str(err))
            return pods
        fresh = job_pods(job, {str(p["metadata"]["name"]): p for p in listed})
        return fresh or pods

    async def _confirm_job(self) -> dict[str, Any] | None:
        """The Job is not in the watch cache: ask the API server (the cache
        may lag); None when it is really gone."""
        if self.job_name in self.view.deleted_jobs:
            return None
        resolver = self.b._resolver(self.cluster)
        try:
            return await resolver.get("batch/v1", "Job", self.job_name, self.ns)
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
            await self.reporter.record("LeaderPodChanged", {"from": previous, "to": name})
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
            stall_s=self.b.log_stall_s,
            stall_max_s=self.b.log_stall_max_s,
            final_read_s=self.b.final_read_s,
            stats=self.b.stats,
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
            deadline = _wall_to_monotonic(start, self.settings.pod_ready_timeout_s)
            self.staging.add(name)
            tg.start_soon(self._stage_one, name, deadline, first)

    async def _stage_one(self, pod_name: str, deadline: float, first: bool) -> None:
        others = frozenset(p for p in self.view.pods if p != pod_name)
        try:
            staged = await self.b._stage(
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
        except _Canceled:
            return
        except BackendError as err:
            self.rolling_back = True
            try:
                resolver = self.b._resolver(self.cluster)
                refs = [ObjectRef.from_json(o) for o in self.handle.get("objects") or []]
                undone = await self.b._rollback(resolver, self.ns, list(reversed(refs)), self.reporter)
                self.failed = _Failed(f"{err}{undone}", _reason(err, "StagingFailed"))
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
        with anyio.move_on_after(self.b.final_read_s + 15.0):
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
            outcome.phase, reason=outcome.reason, message=outcome.message, exit_code=outcome.exit_code
        )

    async def _delete_auxiliary(self) -> None:
        """On the Job's end: delete the objects other than the primary Job
        and its env Secret (which the Job's TTL removes), newest first."""
        refs = [ObjectRef.from_json(o) for o in self.handle.get("objects") or []]
        aux = [
            r
            for r in refs
            if not (r.kind == "Job" and r.name == self.job_name) and r.name != env_secret_name(self.spec.run_id)
        ]
        if not aux:
            return
        try:
            await self.b._delete_refs(self.b._resolver(self.cluster), self.ns, list(reversed(aux)), self.reporter)
        except BackendError as err:
            log.warning("cleanup of auxiliary objects failed", run=self.spec.run_id, error=str(err))
            await self.reporter.record("CleanupFailed", {"message": str(err)})
