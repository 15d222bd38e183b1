"""The watch cache and the stream pools at scale (issue 29 item 5): a pod
seen ended through a direct read stays ended in the run's view when the
lagging pod watch delivers an older state, and log streams are spread over
several connection pools (pure: no cluster)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from kubernetes import client as k8s_client

from supervisord.daemon.backends.kubernetes.client.access import STREAM_POOLS, Cluster, RetryPolicy
from supervisord.daemon.backends.kubernetes.client.watches import NamespaceWatch
from supervisord.shared.manifest.inject import LABEL_RUN


def _pod(phase: str, rv: int, uid: str = "u1") -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "job-1-abcde", "uid": uid, "resourceVersion": str(rv), "labels": {LABEL_RUN: "r1"}},
        "status": {"phase": phase},
    }


def _watch() -> NamespaceWatch:
    cluster: Any = None  # _apply and views never touch the cluster
    return NamespaceWatch(cluster, "ns")


@pytest.mark.anyio
async def test_a_pod_read_ended_stays_ended_when_the_watch_lags() -> None:
    watch = _watch()
    view = watch.view("r1")
    watch._apply("pods", "ADDED", _pod("Running", 1))
    token = view.token()
    # The reconciler's LIST shows the pod ended before the pod watch does.
    assert view.adopt_ended_pods([_pod("Succeeded", 3)]) is True
    assert token.is_set()  # the log follower waiting on the view wakes
    assert view.pods["job-1-abcde"]["status"]["phase"] == "Succeeded"
    # The watch then delivers the older Running state, then the end itself.
    watch._apply("pods", "MODIFIED", _pod("Running", 2))
    assert view.pods["job-1-abcde"]["status"]["phase"] == "Succeeded"
    watch._apply("pods", "MODIFIED", _pod("Succeeded", 3))
    assert view.pods["job-1-abcde"]["metadata"]["resourceVersion"] == "3"
    # Nothing to take: a running pod, another pod of the same name (uid), an unknown pod.
    assert view.adopt_ended_pods([_pod("Running", 4)]) is False
    watch._apply("pods", "DELETED", _pod("Succeeded", 5))
    watch._apply("pods", "ADDED", _pod("Running", 6, uid="u2"))
    assert view.adopt_ended_pods([_pod("Failed", 7, uid="u3")]) is False
    assert view.pods["job-1-abcde"]["metadata"]["uid"] == "u2"
    # A new pod of the same name is not held back by the old one's end.
    assert view.adopt_ended_pods([_pod("Failed", 8, uid="u2")]) is True
    watch._apply("pods", "ADDED", _pod("Pending", 1, uid="u4"))
    assert view.pods["job-1-abcde"]["metadata"]["uid"] == "u4"


@pytest.mark.anyio
async def test_log_streams_are_spread_over_pools_and_a_log_keeps_its_pool() -> None:
    configuration = k8s_client.Configuration()
    configuration.host = "http://127.0.0.1:9"
    cluster = Cluster(
        "ctx",
        configuration,
        limiter=anyio.CapacityLimiter(2),
        exec_limiter=anyio.CapacityLimiter(1),
        retry=RetryPolicy(),
    )
    try:
        keys = [f"pod-{i}/main" for i in range(500)]
        pools = {id(cluster._stream_client(key)) for key in keys}
        assert len(pools) == STREAM_POOLS  # 500 follows: about 16 connections a pool, not 500 in one
        assert cluster._stream_client(keys[7]) is cluster._stream_client(keys[7])
        assert cluster._stream_client(None) is cluster._http  # the watches' pool
    finally:
        await cluster.aclose()
