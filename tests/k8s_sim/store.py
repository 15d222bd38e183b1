"""The simulated etcd plus the apiserver's generic registry: objects, resourceVersion,
the retained event window that watches resume from, finalizers and deletion.

Every method runs on the simulator's event-loop thread (no locks: the loop is the
lock). Stored objects are never mutated in place; every change stores a new dict,
so a reference handed to a watcher or a reader stays valid.

Behaviour copied from k8s.io/apiserver/pkg/registry/generic/registry/store.go
(create, update with optimistic concurrency, graceful delete, finalizers,
``ReturnDeletedObject``) and the API concepts page "Efficient detection of
changes" (resourceVersion semantics, 410 Gone after compaction).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .util import (
    JSON,
    ApiError,
    dumps,
    err_already_exists,
    err_bad_request,
    err_conflict,
    err_not_found,
    random_suffix,
    rfc3339,
    status_failure,
    status_success,
)


@dataclass(frozen=True)
class ResourceType:
    """One served resource: ``group`` ("" for core), ``version``, ``plural``,
    ``kind``, whether it is namespaced, and the field selectors it supports
    (the apiserver's per-resource field label conversion funcs)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    fields: frozenset[str] = frozenset({"metadata.name", "metadata.namespace"})
    return_deleted_object: bool = False

    @property
    def api_version(self) -> str:
        """``v1`` or ``batch/v1``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``jobs.batch`` or ``pods`` (the name used in error messages)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


_META = frozenset({"metadata.name", "metadata.namespace"})

RESOURCES: dict[tuple[str, str], ResourceType] = {
    (r.group, r.plural): r
    for r in [
        ResourceType(
            "",
            "v1",
            "pods",
            "Pod",
            True,
            _META
            | {
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            },
            return_deleted_object=True,
        ),
        ResourceType("", "v1", "secrets", "Secret", True, _META | {"type"}),
        ResourceType("", "v1", "configmaps", "ConfigMap", True),
        ResourceType("", "v1", "services", "Service", True),
        ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
        ResourceType(
            "",
            "v1",
            "events",
            "Event",
            True,
            _META
            | {
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            },
        ),
        ResourceType("", "v1", "namespaces", "Namespace", False, frozenset({"metadata.name", "status.phase"})),
        ResourceType("batch", "v1", "jobs", "Job", True, _META | {"status.successful"}),
        ResourceType("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False, frozenset({"metadata.name"})),
    ]
}

PODS = RESOURCES[("", "pods")]
JOBS = RESOURCES[("batch", "jobs")]
SECRETS = RESOURCES[("", "secrets")]
CONFIGMAPS = RESOURCES[("", "configmaps")]
EVENTS = RESOURCES[("", "events")]
NAMESPACES = RESOURCES[("", "namespaces")]

Key = tuple[str, str]
"""(namespace, name); namespace is "" for cluster-scoped objects."""


@dataclass
class WatchEvent:
    """One change: ``type`` ADDED/MODIFIED/DELETED, the store ``rv`` it made,
    the new object and the previous one (None for ADDED)."""

    type: str
    rv: int
    resource: ResourceType
    obj: JSON
    prev: JSON | None
    _line: bytes | None = None

    def line(self, type_: str | None = None) -> bytes:
        """The watch stream line ``{"type":...,"object":...}\\n``."""
        if type_ is not None and type_ != self.type:
            return dumps({"type": type_, "object": self.obj}) + b"\n"
        if self._line is None:
            self._line = dumps({"type": self.type, "object": self.obj}) + b"\n"
        return self._line


@dataclass(eq=False)
class Watcher:
    """An open watch: receives every event of its resource into ``queue``; a
    ``bytes`` item is a final line to send (an ERROR event after compaction),
    ``None`` ends the watch."""

    resource: ResourceType
    queue: asyncio.Queue[WatchEvent | bytes | None] = field(default_factory=asyncio.Queue)


def _meta(obj: JSON) -> JSON:
    md = obj.get("metadata")
    if not isinstance(md, dict):
        raise err_bad_request("metadata: Required value: the object has no metadata")
    return md


class ObjectStore:
    """Objects by resource and (namespace, name), one global resourceVersion
    counter, and a bounded history of events.

    ``window`` is how many events are retained for watches to resume from; a
    watch or continue token older than that is 410 Gone (etcd compaction).
    """

    def __init__(self, window: int = 10_000) -> None:
        self.rv = 1
        self.window = window
        self.objects: dict[ResourceType, dict[Key, JSON]] = {r: {} for r in RESOURCES.values()}
        self.history: deque[WatchEvent] = deque()
        self.min_rv = 1
        """The oldest resourceVersion a watch may start from (exclusive bound is
        ``min_rv - 1``: a watch from rv >= min_rv - 1 still sees every event)."""
        self.watchers: dict[ResourceType, set[Watcher]] = {r: set() for r in RESOURCES.values()}
        self.listeners: list[Callable[[WatchEvent], None]] = []
        self.kubelet_done: set[str] = set()
        """Uids of pods whose containers the kubelet has finished with: once
        such a pod is being deleted and has no finalizers it is removed."""

    # ------------------------------------------------------------------ reading

    def get(self, res: ResourceType, namespace: str, name: str) -> JSON:
        """The stored object, or ApiError 404 NotFound."""
        obj = self.objects[res].get((namespace if res.namespaced else "", name))
        if obj is None:
            raise err_not_found(res.qualified, name, res.group, res.plural)
        return obj

    def find(self, res: ResourceType, namespace: str, name: str) -> JSON | None:
        """The stored object or None."""
        return self.objects[res].get((namespace if res.namespaced else "", name))

    def items(self, res: ResourceType, namespace: str | None = None) -> Iterator[JSON]:
        """Every stored object of ``res`` (in ``namespace`` when given), in key order."""
        for (ns, _name), obj in sorted(self.objects[res].items()):
            if namespace is None or not res.namespaced or ns == namespace:
                yield obj

    def dependents(self, owner_uid: str) -> list[tuple[ResourceType, JSON]]:
        """Objects of every kind whose ownerReferences name ``owner_uid`` (the
        garbage collector's dependency graph: pods of a Job, but also a Secret,
        ConfigMap or Service a Job owns)."""
        out: list[tuple[ResourceType, JSON]] = []
        for res in RESOURCES.values():
            for obj in self.objects[res].values():
                for ref in obj["metadata"].get("ownerReferences") or []:
                    if ref.get("uid") == owner_uid:
                        out.append((res, obj))
                        break
        return out

    def find_by_uid(self, uid: str) -> tuple[ResourceType, JSON] | None:
        """The stored object with metadata.uid ``uid`` and its resource, or None."""
        for res in RESOURCES.values():
            for obj in self.objects[res].values():
                if obj["metadata"].get("uid") == uid:
                    return res, obj
        return None

    # ------------------------------------------------------------------ writing

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _emit(self, ev: WatchEvent) -> None:
        self.history.append(ev)
        while len(self.history) > self.window:
            dropped = self.history.popleft()
            self.min_rv = dropped.rv + 1
        for w in self.watchers[ev.resource]:
            w.queue.put_nowait(ev)
        for listener in list(self.listeners):
            listener(ev)

    def compact(self) -> int:
        """Forget every retained event (etcd compaction at the current revision):
        a watch or continue token from any older resourceVersion is 410 Gone.
        Returns the new oldest resumable resourceVersion."""
        self.history.clear()
        self.min_rv = self.rv + 1
        return self.rv

    def prepare_new(self, res: ResourceType, namespace: str, obj: JSON) -> JSON:
        """Fill server-set metadata of a new object (name from generateName, uid,
        creationTimestamp, namespace, generation) without storing it; checks the
        name is free (409). Used by create and by ``dryRun=All``."""
        md = _meta(obj)
        if res.namespaced:
            given = md.get("namespace")
            if given and given != namespace:
                raise err_bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            md["namespace"] = namespace
        else:
            md.pop("namespace", None)
        if not md.get("name"):
            if md.get("generateName"):
                md["name"] = md["generateName"] + random_suffix()
            else:
                from .util import cause, err_invalid

                raise err_invalid(
                    res.kind,
                    res.group,
                    "",
                    [cause("FieldValueRequired", "metadata.name", "Required value: name or generateName is required")],
                )
        key = (namespace if res.namespaced else "", md["name"])
        if key in self.objects[res]:
            raise err_already_exists(res.qualified, md["name"], res.group, res.plural)
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = rfc3339()
        md.pop("resourceVersion", None)
        md.pop("deletionTimestamp", None)
        md.pop("deletionGracePeriodSeconds", None)
        md["generation"] = 1
        obj["apiVersion"] = res.api_version
        obj["kind"] = res.kind
        return obj

    def create(self, res: ResourceType, namespace: str, obj: JSON) -> JSON:
        """Store a prepared object (see :meth:`prepare_new`); emits ADDED."""
        md = obj["metadata"]
        key = (namespace if res.namespaced else "", md["name"])
        if key in self.objects[res]:
            raise err_already_exists(res.qualified, md["name"], res.group, res.plural)
        rv = self._next_rv()
        md["resourceVersion"] = str(rv)
        self.objects[res][key] = obj
        self._emit(WatchEvent("ADDED", rv, res, obj, None))
        return obj

    def replace(
        self,
        res: ResourceType,
        namespace: str,
        name: str,
        new: JSON,
        *,
        check_rv: bool = True,
        status_only: bool = False,
    ) -> JSON:
        """Store a new version of an existing object (PUT semantics).

        A non-empty ``metadata.resourceVersion`` that is not the stored one is a
        409 Conflict. Server-owned metadata (uid, creationTimestamp,
        deletionTimestamp) is kept; ``generation`` increments when ``spec``
        changes. ``status_only`` keeps everything but ``status`` (the /status
        subresource); otherwise ``status`` is kept from the stored object, as
        the main resource ignores status changes. A change that leaves the
        object equal stores nothing and emits nothing. Removing the last
        finalizer of an object being deleted removes it (DELETED).
        """
        old = self.get(res, namespace, name)
        md = _meta(new)
        if md.get("name", name) != name:
            raise err_bad_request(
                f"the name of the object ({md.get('name')}) does not match the name on the URL ({name})"
            )
        if check_rv and md.get("resourceVersion") and md["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise err_conflict(res.qualified, name, res.group, res.plural)
        if status_only:
            merged = dict(old)
            merged["status"] = new.get("status", {})
            new = merged
        else:
            new = dict(new)
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
            new_md = dict(md)
            for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "namespace"):
                if k in old["metadata"]:
                    new_md[k] = old["metadata"][k]
                else:
                    new_md.pop(k, None)
            new_md["name"] = name
            new_md["generation"] = old["metadata"].get("generation", 1) + (
                1 if new.get("spec") != old.get("spec") else 0
            )
            new["metadata"] = new_md
            new["apiVersion"] = res.api_version
            new["kind"] = res.kind
        return self._store_update(res, old, new)

    def _store_update(self, res: ResourceType, old: JSON, new: JSON) -> JSON:
        new_md = dict(new["metadata"])
        new_md["resourceVersion"] = old["metadata"]["resourceVersion"]
        new["metadata"] = new_md
        if new == old:
            return old
        if new_md.get("deletionTimestamp") and not new_md.get("finalizers") and res is not PODS:
            return self._remove(res, new)
        if (
            res is PODS
            and new_md.get("deletionTimestamp")
            and not new_md.get("finalizers")
            and (
                new_md["uid"] in self.kubelet_done
                or not (new.get("spec") or {}).get("nodeName")
                or (new.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            )
        ):
            return self._remove(res, new)
        rv = self._next_rv()
        new_md["resourceVersion"] = str(rv)
        key = (new_md.get("namespace", "") if res.namespaced else "", new_md["name"])
        self.objects[res][key] = new
        self._emit(WatchEvent("MODIFIED", rv, res, new, old))
        return new

    def mutate(self, res: ResourceType, namespace: str, name: str, fn: Callable[[JSON], None]) -> JSON | None:
        """Apply ``fn`` to a deep copy of the stored object and store the result
        (a system write: no resourceVersion check, spec changes bump generation).
        Returns the stored object, or None when it does not exist."""
        import copy

        old = self.find(res, namespace, name)
        if old is None:
            return None
        new = copy.deepcopy(old)
        fn(new)
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        return self._store_update(res, old, new)

    def _remove(self, res: ResourceType, obj: JSON) -> JSON:
        md = dict(obj["metadata"])
        self.kubelet_done.discard(md["uid"])
        rv = self._next_rv()
        md["resourceVersion"] = str(rv)
        final = dict(obj)
        final["metadata"] = md
        key = (md.get("namespace", "") if res.namespaced else "", md["name"])
        prev = self.objects[res].pop(key, None)
        self._emit(WatchEvent("DELETED", rv, res, final, prev))
        return final

    def delete(
        self,
        res: ResourceType,
        namespace: str,
        name: str,
        *,
        propagation: str | None = None,
        grace_seconds: int | None = None,
        precondition_uid: str | None = None,
        precondition_rv: str | None = None,
        dry_run: bool = False,
    ) -> tuple[int, JSON]:
        """DELETE semantics of the generic registry; returns (HTTP code, body).

        - ``propagation`` Orphan or Foreground adds the ``orphan`` /
          ``foregroundDeletion`` finalizer and sets deletionTimestamp; the
          garbage collector (controller.py) finishes the deletion. Background
          removes the object now; its dependents are deleted afterwards.
          The default for Jobs is Orphan (batch/v1 Job's
          DefaultGarbageCollectionPolicy), for other resources Background.
        - Pods that are bound to a node and not terminal are deleted gracefully:
          deletionTimestamp + deletionGracePeriodSeconds (default
          spec.terminationGracePeriodSeconds, 30); the kubelet kills the
          containers and then removes the pod (pod strategy CheckGracefulDelete).
        - An object with finalizers only gets deletionTimestamp.
        - The body is the object when it still exists or for pods
          (ReturnDeletedObject), else a Status Success with details.
        """
        obj = self.get(res, namespace, name)
        md = obj["metadata"]
        if precondition_uid and precondition_uid != md["uid"]:
            raise ApiError(
                status_failure(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.qualified} "{name}": Precondition failed: '
                    f"UID in precondition: {precondition_uid}, UID in object meta: {md['uid']}",
                    {"name": name, "group": res.group, "kind": res.plural},
                )
            )
        if precondition_rv and precondition_rv != md["resourceVersion"]:
            raise err_conflict(res.qualified, name, res.group, res.plural)
        if propagation is None:
            propagation = "Orphan" if res is JOBS else "Background"
        if propagation not in ("Orphan", "Background", "Foreground"):
            raise err_bad_request(f"unsupported propagationPolicy {propagation!r}: Orphan, Background, Foreground")
        if dry_run:
            return 200, obj
        finalizers = list(md.get("finalizers") or [])
        if propagation == "Orphan" and "orphan" not in finalizers and self.dependents(md["uid"]):
            finalizers.append("orphan")
        if propagation == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        graceful = False
        if res is PODS:
            phase = (obj.get("status") or {}).get("phase")
            bound = bool((obj.get("spec") or {}).get("nodeName"))
            grace = grace_seconds
            if grace is None:
                grace = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            if bound and phase not in ("Succeeded", "Failed") and md["uid"] not in self.kubelet_done:
                graceful = True
                if md.get("deletionTimestamp"):
                    current = int(md.get("deletionGracePeriodSeconds", grace))
                    grace = min(grace, current)
        if finalizers or graceful:
            new = dict(obj)
            new_md = dict(md)
            new_md["finalizers"] = finalizers
            if not finalizers:
                new_md.pop("finalizers")
            if not new_md.get("deletionTimestamp"):
                new_md["deletionTimestamp"] = rfc3339()
                new_md["deletionGracePeriodSeconds"] = grace if graceful else 0
            elif graceful:
                new_md["deletionGracePeriodSeconds"] = grace
            new["metadata"] = new_md
            stored = self._store_update(res, obj, new)
            code = 202 if propagation == "Foreground" else 200
            return code, stored
        final = self._remove(res, obj)
        if res.return_deleted_object:
            return 200, final
        details: JSON = {"name": name, "kind": res.plural, "uid": md["uid"]}
        if res.group:
            details["group"] = res.group
        return 200, status_success(details)

    def finish_pod_deletion(self, namespace: str, name: str) -> None:
        """The kubelet's final delete (grace 0) once a deleted pod's containers are
        gone: remove it now, or when its last finalizer goes."""
        obj = self.find(PODS, namespace, name)
        if obj is None:
            return
        self.kubelet_done.add(obj["metadata"]["uid"])
        if obj["metadata"].get("finalizers"):
            return
        self._remove(PODS, obj)

    # ---------------------------------------------------------------- watches

    def events_since(self, res: ResourceType, rv: int) -> list[WatchEvent]:
        """Retained events of ``res`` with resourceVersion > ``rv``; ApiError 410
        Expired when events after ``rv`` were already compacted away."""
        if rv + 1 < self.min_rv:
            raise ApiError(status_failure(410, "Expired", f"too old resource version: {rv} ({self.min_rv - 1})"))
        return [ev for ev in self.history if ev.rv > rv and ev.resource is res]

    def add_watcher(self, res: ResourceType) -> Watcher:
        """Register an open watch; every later event of ``res`` lands in its queue."""
        w = Watcher(res)
        self.watchers[res].add(w)
        return w

    def remove_watcher(self, w: Watcher) -> None:
        """Unregister an open watch."""
        self.watchers[w.resource].discard(w)

    def close_watchers(self) -> None:
        """End every open watch (a None in its queue)."""
        for ws in self.watchers.values():
            for w in ws:
                w.queue.put_nowait(None)


def list_item(obj: JSON) -> JSON:
    """A list item as served: without kind/apiVersion (the apiserver omits them
    in the items of built-in lists)."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
