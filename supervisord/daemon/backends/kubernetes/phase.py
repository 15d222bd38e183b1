"""From a Job and its pods to the run's phase: pure functions, no I/O.

Rules (docs/kubernetes.md, "While it runs"), with the Kubernetes fields they read
(batch/v1 JobStatus and core/v1 PodStatus; conditions per
https://kubernetes.io/docs/concepts/workloads/controllers/job/#termination-of-job-pods):

- a Job condition ``Complete`` or ``SuccessCriteriaMet`` with status
  ``"True"`` -> COMPLETED (the exit code of the script container, if it
  terminated);
- ``Failed`` or ``FailureTarget`` with status ``"True"`` -> ERROR with the
  most specific cause a script can act on (README.md, "Phases and
  reasons"): the script container's terminated reason (``OOMKilled``;
  ``Error`` or any other non-zero exit -> ``NonZeroExit``; a start failure
  such as ``StartError``/``ContainerCannotRun`` -> ``StartFailed``), else
  the pod's (``Evicted``, ``DeadlineExceeded`` from the pod's
  activeDeadlineSeconds), else the Job condition's (``DeadlineExceeded``,
  ``BackoffLimitExceeded``, ``PodFailurePolicy``...). A container killed
  *because* the pod was evicted or ran past a deadline (the pod's reason
  is Evicted/DeadlineExceeded, or the Job's condition is DeadlineExceeded)
  exits non-zero as a consequence, so there the deadline or eviction is the
  cause and the exit is detail. The message keeps the detail first and the
  Job condition's ``reason: message`` after it (``NonZeroExit: container
  "main" exited with code 3 (Error). BackoffLimitExceeded: Job has reached
  the specified backoff limit``); the script container's exit code is
  recorded whenever it terminated;
- a condition with status ``"False"`` or ``"Unknown"`` is never terminal;
- otherwise the current pod decides: its script container running ->
  RUNNING (STAGING until jobsup staged the source), else SCHEDULING with the
  scheduler's ``Unschedulable`` message or the container's waiting reason
  and message (ImagePullBackOff, CreateContainerConfigError, ...) kept.

A terminated container reason such as OOMKilled on a Job that completed
does not make the run an ERROR (it is mentioned in the message).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "COMPLETION_INDEX",
    "PERMANENT_WAITING_REASONS",
    "POD_KILL_REASONS",
    "START_FAILURES",
    "Observation",
    "condition",
    "container_cause",
    "container_status",
    "current_pod",
    "describe_pod",
    "failure_cause",
    "job_outcome",
    "leader_pod",
    "observe",
    "pod_cause",
    "pod_is_terminal",
    "pod_progress",
    "terminated_state",
    "waiting_failure_reason",
]

#: The annotation (and label) Indexed Jobs put on each pod (batch/v1).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

_SUCCESS = ("Complete", "SuccessCriteriaMet")
_FAILURE = ("Failed", "FailureTarget")


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a Job and its pods say about the run: ``phase`` (a jobsup phase),
    ``reason`` (one CamelCase word or None), ``message`` (human text or
    None), ``exit_code`` (of the script container, when it terminated)."""

    phase: str
    reason: str | None = None
    message: str | None = None
    exit_code: int | None = None

    @property
    def terminal(self) -> bool:
        """True for COMPLETED and ERROR (the phases a Job itself can reach)."""
        return self.phase in ("COMPLETED", "ERROR")


def condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    """The Job's condition of ``type_`` when its status is ``"True"``, else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def pod_is_terminal(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's phase is Succeeded or Failed."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def _index(pod: Mapping[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(COMPLETION_INDEX) or (meta.get("labels") or {}).get(COMPLETION_INDEX)
    return None if value is None else str(value)


def leader_pod(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod whose logs are the run's: among the pods not yet terminal and
    not being deleted (else among all), the one with completion index "0",
    else the first by name. None without pods."""
    live = [p for p in pods if not pod_is_terminal(p) and not (p.get("metadata") or {}).get("deletionTimestamp")]
    candidates = live or list(pods)
    if not candidates:
        return None
    indexed = [p for p in candidates if _index(p) == "0"]
    if indexed:
        return min(indexed, key=_name)
    return min(candidates, key=_name)


def current_pod(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod that says where the run is now: the newest pod not yet
    terminal, else the newest pod. None without pods."""
    if not pods:
        return None
    ordered = sorted(pods, key=lambda p: (_created(p), _name(p)))
    live = [p for p in ordered if not pod_is_terminal(p)]
    return (live or ordered)[-1]


def container_status(pod: Mapping[str, Any], container: str) -> Mapping[str, Any] | None:
    """The containerStatuses (or initContainerStatuses) entry named ``container``."""
    status = pod.get("status") or {}
    for field in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(field) or []:
            if isinstance(cs, Mapping) and cs.get("name") == container:
                return cs
    return None


def container_times(pod: Mapping[str, Any], container: str) -> tuple[str | None, str | None]:
    """``(startedAt, finishedAt)`` of the container (RFC 3339 text, None
    while unknown): from ``state.running`` or ``state.terminated``."""
    cs = container_status(pod, container)
    state = (cs or {}).get("state") or {}
    running, term = state.get("running"), state.get("terminated")
    started = finished = None
    if isinstance(term, Mapping):
        started, finished = term.get("startedAt"), term.get("finishedAt")
    elif isinstance(running, Mapping):
        started = running.get("startedAt")
    return (
        started if isinstance(started, str) and started else None,
        finished if isinstance(finished, str) and finished else None,
    )


def terminated_state(pod: Mapping[str, Any], container: str) -> Mapping[str, Any] | None:
    """``state.terminated`` of the container, or None while it has not terminated."""
    cs = container_status(pod, container)
    if cs is None:
        return None
    term = (cs.get("state") or {}).get("terminated")
    return term if isinstance(term, Mapping) else None


def _exit_code(term: Mapping[str, Any] | None) -> int | None:
    if term is None:
        return None
    code = term.get("exitCode")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


#: Terminated reasons of a container that never started its command: the
#: kubelet's (containerd/CRI-O ``StartError``, dockershim ``ContainerCannotRun``)
#: and the runtime errors reported on the way (``CreateContainerError``,
#: ``RunContainerError``).
START_FAILURES = frozenset({"StartError", "ContainerCannotRun", "CreateContainerError", "RunContainerError"})
#: Pod status reasons (core/v1 PodStatus.reason) that end a pod from outside
#: its containers: node-pressure eviction and the pod's activeDeadlineSeconds.
POD_KILL_REASONS = frozenset({"Evicted", "DeadlineExceeded"})


#: Waiting reasons the kubelet never gets out of by retrying: an image
#: reference that does not parse, and a missing image with imagePullPolicy
#: Never. A run waiting on one of these fails at once instead of waiting out
#: kubernetes.pod_ready_timeout_s.
PERMANENT_WAITING_REASONS = frozenset({"InvalidImageName", "ErrImageNeverPull"})


def waiting_failure_reason(reason: str | None) -> str | None:
    """The run's reason when it fails while its pod waits with ``reason``:
    the kubelet alternates ``ErrImagePull`` (an attempt failed) and
    ``ImagePullBackOff`` (waiting for the next attempt), so both are
    ``ImagePullBackOff`` and the outcome does not depend on which half of
    the cycle the deadline fell in; any other reason is kept."""
    return "ImagePullBackOff" if reason == "ErrImagePull" else reason


def container_cause(term: Mapping[str, Any] | None, container: str) -> tuple[str, str] | None:
    """(reason, detail) of a terminated container that failed, or None when
    it did not terminate or exited 0: ``OOMKilled``, ``StartFailed`` (a
    :data:`START_FAILURES` reason), ``NonZeroExit`` (``Error`` or any other
    non-zero exit code). ``detail`` is one human sentence starting with the
    reason, e.g. ``NonZeroExit: container "main" exited with code 3 (Error)``."""
    if term is None:
        return None
    code = _exit_code(term)
    why = str(term.get("reason") or "")
    if why == "OOMKilled":
        return (
            "OOMKilled",
            f'OOMKilled: container "{container}" was killed for using too much memory (exit code {code})',
        )
    if why in START_FAILURES:
        said = str(term.get("message") or "").strip()
        return "StartFailed", f'StartFailed: container "{container}" could not start ({why}' + (
            f": {said})" if said else ")"
        )
    if code or why == "Error":
        return "NonZeroExit", f'NonZeroExit: container "{container}" exited with code {code}' + (
            f" ({why})" if why else ""
        )
    return None


def pod_cause(pod: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(reason, detail) when the pod itself was ended from outside its
    containers (:data:`POD_KILL_REASONS`), else None."""
    if pod is None:
        return None
    status = pod.get("status") or {}
    reason = status.get("reason")
    if reason not in POD_KILL_REASONS:
        return None
    said = str(status.get("message") or "").strip() or (
        "the pod was evicted" if reason == "Evicted" else "the pod ran past its deadline"
    )
    return str(reason), f"{reason}: {said}"


def failure_cause(
    job_reason: str, pod: Mapping[str, Any] | None, term: Mapping[str, Any] | None, container: str
) -> tuple[str, list[str]]:
    """The run's reason for a failed Job and the details that go before the
    Job condition in the message (most specific first); see the module
    docstring for the order."""
    by_container = container_cause(term, container)
    by_pod = pod_cause(pod)
    consequence = (
        by_container is not None
        and by_container[0] == "NonZeroExit"
        and (by_pod is not None or job_reason == "DeadlineExceeded")
    )
    if by_container is not None and not consequence:
        return by_container[0], [by_container[1]]
    if by_pod is not None:
        return by_pod[0], [by_pod[1]] + ([by_container[1]] if by_container else [])
    return job_reason, [by_container[1]] if by_container else []


def job_outcome(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], script_container: str) -> Observation | None:
    """The terminal :class:`Observation` when the Job has finished (a
    success or failure condition with status "True"), else None."""
    pod = current_pod(pods)
    term = terminated_state(pod, script_container) if pod is not None else None
    success = next((c for t in _SUCCESS if (c := condition(job, t)) is not None), None)
    if success is not None:
        code = _exit_code(term)
        message = None
        if term is not None and term.get("reason") == "OOMKilled":
            message = f'container "{script_container}" reported OOMKilled, but the Job completed'
        return Observation("COMPLETED", None, message, 0 if code is None else code)
    failure = next((c for t in _FAILURE if (c := condition(job, t)) is not None), None)
    if failure is None:
        return None
    job_reason = str(failure.get("reason") or "Failed")
    job_text = f"{job_reason}: {failure.get('message') or 'the Job failed'}"
    reason, details = failure_cause(job_reason, pod, term, script_container)
    # The Job's own cause (a deadline) leads; what it did to the container follows.
    text = f"{job_text} ({'; '.join(details)})" if reason == job_reason and details else ". ".join([*details, job_text])
    return Observation("ERROR", reason, text, _exit_code(term))


def _unschedulable(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (
            isinstance(cond, Mapping)
            and cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return cond
    return None


def _waiting(pod: Mapping[str, Any], script_container: str) -> tuple[str, str | None] | None:
    """The most telling waiting reason: an init container's, else the
    script container's, else any other container's."""
    status = pod.get("status") or {}
    ordered: list[Mapping[str, Any]] = []
    ordered += [cs for cs in status.get("initContainerStatuses") or [] if isinstance(cs, Mapping)]
    regular = [cs for cs in status.get("containerStatuses") or [] if isinstance(cs, Mapping)]
    ordered += [cs for cs in regular if cs.get("name") == script_container]
    ordered += [cs for cs in regular if cs.get("name") != script_container]
    fallback: tuple[str, str | None] | None = None
    for cs in ordered:
        waiting = (cs.get("state") or {}).get("waiting")
        if not isinstance(waiting, Mapping) or not waiting.get("reason"):
            continue
        found = (str(waiting["reason"]), str(waiting["message"]) if waiting.get("message") else None)
        # ContainerCreating/PodInitializing say little; keep looking for a problem.
        if found[0] not in ("ContainerCreating", "PodInitializing"):
            return found
        fallback = fallback or found
    return fallback


def pod_progress(pods: Sequence[Mapping[str, Any]], script_container: str, *, staged: bool) -> Observation:
    """The non-terminal phase the pods show: RUNNING once the script
    container runs (STAGING when the source is not staged yet; a container
    that already terminated counts as having run), else SCHEDULING with the
    reason and message that say why (Unschedulable, ImagePullBackOff...)."""
    pod = current_pod(pods)
    if pod is None:
        return Observation("SCHEDULING", None, "waiting for the Job's pod to be created")
    cs = container_status(pod, script_container)
    state = (cs or {}).get("state") or {}
    if "running" in state or "terminated" in state:
        return Observation("RUNNING" if staged else "STAGING")
    unschedulable = _unschedulable(pod)
    if unschedulable is not None:
        return Observation("SCHEDULING", "Unschedulable", str(unschedulable.get("message") or "") or None)
    waiting = _waiting(pod, script_container)
    if waiting is not None:
        return Observation("SCHEDULING", waiting[0], waiting[1])
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return Observation("SCHEDULING", None, f"pod {_name(pod)} is {phase}")


def observe(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], script_container: str, *, staged: bool
) -> Observation:
    """The run's phase from its primary Job and that Job's pods:
    :func:`job_outcome` when the Job finished, else :func:`pod_progress`."""
    return job_outcome(job, pods, script_container) or pod_progress(pods, script_container, staged=staged)


def describe_pod(pod: Mapping[str, Any] | None, script_container: str) -> str:
    """One line on where a pod is, for error messages: its phase and the
    scheduler's or the container's reason and message, e.g. ``pod train-x
    is Pending; container "main" waiting: ImagePullBackOff: Back-off pulling
    image "…"``."""
    if pod is None:
        return "no pod of the Job was created"
    status = pod.get("status") or {}
    text = f"pod {_name(pod)} is {status.get('phase') or 'Pending'}"
    unschedulable = _unschedulable(pod)
    if unschedulable is not None:
        return f"{text}; Unschedulable: {unschedulable.get('message') or 'no node fits'}"
    waiting = _waiting(pod, script_container)
    if waiting is not None:
        who = script_container
        for field in ("initContainerStatuses", "containerStatuses"):
            for cs in status.get(field) or []:
                if ((cs.get("state") or {}).get("waiting") or {}).get("reason") == waiting[0]:
                    who = str(cs.get("name"))
                    break
        return f'{text}; container "{who}" waiting: {waiting[0]}' + (f": {waiting[1]}" if waiting[1] else "")
    term = terminated_state(pod, script_container)
    if term is not None:
        return f'{text}; container "{script_container}" terminated with exit code {term.get("exitCode")} ({term.get("reason") or "no reason"})'
    if status.get("reason"):
        return f"{text}; {status.get('reason')}: {status.get('message') or ''}".rstrip(": ")
    return text
