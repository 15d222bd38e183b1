"""Each fault knob of the simulator, observed through the official client."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import SimCluster
from .k8s_typed import Watch, exec_stream, status_body
from .manifests import job, pod

TICKER = "i=0; while [ $i -lt 400 ]; do i=$((i+1)); echo tick$i; sleep 0.05; done"


def _running_pod(sim: SimCluster, core: Any, name: str, script: str) -> None:
    core.create_namespaced_pod(sim.namespace, pod(name, script))
    sim.wait_for(
        lambda: (p := sim.get_object("pods", name)) and p["status"].get("phase") == "Running", what=f"{name} running"
    )


def _read_lines(resp: Any, want: int | None = None) -> tuple[list[str], BaseException | None]:
    """Read a streaming log response line by line until EOF, an error, or
    ``want`` lines; returns (lines, the exception that ended it). Reading goes
    on where the previous call stopped (one chunk iterator per response)."""
    lines: list[str] = []
    buf = b""
    if not hasattr(resp, "_sim_chunks"):
        resp._sim_chunks = resp.stream(amt=None, decode_content=False)
        resp._sim_buf = b""
    buf = resp._sim_buf
    try:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            lines.append(line.decode())
            if want is not None and len(lines) >= want:
                resp._sim_buf = buf
                return lines, None
        for chunk in resp._sim_chunks:
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                lines.append(line.decode())
                if want is not None and len(lines) >= want:
                    resp._sim_buf = buf
                    return lines, None
    except Exception as exc:  # noqa: BLE001 - the test inspects which error ended the stream
        return lines, exc
    return lines, None


def test_stall_log_stream_after_n_lines(sim: SimCluster, core: Any) -> None:
    _running_pod(sim, core, "ticker", TICKER)
    time.sleep(0.5)
    sim.faults.stall_logs(3, pod="ticker")
    resp = core.read_namespaced_pod_log(
        "ticker", sim.namespace, follow=True, _preload_content=False, _request_timeout=(5, 1.5)
    )
    lines, exc = _read_lines(resp)
    assert lines == ["tick1", "tick2", "tick3"]
    assert isinstance(exc, (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError)), repr(exc)
    # The knob was for one request: the next stream flows.
    resp = core.read_namespaced_pod_log(
        "ticker", sim.namespace, follow=True, _preload_content=False, _request_timeout=(5, 5)
    )
    lines, exc = _read_lines(resp, want=8)
    assert exc is None and lines[:4] == ["tick1", "tick2", "tick3", "tick4"]
    resp.release_conn()


def test_cut_log_stream_after_n_lines(sim: SimCluster, core: Any) -> None:
    _running_pod(sim, core, "ticker", TICKER)
    time.sleep(0.5)
    sim.faults.cut_logs(2)
    resp = core.read_namespaced_pod_log(
        "ticker", sim.namespace, follow=True, _preload_content=False, _request_timeout=(5, 10)
    )
    lines, exc = _read_lines(resp)
    assert lines == ["tick1", "tick2"]
    assert isinstance(exc, urllib3.exceptions.ProtocolError), repr(exc)


def test_rotate_log_silences_follow_and_new_reads_see_new_file(sim: SimCluster, core: Any) -> None:
    _running_pod(sim, core, "ticker", TICKER)
    resp = core.read_namespaced_pod_log(
        "ticker", sim.namespace, follow=True, _preload_content=False, _request_timeout=(5, 1.5)
    )
    first, exc = _read_lines(resp, want=3)
    assert exc is None and first == ["tick1", "tick2", "tick3"]
    rotated = sim.rotate_log("ticker")
    assert rotated.exists()
    rest, exc = _read_lines(resp)
    assert isinstance(exc, (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError)), repr(exc)
    time.sleep(0.3)
    fresh = core.read_namespaced_pod_log("ticker", sim.namespace).splitlines()
    assert fresh and "tick1" not in fresh
    # The follow stream read the rotated file to its end and no further; the
    # new file starts with the very next line.
    seen = first + rest
    assert [int(x[4:]) for x in seen] == list(range(1, len(seen) + 1))
    assert int(fresh[0][4:]) == len(seen) + 1


def test_fail_requests_500_then_429(sim: SimCluster, core: Any) -> None:
    ns = sim.namespace
    sim.faults.fail_requests(500, count=2, path_contains="/configmaps")
    for _ in range(2):
        with pytest.raises(ApiException) as exc:
            core.list_namespaced_config_map(ns)
        body = status_body(exc.value)
        assert exc.value.status == 500 and body["reason"] == "InternalError"
    core.list_namespaced_pod(ns)
    core.list_namespaced_config_map(ns)
    sim.faults.fail_requests(429, seconds=0.5, retry_after_s=1)
    # Writes are not retried by the client: the 429 surfaces.
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "x"}})
    assert exc.value.status == 429 and (exc.value.headers or {})["Retry-After"] == "1"
    assert status_body(exc.value)["details"]["retryAfterSeconds"] == 1
    # Reads are retried by urllib3, which honours Retry-After on 429.
    before = sim.requests_served
    core.list_namespaced_pod(ns)
    assert sim.requests_served - before >= 2
    time.sleep(0.6)
    core.list_namespaced_pod(ns)


def test_fail_requests_after_skipping_some(sim: SimCluster, core: Any) -> None:
    """``skip`` lets the first matching requests through (added for the
    Kubernetes backend's test of a create failing after its dry run)."""
    ns = sim.namespace
    sim.faults.fail_requests(500, count=1, skip=2, path_contains="/configmaps", methods=("POST",))
    core.create_namespaced_config_map(ns, {"metadata": {"name": "s1"}}, dry_run="All")
    core.list_namespaced_config_map(ns)  # another method: neither skipped nor failed
    core.create_namespaced_config_map(ns, {"metadata": {"name": "s1"}})
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(ns, {"metadata": {"name": "s2"}})
    assert exc.value.status == 500
    core.create_namespaced_config_map(ns, {"metadata": {"name": "s2"}})


def test_exec_empty_status_channel(sim: SimCluster, core: Any) -> None:
    _running_pod(sim, core, "box", "sleep 60")
    sim.faults.set_exec_empty_status()
    ws = exec_stream(
        core.connect_get_namespaced_pod_exec,
        "box",
        sim.namespace,
        command=["sh", "-c", "echo hi; exit 3"],
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    ws.run_forever(timeout=10)
    assert ws.read_all() == "hi\n"
    assert ws.read_channel(3) == ""
    with pytest.raises(TypeError):
        _ = ws.returncode  # the client cannot parse an empty status channel
    sim.faults.set_exec_empty_status(False)
    ws = exec_stream(
        core.connect_get_namespaced_pod_exec,
        "box",
        sim.namespace,
        command=["sh", "-c", "exit 3"],
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    ws.run_forever(timeout=10)
    assert ws.returncode == 3


def test_unschedulable_then_scheduled_and_slow_scheduling(sim: SimCluster, core: Any) -> None:
    ns = sim.namespace
    sim.faults.set_unschedulable("stuck")
    core.create_namespaced_pod(ns, pod("stuck-1", "echo ran"))

    def unschedulable() -> bool:
        p = sim.get_object("pods", "stuck-1") or {}
        conds = {c["type"]: c for c in p.get("status", {}).get("conditions") or []}
        c: dict[str, Any] = conds.get("PodScheduled") or {}
        return c.get("status") == "False" and c.get("reason") == "Unschedulable"

    sim.wait_for(unschedulable, what="Unschedulable condition")
    p = sim.get_object("pods", "stuck-1")
    assert p is not None and p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=stuck-1,reason=FailedScheduling").items
    assert events and events[0].source.component == "default-scheduler"
    sim.faults.set_unschedulable(None)
    sim.wait_for(
        lambda: sim.require_object("pods", "stuck-1")["status"]["phase"] == "Succeeded", what="ran once schedulable"
    )

    sim.faults.set_schedule_delay(1.0)
    core.create_namespaced_pod(ns, pod("slow-1", "echo ran"))
    time.sleep(0.4)
    p = sim.get_object("pods", "slow-1")
    assert p is not None and p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")
    sim.faults.set_schedule_delay(0)
    sim.faults.set_start_delay(1.0)
    core.create_namespaced_pod(ns, pod("slow-2", "echo ran"))
    sim.wait_for(lambda: (x := sim.get_object("pods", "slow-2")) and x["spec"].get("nodeName"), what="slow-2 bound")
    cs = sim.require_object("pods", "slow-2")["status"]["containerStatuses"][0]
    assert cs["state"]["waiting"]["reason"] == "ContainerCreating"
    sim.wait_for(lambda: sim.require_object("pods", "slow-1")["status"]["phase"] == "Succeeded", what="slow-1 ran")
    sim.wait_for(lambda: sim.require_object("pods", "slow-2")["status"]["phase"] == "Succeeded", what="slow-2 ran")


@pytest.mark.parametrize("how", ["backoff", "policy"])
def test_evicted_pod_is_replaced_by_the_job_controller(sim: SimCluster, batch: Any, how: str) -> None:
    ns = sim.namespace
    script = 'if [ -n "$SECOND" ]; then :; fi; sleep 1; echo done'
    if how == "backoff":
        body = job("ev", script, backoff_limit=1)
    else:
        body = job(
            "ev",
            script,
            backoff_limit=0,
            podFailurePolicy={"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
        )
    batch.create_namespaced_job(ns, body)
    first = sim.wait_for(
        lambda: (p := sim.pod_of_job("ev")) and p["status"].get("phase") == "Running" and p, what="first pod running"
    )
    sim.evict_pod(first["metadata"]["name"])

    def evicted() -> dict[str, Any] | None:
        p = sim.get_object("pods", first["metadata"]["name"])
        return p if p and p["status"].get("reason") == "Evicted" else None

    p = sim.wait_for(evicted, what="pod evicted")
    assert p["status"]["phase"] == "Failed"
    conds = {c["type"]: c for c in p["status"]["conditions"]}
    assert conds["DisruptionTarget"]["reason"] == "TerminationByKubelet"
    j = sim.wait_for(
        lambda: (
            (x := sim.get_object("jobs.batch", "ev"))
            and any(c["type"] in ("Complete", "Failed") for c in x["status"].get("conditions") or [])
            and x
        ),
        what="job finished",
        timeout=30,
    )
    assert [c["type"] for c in j["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert j["status"].get("failed", 0) == (1 if how == "backoff" else 0)
    pods = [x for x in sim.list_objects("pods") if x["metadata"]["labels"].get("job-name") == "ev"]
    assert len(pods) == 2


def test_job_deleted_behind_the_clients_back(sim: SimCluster, batch: Any) -> None:
    ns = sim.namespace
    batch.create_namespaced_job(ns, job("gone", "sleep 60"))
    sim.wait_for(lambda: (p := sim.pod_of_job("gone")) and p["status"].get("phase") == "Running", what="running")
    rv = batch.list_namespaced_job(ns).metadata.resource_version
    sim.delete_job("gone")
    types = [e["type"] for e in Watch().stream(batch.list_namespaced_job, ns, resource_version=rv, timeout_seconds=2)]
    assert types[-1] == "DELETED"
    sim.wait_for(lambda: sim.pod_of_job("gone") is None, what="pods deleted", timeout=40)


def test_kill_and_restart_api_server_keeps_state(sim: SimCluster, batch: Any, core: Any) -> None:
    ns = sim.namespace
    batch.create_namespaced_job(ns, job("survivor", "sleep 1; echo finished"))
    rv = batch.list_namespaced_job(ns).metadata.resource_version
    errors: list[BaseException] = []
    events: list[str] = []

    def watch_it() -> None:
        try:
            for e in Watch().stream(batch.list_namespaced_job, ns, resource_version=rv, timeout_seconds=30):
                events.append(e["type"])
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=watch_it)
    t.start()
    time.sleep(0.3)
    port = sim.port
    sim.stop()
    t.join(10)
    assert not t.is_alive()
    assert errors, "an open watch must break when the API server dies"
    down: Any = client.BatchV1Api(sim.api_client())
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        down.list_namespaced_job(ns, _request_timeout=2)
    time.sleep(1.5)  # the job's pod finishes while the API server is down
    sim.restart()
    assert sim.port == port
    fresh: Any = client.BatchV1Api(sim.api_client())
    listed = fresh.list_namespaced_job(ns)
    assert [j.metadata.name for j in listed.items] == ["survivor"]
    assert int(listed.metadata.resource_version) >= int(rv)
    sim.wait_for(
        lambda: "Complete" in [c.type for c in fresh.read_namespaced_job("survivor", ns).status.conditions or []],
        what="job complete after restart",
    )
    p = sim.pod_of_job("survivor")
    assert p is not None
    assert client.CoreV1Api(sim.api_client()).read_namespaced_pod_log(p["metadata"]["name"], ns) == "finished\n"
