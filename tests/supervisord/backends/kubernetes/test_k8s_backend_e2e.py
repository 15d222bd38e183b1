"""The Kubernetes backend end to end on the simulated cluster: the real
supervisor and event store, the official client over HTTPS, real containers
as local processes, and the simulator's fault knobs.

One simulated cluster serves the whole module; each test uses its own store
and repository.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from store import NewEvent
from supervisord.daemon.scheduler.driver import ADMITTED
from supervisord.shared.exceptions import BackendError
from tests.k8s_sim import MISSING_REGISTRY, SimCluster
from tests.supervisord.backends.kubernetes.k8s_backend_helpers import job_manifest, run_objects, sim_cluster
from tests.supervisord.backends.kubernetes.k8s_supervisor_env import k8s_env

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

M = ".jobsup/k8s.yaml"


def ticker(n: int, pause: float = 0.01) -> str:
    """A command printing line-1..line-n, ``pause`` seconds apart."""
    return f"for i in $(seq 1 {n}); do echo line-$i; sleep {pause}; done"


def expected(n: int) -> list[str]:
    return [f"line-{i}" for i in range(1, n + 1)]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    with sim_cluster(tmp_path_factory.mktemp("sim")) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def clean_faults(sim: SimCluster) -> Iterator[None]:
    yield
    sim.faults.clear_request_failures()
    sim.faults.clear_log_faults()
    sim.faults.set_exec_empty_status(False)
    sim.faults.set_unschedulable(None)


def pod_name(sim: SimCluster, run_id: str) -> str:
    pod = sim.wait_for(lambda: sim.pod_of_job(f"t-{run_id}"), what="the run's pod")
    return str(pod["metadata"]["name"])


async def no_pods_left(sim: SimCluster, run_id: str, timeout_s: float = 30) -> None:
    with anyio.fail_after(timeout_s):
        while run_objects(sim, run_id, "pods"):
            await anyio.sleep(0.1)


# --------------------------------------------------------------- happy path


async def test_submit_stage_run_logs_complete(tmp_path: Path, sim: SimCluster) -> None:
    extra = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg-{{JOBSUP_RUN}}"}, "data": {"a": "1"}}]
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            'echo "secret is $API_KEY"; cat data.txt; printf last-no-newline',
            manifest=M,
            files={M: job_manifest(extra_docs=extra), "data.txt": "from-the-commit\n"},
            env={"API_KEY": "v3ry-s3cret"},
        )
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED" and run.exit_code == 0, run
        assert await env.lines(run_id) == ["secret is v3ry-s3cret", "from-the-commit", "last-no-newline"]
        phases = [p for p, _ in await env.phases(run_id)]
        assert phases[0] == "SCHEDULING" and "STAGING" in phases and phases[-2:] == ["RUNNING", "COMPLETED"], phases
        # Every object is recorded as created, the env Secret with names and hashes only.
        created = await env.events(run_id, "ObjectCreated")
        kinds = [(e.data["kind"], e.data["name"]) for e in created]
        assert kinds == [("Secret", f"jobsup-env-{run_id}"), ("ConfigMap", f"cfg-{run_id}"), ("Job", f"t-{run_id}")]
        assert all(e.data["uid"] for e in created)
        submitted = (await env.events(run_id, "Submitted"))[0]
        assert created[0].data["env"] == submitted.data["env"] and list(created[0].data["env"]) == ["API_KEY"]
        for event in await env.events(run_id):
            if event.type != "LogLines":
                assert "v3ry-s3cret" not in str(event.data)
        # The Secret is per run, labelled, owned by the Job; the rendered
        # envFrom references it.
        secret = sim.get_object("secrets", f"jobsup-env-{run_id}")
        assert secret is not None
        assert secret["metadata"]["labels"]["jobsup.io/managed-by"] == "jobsup"
        assert secret["metadata"]["labels"]["jobsup.io/run"] == run_id
        job = sim.get_object("jobs.batch", f"t-{run_id}")
        assert job is not None
        assert [r["uid"] for r in secret["metadata"]["ownerReferences"]] == [job["metadata"]["uid"]]
        env_from = job["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        assert {"secretRef": {"name": f"jobsup-env-{run_id}", "optional": True}} in env_from
        # On completion the auxiliary ConfigMap is deleted; the Job stays for its TTL.
        assert sim.get_object("configmaps", f"cfg-{run_id}") is None
        assert [e.data["name"] for e in await env.events(run_id, "ObjectDeleted")] == [f"cfg-{run_id}"]
        status = await env.store.get_run(run_id)
        assert status is not None and status.handle["staged_pods"] and status.handle["created"] is True


async def test_exec_credential_plugin_context(tmp_path: Path, sim: SimCluster) -> None:
    # The kubeconfig's other context gets its token from an exec credential
    # plugin: short calls, watches, log streams and exec all carry it, and
    # the plugin runs once, not per request.
    before = sim.exec_plugin_calls()
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            "echo via-exec-plugin", manifest=M, files={M: job_manifest()}, kube={"context": sim.contexts[1]}
        )
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert await env.lines(run_id) == ["via-exec-plugin"]
        assert run.handle["context"] == sim.contexts[1]
    assert 1 <= sim.exec_plugin_calls() - before <= 2


@pytest.mark.parametrize("protocols", [("v5.channel.k8s.io", "v4.channel.k8s.io"), ("v4.channel.k8s.io",)])
async def test_staging_a_larger_snapshot_intact(tmp_path: Path, sim: SimCluster, protocols: tuple[str, ...]) -> None:
    # v4 has no stdin half-close: the pod side reads exactly the byte count.
    import base64
    import hashlib
    import os

    blob = base64.b64encode(os.urandom(3 * 2**20)).decode()
    digest = hashlib.sha256(blob.encode()).hexdigest()
    sim.configure(exec_protocols=protocols)
    try:
        async with k8s_env(tmp_path, sim) as env:
            run_id = await env.submit("sha256sum big.txt", manifest=M, files={M: job_manifest(), "big.txt": blob})
            run = await env.terminal(run_id)
            assert run.phase == "COMPLETED", run
            assert await env.lines(run_id) == [f"{digest}  big.txt"]
    finally:
        sim.configure(exec_protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))


async def test_failing_command_is_error_with_exit_code(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo about to fail; exit 7", manifest=M, files={M: job_manifest()})
        run = await env.terminal(run_id)
        assert run.phase == "ERROR" and run.exit_code == 7, run
        # The most specific cause, not the Job's BackoffLimitExceeded (backoffLimit is always 0);
        # the Job condition's "reason: message" is kept in the message.
        assert run.reason == "NonZeroExit"
        assert run.message is not None and run.message.startswith('NonZeroExit: container "main" exited with code 7')
        assert "BackoffLimitExceeded: " in run.message
        assert await env.lines(run_id) == ["about to fail"]


async def test_started_and_ended_come_from_the_pods_container(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("sleep 1.2; echo done", manifest=M, files={M: job_manifest()})
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        pod = sim.get_object("pods", pod_name(sim, run_id))
        assert pod is not None
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        times = await env.events(run_id, "ContainerTimes")
        assert {k: v for e in times for k, v in e.data.items() if k.endswith("_at")} == {
            "started_at": term["startedAt"],
            "finished_at": term["finishedAt"],
        }
        assert all(e.data["pod"] == pod["metadata"]["name"] for e in times)
        # The run's times are the container's, not when jobsup looked.
        assert (run.started_at, run.ended_at) == (term["startedAt"], term["finishedAt"]), run
        assert run.elapsed_s() is not None and run.elapsed_s() >= 1.0
        from supervisord.shared import schemas

        for e in times:
            assert not schemas.schema_errors("event", e.to_json())


async def test_oom_killed_container_is_error_oom_killed(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo started; sleep 60", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines >= 1)
        sim.oom_kill(pod_name(sim, run_id))
        run = await env.terminal(run_id)
        assert (run.phase, run.reason, run.exit_code) == ("ERROR", "OOMKilled", 137), run
        assert run.message is not None and "BackoffLimitExceeded: " in run.message


async def test_evicted_pod_is_error_evicted(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo started; sleep 60", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines >= 1)
        sim.evict_pod(pod_name(sim, run_id))
        run = await env.terminal(run_id)
        assert (run.phase, run.reason) == ("ERROR", "Evicted"), run
        assert (
            run.message is not None and run.message.startswith("Evicted: ") and "BackoffLimitExceeded: " in run.message
        )


async def test_active_deadline_is_error_deadline_exceeded(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        # The deadline counts from the Job's start: leave room for staging under load.
        run_id = await env.submit("echo started; sleep 60", manifest=M, files={M: job_manifest()}, timeout_s=8)
        run = await env.terminal(run_id)
        assert run.phase == "ERROR" and run.reason == "DeadlineExceeded", run
        assert "started" in await env.lines(run_id)
        await no_pods_left(sim, run_id)


async def test_deadline_sigterm_reaches_the_command_not_only_pid_1(tmp_path: Path, sim: SimCluster) -> None:
    # The kubelet signals only the container's PID 1 (bash running the
    # script), and a PID 1 without a handler never hears it: the script
    # forwards SIGTERM to the command, which can clean up at once instead of
    # being SIGKILLed after the 30 s grace period.
    command = (
        "python3 -c 'import signal, sys, time\n"
        'signal.signal(signal.SIGTERM, lambda *a: (print("cleaning up", flush=True), sys.exit(5)))\n'
        'print("started", flush=True)\n'
        "time.sleep(60)'"
    )
    async with k8s_env(tmp_path, sim) as env:
        started = anyio.current_time()
        run_id = await env.submit(command, manifest=M, files={M: job_manifest()}, timeout_s=3)
        run = await env.terminal(run_id)
        assert run.phase == "ERROR" and run.reason == "DeadlineExceeded", run
        await env.wait_until(run_id, lambda r: r.log_lines >= 2)
        assert await env.lines(run_id) == ["started", "cleaning up"]
        assert anyio.current_time() - started < 25, "the command did not get SIGTERM (SIGKILL after the grace period)"


async def test_cancel_deletes_everything_and_is_canceled(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo started; sleep 300", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING")
        await env.wait_until(run_id, lambda r: r.log_lines >= 1)
        spec = env.supervisor._runs[run_id].spec  # the supervised run's spec, env values included
        run = await env.supervisor.cancel(run_id)
        assert run.phase == "CANCELED"
        assert not run_objects(sim, run_id, "pods")
        assert not run_objects(sim, run_id, "jobs.batch") and not run_objects(sim, run_id, "secrets")
        assert await env.lines(run_id) == ["started"]
        again = await env.supervisor.cancel(run_id)
        assert again.phase == "CANCELED" and again.version == run.version
        # The backend's cancel is idempotent on its own too.
        await env.backend.cancel(spec, run.handle)


# ---------------------------------------------------------- pod not ready


async def test_missing_image_is_scheduling_then_error_and_rolled_back(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            "echo never",
            manifest=M,
            files={M: job_manifest(image=MISSING_REGISTRY + "nope:1")},
            kube={"pod_ready_timeout_s": 3},
        )
        run = await env.terminal(run_id, timeout_s=30)
        assert run.phase == "ERROR" and run.reason == "ImagePullBackOff", run
        assert run.message is not None
        # ErrImagePull and ImagePullBackOff alternate: whichever the deadline
        # meets, the run's reason is ImagePullBackOff and the message has the pod's words.
        assert "pod_ready_timeout_s=3s" in run.message and f"{MISSING_REGISTRY}nope:1" in run.message
        assert "jobsup deleted" in run.message
        reasons = [r for p, r in await env.phases(run_id) if p == "SCHEDULING"]
        assert "ImagePullBackOff" in reasons and "ErrImagePull" in reasons, reasons
        assert "RUNNING" not in [p for p, _ in await env.phases(run_id)]
        assert not run_objects(sim, run_id, "jobs.batch") and not run_objects(sim, run_id, "secrets")
        await no_pods_left(sim, run_id)


@pytest.mark.parametrize("timeout_s", [2, 3, 4])
async def test_image_pull_failure_reason_does_not_depend_on_the_cycle(
    tmp_path: Path, sim: SimCluster, timeout_s: int
) -> None:
    # Deadlines landing in either half of the ErrImagePull/ImagePullBackOff cycle.
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            "echo never",
            manifest=M,
            files={M: job_manifest(image=MISSING_REGISTRY + "nope:1")},
            kube={"pod_ready_timeout_s": timeout_s},
        )
        run = await env.terminal(run_id, timeout_s=30)
        assert (run.phase, run.reason) == ("ERROR", "ImagePullBackOff"), run


async def test_invalid_image_name_fails_at_once(tmp_path: Path, sim: SimCluster) -> None:
    # InvalidImageName is never retried by the kubelet: no point in waiting
    # out the pod-ready budget (here 300 s).
    async with k8s_env(tmp_path, sim) as env:
        started = anyio.current_time()
        run_id = await env.submit(
            "echo never",
            manifest=M,
            files={M: job_manifest(image="Registry.Example/My_Image:1")},
            kube={"pod_ready_timeout_s": 300},
        )
        run = await env.terminal(run_id, timeout_s=60)
        assert (run.phase, run.reason) == ("ERROR", "InvalidImageName"), run
        assert run.message is not None and "invalid reference format" in run.message and "jobsup deleted" in run.message
        assert anyio.current_time() - started < 45
        assert not run_objects(sim, run_id, "jobs.batch")
        await no_pods_left(sim, run_id)


async def test_missing_secret_key_is_create_container_config_error(tmp_path: Path, sim: SimCluster) -> None:
    sim.create_secret("creds-e2e", {"present": "x"})
    env_var = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds-e2e", "key": "absent"}}}]
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            "echo never", manifest=M, files={M: job_manifest(env=env_var)}, kube={"pod_ready_timeout_s": 3}
        )
        run = await env.terminal(run_id, timeout_s=30)
        assert run.phase == "ERROR" and run.reason == "CreateContainerConfigError", run
        assert run.message is not None and "couldn't find key absent" in run.message
        assert ("SCHEDULING", "CreateContainerConfigError") in await env.phases(run_id)
        assert not run_objects(sim, run_id, "jobs.batch")


async def test_secret_deleted_after_preflight_is_create_container_config_error(tmp_path: Path, sim: SimCluster) -> None:
    # Preflight saw the Secret; it is gone before the container starts.
    sim.create_secret("short-lived", {"K": "v"})
    doc = yaml.safe_load(job_manifest())
    doc["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "short-lived"}}]
    sim.faults.set_start_delay(1.0)
    try:
        async with k8s_env(tmp_path, sim) as env:
            run_id = await env.submit(
                "echo never", manifest=M, files={M: yaml.safe_dump(doc)}, kube={"pod_ready_timeout_s": 4}
            )
            sim.delete_object("secrets", "short-lived")
            run = await env.terminal(run_id, timeout_s=30)
            assert run.phase == "ERROR" and run.reason == "CreateContainerConfigError", run
            assert run.message is not None and 'secret "short-lived" not found' in run.message
            assert ("SCHEDULING", "CreateContainerConfigError") in await env.phases(run_id)
            assert not run_objects(sim, run_id, "jobs.batch") and not run_objects(sim, run_id, "secrets")
    finally:
        sim.faults.set_start_delay(0)


async def test_unschedulable_reports_the_schedulers_message(tmp_path: Path, sim: SimCluster) -> None:
    sim.faults.set_unschedulable("unsched-")
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            "echo never",
            manifest=M,
            files={M: job_manifest(name="unsched-{{JOBSUP_RUN}}")},
            kube={"pod_ready_timeout_s": 3},
        )
        run = await env.terminal(run_id, timeout_s=30)
        assert run.phase == "ERROR" and run.reason == "Unschedulable", run
        assert run.message is not None and "0/1 nodes are available" in run.message
        assert ("SCHEDULING", "Unschedulable") in await env.phases(run_id)


async def test_slow_pod_within_budget_runs(tmp_path: Path, sim: SimCluster) -> None:
    sim.faults.set_start_delay(1.5)
    try:
        async with k8s_env(tmp_path, sim) as env:
            run_id = await env.submit(
                "echo ok", manifest=M, files={M: job_manifest()}, kube={"pod_ready_timeout_s": 20}
            )
            run = await env.terminal(run_id)
            assert run.phase == "COMPLETED", run
            assert ("SCHEDULING", "ContainerCreating") in await env.phases(run_id)
    finally:
        sim.faults.set_start_delay(0)


async def test_exec_status_channel_empty_is_error_not_running(tmp_path: Path, sim: SimCluster) -> None:
    sim.faults.set_exec_empty_status(True)
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo never", manifest=M, files={M: job_manifest()}, kube={"pod_ready_timeout_s": 3})
        run = await env.terminal(run_id, timeout_s=30)
        assert run.phase == "ERROR", run
        assert run.message is not None and "status channel was empty" in run.message
        assert "RUNNING" not in [p for p, _ in await env.phases(run_id)]
        assert await env.lines(run_id) == []
        assert not run_objects(sim, run_id, "jobs.batch")


async def test_pod_exiting_before_staging_is_error_with_its_last_lines(tmp_path: Path, sim: SimCluster) -> None:
    doc = yaml.safe_load(job_manifest())
    doc["spec"]["template"]["spec"]["containers"][0]["command"] = ["bash", "-c", "echo broken image; exit 3"]
    doc["spec"]["template"]["spec"]["containers"][0]["args"] = ['eval "$JOBSUP_SCRIPT"']
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            "echo never", manifest=M, files={M: yaml.safe_dump(doc)}, kube={"pod_ready_timeout_s": 20}
        )
        run = await env.terminal(run_id, timeout_s=30)
        assert run.phase == "ERROR" and run.reason == "ExitedBeforeStaging", run
        assert run.message is not None and "exit code 3" in run.message and "broken image" in run.message
        assert not run_objects(sim, run_id, "jobs.batch")


# --------------------------------------------------------- submit failures


async def test_create_failing_on_second_object_deletes_the_first(tmp_path: Path, sim: SimCluster) -> None:
    # The ConfigMap's dry run passes; its create then fails with 500 on every
    # retry. The env Secret (created first) is deleted again.
    extra = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "first-{{JOBSUP_RUN}}"}, "data": {"a": "1"}}
    ]
    async with k8s_env(tmp_path, sim) as env:
        sim.faults.fail_requests(500, count=20, skip=1, path_contains="/configmaps", methods=("POST",))
        run_id = await env.submit("echo never", manifest=M, files={M: job_manifest(extra_docs=extra)})
        run = await env.terminal(run_id)
        assert run.phase == "ERROR" and run.reason == "InternalError", run
        assert run.message is not None and f"create ConfigMap/first-{run_id}" in run.message
        assert "injected by the simulator" in run.message and f"Secret/jobsup-env-{run_id}" in run.message
        assert sim.get_object("secrets", f"jobsup-env-{run_id}") is None
        assert not run_objects(sim, run_id, "jobs.batch")
        created = [e.data["name"] for e in await env.events(run_id, "ObjectCreated")]
        deleted = [e.data["name"] for e in await env.events(run_id, "ObjectDeleted")]
        assert created == deleted == [f"jobsup-env-{run_id}"]


async def test_dry_run_refusal_creates_nothing(tmp_path: Path, sim: SimCluster) -> None:
    # A Job of that name exists and is not this run's: the dry run says so.
    sim.create_object("jobs.batch", yaml.safe_load(job_manifest(name="taken-job")))
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo never", manifest=M, files={M: job_manifest(name="taken-job")})
        run = await env.terminal(run_id)
        assert run.phase == "ERROR" and run.reason == "AlreadyExists", run
        assert run.message is not None and "dry run" in run.message and "already exists" in run.message
        assert await env.events(run_id, "ObjectCreated") == []
        assert sim.get_object("secrets", f"jobsup-env-{run_id}") is None


async def test_transient_api_errors_are_retried(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        sim.faults.fail_requests(500, count=2, methods=("POST",))
        sim.faults.fail_requests(429, count=2, path_contains="/jobs", methods=("GET",), retry_after_s=1)
        run_id = await env.submit("echo fine", manifest=M, files={M: job_manifest()})
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert await env.lines(run_id) == ["fine"]


# -------------------------------------------------------------- supervision


async def test_job_deleted_behind_our_back_is_deleted(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo started; sleep 300", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines >= 1)
        sim.delete_job(f"t-{run_id}")
        run = await env.terminal(run_id)
        assert run.phase == "DELETED" and run.reason == "JobDeleted", run
        assert await env.lines(run_id) == ["started"]


async def test_watch_410_mid_run_relists_and_completes(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(ticker(40, 0.05), manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING")
        watch = next(iter(env.backend.connections.watches.values()))
        before = watch.relists
        sim.expire_watches()
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert watch.relists >= before + 2  # both the Job and the Pod watch listed again
        assert await env.lines(run_id) == expected(40)


@pytest.mark.parametrize("fault", ["cut", "stall", "rotate"])
async def test_log_stream_faults_keep_every_line_exactly_once(tmp_path: Path, sim: SimCluster, fault: str) -> None:
    n, half = 150, 75
    # The job prints half its lines, then waits for the gate: every fault
    # and the follow that recovers from it happen while it still runs (a
    # loaded machine could otherwise finish the job first, and its last
    # read picks the lines up: right, but not the case tested here). Not
    # under /tmp: the simulated container may have a private one.
    gate_dir = Path(tempfile.mkdtemp(prefix="jobsup-gate-", dir="/var/tmp"))
    gate = gate_dir / "gate"
    job = (
        f"for i in $(seq 1 {half}); do echo line-$i; sleep 0.02; done; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; "
        f"for i in $(seq {half + 1} {n}); do echo line-$i; sleep 0.02; done"
    )
    faulted, times = ("log_cuts", 3) if fault == "cut" else ("log_stalls", 1)
    try:
        async with k8s_env(tmp_path, sim) as env:
            if fault == "cut":
                sim.faults.cut_logs(7, count=3)
            elif fault == "stall":
                sim.faults.stall_logs(9, count=1)
            run_id = await env.submit(job, manifest=M, files={M: job_manifest()})
            if fault == "rotate":
                await env.wait_until(run_id, lambda r: r.log_lines >= 20)
                name = pod_name(sim, run_id)
                sim.rotate_log(name)
                await env.wait_until(run_id, lambda r: r.log_lines >= 60)
                sim.rotate_log(name)
            stats = env.backend.stats
            with anyio.fail_after(60):
                while stats.get("log_follows", 0) < 2 or stats.get(faulted, 0) < times:
                    await anyio.sleep(0.05)
            gate.touch()
            run = await env.terminal(run_id)
            assert run.phase == "COMPLETED", run
            assert await env.lines(run_id) == expected(n)
    finally:
        shutil.rmtree(gate_dir)


async def test_crio_logs_same_timestamp_per_read_and_utc_offset_exactly_once(tmp_path: Path, sim: SimCluster) -> None:
    # CRI-O stamps every line of one read buffer with one time, in the node's
    # zone (+01:00): positions count lines per timestamp, so streams cut
    # mid-burst resume without losing or doubling a line.
    bursts = "; ".join(
        f'python3 -c \'print("\\n".join("line-%d" % i for i in range({b * 30 + 1}, {b * 30 + 31})))\'; sleep 0.2'
        for b in range(5)
    )
    sim.configure(log_runtime="cri-o", log_utc_offset_s=3600)
    try:
        async with k8s_env(tmp_path, sim) as env:
            sim.faults.cut_logs(7, count=4)
            run_id = await env.submit(bursts, manifest=M, files={M: job_manifest()})
            run = await env.terminal(run_id)
            assert run.phase == "COMPLETED", run
            assert await env.lines(run_id) == expected(150)
            assert env.backend.stats.get("log_cuts", 0) >= 3, env.backend.stats
            positions = [line.pos for line in await env.store.log_lines(run_id, 0, 1_000_000)]
            assert all("+01:00#" in p for p in positions), positions[:3]
            assert len({p.partition("#")[0] for p in positions}) < len(positions) / 5, "bursts share timestamps"
    finally:
        sim.configure(log_runtime="containerd", log_utc_offset_s=0)


async def test_follow_stream_ending_while_running_is_followed_again(tmp_path: Path, sim: SimCluster) -> None:
    # An idle or server timeout ends the follow cleanly while the container
    # runs: jobsup follows again from its cursor, every line exactly once.
    async with k8s_env(tmp_path, sim) as env:
        sim.faults.end_logs(5, count=3)
        run_id = await env.submit(ticker(60, 0.03), manifest=M, files={M: job_manifest()})
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert await env.lines(run_id) == expected(60)
        assert env.backend.stats["log_follows"] >= 3, env.backend.stats


async def test_quiet_container_keeps_its_log_stream(tmp_path: Path, sim: SimCluster) -> None:
    # No output for a while is not a stall: a small check read finds nothing
    # new and the same stream goes on (the check's wait doubles).
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo a; sleep 7; echo b", manifest=M, files={M: job_manifest()})
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert await env.lines(run_id) == ["a", "b"]
        stats = env.backend.stats
        assert stats.get("log_stall_checks", 0) >= 2 and stats.get("log_stalls", 0) == 0, stats
        assert stats["log_follows"] <= 2, stats  # one, and maybe one more racing the container's end


async def test_lines_a_stall_check_read_are_recorded_when_the_pod_is_gone_before_the_next_read(tmp_path: Path) -> None:
    # The follow stream stalls after "started"; the stall check's read sees
    # "second"; the pod is deleted before any later read gets it (here every
    # later log request fails until then). What the check read is recorded:
    # otherwise the pod's last lines are lost with it (a Job deadline
    # deleting the pod during a reconnect lost a job's last line on a
    # loaded CI machine). A cluster of its own: the stall fault takes the
    # next log stream of any pod, and another test's may still be open.
    with sim_cluster(tmp_path / "sim") as sim:
        await _check_read_recorded(tmp_path, sim)


async def _check_read_recorded(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        sim.faults.stall_logs(1, count=1)
        run_id = await env.submit("echo started; echo second; sleep 300", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.log_lines >= 1)
        sim.faults.fail_requests(500, path_contains="/log", skip=1)  # the stall check passes, nothing after it
        with anyio.fail_after(60):
            while not env.backend.stats.get("log_stalls"):
                await anyio.sleep(0.05)
        sim.delete_object("pods", pod_name(sim, run_id), grace_seconds=0)
        await env.wait_until(run_id, lambda r: r.log_lines >= 2)
        sim.faults.clear_request_failures()
        assert await env.lines(run_id) == ["started", "second"]
        await env.terminal(run_id)
        assert await env.lines(run_id) == ["started", "second"]


async def test_api_server_restart_mid_run(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(ticker(100, 0.03), manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.log_lines >= 10)
        await anyio.to_thread.run_sync(sim.stop)
        await anyio.sleep(1.0)
        await anyio.to_thread.run_sync(sim.restart)
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert await env.lines(run_id) == expected(100)


async def test_api_server_restart_that_drops_watch_history_relists(tmp_path: Path, sim: SimCluster) -> None:
    # The Job finishes while the API server is down, and the restarted server
    # has no watch history: resuming from the old resourceVersion is 410, and
    # jobsup must relist to learn the outcome (and read the rest of the log).
    async with k8s_env(tmp_path, sim, resync_s=600.0) as env:
        run_id = await env.submit(ticker(40, 0.03) + "; exit 3", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.log_lines >= 5)
        await anyio.to_thread.run_sync(sim.stop)
        await anyio.to_thread.run_sync(
            lambda: sim.wait_for(
                lambda: (
                    (j := sim.get_object("jobs.batch", f"t-{run_id}")) is not None
                    and any(c["type"] == "Failed" for c in j["status"].get("conditions") or [])
                ),
                what="the Job failed while the API server is down",
            )
        )
        await anyio.to_thread.run_sync(lambda: sim.restart(drop_watch_history=True))
        run = await env.terminal(run_id)
        assert (run.phase, run.reason, run.exit_code) == ("ERROR", "NonZeroExit", 3), run
        assert await env.lines(run_id) == expected(40)


async def test_cancel_while_the_api_server_is_down_is_recorded_as_failed(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim, cancel_timeout_s=3.0) as env:
        run_id = await env.submit("echo s; sleep 120", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING")
        await anyio.to_thread.run_sync(sim.stop)
        try:
            with pytest.raises(BackendError):
                await env.supervisor.cancel(run_id)
            failed = await env.events(run_id, "CancelFailed")
            assert len(failed) == 1 and failed[0].data["message"]
        finally:
            await anyio.to_thread.run_sync(sim.restart)
        # Once the API answers again, a second cancel works.
        run = await env.supervisor.cancel(run_id)
        assert run.phase == "CANCELED", run
        await no_pods_left(sim, run_id)


async def test_cancel_while_the_api_server_hangs_is_recorded_as_failed_in_time(tmp_path: Path, sim: SimCluster) -> None:
    # A hung server (connections accepted by the kernel, never answered)
    # must not hold a cancel past its budget: every call times out.
    async with k8s_env(tmp_path, sim, cancel_timeout_s=8.0) as env:
        run_id = await env.submit("echo s; sleep 120", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING")
        await anyio.to_thread.run_sync(sim.hang)
        try:
            started = anyio.current_time()
            with pytest.raises(BackendError):
                await env.supervisor.cancel(run_id)
            assert anyio.current_time() - started < 30, "cancel outlived its budget"
            failed = await env.events(run_id, "CancelFailed")
            assert len(failed) == 1 and failed[0].data["message"]
        finally:
            await anyio.to_thread.run_sync(sim.restart)
        run = await env.supervisor.cancel(run_id)
        assert run.phase == "CANCELED", run
        await no_pods_left(sim, run_id)


async def test_start_while_the_api_server_hangs_ends_in_time_and_leaves_nothing(
    tmp_path: Path, sim: SimCluster
) -> None:
    # Preflight passed, then the server hangs (accepts, never answers): the
    # start gives up within its one budget (each call's retries alone took
    # minutes), the run is ERROR StartTimeout naming the step, and nothing
    # of it is left once the server is back.
    async with k8s_env(tmp_path, sim, start_timeout_s=6.0, cancel_timeout_s=6.0) as env:
        env.supervisor.gated = True  # hold it in QUEUED past its preflight
        run_id = await env.submit("echo never", manifest=M, files={M: job_manifest()})
        await anyio.to_thread.run_sync(sim.hang)
        try:
            started = anyio.current_time()
            admitted = NewEvent(ADMITTED, {"queue": "default"})
            assert await env.supervisor.admit(run_id, admitted, {}, "admitted by the test")
            run = await env.terminal(run_id, timeout_s=90)
            took = anyio.current_time() - started
            assert run.phase == "ERROR" and run.reason == "StartTimeout", run
            assert "did not start within 6s" in (run.message or "") and "does not answer" in (run.message or "")
            assert took < 45, f"start outlived its budget: {took:.1f}s"
        finally:
            await anyio.to_thread.run_sync(sim.restart)
        await anyio.sleep(1.0)
        for resource in ("jobs.batch", "secrets", "pods"):
            assert run_objects(sim, run_id, resource) == [], resource


async def test_start_timing_out_after_creating_records_the_pending_cleanup(tmp_path: Path, sim: SimCluster) -> None:
    # The objects exist and the pod waits when the server hangs: the start
    # runs out of its budget, its rollback out of its own, and what may
    # remain is named in the run's message and a CleanupFailed event.
    sim.faults.set_unschedulable("t-")
    async with k8s_env(tmp_path, sim, start_timeout_s=8.0, cancel_timeout_s=4.0) as env:
        run_id = await env.submit("echo never", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: bool(r.handle and r.handle.get("created")))
        await anyio.to_thread.run_sync(sim.hang)
        try:
            run = await env.terminal(run_id, timeout_s=90)
            assert run.phase == "ERROR" and run.reason == "StartTimeout", run
            assert "cleanup pending" in (run.message or "") and f"Job/t-{run_id}" in (run.message or ""), run
            failed = await env.events(run_id, "CleanupFailed")
            assert len(failed) == 1, failed
            assert f"Job/t-{run_id}" in failed[0].data["message"]
            assert f"Secret/jobsup-env-{run_id}" in failed[0].data["message"]
        finally:
            await anyio.to_thread.run_sync(sim.restart)
    # What the event named is indeed there: the test cleans it up.
    assert [o["metadata"]["name"] for o in run_objects(sim, run_id, "jobs.batch")] == [f"t-{run_id}"]
    sim.delete_object("jobs.batch", f"t-{run_id}")
    await no_pods_left(sim, run_id)


async def test_api_server_hanging_mid_run_then_back(tmp_path: Path, sim: SimCluster) -> None:
    # Watches, log follows and their reconnects all meet a server that
    # answers nothing; once it is back the run completes, each line once.
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(ticker(80, 0.05), manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.log_lines >= 10)
        await anyio.to_thread.run_sync(sim.hang)
        await anyio.sleep(8.0)
        await anyio.to_thread.run_sync(sim.restart)
        run = await env.terminal(run_id, timeout_s=90)
        assert run.phase == "COMPLETED", run
        assert await env.lines(run_id) == expected(80)


async def test_a_line_longer_than_64k_is_recorded_in_pieces(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            'python3 -c \'print("y" * 200000); print("after")\'', manifest=M, files={M: job_manifest()}
        )
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        lines = await env.lines(run_id)
        assert [len(l) for l in lines] == [65536, 65536, 65536, 3392, 5]
        assert "".join(lines[:4]) == "y" * 200000 and lines[-1] == "after"


async def test_eviction_replacement_pod_is_staged_and_followed(tmp_path: Path, sim: SimCluster) -> None:
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            'echo "run on $HOSTNAME"; sleep 1.5; echo done',
            manifest=M,
            files={M: job_manifest(podFailurePolicy=policy)},
        )
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines >= 1)
        first = pod_name(sim, run_id)
        sim.evict_pod(first)
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        changed = await env.events(run_id, "LeaderPodChanged")
        assert changed and changed[0].data["from"] == first
        second = changed[0].data["to"]
        lines = await env.lines(run_id)
        assert lines == [f"run on {first}", f"run on {second}", "done"]
        staged = [e.data["pod"] for e in await env.events(run_id, "StagingStep")]
        assert staged == [first, second]


async def test_completed_job_then_ttl_deleted_stays_completed(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo quick", manifest=M, files={M: job_manifest(ttlSecondsAfterFinished=1)})
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED"
        sim.wait_for(lambda: sim.get_object("jobs.batch", f"t-{run_id}") is None, what="the TTL deletion")
        # The env Secret is owned by the Job: the garbage collector takes it with the Job.
        sim.wait_for(lambda: not run_objects(sim, run_id, "secrets"), what="the env Secret collected")
        after = await env.store.get_run(run_id)
        assert after is not None and after.phase == "COMPLETED" and after.version == run.version


# ----------------------------------------------------------------- reattach


async def test_reattach_after_restart_resumes_logs_exactly_once(tmp_path: Path, sim: SimCluster) -> None:
    n = 120
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(ticker(n, 0.03), manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.log_lines >= 15)
    # The "daemon" is gone; the run goes on. A new one reattaches.
    await anyio.sleep(0.5)
    async with k8s_env(tmp_path, sim, reattach=True) as env:
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert await env.lines(run_id) == expected(n)


async def test_reattach_to_a_job_gone_while_down_is_deleted(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo started; sleep 300", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines >= 1)
    sim.delete_job(f"t-{run_id}")
    async with k8s_env(tmp_path, sim, reattach=True) as env:
        run = await env.terminal(run_id)
        assert run.phase == "DELETED", run
        assert await env.lines(run_id) == ["started"]


async def test_reattach_to_a_finished_job_reports_its_outcome(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit("echo started; sleep 2; echo finished; exit 4", manifest=M, files={M: job_manifest()})
        await env.wait_until(run_id, lambda r: r.phase == "RUNNING" and r.log_lines >= 1)
    sim.wait_for(
        lambda: any(
            c["type"] == "Failed"
            for c in (sim.get_object("jobs.batch", f"t-{run_id}") or {}).get("status", {}).get("conditions") or []
        ),
        what="the Job to fail",
    )
    async with k8s_env(tmp_path, sim, reattach=True) as env:
        run = await env.terminal(run_id)
        assert run.phase == "ERROR" and run.exit_code == 4, run
        assert await env.lines(run_id) == ["started", "finished"]


async def test_reattach_mid_staging_finishes_staging(tmp_path: Path, sim: SimCluster) -> None:
    # The daemon stops while the pod is still ContainerCreating (objects
    # created, source not staged): the next one stages and the run completes.
    sim.faults.set_start_delay(2.0)
    try:
        async with k8s_env(tmp_path, sim) as env:
            run_id = await env.submit(
                "echo staged-late", manifest=M, files={M: job_manifest()}, kube={"pod_ready_timeout_s": 30}
            )
            await env.wait_until(run_id, lambda r: r.handle.get("created") is True)
            status = await env.store.get_run(run_id)
            assert (
                status is not None and status.handle["staged_pods"] == [] and status.phase in ("QUEUED", "SCHEDULING")
            )
    finally:
        sim.faults.set_start_delay(0)
    async with k8s_env(tmp_path, sim, reattach=True) as env:
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert await env.lines(run_id) == ["staged-late"]
        assert len(await env.events(run_id, "StagingStep")) == 1


async def test_reattach_after_the_pod_ready_deadline_is_error_not_deleted(tmp_path: Path, sim: SimCluster) -> None:
    # The daemon stops while the pod cannot pull its image; the pod-ready
    # budget runs out while no daemon runs. The next daemon rolls the run back
    # itself: that is an ERROR with the waiting reason, not an outside delete.
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(
            "echo never",
            manifest=M,
            files={M: job_manifest(image=MISSING_REGISTRY + "nope:1")},
            kube={"pod_ready_timeout_s": 3},
        )
        await env.wait_until(run_id, lambda r: r.phase == "SCHEDULING" and r.handle.get("created") is True)
    await anyio.sleep(4.0)
    async with k8s_env(tmp_path, sim, reattach=True) as env:
        run = await env.terminal(run_id, timeout_s=60)
        assert run.phase == "ERROR" and run.reason in ("ImagePullBackOff", "ErrImagePull"), run
        assert not run_objects(sim, run_id, "jobs.batch") and not run_objects(sim, run_id, "secrets")


async def test_cancel_racing_completion_ends_in_one_terminal_phase(tmp_path: Path, sim: SimCluster) -> None:
    async with k8s_env(tmp_path, sim) as env:
        for delay in (0.0, 0.3):
            run_id = await env.submit(f"sleep {delay}; echo done", manifest=M, files={M: job_manifest()})
            await env.wait_until(run_id, lambda r: r.phase in ("RUNNING", "COMPLETED"))
            run = await env.supervisor.cancel(run_id)
            assert run.phase in ("CANCELED", "COMPLETED"), run
            terminal = [p for p, _ in await env.phases(run_id) if p in ("COMPLETED", "ERROR", "CANCELED", "DELETED")]
            assert terminal == [run.phase], terminal
            if run.phase == "CANCELED":
                await no_pods_left(sim, run_id)


async def test_reattach_mid_submit_rolls_back(tmp_path: Path, sim: SimCluster) -> None:
    # Simulate a daemon that died after recording the handle and creating the
    # Secret, before the Job: supervise finds the objects by label.
    from supervisord.daemon.backends.kubernetes.client.resources import env_secret
    from supervisord.shared.manifest.inject import run_labels

    async with k8s_env(tmp_path, sim) as env:
        commit = await anyio.to_thread.run_sync(env.commit, {M: job_manifest()})
        assert commit
        run_id = "0123456789ab"
        labels = run_labels(run_id=run_id, project="k8s-e2e", name="t")
        secret = env_secret(run_id, sim.namespace, labels, {})
        sim.create_object("secrets", secret)
        handle: dict[str, Any] = {
            "context": sim.contexts[0],
            "namespace": sim.namespace,
            "job": f"t-{run_id}",
            "script_container": "main",
            "objects": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"t-{run_id}", "uid": None}],
            "created": False,
            "staged_pods": [],
        }
        from store import NewEvent

        await env.store.append(
            run_id,
            0,
            [
                NewEvent(
                    "Submitted",
                    {
                        "project": "k8s-e2e",
                        "name": "t",
                        "backend": "kubernetes",
                        "config": {"kubernetes": {"namespace": sim.namespace, "context": sim.contexts[0]}},
                    },
                )
            ],
        )
        await env.store.append(run_id, 1, [NewEvent("HandleRecorded", {"handle": handle})])
    async with k8s_env(tmp_path, sim, reattach=True) as env:
        run = await env.terminal(run_id)
        assert run.phase == "ERROR" and run.reason == "SubmitInterrupted", run
        assert f"jobsup-env-{run_id}" in (run.message or "")
        assert sim.get_object("secrets", f"jobsup-env-{run_id}") is None


# ------------------------------------------------- sandbox options ---------


async def test_secret_mount_and_read_only_pvc_mount(tmp_path: Path, sim: SimCluster) -> None:
    sim.create_secret("e2e-creds", {"token": "t0ken-e2e"})
    sim.create_pvc("e2e-data")
    (sim.pvc_path("e2e-data") / "in.txt").write_text("claim-data\n")
    base = "/srv/jobsup-k8s-e2e"
    kube = {
        "secret_mounts": [{"secret_name": "e2e-creds", "mount_path": f"{base}/creds"}],
        "pvc_mounts": [{"claim_name": "e2e-data", "mount_path": f"{base}/data", "read_only": True}],
    }
    command = (
        f"cat {base}/creds/token; echo; cat {base}/data/in.txt; "
        f"if {{ echo x > {base}/data/new; }} 2>/dev/null; then echo writable; else echo read-only; fi"
    )
    async with k8s_env(tmp_path, sim) as env:
        run_id = await env.submit(command, manifest=M, files={M: job_manifest()}, kube=kube)
        run = await env.terminal(run_id)
        assert run.phase == "COMPLETED", run
        assert await env.lines(run_id) == ["t0ken-e2e", "claim-data", "read-only" if sim.private_tmp else "writable"]
        job = sim.get_object("jobs.batch", f"t-{run_id}")
        assert job is not None
        mounts = job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "jobsup-pvc-0", "mountPath": f"{base}/data", "readOnly": True} in mounts
