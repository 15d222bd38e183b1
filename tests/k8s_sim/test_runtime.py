"""The Job controller and the kubelet through the official kubernetes client:
real processes, env, private /tmp, statuses, logs and exec over WebSocket."""

from __future__ import annotations

import hashlib
import io
import os
import re
import ssl
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import SimCluster
from .k8s_typed import Watch, exec_stream, status_body
from .manifests import job, pod

TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{9}Z ")


def _conditions(sim: SimCluster, name: str) -> list[str]:
    j = sim.get_object("jobs.batch", name)
    assert j is not None
    return [c["type"] for c in j.get("status", {}).get("conditions") or []]


def _wait_terminal(sim: SimCluster, name: str, timeout: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        j = sim.get_object("jobs.batch", name)
        conds = [c["type"] for c in (j or {}).get("status", {}).get("conditions") or []]
        return j if ("Complete" in conds or "Failed" in conds) else None

    found: dict[str, Any] = sim.wait_for(done, timeout=timeout, what=f"job {name} finished")
    return found


def _raw_get(sim: SimCluster, path: str) -> str:
    """GET a path with the kubeconfig's token (for parameters the generated
    client does not offer)."""
    token = yaml.safe_load(sim.kubeconfig_path.read_text())["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cafile=str(sim.ca_cert_path))
    req = urllib.request.Request(sim.url + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        return str(resp.read().decode())


def _running(sim: SimCluster, name: str, *, job_name: bool = True) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        p = sim.pod_of_job(name) if job_name else sim.get_object("pods", name)
        return p if p and p["status"].get("phase") == "Running" else None

    found: dict[str, Any] = sim.wait_for(check, what=f"{name} running")
    return found


def test_job_pod_runs_real_command_with_env(sim: SimCluster, batch: Any, core: Any) -> None:
    ns = sim.namespace
    sim.create_secret("jobsup-env", {"FROM_SECRET": "sv"})
    sim.create_configmap("cfg", {"MODE": "fast"})
    script = "echo cmd=$1; echo secret=$FROM_SECRET mode=$CFG_MODE greeting=$GREETING; echo lit='$(NOPE)'; pwd; echo $HOSTNAME"
    body = job(
        "envjob",
        script,
        env=[
            {"name": "NAME", "value": "world"},
            {"name": "GREETING", "value": "hello $(NAME) $$(NAME)"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        env_from=[
            {"secretRef": {"name": "jobsup-env", "optional": True}},
            {"configMapRef": {"name": "cfg"}, "prefix": "CFG_"},
            {"secretRef": {"name": "absent", "optional": True}},
        ],
    )
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["bash", "-c", script, "arg0", "$(NAME)"]
    batch.create_namespaced_job(ns, body)
    j = _wait_terminal(sim, "envjob")
    st = j["status"]
    assert [c["type"] for c in st["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert st["succeeded"] == 1 and st.get("active") is None and st["startTime"] and st["completionTime"]
    p = sim.pod_of_job("envjob")
    assert p is not None
    md = p["metadata"]
    assert md["name"].startswith("envjob-")
    assert md["labels"]["job-name"] == "envjob" and md["labels"]["controller-uid"] == j["metadata"]["uid"]
    assert md["labels"]["batch.kubernetes.io/job-name"] == "envjob"
    assert md["ownerReferences"][0]["kind"] == "Job" and md["ownerReferences"][0]["controller"] is True
    assert not md.get("finalizers"), "the tracking finalizer goes once the pod is counted"
    assert p["spec"]["nodeName"] and p["status"]["phase"] == "Succeeded" and p["status"]["startTime"]
    term = p["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    out = core.read_namespaced_pod_log(md["name"], ns)
    assert out.splitlines() == [
        "cmd=world",
        "secret=sv mode=fast greeting=hello world $(NAME)",
        "lit=$(NOPE)",
        "/tmp/workdir",
        md["name"],
    ]
    reasons = {
        e.reason for e in core.list_namespaced_event(ns, field_selector=f"involvedObject.name={md['name']}").items
    }
    assert {"Scheduled", "Created", "Started"} <= reasons


def test_failed_job_backoff_limit_and_replacement(sim: SimCluster, batch: Any) -> None:
    ns = sim.namespace
    batch.create_namespaced_job(ns, job("fails", "echo boom >&2; exit 3", backoff_limit=1))
    j = _wait_terminal(sim, "fails")
    st = j["status"]
    assert st["failed"] == 2, "backoffLimit 1 allows one replacement"
    assert [c["type"] for c in st["conditions"]] == ["FailureTarget", "Failed"]
    assert st["conditions"][-1]["reason"] == "BackoffLimitExceeded"
    assert "completionTime" not in st
    pods = [p for p in sim.list_objects("pods") if p["metadata"]["labels"].get("job-name") == "fails"]
    assert len(pods) == 2
    for p in pods:
        term = p["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 3 and term["reason"] == "Error"


def test_active_deadline_exceeded(sim: SimCluster, batch: Any) -> None:
    batch.create_namespaced_job(sim.namespace, job("slow", "sleep 30", activeDeadlineSeconds=1))
    j = _wait_terminal(sim, "slow", timeout=30)
    conds = j["status"]["conditions"]
    assert [c["type"] for c in conds] == ["FailureTarget", "Failed"]
    assert conds[-1]["reason"] == "DeadlineExceeded"
    p = sim.pod_of_job("slow")
    assert p is None or p["status"]["phase"] == "Failed"


def test_ttl_after_finished_deletes_job_and_pods(sim: SimCluster, batch: Any) -> None:
    batch.create_namespaced_job(sim.namespace, job("ttl", "true", ttlSecondsAfterFinished=1))
    _wait_terminal(sim, "ttl")
    sim.wait_for(lambda: sim.get_object("jobs.batch", "ttl") is None, what="ttl job deleted", timeout=20)
    sim.wait_for(lambda: sim.pod_of_job("ttl") is None, what="ttl pods deleted", timeout=20)


def test_oom_and_exit_137(sim: SimCluster, batch: Any) -> None:
    batch.create_namespaced_job(sim.namespace, job("oom", "exit 137"))
    _wait_terminal(sim, "oom")
    p = sim.pod_of_job("oom")
    assert p is not None
    term = p["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 137 and term["reason"] == "OOMKilled"
    batch.create_namespaced_job(sim.namespace, job("oom2", "sleep 60"))
    p = _running(sim, "oom2")
    sim.oom_kill(p["metadata"]["name"])
    _wait_terminal(sim, "oom2")
    oom2 = sim.pod_of_job("oom2")
    assert oom2 is not None
    term = oom2["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["reason"] == "OOMKilled"


def test_waiting_reasons_image_and_config(sim: SimCluster, core: Any) -> None:
    ns = sim.namespace
    core.create_namespaced_pod(ns, pod("noimg", "true", image="missing.invalid/nothing:1"))

    def waiting(name: str, reason: str) -> bool:
        p = sim.get_object("pods", name)
        cs = (p or {}).get("status", {}).get("containerStatuses") or []
        return bool(cs) and cs[0]["state"].get("waiting", {}).get("reason") == reason

    sim.wait_for(lambda: waiting("noimg", "ImagePullBackOff"), what="ImagePullBackOff")
    assert sim.require_object("pods", "noimg")["status"]["phase"] == "Pending"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log("noimg", ns)
    assert exc.value.status == 400 and "is waiting to start" in status_body(exc.value)["message"]

    body = pod("nosecret", "echo $TOKEN")
    body["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "t"}}}
    ]
    core.create_namespaced_pod(ns, body)
    sim.wait_for(lambda: waiting("nosecret", "CreateContainerConfigError"), what="CreateContainerConfigError")
    cs = sim.require_object("pods", "nosecret")["status"]["containerStatuses"][0]
    assert cs["state"]["waiting"]["message"] == 'secret "later" not found'
    sim.create_secret("later", {"t": "tok"})
    sim.wait_for(
        lambda: sim.require_object("pods", "nosecret")["status"]["phase"] == "Succeeded",
        what="starts once the secret exists",
    )
    assert core.read_namespaced_pod_log("nosecret", ns) == "tok\n"


def test_logs_timestamps_since_tail_follow_previous(sim: SimCluster, batch: Any, core: Any) -> None:
    ns = sim.namespace
    script = "for i in 1 2 3; do echo line$i; done; sleep 1.2; echo late1; echo late2; echo err >&2; sleep 0.5"
    batch.create_namespaced_job(ns, job("logs", script))
    p = _running(sim, "logs")
    name = p["metadata"]["name"]
    # Follow to the end.
    resp = core.read_namespaced_pod_log(name, ns, follow=True, _preload_content=False)
    followed = resp.data.decode()
    assert followed.splitlines() == ["line1", "line2", "line3", "late1", "late2", "err"]
    lines = core.read_namespaced_pod_log(name, ns, timestamps=True).splitlines()
    assert len(lines) == 6 and all(TS.match(x) for x in lines), lines
    stamps = [x.split(" ", 1)[0] for x in lines]
    late = stamps[3]
    # sinceTime (not in the client's generated signature, so sent raw) is
    # applied at one-second granularity: everything from the start of late1's
    # second, which never includes the lines 1.2 s earlier.
    since = late[:19] + ".999999999Z"
    got = _raw_get(sim, f"/api/v1/namespaces/{ns}/pods/{name}/log?timestamps=true&sinceTime={since}")
    got_lines = [x.split(" ", 1)[1] for x in got.splitlines()]
    assert got_lines[-3:] == ["late1", "late2", "err"]
    assert all(s[:19] >= late[:19] for s in (x.split(" ", 1)[0] for x in got.splitlines()))
    assert core.read_namespaced_pod_log(name, ns, tail_lines=2) == "late2\nerr\n"
    assert core.read_namespaced_pod_log(name, ns, stream="Stderr") == "err\n"
    assert core.read_namespaced_pod_log(name, ns, since_seconds=3600).count("\n") == 6
    assert core.read_namespaced_pod_log(name, ns, limit_bytes=8) == "line1\nli"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_pod_log(name, ns, previous=True)
    assert exc.value.status == 400 and "previous terminated container" in status_body(exc.value)["message"]


def test_previous_logs_after_onfailure_restart(sim: SimCluster, batch: Any, core: Any) -> None:
    ns = sim.namespace
    # Fails on the first run, succeeds on the restart (the marker lives in the pod's /tmp).
    script = "if [ -f /tmp/ran ]; then echo second; exit 0; fi; touch /tmp/ran; echo first; exit 1"
    batch.create_namespaced_job(ns, job("again", script, restart_policy="OnFailure", backoff_limit=3))
    _wait_terminal(sim, "again")
    p = sim.pod_of_job("again")
    assert p is not None
    cs = p["status"]["containerStatuses"][0]
    assert cs["restartCount"] == 1 and cs["lastState"]["terminated"]["exitCode"] == 1
    assert core.read_namespaced_pod_log(p["metadata"]["name"], ns) == "second\n"
    assert core.read_namespaced_pod_log(p["metadata"]["name"], ns, previous=True) == "first\n"


def _tar_bytes(size: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(size)
        info = tarfile.TarInfo("payload.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _exec(
    core: Any, ns: str, name: str, cmd: list[str], stdin: bytes | None = None, close_stdin: bool = False
) -> tuple[bytes, bytes, Any]:
    ws = exec_stream(
        core.connect_get_namespaced_pod_exec,
        name,
        ns,
        command=cmd,
        stdin=stdin is not None,
        stdout=True,
        stderr=True,
        tty=False,
        binary=True,
        _preload_content=False,
    )
    if stdin is not None:
        for i in range(0, len(stdin), 256 * 1024):
            ws.write_stdin(stdin[i : i + 256 * 1024])
        if close_stdin:
            ws.close_channel(0)
    out, err = b"", b""
    deadline = time.monotonic() + 30
    while ws.is_open() and time.monotonic() < deadline:
        ws.update(timeout=1)
        out += ws.read_stdout(timeout=0) or b""
        err += ws.read_stderr(timeout=0) or b""
    out += ws.read_stdout(timeout=0) or b""
    err += ws.read_stderr(timeout=0) or b""
    return out, err, ws


@pytest.mark.parametrize("protocol", ["v5.channel.k8s.io", "v4.channel.k8s.io"])
def test_exec_stdin_tar_into_private_tmp(sim: SimCluster, core: Any, protocol: str) -> None:
    sim.configure(exec_protocols=(protocol,))
    ns = sim.namespace
    core.create_namespaced_pod(
        ns,
        pod(
            "box",
            "while [ ! -f /tmp/jobsup-source/source.tar.ready ]; do sleep 0.1; done; tar -xf /tmp/jobsup-source/source.tar -C /tmp/jobsup-source && ls -l /tmp/jobsup-source",
        ),
    )
    core.create_namespaced_pod(ns, pod("other", "sleep 60"))
    _running(sim, "box", job_name=False)
    _running(sim, "other", job_name=False)
    data = _tar_bytes(3 * 1024 * 1024 + 17)
    n = len(data)
    cmd = [
        "sh",
        "-c",
        f"mkdir -p /tmp/jobsup-source && head -c {n} > /tmp/jobsup-source/source.tar.part && sha256sum /tmp/jobsup-source/source.tar.part",
    ]
    out, err, ws = _exec(core, ns, "box", cmd, stdin=data, close_stdin=protocol.startswith("v5"))
    assert ws.subprotocol == protocol
    assert out.split()[0].decode() == hashlib.sha256(data).hexdigest(), err
    assert ws.returncode == 0
    out, _err, ws = _exec(
        core,
        ns,
        "box",
        [
            "sh",
            "-c",
            "mv /tmp/jobsup-source/source.tar.part /tmp/jobsup-source/source.tar && touch /tmp/jobsup-source/source.tar.ready",
        ],
    )
    assert ws.returncode == 0
    sim.wait_for(lambda: sim.require_object("pods", "box")["status"]["phase"] == "Succeeded", what="box extracted")
    assert "payload.bin" in core.read_namespaced_pod_log("box", ns)
    # The other pod has its own /tmp.
    out, _err, ws = _exec(core, ns, "other", ["sh", "-c", "ls /tmp/jobsup-source 2>&1; exit 7"])
    assert ws.returncode == 7 and b"No such file" in out
    # Exec into a finished container is refused before the upgrade.
    with pytest.raises(ApiException) as exc:
        _exec(core, ns, "box", ["true"])
    assert "Handshake status 400" in str(exc.value.reason) and "container not found" in str(exc.value.reason)


def test_exec_stdin_close_v5(sim: SimCluster, core: Any) -> None:
    ns = sim.namespace
    core.create_namespaced_pod(ns, pod("cat", "sleep 60"))
    _running(sim, "cat", job_name=False)
    out, _err, ws = _exec(core, ns, "cat", ["sh", "-c", "wc -c; echo done >&2"], stdin=b"x" * 1000, close_stdin=True)
    assert out.strip() == b"1000" and ws.returncode == 0


def test_suspend_and_resume(sim: SimCluster, batch: Any) -> None:
    ns = sim.namespace
    batch.create_namespaced_job(ns, job("susp", "sleep 0.5; echo ok"))
    _running(sim, "susp")
    batch.patch_namespaced_job("susp", ns, {"spec": {"suspend": True}})

    def suspended() -> dict[str, Any] | None:
        j = sim.require_object("jobs.batch", "susp")
        conds = {c["type"]: c for c in j["status"].get("conditions") or []}
        s = conds.get("Suspended")
        return j if s and s["status"] == "True" and not j["status"].get("active") else None

    j = sim.wait_for(suspended, what="suspended")
    assert "startTime" not in j["status"] and j["status"]["conditions"][0]["reason"] == "JobSuspended"
    batch.patch_namespaced_job("susp", ns, {"spec": {"suspend": False}})
    j = _wait_terminal(sim, "susp")
    conds = {c["type"]: c for c in j["status"]["conditions"]}
    assert conds["Suspended"]["status"] == "False" and conds["Suspended"]["reason"] == "JobResumed"
    assert "Complete" in conds


def test_pod_failure_policy_fail_job_on_exit_code(sim: SimCluster, batch: Any) -> None:
    policy = {
        "rules": [{"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}}]
    }
    batch.create_namespaced_job(
        sim.namespace, job("pfp", "exit 42", backoff_limit=5, podFailurePolicy=policy, podReplacementPolicy="Failed")
    )
    j = _wait_terminal(sim, "pfp")
    conds = j["status"]["conditions"]
    assert [c["type"] for c in conds] == ["FailureTarget", "Failed"] and conds[-1]["reason"] == "PodFailurePolicy"
    assert j["status"]["failed"] == 1


def test_exec_v4_offered_alone_and_text_frames(sim: SimCluster, core: Any) -> None:
    ns = sim.namespace
    core.create_namespaced_pod(ns, pod("txt", "sleep 60"))
    _running(sim, "txt", job_name=False)
    # A client that offers only v4; stdin sent as text frames (binary=False).
    ws = exec_stream(
        core.connect_get_namespaced_pod_exec,
        "txt",
        ns,
        command=["sh", "-c", "head -c 5; echo; echo oops >&2; exit 2"],
        stdin=True,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
        _headers={"sec-websocket-protocol": "v4.channel.k8s.io"},
    )
    assert ws.subprotocol == "v4.channel.k8s.io"
    ws.write_stdin("h\u00e9llo")
    ws.run_forever(timeout=10)
    assert ws.read_stdout() == "h\u00e9ll\n"
    assert ws.read_stderr() == "oops\n"
    assert ws.returncode == 2


def test_fallback_without_mount_namespaces_rewrites_tmp(tmp_path: Path) -> None:
    marker = f"who-{os.getpid()}-{time.monotonic_ns()}"
    with SimCluster.start(tmp_path / "sim", private_tmp=False) as sim:
        core: Any = client.CoreV1Api(sim.api_client())
        core.create_namespaced_pod(
            sim.namespace,
            pod("a", f"mkdir -p /tmp/jobsup-source && echo a > /tmp/jobsup-source/{marker}; echo $TMPDIR; sleep 30"),
        )
        sim.wait_for(
            lambda: any(tmp_path.glob(f"sim/pods/*/containers/main/tmp/jobsup-source/{marker}")),
            what="a wrote its file",
        )
        core.create_namespaced_pod(
            sim.namespace, pod("b", f"if [ -e /tmp/jobsup-source/{marker} ]; then echo shared; else echo isolated; fi")
        )
        sim.wait_for(lambda: sim.require_object("pods", "b")["status"]["phase"] == "Succeeded", what="b done")
        assert core.read_namespaced_pod_log("b", sim.namespace) == "isolated\n"
        assert core.read_namespaced_pod_log("a", sim.namespace).startswith(str(tmp_path / "sim" / "pods"))
        assert not Path("/tmp/jobsup-source", marker).exists(), "the host's /tmp was written"


JOBSUP_SCRIPT = r"""
set -e
while [ ! -f /tmp/jobsup-source/source.tar.ready ]; do sleep 0.1; done
mkdir -p /tmp/jobsup-source/repo
tar -xf /tmp/jobsup-source/source.tar -C /tmp/jobsup-source/repo
cd /tmp/jobsup-source/repo
exec python3 train.py
"""


def test_jobsup_manifest_contract_flow(sim: SimCluster, batch: Any, core: Any) -> None:
    """The path jobsup's backend takes: a Job whose container evals
    JOBSUP_SCRIPT, source staged over exec stdin, logs followed with
    timestamps, completion seen on a label-selected watch."""
    ns = sim.namespace
    run = "0123456789ab"
    labels = {"jobsup.io/run": run, "jobsup.io/project": "demo", "jobsup.io/name": "train"}
    body = job(
        f"jobsup-{run}",
        "",
        labels=labels,
        env=[
            {"name": "JOBSUP_SCRIPT", "value": JOBSUP_SCRIPT},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "PYTHONIOENCODING", "value": "utf-8"},
        ],
        env_from=[{"secretRef": {"name": "jobsup-env", "optional": True}}],
        activeDeadlineSeconds=3600,
        ttlSecondsAfterFinished=86400,
    )
    body["metadata"]["labels"]["jobsup.io/primary"] = "true"
    body["spec"]["template"]["metadata"]["annotations"] = {"kubectl.kubernetes.io/default-container": "main"}
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["bash", "-c", 'eval "$JOBSUP_SCRIPT"']
    rv = batch.list_namespaced_job(ns, label_selector=f"jobsup.io/run={run}").metadata.resource_version
    batch.create_namespaced_job(ns, body)
    pods = core.list_namespaced_pod(ns, label_selector=f"jobsup.io/run={run}")
    p = sim.wait_for(
        lambda: (x := sim.pod_of_job(f"jobsup-{run}")) and x["status"].get("phase") == "Running" and x,
        what="pod running",
    )
    name = p["metadata"]["name"]
    assert p["metadata"]["labels"]["jobsup.io/run"] == run and pods.metadata.resource_version
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        src = b"import sys\nfor i in range(3):\n    print('epoch', i)\nprint('bye', file=sys.stderr)\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(src)
        tar.addfile(info, io.BytesIO(src))
    data = buf.getvalue()
    out, _err, ws = _exec(
        core,
        ns,
        name,
        [
            "sh",
            "-c",
            f"mkdir -p /tmp/jobsup-source && head -c {len(data)} > /tmp/jobsup-source/source.tar.part && sha256sum /tmp/jobsup-source/source.tar.part",
        ],
        stdin=data,
    )
    assert ws.returncode == 0 and out.split()[0].decode() == hashlib.sha256(data).hexdigest()
    _out, _err, ws = _exec(
        core,
        ns,
        name,
        [
            "sh",
            "-c",
            "mv /tmp/jobsup-source/source.tar.part /tmp/jobsup-source/source.tar && touch /tmp/jobsup-source/source.tar.ready",
        ],
    )
    assert ws.returncode == 0
    resp = core.read_namespaced_pod_log(
        name, ns, container="main", follow=True, timestamps=True, _preload_content=False
    )
    lines = resp.data.decode().splitlines()
    assert [x.split(" ", 1)[1] for x in lines] == ["epoch 0", "epoch 1", "epoch 2", "bye"]
    assert all(TS.match(x) for x in lines)
    done = None
    for ev in Watch().stream(
        batch.list_namespaced_job, ns, label_selector=f"jobsup.io/run={run}", resource_version=rv, timeout_seconds=20
    ):
        conds = [c.type for c in ev["object"].status.conditions or []]
        if "Complete" in conds:
            done = ev["object"]
            break
    assert done is not None and done.status.succeeded == 1


@pytest.mark.parametrize("private_tmp", [True, False])
def test_volume_mounts_secret_pvc_read_only_and_missing(tmp_path: Path, private_tmp: bool) -> None:
    """Secret, PVC (read-only) and emptyDir volumes at their mountPath; a
    missing Secret keeps the pod ContainerCreating with FailedMount (added
    for jobsup's sandbox secret_mounts/pvc_mounts tests)."""
    with SimCluster.start(tmp_path / "sim", private_tmp=private_tmp) as sim:
        sim.create_secret("creds", {"token": "t0ken", "other": "x"})
        sim.create_pvc("data")
        (sim.pvc_path("data") / "input.txt").write_text("from-the-claim\n")
        mount = "/srv/jobsup-k8s-sim-test"
        script = (
            f"cat {mount}/creds/token; echo; cat {mount}/data/input.txt; "
            f"echo scratch > {mount}/scratch/f && cat {mount}/scratch/f; "
            f"if {{ echo x > {mount}/data/new; }} 2>/dev/null; then echo data-writable; else echo data-read-only; fi"
        )
        body = job("vols", script)
        spec = body["spec"]["template"]["spec"]
        spec["volumes"] = [
            {"name": "creds", "secret": {"secretName": "creds"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "scratch", "emptyDir": {}},
        ]
        spec["containers"][0]["volumeMounts"] = [
            {"name": "creds", "mountPath": f"{mount}/creds"},
            {"name": "data", "mountPath": f"{mount}/data", "readOnly": True},
            {"name": "scratch", "mountPath": f"{mount}/scratch"},
        ]
        sim.create_object("jobs.batch", body)
        finished = _wait_terminal(sim, "vols")
        assert [c["type"] for c in finished["status"]["conditions"]][-1] == "Complete"
        pod = sim.pod_of_job("vols")
        assert pod is not None
        logs = _raw_get(sim, f"/api/v1/namespaces/{sim.namespace}/pods/{pod['metadata']['name']}/log")
        lines = logs.splitlines()
        assert lines[:3] == ["t0ken", "from-the-claim", "scratch"]
        assert lines[3] == ("data-read-only" if private_tmp else "data-writable")
        assert (sim.pvc_path("data") / "new").exists() == (not private_tmp)

        missing = job("novol", "true")
        missing["spec"]["template"]["spec"]["volumes"] = [{"name": "s", "secret": {"secretName": "absent"}}]
        missing["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
            {"name": "s", "mountPath": f"{mount}/absent"}
        ]
        sim.create_object("jobs.batch", missing)

        def waiting() -> str | None:
            p = sim.pod_of_job("novol")
            statuses = (p or {}).get("status", {}).get("containerStatuses") or []
            w = (statuses[0]["state"].get("waiting") or {}) if statuses else {}
            return w.get("message") if w.get("reason") == "ContainerCreating" and w.get("message") else None

        message = sim.wait_for(waiting, what="FailedMount")
        assert 'secret "absent" not found' in message
        sim.create_secret("absent", {"k": "v"})
        _wait_terminal(sim, "novol")
