"""Shared watches: one watch on Jobs and one on Pods per namespace, for
every run at once (docs/kubernetes.md, "While it runs").

Both watches select ``jobsup.io/run`` (the label jobsup puts on every object
and on the primary pod template), keep an in-memory cache of what they saw,
and wake the runs whose objects changed. They follow the list-then-watch
pattern of the API concepts page
(https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):

1. LIST with the label selector; the list's ``resourceVersion`` is where the
   watch starts; the cache is reconciled with the list (objects missing
   from it count as deleted);
2. WATCH from that ``resourceVersion`` with ``allowWatchBookmarks``, each
   event moving the resume point forward; when the server ends the watch
   (``timeoutSeconds``) it is resumed from the last ``resourceVersion``;
3. a ``410 Gone``/``Expired`` (as an HTTP status or an ERROR event) means
   the resume point is too old: LIST again and reconcile;
4. every ``resync_s`` seconds the watch is ended and the cache relisted, which
   also catches a watch that went silent without an error; a read that gets
   no byte (not even a BOOKMARK) for longer than the watch's own timeout
   counts as such a stall.

API errors are retried with capped backoff; the cache keeps its last state
meanwhile.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

import anyio
import structlog

from supervisord.daemon.backends.kubernetes.client.access import Cluster
from supervisord.daemon.backends.kubernetes.client.errors import (
    GoneError,
    KubernetesApiError,
    UnreachableError,
    api_error,
)
from supervisord.shared.manifest.inject import LABEL_RUN

__all__ = ["NamespaceWatch", "RunView", "job_pods"]

log = structlog.get_logger("jobsup.kubernetes.watch")

_RESOURCES = {
    "jobs": "/apis/batch/v1/namespaces/{ns}/jobs",
    "pods": "/api/v1/namespaces/{ns}/pods",
}


def job_pods(job: Mapping[str, Any], pods: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods the Job controls: a controller ownerReference to the Job's
    uid, else the ``job-name`` label (older controllers); by name."""
    meta = job.get("metadata") or {}
    uid, name = meta.get("uid"), meta.get("name")
    out = []
    for pod in pods.values():
        pmeta = pod.get("metadata") or {}
        refs = pmeta.get("ownerReferences") or []
        owned = any(r.get("uid") == uid and r.get("kind") == "Job" for r in refs if isinstance(r, Mapping))
        labels = pmeta.get("labels") or {}
        if owned or (not refs and name and labels.get("job-name") == name):
            out.append(pod)
    return sorted(out, key=lambda p: str((p.get("metadata") or {}).get("name")))


@dataclasses.dataclass
class RunView:
    """What the namespace watches know of one run: its Jobs and Pods by name
    (``jobs``, ``pods``), the last state of those seen deleted
    (``deleted_jobs``, ``deleted_pods``), and whether both watches have
    listed at least once (``synced``; from then on the cache is live)."""

    run_id: str
    jobs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    deleted_jobs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    deleted_pods: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    listed: set[str] = dataclasses.field(default_factory=set)
    """The resources the namespace watch has listed at least once (shared
    with the :class:`NamespaceWatch`)."""
    _changed: anyio.Event = dataclasses.field(default_factory=anyio.Event)

    @property
    def synced(self) -> bool:
        """True once both the Job and the Pod watch have listed."""
        return self.listed >= set(_RESOURCES)

    def token(self) -> anyio.Event:
        """An event set at the next change: take it *before* reading the
        view, then wait on it (no lost wake-up)."""
        return self._changed

    def adopt_ended_pods(self, pods: list[Mapping[str, Any]]) -> bool:
        """Take the pods of ``pods`` (read from the API server directly,
        e.g. a LIST) that have ended (phase Succeeded/Failed) where the
        view's copy of the same pod has not: the pod watch may lag seconds
        behind the Job watch under load, and the log follower waits for the
        pod's end. A pod's phase never leaves Succeeded/Failed, so the watch
        does not put the older state back (see :meth:`NamespaceWatch._apply`).
        Wakes the run's waiters and returns True when one was taken."""
        taken = False
        for pod in pods:
            name = str((pod.get("metadata") or {}).get("name") or "")
            mine = self.pods.get(name)
            if mine is not None and _same_uid(mine, pod) and _pod_ended(pod) and not _pod_ended(mine):
                self.pods[name] = dict(pod)
                taken = True
        if taken:
            self.notify()
        return taken

    def notify(self) -> None:
        """Wake everyone holding the current :meth:`token`."""
        event, self._changed = self._changed, anyio.Event()
        event.set()

    async def wait(self, timeout_s: float, token: anyio.Event | None = None) -> bool:
        """Wait for a change (after ``token`` if given) at most ``timeout_s``
        seconds; True when something changed."""
        event = token or self._changed
        with anyio.move_on_after(timeout_s):
            await event.wait()
            return True
        return False


class NamespaceWatch:
    """The Job and Pod watches of one namespace of one cluster.

    ``resync_s``: seconds between relists; ``watch_timeout_s``: the
    ``timeoutSeconds`` of each watch request (the server ends it then and
    it is resumed). Run :meth:`run` in a task group for as long as runs
    need it.
    """

    def __init__(self, cluster: Cluster, namespace: str, *, resync_s: float = 60.0, watch_timeout_s: int = 290) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self._views: dict[str, RunView] = {}
        self._objects: dict[str, dict[str, dict[str, Any]]] = {r: {} for r in _RESOURCES}
        self._listed: set[str] = set()
        self.relists = 0
        """How many LISTs were made (initial, after 410, resyncs)."""
        self.events = 0
        """How many watch events were applied."""

    def view(self, run_id: str) -> RunView:
        """The run's view (made on first use, filled from the cache)."""
        view = self._views.get(run_id)
        if view is None:
            view = RunView(run_id, listed=self._listed)
            for resource, objects in self._objects.items():
                target = view.jobs if resource == "jobs" else view.pods
                for name, obj in objects.items():
                    if _run_of(obj) == run_id:
                        target[name] = obj
            self._views[run_id] = view
        return view

    def forget(self, run_id: str) -> None:
        """Drop a run's view (its objects stay cached while they exist)."""
        self._views.pop(run_id, None)

    async def wait_synced(self, view: RunView, timeout_s: float) -> bool:
        """Wait until ``view`` is synced (both watches listed); False on timeout."""
        with anyio.move_on_after(timeout_s):
            while not view.synced:
                token = view.token()
                if view.synced:
                    break
                await view.wait(5.0, token)
            return True
        return view.synced

    # ------------------------------------------------------------- running

    async def run(self) -> None:
        """Keep both watches going until cancelled."""
        async with anyio.create_task_group() as tg:
            for resource in _RESOURCES:
                tg.start_soon(self._loop, resource, name=f"watch {self.namespace}/{resource}")

    async def _loop(self, resource: str) -> None:
        path = _RESOURCES[resource].format(ns=self.namespace)
        rv: str | None = None
        listed_at = 0.0
        failures = 0
        while True:
            try:
                if rv is None or time.monotonic() - listed_at >= self.resync_s:
                    rv = await self._relist(resource, path)
                    listed_at = time.monotonic()
                left = max(1, int(self.resync_s - (time.monotonic() - listed_at)))
                rv = await self._watch(resource, path, rv, min(self.watch_timeout_s, left))
                failures = 0
            except _Expired:
                log.info("watch expired; relisting", namespace=self.namespace, resource=resource)
                rv = None
            except KubernetesApiError as err:
                failures += 1
                wait = self.cluster.retry.delay(min(failures, 8), err.retry_after_s)
                log.warning(
                    "watch failed; retrying",
                    namespace=self.namespace,
                    resource=resource,
                    error=str(err),
                    wait_s=round(wait, 2),
                )
                if isinstance(err, GoneError):
                    rv = None
                await anyio.sleep(wait)

    async def _relist(self, resource: str, path: str) -> str:
        body = await self.cluster.request(
            "GET", path, query=[("labelSelector", LABEL_RUN)], what=f"list {resource} in namespace {self.namespace}"
        )
        self.relists += 1
        items = {str(o["metadata"]["name"]): o for o in body.get("items") or []}
        kind = "Job" if resource == "jobs" else "Pod"
        for obj in items.values():
            obj.setdefault("kind", kind)
        old = dict(self._objects[resource])
        for name, obj in old.items():
            if name not in items:
                self._apply(resource, "DELETED", obj)
        for name, obj in items.items():
            prev = old.get(name)
            if prev is None or prev["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                self._apply(resource, "MODIFIED" if prev else "ADDED", obj)
        if resource not in self._listed:
            self._listed.add(resource)
            for view in self._views.values():
                view.notify()
        return str((body.get("metadata") or {}).get("resourceVersion") or "0")

    async def _watch(self, resource: str, path: str, rv: str, timeout_s: int) -> str:
        query = [
            ("watch", "1"),
            ("labelSelector", LABEL_RUN),
            ("resourceVersion", rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout_s),
        ]
        async with self.cluster.stream(path, query, what=f"watch {resource} in namespace {self.namespace}") as response:
            lines = response.aiter_lines()
            while True:
                line: str | None = None
                with anyio.move_on_after(timeout_s + 30):
                    try:
                        line = await lines.__anext__()
                    except StopAsyncIteration:
                        return rv
                    except Exception as exc:  # noqa: BLE001 - the connection broke mid-stream
                        raise UnreachableError(
                            f"watch {resource}: the stream broke ({type(exc).__name__}: {exc})",
                            status=0,
                            reason="Unreachable",
                        ) from None
                if line is None:
                    log.warning("watch silent for too long; relisting", namespace=self.namespace, resource=resource)
                    raise _Expired
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise _Expired
                    raise api_error(
                        f"watch {resource}: {obj.get('message') or obj}",
                        status=int(code or 500),
                        reason=str(obj.get("reason") or "Unknown"),
                    )
                new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    obj.setdefault("kind", "Job" if resource == "jobs" else "Pod")
                    self._apply(resource, kind, obj)
                    self.events += 1
                rv = new_rv

    def _apply(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        name = str(obj["metadata"]["name"])
        objects = self._objects[resource]
        if kind == "DELETED":
            objects.pop(name, None)
        else:
            objects[name] = obj
        run_id = _run_of(obj)
        view = self._views.get(run_id) if run_id else None
        if view is None:
            return
        live, gone = (view.jobs, view.deleted_jobs) if resource == "jobs" else (view.pods, view.deleted_pods)
        if kind == "DELETED":
            live.pop(name, None)
            gone[name] = obj
        else:
            # A new object of the same name replaces one seen deleted.
            if name in gone and gone[name]["metadata"].get("uid") != obj["metadata"].get("uid"):
                gone.pop(name, None)
            mine = live.get(name)
            if (
                resource == "pods"
                and mine is not None
                and _same_uid(mine, obj)
                and _pod_ended(mine)
                and not _pod_ended(obj)
            ):
                return  # an older state of a pod the view saw end (RunView.adopt_ended_pods)
            live[name] = obj
        view.notify()


class _Expired(Exception):
    """The watch's resourceVersion is too old (410) or the watch stalled: relist."""


def _pod_ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _same_uid(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return bool((a.get("metadata") or {}).get("uid")) and (a.get("metadata") or {}).get("uid") == (
        b.get("metadata") or {}
    ).get("uid")


def _run_of(obj: Mapping[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_RUN)
    return str(value) if value else None
