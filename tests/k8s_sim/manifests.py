"""Manifest builders for the simulator's tests and the benchmarks."""

from __future__ import annotations

from typing import Any

from .util import JSON

#: terminationGracePeriodSeconds of the builders' pods. As in a cluster, the
#: kubelet's SIGTERM reaches only the container's main process and only when
#: it handles SIGTERM (``bash -c 'sleep 60'`` does not), so a stop waits out
#: the grace period before SIGKILL: short here, so tests about other things
#: do not wait the API default of 30 s.
GRACE_S = 2


def _grace(grace_s: int | None) -> JSON:
    return {} if grace_s is None else {"terminationGracePeriodSeconds": grace_s}


def job(
    name: str,
    script: str,
    *,
    image: str = "docker.io/library/busybox:1.36",
    env: list[JSON] | None = None,
    env_from: list[JSON] | None = None,
    backoff_limit: int = 0,
    restart_policy: str = "Never",
    labels: dict[str, str] | None = None,
    container: str = "main",
    grace_s: int | None = GRACE_S,
    **spec: Any,
) -> JSON:
    """A batch/v1 Job running ``bash -c script`` in one container ``container``.
    Extra keyword arguments are Job spec fields (activeDeadlineSeconds,
    ttlSecondsAfterFinished, podFailurePolicy...). ``grace_s``: the pod's
    terminationGracePeriodSeconds (None: the API default, 30)."""
    c: JSON = {"name": container, "image": image, "command": ["bash", "-c", script]}
    if env:
        c["env"] = env
    if env_from:
        c["envFrom"] = env_from
    body: JSON = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"labels": dict(labels or {})},
                "spec": {"restartPolicy": restart_policy, "containers": [c], **_grace(grace_s)},
            },
            **spec,
        },
    }
    return body


def pod(
    name: str,
    script: str,
    *,
    image: str = "docker.io/library/busybox:1.36",
    container: str = "main",
    grace_s: int | None = GRACE_S,
    **spec: Any,
) -> JSON:
    """A bare v1 Pod running ``bash -c script`` (restartPolicy Never);
    ``grace_s`` as for :func:`job`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": container, "image": image, "command": ["bash", "-c", script]}],
            **_grace(grace_s),
            **spec,
        },
    }
