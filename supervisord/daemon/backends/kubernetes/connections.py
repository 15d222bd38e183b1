"""The backend's connections to its clusters, shared by every run: the
clients per context (:class:`~.client.access.ClusterAccess`), one
:class:`~.client.resources.ResourceResolver` per context, and the shared
Job/Pod watches, one pair per namespace in use, run by :meth:`Connections.serve`.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import anyio.abc

from supervisord.daemon.backends.kubernetes.client.access import Cluster, ClusterAccess
from supervisord.daemon.backends.kubernetes.client.errors import KubeconfigError
from supervisord.daemon.backends.kubernetes.client.resources import ResourceResolver
from supervisord.daemon.backends.kubernetes.client.watches import NamespaceWatch
from supervisord.shared.exceptions import BackendError, KubernetesApiError

__all__ = ["Connections"]


class Connections:
    """Clusters, resolvers and watches (see the module docstring).

    ``access``: how clusters are loaded (the kubeconfig the daemon resolved);
    ``resync_s`` and ``watch_timeout_s``: the watches' relist period and
    server-side timeout, in seconds.
    """

    def __init__(self, access: ClusterAccess, *, resync_s: float, watch_timeout_s: int) -> None:
        self.access = access
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self._tg: anyio.abc.TaskGroup | None = None
        self._serving = anyio.Event()
        self._watches: dict[tuple[str, str], NamespaceWatch] = {}
        self._resolvers: dict[str, ResourceResolver] = {}

    @property
    def watches(self) -> Mapping[tuple[str, str], NamespaceWatch]:
        """The running watches by (context, namespace) (read-only)."""
        return dict(self._watches)

    async def cluster(self, context: str | None) -> Cluster:
        """The cluster of ``context`` (None: the kubeconfig's current one).
        Raises BackendError (the kubeconfig or the server failed)."""
        try:
            return await self.access.cluster(context)
        except (KubeconfigError, KubernetesApiError) as err:
            raise BackendError(str(err)) from None

    def resolver(self, cluster: Cluster) -> ResourceResolver:
        """The resolver of ``cluster`` (kept per context; a new one when the
        cluster was loaded again)."""
        resolver = self._resolvers.get(cluster.context)
        if resolver is None or resolver.cluster is not cluster:
            resolver = self._resolvers[cluster.context] = ResourceResolver(cluster)
        return resolver

    async def watch(self, cluster: Cluster, namespace: str) -> NamespaceWatch:
        """The shared watch of ``namespace``, started on first use. Raises
        BackendError when :meth:`serve` is not running (after 30 s)."""
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
        """Run the shared watches until cancelled."""
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
