"""The run's objects on the API server: where each kind lives, the per-run
env Secret, dry run, create, delete (docs/kubernetes.md, "What jobsup adds",
"Submit", "Cancel").

Any kind a manifest holds is reached by its REST path, found once per
cluster through API discovery (``/api/v1``, ``/apis/<group>/<version>``:
the resource whose ``kind`` matches and that is not a subresource), the way
``kubectl`` maps kinds to resources; the common kinds are known up front.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import structlog

from supervisord.daemon.backends.kubernetes.client.access import Cluster
from supervisord.daemon.backends.kubernetes.client.errors import ConflictError, NotFoundError
from supervisord.shared.manifest.inject import LABEL_RUN, env_secret_name

__all__ = [
    "MANAGED_BY_LABEL",
    "ObjectRef",
    "ResourceInfo",
    "ResourceResolver",
    "env_secret",
    "env_secret_name",
    "owner_reference",
]

log = structlog.get_logger("jobsup.kubernetes.objects")

#: Label on the env Secret (app.kubernetes.io/managed-by is the common key;
#: jobsup's own prefix keeps it apart from what other tools manage).
MANAGED_BY_LABEL = "jobsup.io/managed-by"

_KNOWN: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Pod"): ("pods", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Service"): ("services", True),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "PersistentVolumeClaim"): ("persistentvolumeclaims", True),
    ("batch/v1", "Job"): ("jobs", True),
    ("node.k8s.io/v1", "RuntimeClass"): ("runtimeclasses", False),
}


def env_secret(run_id: str, namespace: str, labels: Mapping[str, str], env: Mapping[str, str]) -> dict[str, Any]:
    """The env Secret object: type Opaque, ``stringData`` the task's env,
    labels ``jobsup.io/managed-by: jobsup`` and the run labels."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": env_secret_name(run_id),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: "jobsup", **labels},
        },
        "type": "Opaque",
        "stringData": dict(env),
    }


def owner_reference(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to ``obj`` (a created object with a uid), so the
    garbage collector deletes the dependent with it (not a controller
    reference; blockOwnerDeletion false)."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj.get("apiVersion") or "batch/v1",
        "kind": obj.get("kind") or "Job",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": False,
        "blockOwnerDeletion": False,
    }


@dataclasses.dataclass(frozen=True)
class ResourceInfo:
    """Where objects of one kind live: ``group_version`` (``v1``,
    ``batch/v1``), ``plural`` (``jobs``), ``namespaced``."""

    group_version: str
    kind: str
    plural: str
    namespaced: bool

    def collection_path(self, namespace: str) -> str:
        """``/api/v1/namespaces/<ns>/pods`` or ``/apis/<g>/<v>/...``."""
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        return f"{base}/namespaces/{namespace}/{self.plural}" if self.namespaced else f"{base}/{self.plural}"

    def object_path(self, namespace: str, name: str) -> str:
        """The path of one object."""
        return f"{self.collection_path(namespace)}/{name}"


@dataclasses.dataclass(frozen=True)
class ObjectRef:
    """One object jobsup created (or will create): what ``ObjectCreated``
    records and cancel deletes."""

    api_version: str
    kind: str
    name: str
    uid: str | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        """The reference of an object dict."""
        meta = obj.get("metadata") or {}
        return cls(str(obj.get("apiVersion")), str(obj.get("kind")), str(meta.get("name")), meta.get("uid"))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ObjectRef:
        """From :meth:`to_json`'s shape."""
        return cls(str(data["apiVersion"]), str(data["kind"]), str(data["name"]), data.get("uid"))

    def to_json(self) -> dict[str, Any]:
        """``{"apiVersion", "kind", "name", "uid"}``."""
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


class ResourceResolver:
    """Maps (apiVersion, kind) to a :class:`ResourceInfo` on one cluster,
    through discovery, cached."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._cache: dict[tuple[str, str], ResourceInfo] = {
            key: ResourceInfo(key[0], key[1], plural, namespaced) for key, (plural, namespaced) in _KNOWN.items()
        }

    async def resolve(self, api_version: str, kind: str) -> ResourceInfo:
        """The resource for ``kind`` in ``api_version``. Raises
        KubernetesApiError (reason ``NotFound``) when the server does not
        serve it, naming both."""
        key = (api_version, kind)
        found = self._cache.get(key)
        if found is not None:
            return found
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            body = await self.cluster.request("GET", path, what=f"discover {api_version}")
        except NotFoundError:
            raise NotFoundError(
                f"the cluster does not serve apiVersion {api_version} (needed for kind {kind})",
                status=404,
                reason="NotFound",
            ) from None
        for res in body.get("resources") or []:
            name = str(res.get("name") or "")
            if res.get("kind") == kind and "/" not in name:
                info = ResourceInfo(api_version, kind, name, bool(res.get("namespaced")))
                self._cache[key] = info
                return info
        raise NotFoundError(f"the cluster serves {api_version} but no kind {kind} in it", status=404, reason="NotFound")

    async def info_of(self, obj: Mapping[str, Any]) -> ResourceInfo:
        """The resource of an object dict (its apiVersion and kind)."""
        return await self.resolve(str(obj.get("apiVersion")), str(obj.get("kind")))

    # ------------------------------------------------------------- verbs

    async def dry_run(self, obj: Mapping[str, Any], namespace: str) -> None:
        """Server-side dry run of a create (``dryRun=All``): defaulting,
        validation and admission run, nothing is stored. Raises
        KubernetesApiError with the API's message."""
        info = await self.info_of(obj)
        await self.cluster.request(
            "POST",
            info.collection_path(namespace),
            query=[("dryRun", "All"), ("fieldManager", "jobsup")],
            body=dict(obj),
            what=f"dry run of {ObjectRef.of(obj)}",
        )

    async def create(self, obj: Mapping[str, Any], namespace: str, run_id: str) -> dict[str, Any]:
        """Create ``obj`` and return the stored object. A 409 for an object
        that already carries this run's ``jobsup.io/run`` label (a retried
        create whose first try went through) returns that object. Raises
        KubernetesApiError with the API's message."""
        info = await self.info_of(obj)
        ref = ObjectRef.of(obj)
        try:
            created: dict[str, Any] = await self.cluster.request(
                "POST",
                info.collection_path(namespace),
                query=[("fieldManager", "jobsup")],
                body=dict(obj),
                what=f"create {ref}",
            )
            return created
        except ConflictError as err:
            existing = await self.get(ref.api_version, ref.kind, ref.name, namespace)
            if existing is not None and ((existing.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN) == run_id:
                log.info("object already created by this run", object=str(ref), run=run_id)
                return existing
            raise ConflictError(
                f"{err}. Another object named {ref.name} exists; put {{{{JOBSUP_RUN}}}} in metadata.name so each run gets its own",
                status=409,
                reason="AlreadyExists",
                body=err.body,
            ) from None

    async def replace(self, obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """PUT ``obj`` over the stored object of the same name (an update;
        ``metadata.resourceVersion`` makes it conditional when set)."""
        info = await self.info_of(obj)
        ref = ObjectRef.of(obj)
        replaced: dict[str, Any] = await self.cluster.request(
            "PUT",
            info.object_path(namespace, ref.name),
            query=[("fieldManager", "jobsup")],
            body=dict(obj),
            what=f"update {ref}",
        )
        return replaced

    async def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        """The stored object, or None when it does not exist."""
        info = await self.resolve(api_version, kind)
        try:
            found: dict[str, Any] = await self.cluster.request(
                "GET", info.object_path(namespace, name), what=f"get {kind}/{name}"
            )
            return found
        except NotFoundError:
            return None

    async def delete(self, ref: ObjectRef, namespace: str) -> bool:
        """Delete one object with ``propagationPolicy: Background`` (its
        dependents, e.g. a Job's pods, are garbage-collected); True when a
        delete was issued, False when it was already gone (NotFound).
        With a uid, a ``preconditions.uid`` keeps a newer object of the same
        name safe. Raises KubernetesApiError for other errors."""
        info = await self.resolve(ref.api_version, ref.kind)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if ref.uid:
            body["preconditions"] = {"uid": ref.uid}
        try:
            await self.cluster.request("DELETE", info.object_path(namespace, ref.name), body=body, what=f"delete {ref}")
        except NotFoundError:
            return False
        except ConflictError:
            if ref.uid:
                # Precondition failed: the name now belongs to another object; ours is gone.
                return False
            raise
        return True

    async def list_run(self, api_version: str, kind: str, namespace: str, run_id: str) -> list[dict[str, Any]]:
        """The objects of one kind labelled ``jobsup.io/run=<run_id>``."""
        info = await self.resolve(api_version, kind)
        body = await self.cluster.request(
            "GET",
            info.collection_path(namespace),
            query=[("labelSelector", f"{LABEL_RUN}={run_id}")],
            what=f"list {info.plural} of run {run_id}",
        )
        items: list[dict[str, Any]] = []
        for item in body.get("items") or []:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
            items.append(item)
        return items
