"""The Job/pod -> phase mapping, table-tested (pure; no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from supervisord.daemon.backends.kubernetes.phase import (
    Observation,
    describe_pod,
    job_outcome,
    leader_pod,
    observe,
    pod_progress,
)

C = "main"


def cond(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def job(*conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "t-1", "uid": "u1"}, "status": {"conditions": list(conditions)}}


def pod(
    name: str = "t-1-aaaaa",
    *,
    phase: str = "Running",
    state: dict[str, Any] | None = None,
    created: str = "2026-01-01T00:00:00Z",
    conditions: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    reason: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if state is not None:
        status["containerStatuses"] = [{"name": C, "state": state}]
    if init is not None:
        status["initContainerStatuses"] = init
    if reason:
        status["reason"] = reason
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created, "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    return {"metadata": meta, "status": status}


RUNNING = {"running": {"startedAt": "2026-01-01T00:00:01Z"}}


def terminated(code: int, reason: str) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason}}


def waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    w: dict[str, Any] = {"reason": reason}
    if message:
        w["message"] = message
    return {"waiting": w}


CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]], bool, Observation]] = [
    ("no pod yet", job(), [], True, Observation("SCHEDULING", None, "waiting for the Job's pod to be created")),
    (
        "pending without status",
        job(),
        [pod(phase="Pending")],
        True,
        Observation("SCHEDULING", None, "pod t-1-aaaaa is Pending"),
    ),
    (
        "unschedulable",
        job(),
        [pod(phase="Pending", conditions=[cond("PodScheduled", "False", "Unschedulable", "0/3 nodes are available")])],
        True,
        Observation("SCHEDULING", "Unschedulable", "0/3 nodes are available"),
    ),
    (
        "image pull back-off keeps its message",
        job(),
        [pod(phase="Pending", state=waiting("ImagePullBackOff", 'Back-off pulling image "x"'))],
        True,
        Observation("SCHEDULING", "ImagePullBackOff", 'Back-off pulling image "x"'),
    ),
    (
        "config error",
        job(),
        [pod(phase="Pending", state=waiting("CreateContainerConfigError", 'secret "s" not found'))],
        True,
        Observation("SCHEDULING", "CreateContainerConfigError", 'secret "s" not found'),
    ),
    (
        "an init container's problem wins over ContainerCreating",
        job(),
        [
            pod(
                phase="Pending",
                state=waiting("PodInitializing"),
                init=[{"name": "fetch", "state": waiting("ErrImagePull", "nope")}],
            )
        ],
        True,
        Observation("SCHEDULING", "ErrImagePull", "nope"),
    ),
    (
        "container creating",
        job(),
        [pod(phase="Pending", state=waiting("ContainerCreating"))],
        True,
        Observation("SCHEDULING", "ContainerCreating", None),
    ),
    ("running and staged", job(), [pod(state=RUNNING)], True, Observation("RUNNING")),
    ("running, not staged yet", job(), [pod(state=RUNNING)], False, Observation("STAGING")),
    (
        "terminated before the Job noticed",
        job(),
        [pod(phase="Succeeded", state=terminated(0, "Completed"))],
        True,
        Observation("RUNNING"),
    ),
    (
        "complete",
        job(cond("Complete", reason="CompletionsReached")),
        [pod(phase="Succeeded", state=terminated(0, "Completed"))],
        True,
        Observation("COMPLETED", None, None, 0),
    ),
    (
        "success criteria met counts as complete",
        job(cond("SuccessCriteriaMet", reason="CompletionsReached")),
        [pod(state=terminated(0, "Completed"))],
        True,
        Observation("COMPLETED", None, None, 0),
    ),
    (
        "OOMKilled note on a complete Job is not an error",
        job(cond("Complete")),
        [pod(phase="Succeeded", state=terminated(0, "OOMKilled"))],
        True,
        Observation("COMPLETED", None, 'container "main" reported OOMKilled, but the Job completed', 0),
    ),
    (
        "failed with a non-zero exit: NonZeroExit, the Job's reason: message in the message",
        job(cond("Failed", reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit")),
        [pod(phase="Failed", state=terminated(3, "Error"))],
        True,
        Observation(
            "ERROR",
            "NonZeroExit",
            'NonZeroExit: container "main" exited with code 3 (Error). '
            "BackoffLimitExceeded: Job has reached the specified backoff limit",
            3,
        ),
    ),
    (
        "failure target is terminal too; OOMKilled is the reason",
        job(cond("FailureTarget", reason="BackoffLimitExceeded", message="limit")),
        [pod(phase="Failed", state=terminated(137, "OOMKilled"))],
        True,
        Observation(
            "ERROR",
            "OOMKilled",
            'OOMKilled: container "main" was killed for using too much memory (exit code 137). BackoffLimitExceeded: limit',
            137,
        ),
    ),
    (
        "deadline exceeded keeps its own reason first",
        job(cond("Failed", reason="DeadlineExceeded", message="Job was active longer than specified deadline")),
        [pod(phase="Failed", state=terminated(143, "Error"))],
        True,
        Observation(
            "ERROR",
            "DeadlineExceeded",
            'DeadlineExceeded: Job was active longer than specified deadline (NonZeroExit: container "main" exited with code 143 (Error))',
            143,
        ),
    ),
    (
        "evicted pod",
        job(cond("Failed", reason="BackoffLimitExceeded", message="limit")),
        [pod(phase="Failed", reason="Evicted", state=waiting("ContainerCreating"))],
        True,
        Observation("ERROR", "Evicted", "Evicted: the pod was evicted. BackoffLimitExceeded: limit", None),
    ),
    (
        "an evicted pod's killed container: Evicted is the cause, the exit is detail",
        job(cond("Failed", reason="BackoffLimitExceeded", message="limit")),
        [
            pod(
                phase="Failed",
                reason="Evicted",
                state=terminated(137, "Error"),
            )
        ],
        True,
        Observation(
            "ERROR",
            "Evicted",
            'Evicted: the pod was evicted. NonZeroExit: container "main" exited with code 137 (Error). '
            "BackoffLimitExceeded: limit",
            137,
        ),
    ),
    (
        "an OOMKilled container on an evicted pod is OOMKilled",
        job(cond("Failed", reason="BackoffLimitExceeded", message="limit")),
        [pod(phase="Failed", reason="Evicted", state=terminated(137, "OOMKilled"))],
        True,
        Observation(
            "ERROR",
            "OOMKilled",
            'OOMKilled: container "main" was killed for using too much memory (exit code 137). BackoffLimitExceeded: limit',
            137,
        ),
    ),
    (
        "a start failure is StartFailed with the runtime's message",
        job(cond("Failed", reason="BackoffLimitExceeded", message="limit")),
        [
            pod(
                phase="Failed",
                state={"terminated": {"exitCode": 128, "reason": "StartError", "message": 'exec: "nope": not found'}},
            )
        ],
        True,
        Observation(
            "ERROR",
            "StartFailed",
            'StartFailed: container "main" could not start (StartError: exec: "nope": not found). BackoffLimitExceeded: limit',
            128,
        ),
    ),
    (
        "ContainerCannotRun (dockershim) is a start failure too",
        job(cond("Failed", reason="BackoffLimitExceeded", message="limit")),
        [pod(phase="Failed", state=terminated(127, "ContainerCannotRun"))],
        True,
        Observation(
            "ERROR",
            "StartFailed",
            'StartFailed: container "main" could not start (ContainerCannotRun). BackoffLimitExceeded: limit',
            127,
        ),
    ),
    (
        "the pod's own deadline (activeDeadlineSeconds on the pod)",
        job(cond("Failed", reason="BackoffLimitExceeded", message="limit")),
        [pod(phase="Failed", reason="DeadlineExceeded", state=terminated(143, "Error"))],
        True,
        Observation(
            "ERROR",
            "DeadlineExceeded",
            "DeadlineExceeded: the pod ran past its deadline. "
            'NonZeroExit: container "main" exited with code 143 (Error). BackoffLimitExceeded: limit',
            143,
        ),
    ),
    (
        "a pod failure policy on the exit code: NonZeroExit",
        job(
            cond(
                "Failed", reason="PodFailurePolicy", message="Container main for pod t-1-aaaaa failed with exit code 42"
            )
        ),
        [pod(phase="Failed", state=terminated(42, "Error"))],
        True,
        Observation(
            "ERROR",
            "NonZeroExit",
            'NonZeroExit: container "main" exited with code 42 (Error). '
            "PodFailurePolicy: Container main for pod t-1-aaaaa failed with exit code 42",
            42,
        ),
    ),
    (
        "no pod left to tell: the Job condition's reason",
        job(cond("Failed", reason="BackoffLimitExceeded", message="limit")),
        [],
        True,
        Observation("ERROR", "BackoffLimitExceeded", "BackoffLimitExceeded: limit", None),
    ),
    (
        "a deadline after the container exited 0 is the deadline",
        job(cond("Failed", reason="DeadlineExceeded", message="deadline")),
        [pod(phase="Succeeded", state=terminated(0, "Completed"))],
        True,
        Observation("ERROR", "DeadlineExceeded", "DeadlineExceeded: deadline", 0),
    ),
    (
        "a False condition is not terminal",
        job(cond("Failed", "False"), cond("Complete", "False")),
        [pod(state=RUNNING)],
        True,
        Observation("RUNNING"),
    ),
    (
        "an Unknown condition is not terminal",
        job(cond("Complete", "Unknown")),
        [pod(state=RUNNING)],
        True,
        Observation("RUNNING"),
    ),
    (
        "the newest live pod decides (a replacement after eviction)",
        job(),
        [
            pod("t-1-aaaaa", phase="Failed", reason="Evicted", created="2026-01-01T00:00:00Z"),
            pod("t-1-bbbbb", phase="Pending", state=waiting("ContainerCreating"), created="2026-01-01T00:01:00Z"),
        ],
        True,
        Observation("SCHEDULING", "ContainerCreating", None),
    ),
]


@pytest.mark.parametrize("what,job_obj,pods,staged,want", CASES, ids=[c[0] for c in CASES])
def test_observe(
    what: str, job_obj: dict[str, Any], pods: list[dict[str, Any]], staged: bool, want: Observation
) -> None:
    assert observe(job_obj, pods, C, staged=staged) == want


def test_job_outcome_is_none_while_running() -> None:
    assert job_outcome(job(), [pod(state=RUNNING)], C) is None
    assert pod_progress([], C, staged=True).phase == "SCHEDULING"


@pytest.mark.parametrize(
    "pods,leader",
    [
        ([], None),
        ([pod("b"), pod("a")], "a"),
        (
            [
                pod("a", annotations={"batch.kubernetes.io/job-completion-index": "1"}),
                pod("b", annotations={"batch.kubernetes.io/job-completion-index": "0"}),
            ],
            "b",
        ),
        ([pod("a", phase="Failed", reason="Evicted"), pod("b", phase="Pending")], "b"),
        ([pod("a", deleting=True), pod("b")], "b"),
        ([pod("a", phase="Succeeded"), pod("b", phase="Failed")], "a"),
    ],
)
def test_leader_pod(pods: list[dict[str, Any]], leader: str | None) -> None:
    found = leader_pod(pods)
    assert (found["metadata"]["name"] if found else None) == leader


def test_describe_pod_names_reason_and_message() -> None:
    assert describe_pod(None, C) == "no pod of the Job was created"
    text = describe_pod(pod(phase="Pending", state=waiting("ImagePullBackOff", 'Back-off pulling image "x"')), C)
    assert text == 'pod t-1-aaaaa is Pending; container "main" waiting: ImagePullBackOff: Back-off pulling image "x"'
    text = describe_pod(
        pod(phase="Pending", conditions=[cond("PodScheduled", "False", "Unschedulable", "0/1 nodes")]), C
    )
    assert text == "pod t-1-aaaaa is Pending; Unschedulable: 0/1 nodes"
