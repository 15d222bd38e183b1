"""The Kubernetes backend against a real cluster: the conformance scenarios
and the pod-not-ready, Job-deleted and preflight cases the simulator tests
cover, with a real API server, scheduler, kubelet and image.

Skipped unless ``JOBSUP_E2E_KUBECONFIG`` names a kubeconfig. Optional:
``JOBSUP_E2E_CONTEXT`` (default: the kubeconfig's current context),
``JOBSUP_E2E_NAMESPACE`` (default ``default``), ``JOBSUP_E2E_IMAGE`` (an image
with bash, tar and coreutils; default ``python:3.12-slim``),
``JOBSUP_E2E_POD_READY_TIMEOUT_S`` (default 180: room for an image pull).
The identity needs what ``jobsup doctor`` checks in that namespace. Every
object is labelled ``jobsup.io/run`` and deleted by the test that made it.
See docs/kubernetes.md, "Running on a cluster".
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from supervisord.daemon.backends.base import RunSpec
from supervisord.daemon.backends.kubernetes import KubernetesBackend
from supervisord.shared.exceptions import PreflightError
from tests.supervisord.backends.conformance import SCENARIOS, BackendHarness, SupervisorHarness

KUBECONFIG = os.environ.get("JOBSUP_E2E_KUBECONFIG", "")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.anyio,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not KUBECONFIG,
        reason="JOBSUP_E2E_KUBECONFIG is not set: these tests need a real Kubernetes cluster (see docs/kubernetes.md)",
    ),
]

NAMESPACE = os.environ.get("JOBSUP_E2E_NAMESPACE", "default")
CONTEXT = os.environ.get("JOBSUP_E2E_CONTEXT") or None
IMAGE = os.environ.get("JOBSUP_E2E_IMAGE", "python:3.12-slim")
POD_READY_S = int(os.environ.get("JOBSUP_E2E_POD_READY_TIMEOUT_S", "180"))
MANIFEST_PATH = ".jobsup/k8s.yaml"


def manifest(image: str = IMAGE, **spec: Any) -> str:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "e2e-{{JOBSUP_RUN}}"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": image, "command": ["bash", "-c", 'eval "$JOBSUP_SCRIPT"']}
                    ],
                }
            },
            **spec,
        },
    }
    return yaml.safe_dump(job, sort_keys=False)


def config(**kube: Any) -> dict[str, Any]:
    k: dict[str, Any] = {"namespace": NAMESPACE, "pod_ready_timeout_s": POD_READY_S, **kube}
    if CONTEXT:
        k["context"] = CONTEXT
    return {"kubernetes": k, "env": {}}


def make_backend() -> KubernetesBackend:
    return KubernetesBackend(kubeconfig=KUBECONFIG, log_stall_s=10.0, log_stall_max_s=60.0)


def harness(repo_manifest: str | None = None, **kube: Any) -> BackendHarness:
    return BackendHarness(
        name="kubernetes",
        make=make_backend,
        config=config(**kube),
        repo_files={MANIFEST_PATH: repo_manifest or manifest()},
        submitted={"manifest": MANIFEST_PATH},
        stderr_stream="stdout",
    )


async def _open(tmp_path: Path, h: BackendHarness) -> AsyncIterator[SupervisorHarness]:
    async for opened in SupervisorHarness.open(tmp_path, h):
        try:
            yield opened
        finally:
            await _delete_leftovers(opened)


async def _delete_leftovers(h: SupervisorHarness) -> None:
    """Cancel whatever a failed test left running (the backend deletes by label)."""
    for run in await h.store.list_runs(non_terminal_only=True):
        with anyio.move_on_after(120):
            await h.supervisor.cancel(run.id)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SupervisorHarness]:
    async for h in _open(tmp_path, harness()):
        yield h


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_conformance_on_a_real_cluster(cluster: SupervisorHarness, scenario: str) -> None:
    await SCENARIOS[scenario](cluster)


async def test_missing_image_is_error_with_the_pull_reason(tmp_path: Path) -> None:
    async for h in _open(
        tmp_path, harness(manifest("registry.invalid/jobsup/no-such-image:1"), pod_ready_timeout_s=60)
    ):
        run_id = await h.submit("echo never")
        run = await h.terminal(run_id, timeout_s=300)
        assert run.phase == "ERROR" and run.reason in ("ImagePullBackOff", "ErrImagePull"), run
        assert run.message is not None and "pod_ready_timeout_s=60s" in run.message


async def test_job_deleted_behind_our_back_is_deleted(tmp_path: Path) -> None:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    async for h in _open(tmp_path, harness()):
        run_id = await h.submit("echo started; sleep 600")
        await h.wait_until(run_id, lambda r: r.phase == "RUNNING", timeout_s=POD_READY_S + 60)
        api = k8s_config.new_client_from_config(config_file=KUBECONFIG, context=CONTEXT)
        try:
            k8s_client.BatchV1Api(api).delete_namespaced_job(
                f"e2e-{run_id}", NAMESPACE, propagation_policy="Background"
            )
        finally:
            api.close()
        run = await h.terminal(run_id, timeout_s=120)
        assert run.phase == "DELETED", run


async def test_preflight_refuses_a_missing_secret(tmp_path: Path) -> None:
    from supervisord.shared.source import resolve_commit
    from tests.supervisord.jobsup_env import make_repo

    doc = yaml.safe_load(manifest())
    pod = doc["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "s", "secret": {"secretName": f"jobsup-e2e-absent-{int(time.time())}"}}]
    pod["containers"][0]["volumeMounts"] = [{"name": "s", "mountPath": "/secrets"}]
    repo = tmp_path / "repo"
    commit = resolve_commit(make_repo(repo, {MANIFEST_PATH: yaml.safe_dump(doc)}), "HEAD")
    spec = RunSpec(
        run_id="e2e000000001",
        project="e2e",
        name="t",
        backend="kubernetes",
        command="true",
        timeout_s=60,
        env={},
        config=config(),
        snapshot=tmp_path / "none.tar",
        snapshot_sha256="",
        commit=commit,
        repo=str(repo),
        run_dir=tmp_path / "run",
        submitted={"manifest": MANIFEST_PATH},
        manifest=MANIFEST_PATH,
    )
    backend = make_backend()
    try:
        with pytest.raises(PreflightError) as err:
            await backend.preflight(spec)
        assert "jobsup-e2e-absent-" in str(err.value) and "does not exist" in str(err.value)
    finally:
        await backend.aclose()
