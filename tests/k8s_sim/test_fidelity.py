"""Where a real cluster is less kind than a test would like: each behaviour
of the simulator that jobsup must survive, through the official client."""

from __future__ import annotations

from typing import Any

from . import SimCluster
from .manifests import job


def _owned(kind: str, api_version: str, name: str, owner: dict[str, Any]) -> dict[str, Any]:
    ref = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": False,
        "blockOwnerDeletion": True,
    }
    body: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "ownerReferences": [ref]}}
    if kind in ("Secret", "ConfigMap"):
        body["data"] = {}
    if kind == "Service":
        body["spec"] = {"clusterIP": "None", "selector": {"a": "b"}, "ports": [{"port": 80}]}
    return body


def test_garbage_collection_of_every_owned_kind(sim: SimCluster, batch: Any) -> None:
    # kube-controller-manager's garbage collector follows ownerReferences of
    # every kind: a Secret, ConfigMap or Service owned by a Job goes with it
    # (Background and Foreground), and is orphaned by the Jobs' default.
    ns = sim.namespace
    owned = [("secrets", "Secret", "v1"), ("configmaps", "ConfigMap", "v1"), ("services", "Service", "v1")]
    for policy in ("Background", "Foreground", None):
        name = f"gc-{(policy or 'orphan').lower()}"
        stored = batch.create_namespaced_job(ns, job(name, "sleep 60"))
        owner = {"metadata": {"name": name, "uid": stored.metadata.uid}}
        for resource, kind, api_version in owned:
            sim.create_object(resource, _owned(kind, api_version, f"{name}-{resource}", owner))
        if policy is None:
            batch.delete_namespaced_job(name, ns)
        else:
            batch.delete_namespaced_job(name, ns, propagation_policy=policy)
        def job_gone(n: str = name) -> bool:
            return sim.get_object("jobs.batch", n) is None

        sim.wait_for(job_gone, what=f"{name} gone", timeout=40)
        for resource, _kind, _v in owned:
            if policy is None:
                left = sim.get_object(resource, f"{name}-{resource}")
                assert left is not None and not left["metadata"].get("ownerReferences"), left
            else:
                def collected(r: str = resource, n: str = name) -> bool:
                    return sim.get_object(r, f"{n}-{r}") is None

                sim.wait_for(collected, what=f"{resource} of {name} collected", timeout=20)
