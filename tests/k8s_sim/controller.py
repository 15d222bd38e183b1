"""The controllers of the simulated control plane: the Job controller, the
TTL-after-finished controller and the garbage collector.

Job controller behaviour follows pkg/controller/job (Kubernetes 1.31+):

- one pod per needed completion (NonIndexed; parallelism and completions are
  honoured), named ``<job>-<5 chars>``, with labels ``job-name``,
  ``controller-uid``, ``batch.kubernetes.io/job-name``,
  ``batch.kubernetes.io/controller-uid``, a controller ownerReference and the
  ``batch.kubernetes.io/job-tracking`` finalizer (removed once the pod is
  counted);
- status: startTime, active, ready, terminating, succeeded, failed,
  completionTime, uncountedTerminatedPods;
- terminal conditions are delayed until the pods have terminated: first
  ``FailureTarget`` (reasons BackoffLimitExceeded, DeadlineExceeded,
  PodFailurePolicy) or ``SuccessCriteriaMet`` (CompletionsReached), and
  ``Failed`` / ``Complete`` once no pod is still running;
- backoffLimit: a failed pod is replaced after an exponential back-off while
  ``failed <= backoffLimit`` (restartPolicy OnFailure counts container
  restarts too); activeDeadlineSeconds is measured from startTime;
  podFailurePolicy rules (FailJob, Ignore, Count; onExitCodes,
  onPodConditions) are applied to failed pods;
- a pod that disappears or is deleted before finishing counts as failed.

The TTL controller deletes a finished Job ``ttlSecondsAfterFinished`` after its
terminal condition (foreground propagation, like
pkg/controller/ttlafterfinished). The garbage collector handles the
``orphan`` and ``foregroundDeletion`` finalizers and deletes the dependents of
objects removed with Background propagation, for owners and dependents of
every kind (a Job's pods, and a Secret, ConfigMap or Service whose
ownerReference names the Job), as kube-controller-manager's garbage
collector does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from .kubelet import record_event
from .store import JOBS, PODS, ObjectStore, ResourceType, WatchEvent
from .util import JSON, ApiError, clone, parse_rfc3339_ns, rfc3339

log = structlog.get_logger("tests.k8s_sim.controller")

TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
MAX_BACKOFF_S = 360.0


def _condition(type_: str, reason: str, message: str) -> JSON:
    now = rfc3339()
    return {
        "type": type_,
        "status": "True",
        "lastProbeTime": now,
        "lastTransitionTime": now,
        "reason": reason,
        "message": message,
    }


def _has(status: JSON, type_: str) -> JSON | None:
    for c in status.get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return dict(c)
    return None


def _controller_uid(pod: JSON) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Job":
            return str(ref.get("uid"))
    return None


def _is_terminal(pod: JSON) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class JobController:
    """Reconciles Jobs and their pods; also runs the TTL controller and the
    garbage collector. Work is event-driven: store events enqueue keys, timers
    (backoff, deadline, TTL) enqueue them again."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.backoff_base_s = 1.0
        """First delay before replacing a failed pod (the Job controller uses
        10 s doubling to 6 min; shortened here, doubling likewise)."""
        self._queue: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
        self._pending: set[tuple[str, str, str]] = set()
        self._counted: dict[str, set[str]] = {}
        self._last_failure: dict[str, float] = {}
        self._timers: dict[tuple[str, str, str, str], asyncio.TimerHandle] = {}
        self._task: asyncio.Task[None] | None = None
        self._active_seen: dict[str, set[str]] = {}
        self._job_keys: dict[str, tuple[str, str]] = {}
        self._pods_by_owner: dict[str, set[tuple[str, str]]] = {}
        store.listeners.append(self._on_event)

    def start(self) -> None:
        """Start the worker task on the running loop; enqueue every Job."""
        self._task = asyncio.get_running_loop().create_task(self._worker(), name="job controller")
        for job in self.store.items(JOBS):
            self._enqueue(("job", job["metadata"]["namespace"], job["metadata"]["name"]))

    async def close(self) -> None:
        """Stop the worker and every timer."""
        for h in self._timers.values():
            h.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -------------------------------------------------------------- queueing

    def _enqueue(self, key: tuple[str, str, str]) -> None:
        if key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait(key)

    def _later(self, key: tuple[str, str, str], tag: str, delay: float) -> None:
        tkey = (*key, tag)
        old = self._timers.pop(tkey, None)
        if old is not None:
            old.cancel()

        def fire() -> None:
            self._timers.pop(tkey, None)
            self._enqueue(key)

        self._timers[tkey] = asyncio.get_running_loop().call_later(max(delay, 0.0), fire)

    def _on_event(self, ev: WatchEvent) -> None:
        md = ev.obj["metadata"]
        if ev.resource is JOBS:
            if ev.type == "DELETED":
                self._job_keys.pop(md["uid"], None)
                self._counted.pop(md["uid"], None)
                self._active_seen.pop(md["uid"], None)
                self._last_failure.pop(md["uid"], None)
            else:
                self._job_keys[md["uid"]] = (md["namespace"], md["name"])
                self._enqueue(("job", md["namespace"], md["name"]))
        if md.get("deletionTimestamp") or ev.type == "DELETED":
            # Any kind can own objects (a Job its pods, but also a Secret or
            # ConfigMap it owns): the garbage collector follows every kind.
            self._enqueue(("gc", ev.resource.plural, md["uid"]))
        if ev.type == "DELETED" and ev.resource is not PODS:
            for ref in md.get("ownerReferences") or []:
                self._enqueue(("gc-dependent", md.get("namespace", ""), str(ref.get("uid"))))
        if ev.resource is PODS:
            key = (md["namespace"], md["name"])
            owner = _controller_uid(ev.obj)
            prev_owner = _controller_uid(ev.prev) if ev.prev is not None else None
            if prev_owner is not None and (prev_owner != owner or ev.type == "DELETED"):
                self._pods_by_owner.get(prev_owner, set()).discard(key)
            if owner is not None:
                if ev.type == "DELETED":
                    self._pods_by_owner.get(owner, set()).discard(key)
                else:
                    self._pods_by_owner.setdefault(owner, set()).add(key)
                self._enqueue(("pod-owner", md["namespace"], owner))
            if prev_owner is not None and prev_owner != owner:
                self._enqueue(("pod-owner", md["namespace"], prev_owner))
            if TRACKING_FINALIZER in (md.get("finalizers") or []):
                self._enqueue(("pod", md["namespace"], md["name"]))
            if ev.type == "DELETED":
                for ref in md.get("ownerReferences") or []:
                    self._enqueue(("gc-dependent", md["namespace"], str(ref.get("uid"))))

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._pending.discard(key)
            try:
                kind, a, b = key
                if kind == "job":
                    self._sync_job(a, b)
                elif kind == "pod-owner":
                    job = self._job_by_uid(a, b)
                    if job is not None:
                        self._sync_job(a, job["metadata"]["name"])
                elif kind == "pod":
                    self._sync_orphan_pod(a, b)
                elif kind in ("gc", "gc-dependent"):
                    self._gc(b)
            except ApiError as exc:
                log.debug("controller write refused; retrying", key=key, error=str(exc))
                self._later(key, "retry", 0.2)
            except Exception:
                log.exception("controller sync failed", key=key)

    def _job_by_uid(self, namespace: str, uid: str) -> JSON | None:
        key = self._job_keys.get(uid)
        if key is None or key[0] != namespace:
            return None
        job = self.store.find(JOBS, *key)
        return job if job is not None and job["metadata"]["uid"] == uid else None

    # ------------------------------------------------------------------ Job

    def _pods_of(self, job: JSON) -> list[JSON]:
        uid = job["metadata"]["uid"]
        out: list[JSON] = []
        for ns, name in sorted(self._pods_by_owner.get(uid, set())):
            pod = self.store.find(PODS, ns, name)
            if pod is not None and _controller_uid(pod) == uid:
                out.append(pod)
        return out

    def _sync_orphan_pod(self, namespace: str, name: str) -> None:
        """Remove the tracking finalizer from a pod whose Job is gone (or that
        no longer has a controller), once it is terminal or being deleted."""
        pod = self.store.find(PODS, namespace, name)
        if pod is None or TRACKING_FINALIZER not in (pod["metadata"].get("finalizers") or []):
            return
        owner = _controller_uid(pod)
        job = self._job_by_uid(namespace, owner) if owner else None
        if job is not None and not job["metadata"].get("deletionTimestamp"):
            return
        if owner is None or job is None or _is_terminal(pod) or pod["metadata"].get("deletionTimestamp"):
            self._drop_finalizer(pod)

    def _drop_finalizer(self, pod: JSON) -> None:
        def apply(p: JSON) -> None:
            fins = [f for f in p["metadata"].get("finalizers") or [] if f != TRACKING_FINALIZER]
            if fins:
                p["metadata"]["finalizers"] = fins
            else:
                p["metadata"].pop("finalizers", None)

        self.store.mutate(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], apply)

    def _event(self, job: JSON, type_: str, reason: str, message: str) -> None:
        md = job["metadata"]
        record_event(
            self.store,
            {
                "kind": "Job",
                "namespace": md["namespace"],
                "name": md["name"],
                "uid": md["uid"],
                "apiVersion": "batch/v1",
            },
            type_,
            reason,
            message,
            "job-controller",
        )

    def _sync_job(self, namespace: str, name: str) -> None:
        job = self.store.find(JOBS, namespace, name)
        if job is None:
            return
        md, spec = job["metadata"], job.get("spec") or {}
        uid = md["uid"]
        status: JSON = clone(job.get("status") or {})
        pods = self._pods_of(job)
        counted = self._counted.setdefault(uid, set())
        finished = _has(status, "Complete") or _has(status, "Failed")
        if md.get("deletionTimestamp"):
            for p in pods:
                if _is_terminal(p) or p["metadata"].get("deletionTimestamp"):
                    self._drop_finalizer(p)
            return
        if finished:
            for p in pods:
                if TRACKING_FINALIZER in (p["metadata"].get("finalizers") or []) and (
                    _is_terminal(p) or p["metadata"].get("deletionTimestamp")
                ):
                    self._drop_finalizer(p)
            self._schedule_ttl(job, status)
            return
        now = time.time()
        suspended = bool(spec.get("suspend"))
        if suspended:
            # Suspending deletes the active pods, clears startTime and sets
            # Suspended=True (reason JobSuspended); resuming flips it to False.
            for p in pods:
                if not _is_terminal(p) and not p["metadata"].get("deletionTimestamp"):
                    # Pods removed by suspension are not failures.
                    counted.add(p["metadata"]["uid"])
                    self._delete_pod(job, p)
            if not _has(status, "Suspended"):
                status["conditions"] = [c for c in status.get("conditions") or [] if c.get("type") != "Suspended"]
                status["conditions"].append(_condition("Suspended", "JobSuspended", "Job suspended"))
                self._event(job, "Normal", "Suspended", "Job suspended")
            status.pop("startTime", None)
        elif _has(status, "Suspended"):
            for c in status["conditions"]:
                if c.get("type") == "Suspended":
                    c.update(
                        status="False",
                        reason="JobResumed",
                        message="Job resumed",
                        lastTransitionTime=rfc3339(now),
                        lastProbeTime=rfc3339(now),
                    )
            self._event(job, "Normal", "Resumed", "Job resumed")
        if not status.get("startTime") and not suspended:
            status["startTime"] = rfc3339(now)
        succeeded = int(status.get("succeeded", 0))
        failed = int(status.get("failed", 0))
        fail_job: tuple[str, str] | None = None
        # Count terminal pods once; a pod that is gone or being deleted before
        # finishing counts as failed (it is terminal by the time the kubelet is done).
        # job_controller.go isPodFailed: unless only failed pods are replaced
        # (podReplacementPolicy Failed, or a podFailurePolicy), a pod being
        # deleted counts as failed at once.
        only_failed = spec.get("podReplacementPolicy") == "Failed" or spec.get("podFailurePolicy") is not None
        for p in pods:
            puid = p["metadata"]["uid"]
            phase = (p.get("status") or {}).get("phase")
            deleting = bool(p["metadata"].get("deletionTimestamp"))
            if puid in counted or not (phase in ("Succeeded", "Failed") or (deleting and not only_failed)):
                continue
            counted.add(puid)
            if phase == "Succeeded":
                succeeded += 1
            else:
                action = self._pod_failure_action(spec, p)
                if action == "FailJob":
                    failed += 1
                    fail_job = (
                        "PodFailurePolicy",
                        f"Pod {namespace}/{p['metadata']['name']} has condition or exit code matching FailJob rule",
                    )
                elif action != "Ignore":
                    failed += 1
                    self._last_failure[uid] = now
        # Pods removed from the store without a terminal phase (force delete).
        live_uids = {p["metadata"]["uid"] for p in pods}
        for puid in list(self._seen_active(uid)):
            if puid not in live_uids and puid not in counted:
                counted.add(puid)
                failed += 1
                self._last_failure[uid] = now
        for p in pods:
            if (
                p["metadata"]["uid"] in counted
                and (_is_terminal(p) or p["metadata"].get("deletionTimestamp"))
                and TRACKING_FINALIZER in (p["metadata"].get("finalizers") or [])
            ):
                self._drop_finalizer(p)
        active_pods = [p for p in pods if not _is_terminal(p) and not p["metadata"].get("deletionTimestamp")]
        terminating = [p for p in pods if not _is_terminal(p) and p["metadata"].get("deletionTimestamp")]
        self._remember_active(uid, [p["metadata"]["uid"] for p in active_pods + terminating])
        restarts = 0
        if (spec.get("template") or {}).get("spec", {}).get("restartPolicy") == "OnFailure":
            for p in active_pods:
                for cs in (p.get("status") or {}).get("containerStatuses") or []:
                    restarts += int(cs.get("restartCount", 0))
        completions = spec.get("completions", 1)
        parallelism = spec.get("parallelism", 1)
        backoff_limit = int(spec.get("backoffLimit", 6))
        status["succeeded"] = succeeded
        status["failed"] = failed
        target_fail = _has(status, "FailureTarget")
        target_ok = _has(status, "SuccessCriteriaMet")
        if not target_fail and not target_ok:
            deadline = spec.get("activeDeadlineSeconds")
            started_ns = parse_rfc3339_ns(status["startTime"]) if status.get("startTime") else None
            if fail_job is not None:
                target_fail = _condition("FailureTarget", *fail_job)
            elif failed + restarts > backoff_limit:
                target_fail = _condition(
                    "FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                )
            elif (
                deadline is not None
                and started_ns is not None
                and not suspended
                and now >= started_ns / 1e9 + float(deadline)
            ):
                target_fail = _condition(
                    "FailureTarget", "DeadlineExceeded", "Job was active longer than specified deadline"
                )
            elif completions is not None and succeeded >= int(completions):
                target_ok = _condition(
                    "SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"
                )
            if target_fail is not None:
                status.setdefault("conditions", []).append(target_fail)
                self._event(job, "Warning", target_fail["reason"], target_fail["message"])
            elif target_ok is not None:
                status.setdefault("conditions", []).append(target_ok)
            elif deadline is not None and started_ns is not None and not suspended:
                self._later(("job", namespace, name), "deadline", started_ns / 1e9 + float(deadline) - now + 0.01)
        if target_fail or target_ok:
            for p in active_pods:
                self._delete_pod(job, p)
                terminating.append(p)
            active_pods = []
            if not terminating:
                if target_fail:
                    status["conditions"].append(_condition("Failed", target_fail["reason"], target_fail["message"]))
                else:
                    status["conditions"].append(
                        _condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods")
                    )
                    status["completionTime"] = rfc3339()
                    self._event(job, "Normal", "Completed", "Job completed")
        elif not suspended:
            want = parallelism if completions is None else min(parallelism, int(completions) - succeeded)
            missing = want - len(active_pods) - (len(terminating) if only_failed else 0)
            if missing > 0:
                last = self._last_failure.get(uid)
                delay = 0.0
                if failed > 0 and last is not None:
                    delay = min(self.backoff_base_s * (2 ** (failed - 1)), MAX_BACKOFF_S) - (now - last)
                if delay > 0:
                    self._later(("job", namespace, name), "backoff", delay)
                else:
                    for _ in range(missing):
                        active_pods.append(self._create_pod(job))
        status["active"] = len(active_pods)
        status["ready"] = sum(1 for p in active_pods if _pod_ready(p))
        status["terminating"] = len(terminating)
        status["uncountedTerminatedPods"] = {}
        for k in ("active", "succeeded", "failed", "terminating"):
            if not status[k]:
                status.pop(k)
        if status != (job.get("status") or {}):
            self.store.mutate(JOBS, namespace, name, lambda j: j.__setitem__("status", status))
            if _has(status, "Complete") or _has(status, "Failed"):
                self._schedule_ttl(job, status)

    def _seen_active(self, job_uid: str) -> set[str]:
        return set(self._active_seen.get(job_uid, set()))

    def _remember_active(self, job_uid: str, uids: list[str]) -> None:
        self._active_seen[job_uid] = set(uids)

    def _pod_failure_action(self, spec: JSON, pod: JSON) -> str:
        """The podFailurePolicy action for a failed pod: FailJob, Ignore, Count
        (the default when no rule matches)."""
        policy = spec.get("podFailurePolicy") or {}
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        conditions = (pod.get("status") or {}).get("conditions") or []
        for rule in policy.get("rules") or []:
            on_codes = rule.get("onExitCodes")
            if on_codes is not None:
                values = set(on_codes.get("values") or [])
                cname = on_codes.get("containerName")
                for cs in statuses:
                    if cname and cs.get("name") != cname:
                        continue
                    term = (cs.get("state") or {}).get("terminated")
                    if term is None or term.get("exitCode") == 0:
                        continue
                    hit = term.get("exitCode") in values
                    if on_codes.get("operator") == "NotIn":
                        hit = not hit
                    if hit:
                        return str(rule["action"])
            for pat in rule.get("onPodConditions") or []:
                for c in conditions:
                    if c.get("type") == pat.get("type") and c.get("status") == pat.get("status", "True"):
                        return str(rule["action"])
        return "Count"

    def _create_pod(self, job: JSON) -> JSON:
        md, spec = job["metadata"], job.get("spec") or {}
        template = clone(spec.get("template") or {})
        tmd = template.get("metadata") or {}
        labels = dict(tmd.get("labels") or {})
        labels.update(
            {
                "batch.kubernetes.io/controller-uid": md["uid"],
                "batch.kubernetes.io/job-name": md["name"],
                "controller-uid": md["uid"],
                "job-name": md["name"],
            }
        )
        pod: JSON = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": md["name"] + "-",
                "namespace": md["namespace"],
                "labels": labels,
                "annotations": dict(tmd.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": md["name"],
                        "uid": md["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
                "finalizers": [TRACKING_FINALIZER],
            },
            "spec": template.get("spec") or {},
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        from .server import default_pod_spec

        default_pod_spec(pod["spec"])
        created = self.store.create(PODS, md["namespace"], self.store.prepare_new(PODS, md["namespace"], pod))
        self._event(job, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")
        return created

    def _delete_pod(self, job: JSON, pod: JSON) -> None:
        try:
            self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], propagation="Background")
        except ApiError:
            return
        self._event(job, "Normal", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}")

    def _schedule_ttl(self, job: JSON, status: JSON) -> None:
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        cond = _has(status, "Complete") or _has(status, "Failed")
        if cond is None:
            return
        finished = parse_rfc3339_ns(cond["lastTransitionTime"]) / 1e9
        md = job["metadata"]
        due = finished + float(ttl) - time.time()
        if due > 0:
            self._later(("job", md["namespace"], md["name"]), "ttl", due + 0.01)
            return
        with contextlib.suppress(ApiError):
            self.store.delete(JOBS, md["namespace"], md["name"], propagation="Foreground")

    # -------------------------------------------------------------------- GC

    def _gc(self, owner_uid: str) -> None:
        """Finish orphan / foreground deletions of ``owner_uid`` and delete the
        dependents of an owner that is gone (Background)."""
        found = self.store.find_by_uid(owner_uid)
        owner_res, owner = found if found is not None else (JOBS, None)
        dependents = self.store.dependents(owner_uid)
        if owner is None:
            for res, dep in dependents:
                if not dep["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(ApiError):
                        self.store.delete(
                            res, dep["metadata"].get("namespace", ""), dep["metadata"]["name"], propagation="Background"
                        )
            return
        md = owner["metadata"]
        if not md.get("deletionTimestamp"):
            return
        fins = list(md.get("finalizers") or [])
        if "orphan" in fins:
            for res, dep in dependents:

                def unown(o: JSON) -> None:
                    refs = [r for r in o["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
                    if refs:
                        o["metadata"]["ownerReferences"] = refs
                    else:
                        o["metadata"].pop("ownerReferences", None)

                self.store.mutate(res, dep["metadata"].get("namespace", ""), dep["metadata"]["name"], unown)
            self._remove_finalizer(owner_res, owner, "orphan")
        elif "foregroundDeletion" in fins:
            blocking = [
                d
                for _r, d in dependents
                if any(
                    r.get("uid") == owner_uid and r.get("blockOwnerDeletion")
                    for r in d["metadata"].get("ownerReferences") or []
                )
            ]
            for res, dep in dependents:
                if not dep["metadata"].get("deletionTimestamp"):
                    with contextlib.suppress(ApiError):
                        self.store.delete(
                            res, dep["metadata"].get("namespace", ""), dep["metadata"]["name"], propagation="Background"
                        )
            if not blocking:
                self._remove_finalizer(owner_res, owner, "foregroundDeletion")

    def _remove_finalizer(self, res: ResourceType, obj: JSON, name: str) -> None:
        def apply(o: JSON) -> None:
            fins = [f for f in o["metadata"].get("finalizers") or [] if f != name]
            if fins:
                o["metadata"]["finalizers"] = fins
            else:
                o["metadata"].pop("finalizers", None)

        self.store.mutate(res, obj["metadata"].get("namespace", ""), obj["metadata"]["name"], apply)


def _pod_ready(pod: JSON) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False
