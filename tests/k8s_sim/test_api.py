"""The simulated API server through the official kubernetes client: serving,
auth, CRUD semantics, Status errors, lists, watches and delete propagation."""

from __future__ import annotations

import json
import ssl
import threading
import urllib.request
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import AccessRule, SimCluster
from .k8s_typed import Watch, iter_resp_lines, status_body, to_dict
from .manifests import job, pod


def _raw(sim: SimCluster, path: str, token: str | None, method: str = "GET") -> tuple[int, dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=str(sim.ca_cert_path))
    req = urllib.request.Request(sim.url + path, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _finished(batch: Any, name: str, ns: str) -> str | None:
    j = batch.read_namespaced_job(name, ns)
    for c in j.status.conditions or []:
        if c.type in ("Complete", "Failed") and c.status == "True":
            return str(c.type)
    return None


def test_kubeconfig_contexts_and_bearer_auth(sim: SimCluster) -> None:
    for ctx in sim.contexts:
        api: Any = client.CoreV1Api(sim.api_client(ctx))
        names = [n.metadata.name for n in api.list_namespace().items]
        assert sim.namespace in names
    assert sim.exec_plugin_calls() >= 1, "the exec context must get its token from the plugin"
    assert sim.url.startswith("https://127.0.0.1:")
    status, body = _raw(sim, "/api/v1/namespaces", None)
    assert status == 401 and body["reason"] == "Unauthorized" and body["kind"] == "Status"
    status, body = _raw(sim, "/api/v1/namespaces", "wrong-token")
    assert status == 401 and body["code"] == 401
    assert client.VersionApi(sim.api_client()).get_code().git_version.startswith("v1.")


def test_create_get_replace_and_status_errors(sim: SimCluster, batch: Any, core: Any) -> None:
    ns = sim.namespace
    created = batch.create_namespaced_job(ns, job("crud", "sleep 30"))
    md = created.metadata
    assert md.uid and md.resource_version and md.creation_timestamp and md.generation == 1
    assert created.spec.backoff_limit == 0 and created.spec.completions == 1
    assert created.spec.template.metadata.labels["batch.kubernetes.io/controller-uid"] == md.uid
    assert created.spec.template.metadata.labels["job-name"] == "crud"

    with pytest.raises(ApiException) as exc:
        batch.create_namespaced_job(ns, job("crud", "true"))
    body = status_body(exc.value)
    assert exc.value.status == 409 and body["reason"] == "AlreadyExists"
    assert body["message"] == 'jobs.batch "crud" already exists'
    assert body["details"] == {"name": "crud", "group": "batch", "kind": "jobs"}

    with pytest.raises(ApiException) as exc:
        batch.read_namespaced_job("nope", ns)
    body = status_body(exc.value)
    assert exc.value.status == 404 and body["reason"] == "NotFound" and body["message"] == 'jobs.batch "nope" not found'

    bad = job("bad", "true", restart_policy="Always")
    with pytest.raises(ApiException) as exc:
        batch.create_namespaced_job(ns, bad)
    body = status_body(exc.value)
    assert exc.value.status == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "spec.template.spec.restartPolicy"
    assert 'Unsupported value: "Always"' in body["message"]

    # Optimistic concurrency: a stale resourceVersion is a 409 Conflict.
    fresh = batch.read_namespaced_job("crud", ns)
    fresh.metadata.labels = {"a": "1"}
    updated = batch.replace_namespaced_job("crud", ns, fresh)
    assert int(updated.metadata.resource_version) > int(md.resource_version)
    assert updated.metadata.generation == 1, "a metadata change does not bump generation"
    stale = batch.read_namespaced_job("crud", ns)
    stale.metadata.resource_version = md.resource_version
    stale.metadata.labels = {"a": "2"}
    with pytest.raises(ApiException) as exc:
        batch.replace_namespaced_job("crud", ns, stale)
    assert exc.value.status == 409 and status_body(exc.value)["reason"] == "Conflict"

    # Merge patch.
    patched = batch.patch_namespaced_job("crud", ns, {"metadata": {"annotations": {"x": "y"}}})
    assert patched.metadata.annotations == {"x": "y"}

    # Namespace must exist.
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("no-such-ns", {"metadata": {"name": "c"}, "data": {}})
    assert exc.value.status == 404


def test_dry_run_validates_and_stores_nothing(sim: SimCluster, batch: Any) -> None:
    ns = sim.namespace
    out = batch.create_namespaced_job(ns, job("dry", "echo no"), dry_run="All")
    assert out.metadata.name == "dry" and out.spec.template.metadata.labels["job-name"] == "dry"
    assert not out.metadata.resource_version
    with pytest.raises(ApiException) as exc:
        batch.read_namespaced_job("dry", ns)
    assert exc.value.status == 404
    assert batch.list_namespaced_job(ns).items == []
    assert sim.list_objects("pods") == []
    with pytest.raises(ApiException) as exc:
        batch.create_namespaced_job(ns, job("dry", "true", restart_policy="Always"), dry_run="All")
    assert exc.value.status == 422


def test_seeded_objects_and_access_review(sim: SimCluster, core: Any, api_client: Any) -> None:
    ns = sim.namespace
    sim.create_secret("creds", {"token": "s3cret"})
    sim.create_pvc("data", storage="5Gi")
    sim.create_runtime_class("gvisor", handler="runsc")
    assert core.read_namespaced_secret("creds", ns).data == {"token": "czNjcmV0"}
    pvc = core.read_namespaced_persistent_volume_claim("data", ns)
    assert pvc.status.phase == "Bound" and pvc.spec.resources.requests == {"storage": "5Gi"}
    rc = client.NodeV1Api(api_client).read_runtime_class("gvisor")
    assert rc.handler == "runsc"
    with pytest.raises(ApiException) as exc:
        client.NodeV1Api(api_client).read_runtime_class("kata")
    assert exc.value.status == 404

    auth: Any = client.AuthorizationV1Api(api_client)

    def can(verb: str, resource: str, group: str = "", sub: str | None = None) -> bool:
        attrs = client.V1ResourceAttributes(namespace=ns, verb=verb, resource=resource, group=group, subresource=sub)
        review = auth.create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attrs))
        )
        return bool(review.status.allowed)

    assert can("create", "jobs", "batch")
    sim.set_access_rules(
        [AccessRule(verbs=("get", "list", "watch", "create", "delete"), groups=("batch",), resources=("jobs",))]
    )
    assert can("create", "jobs", "batch")
    assert not can("create", "pods", "", "exec")
    assert not can("delete", "pods")
    sim.set_access_rules([AccessRule(verbs=("list",), groups=("",), resources=("pods",))], enforce=True)
    core.list_namespaced_pod(ns)
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_secret(ns)
    body = status_body(exc.value)
    assert exc.value.status == 403 and body["reason"] == "Forbidden"
    assert 'cannot list resource "secrets"' in body["message"]


def test_list_label_selector_and_pages(sim: SimCluster, core: Any) -> None:
    ns = sim.namespace
    for i in range(5):
        sim.create_configmap(f"cm-{i}", {"i": str(i)})
        sim.create_object("configmaps", {"metadata": {"name": f"lab-{i}", "labels": {"app": "x", "tier": str(i % 2)}}})
    got = core.list_namespaced_config_map(ns, label_selector="app=x,tier=1")
    assert sorted(c.metadata.name for c in got.items) == ["lab-1", "lab-3"]
    got = core.list_namespaced_config_map(ns, label_selector="tier in (0),app")
    assert sorted(c.metadata.name for c in got.items) == ["lab-0", "lab-2", "lab-4"]
    assert len(core.list_namespaced_config_map(ns, label_selector="!app").items) == 5
    assert [
        c.metadata.name for c in core.list_namespaced_config_map(ns, field_selector="metadata.name=cm-3").items
    ] == ["cm-3"]
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map(ns, field_selector="data.i=3")
    assert exc.value.status == 400
    seen: list[str] = []
    page = core.list_namespaced_config_map(ns, limit=4)
    seen += [c.metadata.name for c in page.items]
    while page.metadata._continue:
        page = core.list_namespaced_config_map(ns, limit=4, _continue=page.metadata._continue)
        seen += [c.metadata.name for c in page.items]
    assert sorted(seen) == sorted([f"cm-{i}" for i in range(5)] + [f"lab-{i}" for i in range(5)])
    core.delete_collection_namespaced_config_map(ns, label_selector="tier=0")
    assert sorted(c.metadata.name for c in core.list_namespaced_config_map(ns, label_selector="app").items) == [
        "lab-1",
        "lab-3",
    ]


def test_watch_from_resource_version_sees_job_lifecycle(sim: SimCluster, batch: Any, core: Any) -> None:
    ns = sim.namespace
    rv = batch.list_namespaced_job(ns).metadata.resource_version
    batch.create_namespaced_job(ns, job("w", "echo from-the-pod; sleep 0.3"))
    events: list[tuple[str, list[str]]] = []
    w = Watch()
    for ev in w.stream(batch.list_namespaced_job, ns, resource_version=rv, timeout_seconds=20):
        conds = [c.type for c in ev["object"].status.conditions or []]
        events.append((ev["type"], conds))
        if "Complete" in conds or "Failed" in conds:
            w.stop()
    assert events[0][0] == "ADDED"
    assert events[-1][1] == ["SuccessCriteriaMet", "Complete"], events
    p = sim.pod_of_job("w")
    assert p is not None
    assert core.read_namespaced_pod_log(p["metadata"]["name"], ns) == "from-the-pod\n"
    # A watch without resourceVersion starts with synthetic ADDED events.
    got = [
        (e["type"], e["object"].metadata.name) for e in Watch().stream(batch.list_namespaced_job, ns, timeout_seconds=1)
    ]
    assert got == [("ADDED", "w")]
    # Label-selected pod watch; delete is DELETED.
    pods_rv = core.list_namespaced_pod(ns).metadata.resource_version
    batch.delete_namespaced_job("w", ns, propagation_policy="Background")
    types = []
    for e in Watch().stream(
        core.list_namespaced_pod, ns, label_selector="job-name=w", resource_version=pods_rv, timeout_seconds=10
    ):
        types.append(e["type"])
        if e["type"] == "DELETED":
            break
    assert types[-1] == "DELETED"


def test_watch_older_than_window_is_410(sim: SimCluster, core: Any) -> None:
    ns = sim.namespace
    old_rv = core.list_namespaced_config_map(ns).metadata.resource_version
    sim.create_configmap("a", {})
    # An open watch gets an ERROR event carrying a 410 Status and ends.
    got: list[dict[str, Any]] = []
    ready = threading.Event()

    def watch_open() -> None:
        resp = core.list_namespaced_config_map(
            ns, watch=True, resource_version=old_rv, timeout_seconds=20, _preload_content=False
        )
        for line in iter_resp_lines(resp):
            got.append(json.loads(line))
            ready.set()

    t = threading.Thread(target=watch_open)
    t.start()
    assert ready.wait(10)
    sim.expire_watches()
    t.join(15)
    assert not t.is_alive()
    assert got[0]["type"] == "ADDED" and got[-1]["type"] == "ERROR"
    assert got[-1]["object"]["code"] == 410 and got[-1]["object"]["reason"] == "Expired"
    # A new watch from the old resourceVersion: 410 (the client raises it when
    # retries are off, as with timeout_seconds).
    with pytest.raises(ApiException) as exc:
        for _ in Watch().stream(core.list_namespaced_config_map, ns, resource_version=old_rv, timeout_seconds=5):
            pass
    assert exc.value.status == 410
    # A fresh list gives a resourceVersion to watch from again.
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    sim.create_configmap("b", {})
    evs = []
    for e in Watch().stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=5):
        evs.append((e["type"], e["object"].metadata.name))
        break
    assert evs == [("ADDED", "b")]


def test_watch_window_size_is_honoured(sim: SimCluster, core: Any) -> None:
    sim.configure(watch_window=3)
    ns = sim.namespace
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    for i in range(5):
        sim.create_configmap(f"c{i}", {})
    with pytest.raises(ApiException) as exc:
        for _ in Watch().stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=2):
            pass
    assert exc.value.status == 410


def test_watch_bookmarks(sim: SimCluster, core: Any) -> None:
    sim.configure(bookmark_interval_s=0.2)
    ns = sim.namespace
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    resp = core.list_namespaced_config_map(
        ns, watch=True, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=1, _preload_content=False
    )
    lines = [json.loads(x) for x in iter_resp_lines(resp)]
    assert lines and all(x["type"] == "BOOKMARK" for x in lines)
    assert int(lines[-1]["object"]["metadata"]["resourceVersion"]) >= int(rv)


def test_delete_propagation(sim: SimCluster, batch: Any, core: Any) -> None:
    ns = sim.namespace

    def running_pod(name: str) -> dict[str, Any]:
        batch.create_namespaced_job(ns, job(name, "sleep 60"))
        found: dict[str, Any] = sim.wait_for(
            lambda: (p := sim.pod_of_job(name)) and p["status"]["phase"] == "Running" and p, what=f"{name} running"
        )
        return found

    # The API default for Jobs orphans the pods (and warns).
    p = running_pod("orphan")
    resp = batch.delete_namespaced_job_with_http_info("orphan", ns)
    assert "child pods are preserved" in resp[2].get("Warning", "")
    sim.wait_for(lambda: sim.get_object("jobs.batch", "orphan") is None, what="orphaned job gone")
    left = core.read_namespaced_pod(p["metadata"]["name"], ns)
    assert left.status.phase == "Running" and not left.metadata.owner_references
    assert not left.metadata.finalizers

    # Background: the Job goes at once (Status Success), the pods after it.
    p = running_pod("bg")
    status = to_dict(batch.delete_namespaced_job("bg", ns, propagation_policy="Background"))
    assert status["status"] == "Success" and status["details"]["name"] == "bg"
    sim.wait_for(lambda: sim.get_object("pods", p["metadata"]["name"]) is None, what="pod gone", timeout=40)

    # Foreground: the Job stays (deletionTimestamp, finalizer) until its pods are gone.
    p = running_pod("fg")
    out = to_dict(batch.delete_namespaced_job("fg", ns, propagation_policy="Foreground"))
    assert out["metadata"]["deletionTimestamp"] and "foregroundDeletion" in out["metadata"]["finalizers"]
    sim.wait_for(lambda: sim.get_object("jobs.batch", "fg") is None, what="fg job gone", timeout=40)
    assert sim.get_object("pods", p["metadata"]["name"]) is None

    # Pods: graceful deletion returns the pod with deletionTimestamp.
    core.create_namespaced_pod(ns, pod("bare", "trap 'exit 0' TERM; sleep 60 & wait"))
    sim.wait_for(
        lambda: (x := sim.get_object("pods", "bare")) and x["status"]["phase"] == "Running", what="bare running"
    )
    out = to_dict(core.delete_namespaced_pod("bare", ns))
    assert out["metadata"]["deletionTimestamp"]
    sim.wait_for(lambda: sim.get_object("pods", "bare") is None, what="bare pod gone", timeout=40)
