"""Shared pieces of the Kubernetes backend tests (not a test module): the
simulated cluster, a backend tuned for tests, manifests and configs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from supervisord.daemon.backends.kubernetes import KubernetesBackend
from tests.k8s_sim import SimCluster
from tests.supervisord.jobsup_env import JobsupEnv

EVAL = ["bash", "-c", 'eval "$JOBSUP_SCRIPT"']
MANIFEST_PATH = ".jobsup/k8s.yaml"


def job_manifest(
    *,
    name: str = "t-{{JOBSUP_RUN}}",
    image: str = "docker.io/library/busybox:1.36",
    container: str = "main",
    env: list[dict[str, Any]] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    extra_docs: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> str:
    """A manifest with one primary Job running the gated script (and
    ``extra_docs`` before it); ``spec`` keys go on the Job spec."""
    c: dict[str, Any] = {"name": container, "image": image, "command": list(EVAL)}
    if env:
        c["env"] = env
    if mounts:
        c["volumeMounts"] = mounts
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [c]}
    if volumes:
        pod["volumes"] = volumes
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": {"spec": pod}, **spec},
    }
    return yaml.safe_dump_all([*(extra_docs or []), job], sort_keys=False)


@contextlib.contextmanager
def sim_cluster(root: Path) -> Iterator[SimCluster]:
    """A simulated cluster with short back-offs."""
    with SimCluster.start(root) as sim:
        sim.configure(job_backoff_s=0.2, crash_backoff_s=0.2, image_pull_backoff_s=0.2, bookmark_interval_s=1.0)
        yield sim


def make_backend(sim: SimCluster, **overrides: Any) -> KubernetesBackend:
    """A backend on the simulator's kubeconfig with test-sized timings."""
    settings: dict[str, Any] = {
        "kubeconfig": str(sim.kubeconfig_path),
        "log_stall_s": 2.0,
        "log_stall_max_s": 8.0,
        "final_read_s": 10.0,
        "resync_s": 20.0,
        "watch_timeout_s": 30,
        "preflight_cache_s": 5.0,
        "cancel_timeout_s": 60.0,
    }
    settings.update(overrides)
    return KubernetesBackend(**settings)


def kube_config(sim: SimCluster, **extra: Any) -> dict[str, Any]:
    """The effective config of a run on the simulator."""
    kube: dict[str, Any] = {"context": sim.contexts[0], "namespace": sim.namespace, "pod_ready_timeout_s": 30}
    kube.update(extra)
    return {"kubernetes": kube, "env": {}}


def use_sim(env: JobsupEnv, sim: SimCluster, *, pod_ready_timeout_s: int | None = None) -> None:
    """Point ``env``'s daemon and CLI at ``sim``: its kubeconfig through
    KUBECONFIG, its first context and namespace in the user's config (and a
    short pod-ready budget when ``pod_ready_timeout_s`` is given)."""
    env.env["KUBECONFIG"] = str(sim.kubeconfig_path)
    text = f"kubernetes:\n  context: {sim.contexts[0]}\n  namespace: {sim.namespace}\n"
    if pod_ready_timeout_s is not None:
        text += f"  pod_ready_timeout_s: {pod_ready_timeout_s}\n"
    env.user_config(text)


def run_objects(sim: SimCluster, run_id: str, resource: str) -> list[Mapping[str, Any]]:
    """Stored objects of ``resource`` labelled with the run."""
    return [o for o in sim.list_objects(resource) if (o["metadata"].get("labels") or {}).get("jobsup.io/run") == run_id]
