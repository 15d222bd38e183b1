"""Where a real cluster is less kind than a test would like: each behaviour
of the simulator that jobsup must survive, through the official client."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from . import SimCluster
from .k8s_typed import Watch
from .manifests import job, pod

TICKER = "i=0; while [ $i -lt 400 ]; do i=$((i+1)); echo tick$i; sleep 0.05; done"


def _owned(kind: str, api_version: str, name: str, owner: dict[str, Any]) -> dict[str, Any]:
    ref = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": False,
        "blockOwnerDeletion": True,
    }
    body: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "ownerReferences": [ref]},
    }
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


def test_crio_log_mode_one_timestamp_per_read_and_local_offset(sim: SimCluster, batch: Any, core: Any) -> None:
    # CRI-O's log writer stamps every line of one read buffer with the same
    # time.Now(), formatted with time.RFC3339Nano in the node's zone; the
    # kubelet's pods/log?timestamps=true keeps that zone (RFC3339NanoFixed).
    sim.configure(log_runtime="cri-o", log_utc_offset_s=3600)
    try:
        batch.create_namespaced_job(sim.namespace, job("crio", "python3 -c 'print(\"a\\nb\\nc\")'; sleep 0.3; echo d"))
        sim.wait_for(lambda: (p := sim.pod_of_job("crio")) and p["status"]["phase"] == "Succeeded", what="crio done")
        pod = sim.pod_of_job("crio")
        assert pod is not None
        text = core.read_namespaced_pod_log(pod["metadata"]["name"], sim.namespace, timestamps=True)
    finally:
        sim.configure(log_runtime="containerd", log_utc_offset_s=0)
    lines = [line.split(" ", 1) for line in text.splitlines()]
    assert [t for _ts, t in lines] == ["a", "b", "c", "d"]
    stamps = [ts for ts, _t in lines]
    assert all(ts.endswith("+01:00") and len(ts.split(".")[1]) == len("000000000+01:00") for ts in stamps), stamps
    assert stamps[0] == stamps[1] == stamps[2] != stamps[3]


def test_follow_stream_ends_cleanly_while_the_container_runs(sim: SimCluster, core: Any) -> None:
    # An idle or server-side timeout ends a follow=true body cleanly (no
    # error) although the container goes on: the client must follow again.
    core.create_namespaced_pod(sim.namespace, pod("eof", TICKER))
    sim.wait_for(
        lambda: (p := sim.get_object("pods", "eof")) and p["status"].get("phase") == "Running", what="eof running"
    )
    time.sleep(0.5)
    sim.faults.end_logs(3, pod="eof")
    resp = core.read_namespaced_pod_log(
        "eof", sim.namespace, follow=True, _preload_content=False, _request_timeout=(5, 10)
    )
    body = b"".join(resp.stream(amt=None, decode_content=False))  # ends without an exception
    assert body.decode().splitlines() == ["tick1", "tick2", "tick3"]
    pod_now = sim.get_object("pods", "eof")
    assert pod_now is not None and pod_now["status"]["phase"] == "Running"
    # One request only: the next follow flows past line 3.
    resp = core.read_namespaced_pod_log(
        "eof", sim.namespace, follow=True, _preload_content=False, _request_timeout=(5, 5)
    )
    got = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        got += chunk
        if got.count(b"\n") >= 5:
            break
    resp.release_conn()
    assert got.decode().splitlines()[:5] == ["tick1", "tick2", "tick3", "tick4", "tick5"]


def test_api_server_restart_drops_the_watch_history(sim: SimCluster, batch: Any) -> None:
    # A restarted apiserver fills its watch cache from etcd at the current
    # revision: resuming a watch from a resourceVersion of before the restart
    # is 410 Expired (an ERROR event), and only a relist sees what changed.
    ns = sim.namespace
    batch.create_namespaced_job(ns, job("resume", "sleep 0.5"))
    rv = batch.list_namespaced_job(ns).metadata.resource_version
    sim.stop()
    time.sleep(1.5)  # the Job completes while the API server is down
    sim.restart(drop_watch_history=True)
    fresh: Any = batch.__class__(sim.api_client())
    with pytest.raises(ApiException) as exc:
        list(Watch().stream(fresh.list_namespaced_job, ns, resource_version=rv, timeout_seconds=5))
    assert exc.value.status == 410 and "too old resource version" in str(exc.value)
    listed = fresh.list_namespaced_job(ns)
    assert [c.type for c in listed.items[0].status.conditions or [] if c.status == "True"][-1] == "Complete"
    # Without the flag a restart keeps the history (the older behaviour stays available).
    rv = listed.metadata.resource_version
    sim.restart()
    events = list(Watch().stream(fresh.list_namespaced_job, ns, resource_version=rv, timeout_seconds=1))
    assert all(e["type"] != "ERROR" for e in events), events


def _failed_pod(sim: SimCluster, name: str, timeout: float = 30) -> dict[str, Any]:
    found: dict[str, Any] = sim.wait_for(
        lambda: (p := sim.get_object("pods", name)) and p["status"].get("phase") == "Failed" and p,
        what=f"{name} Failed",
        timeout=timeout,
    )
    return found


def test_termination_signals_only_the_main_process_then_kills_after_the_grace(sim: SimCluster, core: Any) -> None:
    # The runtime sends SIGTERM to the container's PID 1 only; its children
    # hear nothing, and when PID 1 exits the kernel kills the rest.
    script = (
        "(trap 'echo child got TERM; exit 0' TERM; while :; do sleep 0.1; done) & "
        "trap 'echo main got TERM; sleep 0.3; exit 0' TERM; echo up; wait"
    )
    core.create_namespaced_pod(sim.namespace, pod("pid1", script, activeDeadlineSeconds=2, grace_s=20))
    p = _failed_pod(sim, "pid1")
    assert p["status"]["reason"] == "DeadlineExceeded"
    log = core.read_namespaced_pod_log("pid1", sim.namespace)
    assert log.splitlines() == ["up", "main got TERM"], log
    # A PID 1 without a SIGTERM handler (bash exec'ing sleep) does not hear
    # it at all: SIGKILL after terminationGracePeriodSeconds.
    started = time.monotonic()
    core.create_namespaced_pod(sim.namespace, pod("deaf", "sleep 60", activeDeadlineSeconds=1, grace_s=3))
    p = _failed_pod(sim, "deaf")
    assert time.monotonic() - started >= 3.5, "the grace period was not waited for"
    term = p["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 137, term


def test_image_pull_errors_alternate_and_invalid_names_stick(sim: SimCluster, core: Any) -> None:
    # The kubelet retries a failed pull after a doubling back-off: the
    # waiting reason goes ErrImagePull -> ImagePullBackOff -> ErrImagePull...
    # A reference that does not parse is InvalidImageName, never retried.
    ns = sim.namespace
    core.create_namespaced_pod(ns, pod("pull", "true", image="missing.invalid/nothing:1"))
    seen: list[str] = []

    def reasons() -> bool:
        p = sim.get_object("pods", "pull")
        waiting = (((p or {}).get("status", {}).get("containerStatuses") or [{}])[0].get("state") or {}).get(
            "waiting"
        ) or {}
        reason = waiting.get("reason")
        if reason and (not seen or seen[-1] != reason):
            seen.append(reason)
        return len(seen) >= 4

    sim.wait_for(reasons, what="the pull reasons alternating", timeout=30)
    assert seen[:4] == ["ErrImagePull", "ImagePullBackOff", "ErrImagePull", "ImagePullBackOff"], seen
    core.create_namespaced_pod(ns, pod("badname", "true", image="Registry.Example/MyImage:1"))

    def invalid() -> bool:
        p = sim.get_object("pods", "badname")
        cs = ((p or {}).get("status", {}).get("containerStatuses") or [{}])[0]
        return ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "InvalidImageName"

    sim.wait_for(invalid, what="InvalidImageName", timeout=10)
    time.sleep(1.0)
    p = sim.get_object("pods", "badname")
    assert p is not None and p["status"]["phase"] == "Pending"
    assert p["status"]["containerStatuses"][0]["state"]["waiting"]["message"].endswith("invalid reference format")


def test_hung_api_server_times_out_instead_of_refusing(sim: SimCluster, batch: Any) -> None:
    # A dead or firewalled host does not refuse: the client waits out its
    # own timeout. restart() brings the same state back.
    import urllib3

    ns = sim.namespace
    batch.create_namespaced_job(ns, job("hung", "sleep 1"))
    sim.hang()
    stuck: Any = batch.__class__(sim.api_client())
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError) as exc:
        stuck.list_namespaced_job(ns, _request_timeout=(1.5, 1.5))
    waited = time.monotonic() - started
    assert waited >= 1.2, f"answered after {waited:.2f}s: refused, not hung ({exc.value!r})"
    assert "refused" not in str(exc.value).lower()
    sim.restart()
    fresh: Any = batch.__class__(sim.api_client())
    assert [j.metadata.name for j in fresh.list_namespaced_job(ns).items] == ["hung"]
