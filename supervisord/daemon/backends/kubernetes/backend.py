"""KubernetesBackend: runs tasks as Kubernetes Jobs. It implements the
Backend protocol (:mod:`supervisord.daemon.backends.base`) by delegation:

``preflight`` / ``doctor``
    :class:`~.preflight.PreflightChecker`: render the manifest from the
    recorded commit (a broken manifest is a ManifestError, refused at
    submit), load the kubeconfig context, check the API server, RBAC and
    referenced objects (cluster facts cached for ``preflight_cache_s``).
    Nothing is created.
``start``
    :class:`~.launch.Launcher`: dry runs, creates, staging; rollback on
    failure (:class:`~.cleanup.Cleanup`); one budget in all.
``supervise``
    :func:`~.reconciler.supervise_run`: the per-run reconciler over the
    namespace's shared watches (:class:`~.connections.Connections`).
``cancel``
    :meth:`~.cleanup.Cleanup.cancel`: delete the run's objects newest first,
    then wait until no pod of the run is left.

Per-run settings come from the effective config recorded at submit
(``spec.config["kubernetes"]``, :class:`~.runstate.RunSettings`); the
handle records the context and namespace actually used, so a reattach finds
the run even if the kubeconfig's current context changed since. What the
backend needs beyond the RunSpec arrives through its constructor: the
kubeconfig path(s) and the config ``doctor`` checks, both resolved by the
daemon; the backend reads no file from the user's home.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio

from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.backends.kubernetes.cleanup import Cleanup
from supervisord.daemon.backends.kubernetes.client.access import ClusterAccess
from supervisord.daemon.backends.kubernetes.client.resources import ObjectRef
from supervisord.daemon.backends.kubernetes.connections import Connections
from supervisord.daemon.backends.kubernetes.launch import Launcher
from supervisord.daemon.backends.kubernetes.preflight import PreflightChecker
from supervisord.daemon.backends.kubernetes.reconciler import LogSettings, supervise_run
from supervisord.daemon.backends.kubernetes.runstate import RunSettings, RunState

__all__ = ["KubernetesBackend"]


class KubernetesBackend:
    """Runs tasks as Kubernetes Jobs (see the module docstring).

    ``kubeconfig``: the kubeconfig path(s) (``os.pathsep``-separated) the
    daemon resolved (``KUBECONFIG``, else ``~/.kube/config``); None: no
    kubeconfig, the pod's service account when inside a cluster.
    ``doctor_config``: returns the ``kubernetes`` config section ``doctor``
    checks (context, namespace; default: an empty one). Seconds:
    ``log_stall_s``/``log_stall_max_s`` (log stall detection),
    ``final_read_s`` (last log read), ``resync_s`` and ``watch_timeout_s``
    (watches), ``preflight_cache_s``, ``cancel_timeout_s`` (cancel's budget
    in all, and a rollback's), ``start_timeout_s`` (start's budget in all;
    None: 120 s for the API calls plus the run's ``pod_ready_timeout_s``
    plus the upload's budget).
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        doctor_config: Callable[[], Mapping[str, Any]] = dict,
        log_stall_s: float = 30.0,
        log_stall_max_s: float = 300.0,
        final_read_s: float = 30.0,
        resync_s: float = 60.0,
        watch_timeout_s: int = 290,
        preflight_cache_s: float = 30.0,
        cancel_timeout_s: float = 180.0,
        start_timeout_s: float | None = None,
    ) -> None:
        # git (the manifest at the recorded commit) and config files: their own threads.
        files = anyio.CapacityLimiter(4)
        self.connections = Connections(
            ClusterAccess(kubeconfig=kubeconfig), resync_s=resync_s, watch_timeout_s=watch_timeout_s
        )
        self.cleanup = Cleanup(timeout_s=cancel_timeout_s)
        self.launcher = Launcher(self.connections, self.cleanup, files=files, start_timeout_s=start_timeout_s)
        self.preflights = PreflightChecker(
            self.connections, files=files, cache_s=preflight_cache_s, doctor_config=doctor_config
        )
        self.logs = LogSettings(stall_s=log_stall_s, stall_max_s=log_stall_max_s, final_read_s=final_read_s)
        self._runs: dict[str, RunState] = {}
        self.stats: dict[str, int] = {}
        """Counters for tests and benchmarks (log follows, stalls, cuts...)."""

    def _state(self, run_id: str) -> RunState:
        state = self._runs.get(run_id)
        if state is None:
            state = self._runs[run_id] = RunState()
        return state

    async def serve(self) -> None:
        """Run the shared watches (one pair per namespace in use) until cancelled."""
        await self.connections.serve()

    async def aclose(self) -> None:
        """Close the API clients (the runs keep running)."""
        await self.connections.aclose()

    async def preflight(self, spec: RunSpec) -> list[str]:
        """Render the manifest and check the cluster; return warnings.
        Raises ManifestError, ConfigError, PreflightConfigError (the user's
        to fix), PreflightError (the cluster failed). Creates nothing."""
        return await self.preflights.check(spec)

    async def doctor(self) -> list[dict[str, Any]]:
        """Checks for ``jobsup doctor``: kubeconfig, API server, RBAC."""
        return await self.preflights.doctor()

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        """Create the run's objects and stage the source; return the handle.
        Raises BackendError after deleting what it created."""
        return await self.launcher.start(spec, reporter, self._state(spec.run_id))

    async def never_started(self, spec: RunSpec) -> bool:
        """Always True: asked only of an admitted run with no handle
        recorded, and ``start`` records its handle (the objects it plans)
        before it creates anything, so such a run has nothing in the
        cluster: a restarted daemon starts it."""
        return True

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        """Follow the run until it is terminal; also how a restarted daemon
        reattaches."""
        try:
            await supervise_run(
                spec,
                handle,
                reporter,
                state=self._state(spec.run_id),
                connections=self.connections,
                launcher=self.launcher,
                cleanup=self.cleanup,
                logs=self.logs,
                stats=self.stats,
            )
        finally:
            # The run is over (or the daemon stops): drop what was kept for it.
            self._runs.pop(spec.run_id, None)

    async def cancel(self, spec: RunSpec, handle: Mapping[str, Any]) -> None:
        """Delete the run's objects newest first (Jobs with propagationPolicy
        Background; NotFound counts as gone) and return once no pod of the
        run remains. Idempotent. Raises BackendError when an object cannot
        be deleted or pods are still there after ``cancel_timeout_s``."""
        state = self._state(spec.run_id)
        async with state.lock:
            state.canceled = True
        settings = RunSettings.of(spec)
        context = str(handle.get("context")) if handle.get("context") else settings.context
        ns = str(handle.get("namespace") or settings.namespace)
        cluster = await self.connections.cluster(context)
        refs = [ObjectRef.from_json(o) for o in handle.get("objects") or []]
        known = {(r.kind, r.name) for r in refs}
        refs += [r for r in state.created if (r.kind, r.name) not in known]
        await self.cleanup.cancel(cluster, self.connections.resolver(cluster), ns, spec.run_id, refs)
