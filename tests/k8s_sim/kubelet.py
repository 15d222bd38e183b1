"""The simulated node: runs each bound pod's containers as real local processes.

Copies the kubelet's observable behaviour:

- container environment: envFrom then env, ``$(VAR)`` expansion of env values,
  command and args (pkg/kubelet/kuberuntime makeEnvironmentVariables and
  expansion.Expand); a missing non-optional Secret/ConfigMap or key leaves the
  container waiting in CreateContainerConfigError and is retried;
- images under ``missing.invalid/`` fail to pull: ErrImagePull, then
  ImagePullBackOff (every other image "pulls" at once and is otherwise ignored:
  the host's binaries run);
- each container gets a private ``/tmp``: a per-container host directory bound
  onto ``/tmp`` in its own mount namespace (``unshare --mount``), so two pods
  never share ``/tmp/jobsup-source``; exec enters the same view;
- volumes (secret, configMap, persistentVolumeClaim, emptyDir) are host
  folders bind-mounted at each volumeMount's mountPath in the container's
  mount namespace, read-only when ``readOnly`` says so (pkg/volume: a missing
  non-optional Secret/ConfigMap or PVC keeps the container in
  ContainerCreating with a ``FailedMount`` event, retried); see
  :meth:`Kubelet.pvc_dir` for a claim's folder;
- logs are written in the CRI log format (``<RFC3339Nano> <stream> <P|F>
  <content>``), one file per container instance, so timestamps, sinceTime,
  tailLines, previous and rotation read real files;
- pod phase Pending -> Running -> Succeeded/Failed, containerStatuses with
  waiting/running/terminated (Completed, Error, OOMKilled), conditions
  PodReadyToStartContainers, Initialized, ContainersReady, Ready, PodScheduled,
  DisruptionTarget on eviction; graceful deletion: SIGTERM to the process
  group, SIGKILL after the grace period.

OOMKilled trigger (documented choice, no memory cgroups here): a container that
exits with code 137 (SIGKILL) that the kubelet did not send is reported as
OOMKilled; :meth:`Kubelet.oom_kill` sends such a SIGKILL.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import re
import shlex
import shutil
import signal
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from .faults import Faults
from .store import CONFIGMAPS, EVENTS, PODS, RESOURCES, SECRETS, ObjectStore, WatchEvent
from .util import JSON, ApiError, err_bad_request, err_not_found, expand, rfc3339, rfc3339_nano, rfc3339_nano_go

log = structlog.get_logger("tests.k8s_sim.kubelet")

MISSING_REGISTRY = "missing.invalid/"
"""Images whose name starts with this never pull (ErrImagePull/ImagePullBackOff)."""

NODE_NAME = "sim-node-1"
"""The one node of the simulated cluster."""

PARTIAL_LINE_BYTES = 16 * 1024
"""The CRI runtime splits longer lines into partial (``P``) records of this size
(containerd's default max_container_log_line_size)."""

_LAUNCH = (
    'mount --bind "$1" /tmp || { echo "k8s-sim: cannot make a private /tmp" >&2; exit 127; }; '
    'if [ -n "$3" ]; then mkdir -p "$2" 2>/dev/null; fi; '
    'cd "$2" || exit 127; shift 3; exec "$@"'
)
"""The in-namespace launcher: bind the container's /tmp, enter its working
directory, exec the command (argv: tmp dir, workdir, create-workdir flag, cmd...)."""


class ServerKilledError(Exception):
    """Raised inside a streaming response to abort its connection (the API
    server was killed, or a fault cuts the stream)."""


class VolumeMountError(Exception):
    """A volume cannot be set up yet (its Secret, ConfigMap or claim is
    missing); the container stays ContainerCreating and it is retried. The
    message is the kubelet's FailedMount text."""


class ContainerConfigError(Exception):
    """The container's env refers to a missing Secret/ConfigMap or key
    (kubelet's CreateContainerConfigError); the message is the kubelet's."""


@dataclass
class ContainerRuntime:
    """One container of a running pod and its current instance."""

    name: str
    spec: JSON
    init: bool
    host_tmp: Path
    log_dir: Path
    state: str = "waiting"
    waiting_reason: str = "ContainerCreating"
    waiting_message: str | None = None
    restart_count: int = 0
    instance: int = 0
    container_id: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    exit_code: int = 0
    term_reason: str = ""
    term_message: str | None = None
    last_state: JSON = field(default_factory=dict)
    ever_started: bool = False
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    workdir: str = "/tmp/workdir"
    create_workdir: bool = True
    proc: asyncio.subprocess.Process | None = None
    killed_by_kubelet: bool = False
    log_path: Path | None = None
    log_fh: Any = None
    exec_procs: set[asyncio.subprocess.Process] = field(default_factory=set)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)
    """(host folder, mountPath, read-only) per volumeMount."""
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def kill_execs(self) -> None:
        """Kill the exec sessions' processes: they die with the container."""
        for p in list(self.exec_procs):
            if p.returncode is None:
                _kill_container(p)
        self.exec_procs.clear()

    def changed_token(self) -> asyncio.Event:
        """An event set at the next log write or state change (broadcast)."""
        return self._changed

    def notify(self) -> None:
        """Wake everyone waiting on :meth:`changed_token`."""
        ev = self._changed
        self._changed = asyncio.Event()
        ev.set()

    def log_file(self, index: int) -> Path:
        """The log file of instance ``index`` (``<restart>.log``, like /var/log/pods)."""
        return self.log_dir / f"{index}.log"


@dataclass
class PodRuntime:
    """The kubelet's state for one pod."""

    uid: str
    namespace: str
    name: str
    pod_dir: Path
    containers: dict[str, ContainerRuntime]
    restart_policy: str
    start_time: float = 0.0
    phase: str = "Pending"
    initialized: bool = False
    scheduled: bool = False
    unschedulable_message: str | None = None
    stop_reason: str | None = None
    stop_grace: int = 30
    stop_message: str | None = None
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    cond_times: dict[str, tuple[str, str]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    done: bool = False

    def request_stop(self, reason: str, grace: int, message: str | None = None) -> None:
        """Ask the pod's task to kill its containers (deleted, evicted, deadline)."""
        if self.stop_reason is None or grace < self.stop_grace:
            if self.stop_reason is None:
                self.stop_reason = reason
                self.stop_message = message
            self.stop_grace = grace
        self.stop_event.set()


class Kubelet:
    """Runs pods bound to :data:`NODE_NAME` as local processes.

    ``root`` holds one directory per pod (private /tmp dirs and CRI log files).
    ``private_tmp`` False (no mount namespaces available) falls back to
    rewriting ``/tmp`` in command, args and env values to the container's
    directory and setting TMPDIR (see README).
    """

    def __init__(self, store: ObjectStore, faults: Faults, root: Path, *, private_tmp: bool) -> None:
        self.store = store
        self.faults = faults
        self.root = root
        self.private_tmp = private_tmp
        self.pods: dict[str, PodRuntime] = {}
        self.image_pull_backoff_s = 1.0
        """Seconds between ErrImagePull and ImagePullBackOff."""
        self.config_retry_s = 1.0
        """Seconds between retries of a CreateContainerConfigError container."""
        self.crash_backoff_s = 1.0
        """First CrashLoopBackOff delay for restartPolicy OnFailure (the kubelet
        uses 10 s, doubling up to 5 min; shortened here, doubling likewise)."""
        self.log_runtime = "containerd"
        """How container log records are stamped: ``"containerd"`` (each line
        stamped as it is split off, UTC, RFC3339Nano) or ``"cri-o"`` (CRI-O's
        log writer stamps every line of one read buffer with the same
        ``time.Now()``, in the node's local zone: ``log_utc_offset_s``)."""
        self.log_utc_offset_s = 0
        """The node's local UTC offset in seconds, for ``log_runtime="cri-o"``."""
        self._faults_changed = asyncio.Event()
        self._closing = False
        store.listeners.append(self._on_event)

    # ---------------------------------------------------------------- events

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.resource is not PODS or self._closing:
            return
        md = ev.obj["metadata"]
        uid = md["uid"]
        rt = self.pods.get(uid)
        if ev.type == "DELETED":
            if rt is not None:
                if rt.done:
                    self.forget(uid)
                else:
                    rt.request_stop("deleted", 0)
            return
        if rt is None:
            phase = (ev.obj.get("status") or {}).get("phase")
            if md.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
                return
            if ev.type != "ADDED":
                return
            self._start_pod(ev.obj)
            return
        if md.get("deletionTimestamp") and not rt.done:
            rt.request_stop("deleted", int(md.get("deletionGracePeriodSeconds", 30)))

    def faults_changed(self) -> None:
        """Wake pods waiting on a scheduling knob (called on the loop thread)."""
        ev = self._faults_changed
        self._faults_changed = asyncio.Event()
        ev.set()

    def _start_pod(self, pod: JSON) -> None:
        md = pod["metadata"]
        spec = pod.get("spec") or {}
        pod_dir = self.root / f"{md['namespace']}_{md['name']}_{md['uid']}"
        containers: dict[str, ContainerRuntime] = {}
        for init, key in ((True, "initContainers"), (False, "containers")):
            for c in spec.get(key) or []:
                containers[c["name"]] = ContainerRuntime(
                    name=c["name"],
                    spec=c,
                    init=init,
                    host_tmp=pod_dir / "containers" / c["name"] / "tmp",
                    log_dir=pod_dir / "logs" / c["name"],
                    waiting_reason="PodInitializing"
                    if (not init and spec.get("initContainers"))
                    else "ContainerCreating",
                )
        rt = PodRuntime(
            uid=md["uid"],
            namespace=md["namespace"],
            name=md["name"],
            pod_dir=pod_dir,
            containers=containers,
            restart_policy=spec.get("restartPolicy", "Always"),
        )
        self.pods[rt.uid] = rt
        rt.task = asyncio.get_running_loop().create_task(self._run_pod(rt), name=f"pod {rt.namespace}/{rt.name}")

    # ----------------------------------------------------------- pod status

    def _cond(
        self, rt: PodRuntime, type_: str, status: bool, reason: str | None = None, message: str | None = None
    ) -> JSON:
        s = "True" if status else "False"
        prev = rt.cond_times.get(type_)
        if prev is None or prev[0] != s:
            rt.cond_times[type_] = (s, rfc3339())
        out: JSON = {"type": type_, "status": s, "lastProbeTime": None, "lastTransitionTime": rt.cond_times[type_][1]}
        if reason:
            out["reason"] = reason
        if message:
            out["message"] = message
        return out

    def _container_status(self, c: ContainerRuntime) -> JSON:
        image = c.spec.get("image", "")
        out: JSON = {
            "name": c.name,
            "image": image,
            "imageID": ""
            if not c.ever_started
            else "sim.local/" + image.split("@")[0] + "@sha256:" + hashlib.sha256(image.encode()).hexdigest(),
            "started": c.state == "running",
            "ready": c.state == "running" and not c.init,
            "restartCount": c.restart_count,
            "lastState": c.last_state,
        }
        if c.container_id:
            out["containerID"] = c.container_id
        if c.state == "waiting":
            w: JSON = {"reason": c.waiting_reason}
            if c.waiting_message:
                w["message"] = c.waiting_message
            out["state"] = {"waiting": w}
        elif c.state == "running":
            out["state"] = {"running": {"startedAt": rfc3339(c.started_at)}}
        else:
            out["state"] = {"terminated": self._terminated(c)}
        return out

    def _terminated(self, c: ContainerRuntime) -> JSON:
        t: JSON = {
            "exitCode": c.exit_code,
            "reason": c.term_reason,
            "startedAt": rfc3339(c.started_at) if c.started_at else None,
            "finishedAt": rfc3339(c.finished_at),
            "containerID": c.container_id,
        }
        if c.term_message:
            t["message"] = c.term_message
        return t

    def _write_status(self, rt: PodRuntime) -> bool:
        """Store the pod's status; False when the pod is gone from the store."""
        regular = [c for c in rt.containers.values() if not c.init]
        inits = [c for c in rt.containers.values() if c.init]
        conditions: list[JSON] = []
        if rt.stop_reason == "evicted":
            conditions.append(self._cond(rt, "DisruptionTarget", True, "TerminationByKubelet", rt.stop_message))
        if rt.scheduled:
            all_ready = rt.phase == "Running" and all(c.state == "running" for c in regular)
            not_ready_reason = "PodCompleted" if rt.phase in ("Succeeded", "Failed") else "ContainersNotReady"
            waiting = [c.name for c in regular if c.state != "running"]
            msg = (
                None
                if all_ready or rt.phase in ("Succeeded", "Failed")
                else f"containers with unready status: [{' '.join(waiting)}]"
            )
            conditions.append(self._cond(rt, "PodReadyToStartContainers", rt.phase not in ("Succeeded", "Failed")))
            conditions.append(
                self._cond(
                    rt,
                    "Initialized",
                    rt.initialized or not inits,
                    None if rt.initialized or not inits else "ContainersNotInitialized",
                )
            )
            conditions.append(self._cond(rt, "Ready", all_ready, None if all_ready else not_ready_reason, msg))
            conditions.append(
                self._cond(rt, "ContainersReady", all_ready, None if all_ready else not_ready_reason, msg)
            )
            conditions.append(self._cond(rt, "PodScheduled", True))
        else:
            conditions.append(
                self._cond(
                    rt,
                    "PodScheduled",
                    False,
                    "Unschedulable" if rt.unschedulable_message else None,
                    rt.unschedulable_message,
                )
            )
        status: JSON = {"phase": rt.phase, "conditions": conditions}
        if rt.scheduled:
            status["hostIP"] = "127.0.0.1"
            status["hostIPs"] = [{"ip": "127.0.0.1"}]
            status["podIP"] = "127.0.0.1"
            status["podIPs"] = [{"ip": "127.0.0.1"}]
            status["startTime"] = rfc3339(rt.start_time)
            if inits:
                status["initContainerStatuses"] = [self._container_status(c) for c in inits]
            status["containerStatuses"] = [self._container_status(c) for c in regular]
        status["qosClass"] = _qos_class(regular)
        if rt.stop_reason == "evicted" and rt.phase == "Failed":
            status["reason"] = "Evicted"
            status["message"] = rt.stop_message
        elif rt.stop_reason == "deadline" and rt.phase == "Failed":
            status["reason"] = "DeadlineExceeded"
            status["message"] = "Pod was active on the node longer than the specified deadline"

        def apply(pod: JSON) -> None:
            pod["status"] = status
            if rt.scheduled:
                pod["spec"]["nodeName"] = NODE_NAME

        return self.store.mutate(PODS, rt.namespace, rt.name, apply) is not None

    def _record_event(
        self, rt: PodRuntime, type_: str, reason: str, message: str, field_path: str | None = None
    ) -> None:
        record_event(
            self.store,
            {"kind": "Pod", "namespace": rt.namespace, "name": rt.name, "uid": rt.uid, "apiVersion": "v1"},
            type_,
            reason,
            message,
            "kubelet",
            field_path,
        )

    # ------------------------------------------------------------- pod task

    async def _run_pod(self, rt: PodRuntime) -> None:
        try:
            await self._pod_lifecycle(rt)
        except asyncio.CancelledError:
            await self._kill_all(rt, 0)
            raise
        except Exception:
            log.exception("pod task failed", pod=f"{rt.namespace}/{rt.name}")
            await self._kill_all(rt, 0)
        finally:
            rt.done = True
            for c in rt.containers.values():
                if c.log_fh is not None:
                    c.log_fh.close()
                    c.log_fh = None
                c.kill_execs()
                c.notify()
            pod = self.store.find(PODS, rt.namespace, rt.name)
            if (pod is None or pod["metadata"]["uid"] != rt.uid) and not self._closing:
                self.forget(rt.uid)

    async def _wait_or_stop(self, rt: PodRuntime, seconds: float | None, also: asyncio.Event | None = None) -> bool:
        """Sleep ``seconds`` (None: forever); True when a stop was requested."""
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(rt.stop_event.wait())]
        if also is not None:
            waits.append(asyncio.ensure_future(also.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return rt.stop_event.is_set()

    async def _pod_lifecycle(self, rt: PodRuntime) -> None:
        pod = self.store.find(PODS, rt.namespace, rt.name)
        if pod is None:
            return
        spec = pod.get("spec") or {}
        # Scheduling: one node, bound unless a knob says Unschedulable.
        delay = self.faults.schedule_delay_s
        if delay and await self._wait_or_stop(rt, delay):
            return await self._finish_unbound(rt)
        while self.faults.is_unschedulable(rt.name):
            msg = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
            if rt.unschedulable_message is None:
                rt.unschedulable_message = msg
                if not self._write_status(rt):
                    return
                record_event(
                    self.store,
                    {"kind": "Pod", "namespace": rt.namespace, "name": rt.name, "uid": rt.uid, "apiVersion": "v1"},
                    "Warning",
                    "FailedScheduling",
                    msg,
                    "default-scheduler",
                )
            if await self._wait_or_stop(rt, None, self._faults_changed):
                return await self._finish_unbound(rt)
        rt.scheduled = True
        rt.unschedulable_message = None
        rt.start_time = time.time()
        for c in rt.containers.values():
            c.host_tmp.mkdir(parents=True, exist_ok=True)
            c.log_dir.mkdir(parents=True, exist_ok=True)
        if not self._write_status(rt):
            return
        record_event(
            self.store,
            {"kind": "Pod", "namespace": rt.namespace, "name": rt.name, "uid": rt.uid, "apiVersion": "v1"},
            "Normal",
            "Scheduled",
            f"Successfully assigned {rt.namespace}/{rt.name} to {NODE_NAME}",
            "default-scheduler",
        )
        deadline_s = spec.get("activeDeadlineSeconds")
        deadline_handle = None
        if deadline_s is not None:
            deadline_handle = asyncio.get_running_loop().call_later(
                float(deadline_s),
                lambda: rt.request_stop("deadline", int(spec.get("terminationGracePeriodSeconds", 30))),
            )
        try:
            if self.faults.start_delay_s and await self._wait_or_stop(rt, self.faults.start_delay_s):
                return await self._finish_stopped(rt)
            inits = [c for c in rt.containers.values() if c.init]
            for c in inits:
                ok = await self._run_container(rt, c, spec)
                if rt.stop_event.is_set():
                    return await self._finish_stopped(rt)
                if not ok:
                    rt.phase = "Failed"
                    for r in rt.containers.values():
                        if not r.init:
                            r.waiting_reason = "PodInitializing"
                    self._write_status(rt)
                    return
            rt.initialized = True
            regular = [c for c in rt.containers.values() if not c.init]
            for c in regular:
                if c.waiting_reason == "PodInitializing":
                    c.waiting_reason = "ContainerCreating"
            results = await asyncio.gather(*(self._run_container(rt, c, spec) for c in regular))
            if rt.stop_event.is_set():
                return await self._finish_stopped(rt)
            rt.phase = "Succeeded" if all(results) else "Failed"
            self._write_status(rt)
        finally:
            if deadline_handle is not None:
                deadline_handle.cancel()

    async def _finish_unbound(self, rt: PodRuntime) -> None:
        if rt.stop_reason == "deleted":
            self.store.finish_pod_deletion(rt.namespace, rt.name)

    async def _finish_stopped(self, rt: PodRuntime) -> None:
        """After a stop request: every container is terminated; set the terminal
        phase (pods being deleted go terminal first, then are removed)."""
        await self._kill_all(rt, rt.stop_grace)
        for c in rt.containers.values():
            if c.state == "waiting" and c.ever_started is False and rt.stop_reason in ("evicted", "deadline"):
                c.state = "terminated"
                c.exit_code = 137
                c.term_reason = "ContainerStatusUnknown"
                c.term_message = "The container could not be located when the pod was terminated"
                c.finished_at = time.time()
        regular = [c for c in rt.containers.values() if not c.init]
        if rt.stop_reason in ("evicted", "deadline"):
            rt.phase = "Failed"
        elif all(c.state == "terminated" and c.exit_code == 0 for c in regular):
            rt.phase = "Succeeded"
        else:
            rt.phase = "Failed"
        if rt.stop_reason == "evicted":
            self._record_event(rt, "Warning", "Evicted", rt.stop_message or "Evicted")
        elif rt.stop_reason == "deadline":
            self._record_event(
                rt, "Normal", "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
            )
        self._write_status(rt)
        if rt.stop_reason == "deleted":
            self.store.finish_pod_deletion(rt.namespace, rt.name)

    async def _kill_all(self, rt: PodRuntime, grace: int) -> None:
        procs = [c for c in rt.containers.values() if c.proc is not None and c.proc.returncode is None]
        if not procs:
            return
        for c in procs:
            c.killed_by_kubelet = True
            self._record_event(rt, "Normal", "Killing", f"Stopping container {c.name}", f"spec.containers{{{c.name}}}")
            _signal_main(c.proc, signal.SIGTERM)
        waits = [asyncio.ensure_future(c.proc.wait()) for c in procs if c.proc is not None]
        _done, pending = await asyncio.wait(waits, timeout=max(grace, 0) or 0.01)
        for c in procs:
            if c.proc is not None:
                _kill_container(c.proc)
        if pending:
            await asyncio.wait(pending, timeout=10)

    # ------------------------------------------------------------ containers

    async def _run_container(self, rt: PodRuntime, c: ContainerRuntime, pod_spec: JSON) -> bool:
        """Run one container to its end, restarting per restartPolicy; True when
        it ended with exit code 0."""
        ref = f"spec.{'initContainers' if c.init else 'containers'}{{{c.name}}}"
        image = str(c.spec.get("image", ""))
        # Image "pull".
        if not valid_image_reference(image):
            # The kubelet refuses a reference it cannot parse before any pull,
            # and never retries it (kuberuntime EnsureImageExists).
            c.waiting_reason = "InvalidImageName"
            c.waiting_message = f'Failed to apply default image tag "{image}": couldn\'t parse image reference "{image}": invalid reference format'
            self._record_event(rt, "Warning", "InspectFailed", c.waiting_message, ref)
            self._write_status(rt)
            await self._wait_or_stop(rt, None)
            return False
        if image.startswith(MISSING_REGISTRY):
            # ErrImagePull at each attempt, ImagePullBackOff while the image
            # back-off runs (doubling up to 300 s), then a new attempt: the two
            # reasons alternate for as long as the pod exists.
            backoff = self.image_pull_backoff_s
            while True:
                self._record_event(rt, "Normal", "Pulling", f'Pulling image "{image}"', ref)
                c.waiting_reason = "ErrImagePull"
                c.waiting_message = (
                    f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                    f'failed to resolve reference "{image}": {image}: not found'
                )
                self._record_event(rt, "Warning", "Failed", f'Failed to pull image "{image}": {c.waiting_message}', ref)
                self._write_status(rt)
                if await self._wait_or_stop(rt, self.image_pull_backoff_s):
                    return False
                c.waiting_reason = "ImagePullBackOff"
                c.waiting_message = f'Back-off pulling image "{image}"'
                self._record_event(rt, "Normal", "BackOff", c.waiting_message, ref)
                self._write_status(rt)
                if await self._wait_or_stop(rt, backoff):
                    return False
                backoff = min(backoff * 2, 300.0)
        backoff = self.crash_backoff_s
        while True:
            # Environment; CreateContainerConfigError is retried.
            while True:
                try:
                    self._prepare(rt, c, pod_spec)
                    break
                except VolumeMountError as exc:
                    if c.waiting_message != str(exc):
                        c.waiting_reason = "ContainerCreating"
                        c.waiting_message = str(exc)
                        self._record_event(rt, "Warning", "FailedMount", str(exc))
                        if not self._write_status(rt):
                            return False
                    if await self._wait_or_stop(rt, self.config_retry_s):
                        return False
                except ContainerConfigError as exc:
                    if c.waiting_reason != "CreateContainerConfigError" or c.waiting_message != str(exc):
                        c.waiting_reason = "CreateContainerConfigError"
                        c.waiting_message = str(exc)
                        self._record_event(rt, "Warning", "Failed", f"Error: {exc}", ref)
                        if not self._write_status(rt):
                            return False
                    if await self._wait_or_stop(rt, self.config_retry_s):
                        return False
            if rt.stop_event.is_set():
                return False
            code = await self._start_and_wait(rt, c, ref)
            if code is None:
                return False
            if rt.stop_event.is_set():
                return code == 0
            restart = rt.restart_policy == "Always" or (rt.restart_policy == "OnFailure" and code != 0)
            if c.init and rt.restart_policy != "Never" and code != 0:
                restart = True
            if not restart:
                return code == 0
            # CrashLoopBackOff, then a new instance.
            c.last_state = {"terminated": self._terminated(c)}
            c.restart_count += 1
            c.state = "waiting"
            c.waiting_reason = "CrashLoopBackOff"
            c.waiting_message = (
                f"back-off {backoff:g}s restarting failed container={c.name} pod={rt.name}_{rt.namespace}({rt.uid})"
            )
            c.notify()
            self._record_event(rt, "Warning", "BackOff", "Back-off restarting failed container", ref)
            if not self._write_status(rt):
                return False
            if await self._wait_or_stop(rt, backoff):
                return False
            backoff = min(backoff * 2, 300.0)

    def _prepare(self, rt: PodRuntime, c: ContainerRuntime, pod_spec: JSON) -> None:
        pod = self.store.find(PODS, rt.namespace, rt.name)
        env = resolve_env(self.store, pod or {"metadata": {}, "spec": pod_spec}, c.spec)
        command = list(c.spec.get("command") or [])
        args = list(c.spec.get("args") or [])
        argv = [expand(a, env) for a in command] + [expand(a, env) for a in args]
        workdir = c.spec.get("workingDir") or "/tmp/workdir"
        create = workdir == "/tmp" or workdir.startswith("/tmp/")
        if not create and not os.path.isdir(workdir):
            log.warning("workingDir does not exist on the host; using /tmp/workdir", workdir=workdir)
            workdir, create = "/tmp/workdir", True
        c.mounts = self._volume_mounts(rt, c, (pod or {}).get("spec") or pod_spec)
        if not self.private_tmp:
            host = str(c.host_tmp)
            argv = [_rewrite_mounts(_rewrite_tmp(a, host), c.mounts) for a in argv]
            env = {k: _rewrite_mounts(_rewrite_tmp(v, host), c.mounts) for k, v in env.items()}
            env["TMPDIR"] = host
            workdir = _rewrite_tmp(workdir, host)
        c.env = env
        c.argv = argv
        c.workdir = workdir
        c.create_workdir = create

    def pvc_dir(self, namespace: str, claim: str) -> Path:
        """The host folder behind PersistentVolumeClaim ``claim`` (made on
        first use; shared by every pod mounting the claim), e.g. to seed it."""
        path = self.root / "_pvcs" / namespace / claim
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _volume_mounts(self, rt: PodRuntime, c: ContainerRuntime, pod_spec: JSON) -> list[tuple[str, str, bool]]:
        """Set up the container's volumes as host folders: secret and
        configMap volumes get one file per key (or per ``items`` entry),
        emptyDir a per-pod folder, a PVC :meth:`pvc_dir`. Raises
        VolumeMountError when a Secret, ConfigMap or claim is missing."""
        volumes = {v.get("name"): v for v in pod_spec.get("volumes") or [] if isinstance(v, dict)}
        out: list[tuple[str, str, bool]] = []
        for m in c.spec.get("volumeMounts") or []:
            vol = volumes.get(m.get("name"))
            if vol is None:
                continue
            read_only = bool(m.get("readOnly"))
            host = rt.pod_dir / "volumes" / str(vol["name"])
            if "emptyDir" in vol:
                host.mkdir(parents=True, exist_ok=True)
            elif "secret" in vol or "configMap" in vol:
                kind, key = ("Secret", "secret") if "secret" in vol else ("ConfigMap", "configMap")
                src = vol[key] or {}
                name = src.get("secretName") if kind == "Secret" else src.get("name")
                obj = self.store.find(SECRETS if kind == "Secret" else CONFIGMAPS, rt.namespace, str(name))
                if obj is None and not src.get("optional"):
                    raise VolumeMountError(
                        f'MountVolume.SetUp failed for volume "{vol["name"]}" : {kind.lower()} "{name}" not found'
                    )
                data: dict[str, bytes] = {}
                for k, v in ((obj or {}).get("data") or {}).items():
                    data[k] = base64.b64decode(v) if kind == "Secret" else str(v).encode()
                for k, v in ((obj or {}).get("binaryData") or {}).items():
                    data[k] = base64.b64decode(v)
                items = src.get("items")
                files = {str(i["path"]): data[i["key"]] for i in items if i.get("key") in data} if items else data
                host.mkdir(parents=True, exist_ok=True)
                for rel, content in files.items():
                    target = host / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
                read_only = True  # the kubelet always mounts these read-only
            elif "persistentVolumeClaim" in vol:
                claim = str((vol["persistentVolumeClaim"] or {}).get("claimName"))
                if self.store.find(RESOURCES[("", "persistentvolumeclaims")], rt.namespace, claim) is None:
                    raise VolumeMountError(f'persistentvolumeclaim "{claim}" not found')
                host = self.pvc_dir(rt.namespace, claim)
                read_only = read_only or bool((vol["persistentVolumeClaim"] or {}).get("readOnly"))
            else:
                continue
            sub = m.get("subPath")
            if sub:
                host = host / str(sub)
                host.mkdir(parents=True, exist_ok=True)
            out.append((str(host), str(m["mountPath"]), read_only))
        return out

    def _spawn_argv(self, c: ContainerRuntime, argv: list[str]) -> list[str]:
        if self.private_tmp:
            return [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-c",
                _mount_script(c.mounts) + _LAUNCH,
                "k8s-sim-launch",
                str(c.host_tmp),
                c.workdir,
                "1" if c.create_workdir else "",
                *argv,
            ]
        return [
            "/bin/sh",
            "-c",
            'if [ -n "$2" ]; then mkdir -p "$1"; fi; cd "$1" || exit 127; shift 2; exec "$@"',
            "k8s-sim-launch",
            c.workdir,
            "1" if c.create_workdir else "",
            *argv,
        ]

    async def _start_and_wait(self, rt: PodRuntime, c: ContainerRuntime, ref: str) -> int | None:
        """Start the container's process, pump its output into the CRI log,
        wait for it; returns the exit code (None when it could not start)."""
        c.instance += 1
        c.container_id = "sim://" + os.urandom(32).hex()
        c.killed_by_kubelet = False
        c.term_message = None
        if not c.argv:
            return self._start_error(
                rt, c, "no command specified: the simulator has no image entrypoints; set command or args"
            )
        exe = c.argv[0]
        if "/" not in exe and shutil.which(exe, path=c.env.get("PATH", os.defpath)) is None:
            return self._start_error(rt, c, f'exec: "{exe}": executable file not found in $PATH')
        c.log_path = c.log_file(c.restart_count)
        c.log_fh = open(c.log_path, "ab")  # noqa: SIM115 - kept open for the container's life
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._spawn_argv(c, c.argv),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=c.env,
                cwd=str(c.host_tmp),
                start_new_session=True,
            )
        except OSError as exc:
            c.log_fh.close()
            c.log_fh = None
            return self._start_error(rt, c, str(exc))
        c.proc = proc
        c.state = "running"
        c.ever_started = True
        c.started_at = time.time()
        c.waiting_message = None
        self._record_event(
            rt, "Normal", "Pulled", f'Container image "{c.spec.get("image")}" already present on machine', ref
        )
        self._record_event(rt, "Normal", "Created", f"Created container {c.name}", ref)
        self._record_event(rt, "Normal", "Started", f"Started container {c.name}", ref)
        regular = [x for x in rt.containers.values() if not x.init]
        if not c.init and all(x.state == "running" or x.ever_started for x in regular):
            rt.phase = "Running"
        c.notify()
        self._write_status(rt)
        assert proc.stdout is not None and proc.stderr is not None
        pumps = [
            asyncio.ensure_future(self._pump(c, proc.stdout, b"stdout")),
            asyncio.ensure_future(self._pump(c, proc.stderr, b"stderr")),
        ]
        wait_task = asyncio.ensure_future(proc.wait())
        # The container ends when its main process does: the kernel kills the
        # rest of a PID namespace once its init exits (a background child that
        # keeps stdout open must not keep the container running).
        reaper = asyncio.ensure_future(_kill_when_main_exits(proc))
        stop_task = asyncio.ensure_future(rt.stop_event.wait())
        try:
            await asyncio.wait({wait_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            if not wait_task.done():
                # Deleted, evicted or past activeDeadlineSeconds: SIGTERM to the
                # container's main process only, then SIGKILL after the grace
                # period (kuberuntime killContainer; the runtime signals the
                # init process of the container's PID namespace).
                c.killed_by_kubelet = True
                self._record_event(rt, "Normal", "Killing", f"Stopping container {c.name}", ref)
                _signal_main(proc, signal.SIGTERM)
                done, _ = await asyncio.wait({wait_task}, timeout=max(rt.stop_grace, 0) or 0.01)
                if not done:
                    _kill_container(proc)
            rc = await wait_task
        finally:
            stop_task.cancel()
            reaper.cancel()
        # Like the kernel tearing down the container's PID namespace once its
        # init exits: nothing survives it, exec sessions included.
        _kill_container(proc)
        c.kill_execs()
        await asyncio.wait(pumps, timeout=5)
        for p in pumps:
            p.cancel()
        code = 128 - rc if rc < 0 else rc
        c.exit_code = code
        c.finished_at = time.time()
        if code == 0:
            c.term_reason = "Completed"
        elif code == 137 and not c.killed_by_kubelet:
            c.term_reason = "OOMKilled"
        else:
            c.term_reason = "Error"
        if code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            c.term_message = _log_tail_text(c.log_path, 80, 2048)
        c.state = "terminated"
        c.proc = None
        if c.log_fh is not None:
            c.log_fh.close()
            c.log_fh = None
        c.notify()
        self._write_status(rt)
        return code

    def _start_error(self, rt: PodRuntime, c: ContainerRuntime, message: str) -> int:
        c.state = "terminated"
        c.exit_code = 128
        c.term_reason = "StartError"
        c.term_message = f"failed to create containerd task: failed to create shim task: OCI runtime create failed: {message}: unknown"
        c.started_at = 0.0
        c.finished_at = time.time()
        self._record_event(rt, "Warning", "Failed", f"Error: {c.term_message}")
        c.notify()
        self._write_status(rt)
        return 128

    async def _pump(self, c: ContainerRuntime, stream: asyncio.StreamReader, name: bytes) -> None:
        """Copy a process pipe into the CRI log, one record per line, stamped at
        the moment it is read (like the runtime's log writer): containerd
        stamps each line, CRI-O every line of one read buffer alike and in the
        node's local zone (:attr:`log_runtime`)."""
        pending = b""
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                break
            pending += chunk
            records: list[bytes] = []
            stamp = self._stamp if self.log_runtime == "containerd" else _fixed(self._stamp())
            while True:
                nl = pending.find(b"\n")
                if nl == -1:
                    break
                line, pending = pending[:nl], pending[nl + 1 :]
                while len(line) > PARTIAL_LINE_BYTES:
                    records.append(_cri(stamp(), name, b"P", line[:PARTIAL_LINE_BYTES]))
                    line = line[PARTIAL_LINE_BYTES:]
                records.append(_cri(stamp(), name, b"F", line))
            while len(pending) > PARTIAL_LINE_BYTES:
                records.append(_cri(stamp(), name, b"P", pending[:PARTIAL_LINE_BYTES]))
                pending = pending[PARTIAL_LINE_BYTES:]
            if records:
                self._append_log(c, b"".join(records))
        if pending:
            self._append_log(c, _cri(self._stamp(), name, b"F", pending))

    def _stamp(self) -> bytes:
        """Now, as the runtime writes it in a CRI log record: Go's
        ``time.RFC3339Nano`` (trailing zeros of the fraction dropped), UTC
        for containerd, the node's zone for CRI-O."""
        offset = self.log_utc_offset_s if self.log_runtime == "cri-o" else 0
        return rfc3339_nano_go(time.time_ns(), offset).encode()

    def _append_log(self, c: ContainerRuntime, data: bytes) -> None:
        if c.log_fh is None:
            return
        c.log_fh.write(data)
        c.log_fh.flush()
        c.notify()

    # ----------------------------------------------------------- knobs, API

    def find(self, namespace: str, name: str) -> PodRuntime | None:
        """The runtime of a pod by name, or None."""
        pod = self.store.find(PODS, namespace, name)
        if pod is None:
            return None
        return self.pods.get(pod["metadata"]["uid"])

    def container(
        self, namespace: str, pod_name: str, container: str | None
    ) -> tuple[JSON, ContainerRuntime | None, str]:
        """(pod, container runtime or None if not started, container name) for
        logs/exec. 404 for a missing pod, 400 for a missing/ambiguous container
        (the apiserver's pod log/exec validation messages)."""
        pod = self.store.find(PODS, namespace, pod_name)
        if pod is None:
            raise err_not_found("pods", pod_name, "", "pods")
        spec = pod.get("spec") or {}
        names = [c["name"] for c in spec.get("containers") or []]
        init_names = [c["name"] for c in spec.get("initContainers") or []]
        if not container:
            if len(names) != 1:
                raise err_bad_request(
                    f"a container name must be specified for pod {pod_name}, choose one of: [{' '.join(names)}]"
                    + (f" or one of the init containers: [{' '.join(init_names)}]" if init_names else "")
                )
            container = names[0]
        if container not in names and container not in init_names:
            raise err_bad_request(f"container {container} is not valid for pod {pod_name}")
        rt = self.pods.get(pod["metadata"]["uid"])
        return pod, (rt.containers.get(container) if rt else None), container

    def log_source(
        self, namespace: str, pod_name: str, container: str | None, previous: bool
    ) -> tuple[ContainerRuntime, Path]:
        """The container and the log file a pods/log request reads; 400 with the
        kubelet's message when the container is waiting to start or has no
        previous instance."""
        pod, c, cname = self.container(namespace, pod_name, container)
        if previous:
            if c is None or c.restart_count == 0:
                raise err_bad_request(f'previous terminated container "{cname}" in pod "{pod_name}" not found')
            return c, c.log_file(c.restart_count - 1)
        if c is None or not c.ever_started or c.log_path is None:
            reason = c.waiting_reason if c is not None else "ContainerCreating"
            detail = "trying and failing to pull image" if reason in ("ErrImagePull", "ImagePullBackOff") else reason
            raise err_bad_request(f'container "{cname}" in pod "{pod_name}" is waiting to start: {detail}')
        return c, c.log_path

    def rotate_log(self, namespace: str, pod_name: str, container: str | None) -> Path:
        """Rotate a container's current log file the way the kubelet's
        ContainerLogManager does: rename it to ``<file>.<timestamp>`` and start a
        new one. Open follow streams keep the old file and go silent; a new
        request reads only the new file. Returns the rotated file's new path."""
        _pod, c, cname = self.container(namespace, pod_name, container)
        if c is None or c.log_path is None or c.log_fh is None:
            raise err_bad_request(f'container "{cname}" in pod "{pod_name}" is not running')
        rotated = c.log_path.with_name(c.log_path.name + "." + time.strftime("%Y%m%d-%H%M%S"))
        c.log_fh.close()
        os.rename(c.log_path, rotated)
        c.log_fh = open(c.log_path, "ab")  # noqa: SIM115
        c.notify()
        return rotated

    def evict(self, namespace: str, pod_name: str, message: str) -> None:
        """Node-pressure eviction: kill the pod's containers at once; the pod
        ends Failed with reason Evicted and a DisruptionTarget condition
        (reason TerminationByKubelet)."""
        rt = self.find(namespace, pod_name)
        if rt is None or rt.done:
            raise err_bad_request(f'pod "{pod_name}" is not running on {NODE_NAME}')
        rt.request_stop("evicted", 0, message)

    def oom_kill(self, namespace: str, pod_name: str, container: str | None) -> None:
        """SIGKILL a running container's processes as the OOM killer would; it
        terminates with exit code 137 and reason OOMKilled."""
        _pod, c, cname = self.container(namespace, pod_name, container)
        if c is None or c.proc is None or c.proc.returncode is not None:
            raise err_bad_request(f'container "{cname}" in pod "{pod_name}" is not running')
        _kill_container(c.proc)

    async def exec_process(
        self, namespace: str, pod_name: str, container: str | None, command: list[str], stdin: bool
    ) -> asyncio.subprocess.Process:
        """Start ``command`` inside a running container's view (its private /tmp,
        env and working directory), in its own process group. 400 when the
        container is not running (the kubelet's "container not found")."""
        _pod, c, cname = self.container(namespace, pod_name, container)
        if c is None or c.state != "running":
            raise err_bad_request(f'unable to upgrade connection: container not found ("{cname}")')
        if not command:
            raise err_bad_request("you must specify at least 1 command")
        argv = (
            command
            if self.private_tmp
            else [_rewrite_mounts(_rewrite_tmp(a, str(c.host_tmp)), c.mounts) for a in command]
        )
        proc = await asyncio.create_subprocess_exec(
            *self._spawn_argv(c, argv),
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=c.env,
            cwd=str(c.host_tmp),
            start_new_session=True,
        )
        c.exec_procs = {p for p in c.exec_procs if p.returncode is None}
        c.exec_procs.add(proc)
        return proc

    async def close(self) -> None:
        """Kill every container (SIGKILL) and end every pod task."""
        self._closing = True
        for rt in list(self.pods.values()):
            if rt.task is not None and not rt.task.done():
                rt.task.cancel()
        tasks = [rt.task for rt in self.pods.values() if rt.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=15)

    def forget(self, uid: str) -> None:
        """Drop a finished pod's runtime and its directory (after DELETED)."""
        rt = self.pods.get(uid)
        if rt is not None and rt.done:
            del self.pods[uid]
            shutil.rmtree(rt.pod_dir, ignore_errors=True)


async def stream_log(
    c: ContainerRuntime,
    path: Path,
    *,
    follow: bool,
    timestamps: bool,
    since_ns: int | None,
    tail_lines: int | None,
    limit_bytes: int | None,
    only_stream: bytes | None = None,
    killed: asyncio.Event | None = None,
) -> AsyncGenerator[bytes, None]:
    """Yield the body of a pods/log response read from a CRI log file, like the
    kubelet's ReadLogs: tailLines picks the last N records first, then records
    older than ``since_ns`` are skipped; ``timestamps`` prefixes each record with
    its RFC3339NanoFixed time; ``limitBytes`` cuts the body; ``only_stream``
    (b"stdout"/b"stderr", the ``stream`` parameter) keeps one stream; ``follow`` keeps
    reading until the container instance that writes the file ends (a rotated
    file gets no more data: the stream stays silent). When ``killed`` is set
    while following, ServerKilledError is raised to abort the response."""
    instance = c.instance
    sent = 0
    with open(path, "rb") as fh:
        if tail_lines is not None:
            data = fh.read()
            lines = data.splitlines(keepends=True)
            if data and not data.endswith(b"\n"):
                lines = lines[:-1]
            keep = lines[-tail_lines:] if tail_lines > 0 else []
            start = sum(len(x) for x in lines[: len(lines) - len(keep)])
            fh.seek(start)
        buf = b""
        # As the kubelet's log reader (kuberuntime/logs ReadLogs): the
        # timestamp prefixes a logical line once, not each partial record.
        new_line = True
        while True:
            token = c.changed_token()
            chunk = fh.read()
            if chunk:
                buf += chunk
                out: list[bytes] = []
                while True:
                    nl = buf.find(b"\n")
                    if nl == -1:
                        break
                    rec, buf = buf[:nl], buf[nl + 1 :]
                    parsed = parse_cri(rec)
                    if parsed is None:
                        continue
                    ts_ns, stream_name, partial, content = parsed
                    if since_ns is not None and ts_ns < since_ns:
                        continue
                    if only_stream is not None and stream_name != only_stream:
                        continue
                    # The kubelet parses the record's time and formats it with
                    # RFC3339NanoFixed in the zone it was written in.
                    zone = _zone_offset_s(rec)
                    prefix = rfc3339_nano(ts_ns, zone).encode() + b" " if timestamps and new_line else b""
                    piece = prefix + content + (b"" if partial else b"\n")
                    new_line = not partial
                    if limit_bytes is not None and sent + len(piece) > limit_bytes:
                        piece = piece[: limit_bytes - sent]
                        if piece:
                            out.append(piece)
                        if out:
                            yield b"".join(out)
                        return
                    sent += len(piece)
                    out.append(piece)
                if out:
                    yield b"".join(out)
                continue
            if not follow:
                return
            if c.instance != instance or c.state != "running":
                # One last read: the pumps drained before the state changed.
                rest = fh.read()
                if not rest:
                    return
                buf += rest
                continue
            if killed is None:
                await token.wait()
                continue
            waits = {asyncio.ensure_future(token.wait()), asyncio.ensure_future(killed.wait())}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if killed.is_set():
                raise ServerKilledError("the API server was stopped")


def parse_cri(rec: bytes) -> tuple[int, bytes, bool, bytes] | None:
    """Parse one CRI log record ``<time> <stream> <P|F> <content>`` into
    (Unix ns, stream, partial, content); None when malformed."""
    from .util import parse_rfc3339_ns

    parts = rec.split(b" ", 3)
    if len(parts) < 3:
        return None
    try:
        ts = parse_rfc3339_ns(parts[0].decode())
    except ValueError:
        return None
    content = parts[3] if len(parts) > 3 else b""
    return ts, parts[1], parts[2] == b"P", content


def _cri(stamp: bytes, stream: bytes, tag: bytes, content: bytes) -> bytes:
    return stamp + b" " + stream + b" " + tag + b" " + content + b"\n"


def _fixed(stamp: bytes) -> Callable[[], bytes]:
    return lambda: stamp


def _zone_offset_s(rec: bytes) -> int:
    """The UTC offset (seconds) of a CRI record's timestamp: 0 for ``Z``."""
    ts = rec.split(b" ", 1)[0]
    if ts.endswith((b"Z", b"z")) or len(ts) < 6 or ts[-6:-5] not in (b"+", b"-"):
        return 0
    sign = 1 if ts[-6:-5] == b"+" else -1
    return sign * (int(ts[-5:-3]) * 3600 + int(ts[-2:]) * 60)


def _log_tail_text(path: Path | None, lines: int, max_bytes: int) -> str | None:
    """The last lines of a container log (terminationMessagePolicy
    FallbackToLogsOnError: last 80 lines, at most 2048 bytes)."""
    if path is None or not path.exists():
        return None
    recs = [parse_cri(r) for r in path.read_bytes().splitlines()]
    text = b"\n".join([r[3] for r in recs if r is not None][-lines:])
    return text[-max_bytes:].decode("utf-8", "replace") or None


def _killpg(proc: asyncio.subprocess.Process | None, sig: int) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


_IMAGE_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
)
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    rf"^{_IMAGE_DOMAIN}?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)


def valid_image_reference(image: str) -> bool:
    """Whether ``image`` parses as a container image reference (the grammar
    of github.com/distribution/reference: optional registry host[:port]/,
    lower-case path components, optional :tag and @digest)."""
    return len(image) <= 255 and bool(_IMAGE_REFERENCE.match(image))


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its SigCgt mask in
    /proc/<pid>/status); False when it is gone or cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        return False
    return False


def _signal_main(proc: asyncio.subprocess.Process | None, sig: int) -> None:
    """Signal the container's main process only, as the runtime does (the
    kubelet's StopContainer: SIGTERM to the container's init, not to its
    children). The main process is PID 1 of the container's PID namespace,
    and the kernel drops a signal sent to a namespace's init from outside
    unless the init has a handler for it (pid_namespaces(7)): a bare shell or
    program without a SIGTERM handler does not hear it and is SIGKILLed after
    the grace period. The simulator runs no PID namespace, so it checks the
    handler itself."""
    if proc is None or proc.returncode is not None:
        return
    if sig != signal.SIGKILL and not _catches(proc.pid, sig):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(proc.pid, sig)


def _session_members(sid: int) -> list[int]:
    """Pids of the processes in session ``sid`` (every process of a
    container: it is started as a session leader, and a job's own process
    group stays in the session)."""
    # getsid(2) per pid, not a read of /proc/<pid>/stat: this runs on the
    # simulator's loop twice per container end, and reading every process's
    # stat file was most of the loop's time with 200 containers ending.
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getsid(pid) == sid:
                out.append(pid)
        except OSError:
            continue  # gone meanwhile
    return out


def _main_exited(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 :][:1] in (b"Z", b"X")


async def _kill_when_main_exits(proc: asyncio.subprocess.Process) -> None:
    """Wait until the container's main process has exited (its pidfd turns
    readable then, zombie or not: no polling, which cost the simulator's
    loop 10 /proc reads a second per container), then kill what is left of
    the container."""
    if proc.returncode is None:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            pidfd = None  # already reaped
        if pidfd is not None:
            loop = asyncio.get_running_loop()
            exited: asyncio.Future[None] = loop.create_future()
            loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
            try:
                if not _main_exited(proc.pid):
                    await exited
            finally:
                loop.remove_reader(pidfd)
                os.close(pidfd)
    _kill_container(proc)


def _kill_container(proc: asyncio.subprocess.Process | None) -> None:
    """SIGKILL every process of the container (its session), as the kernel
    does to a PID namespace whose init died or the runtime does to a
    container after the grace period."""
    if proc is None:
        return
    _killpg(proc, signal.SIGKILL)
    for pid in _session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _rewrite_tmp(text: str, host_tmp: str) -> str:
    if text == "/tmp":
        return host_tmp
    return text.replace("/tmp/", host_tmp + "/")


def _mount_script(mounts: list[tuple[str, str, bool]]) -> str:
    """Shell text binding each (host, mountPath, read-only) in the
    container's mount namespace. The mount point folder is created on the
    host when missing (mount namespaces share the file system)."""
    parts = []
    for host, target, read_only in mounts:
        h, t = shlex.quote(host), shlex.quote(target)
        line = f"mkdir -p {t} && mount --bind {h} {t}"
        if read_only:
            line += f" && mount -o remount,bind,ro {t}"
        parts.append(line + f' || {{ echo "k8s-sim: cannot mount a volume at "{t} >&2; exit 127; }}; ')
    return "".join(parts)


def _rewrite_mounts(text: str, mounts: list[tuple[str, str, bool]]) -> str:
    """Without mount namespaces: mountPath prefixes become the host folders
    (read-only is then not enforced)."""
    for host, target, _ro in mounts:
        text = host if text == target else text.replace(target.rstrip("/") + "/", host + "/")
    return text


def _qos_class(containers: list[ContainerRuntime]) -> str:
    """Pod QoS class (pkg/apis/core/v1/helper/qos): BestEffort without any
    requests/limits, Guaranteed when every container's cpu and memory limits
    equal their requests, else Burstable."""
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.spec.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim or req.get(r, lim.get(r)) != lim.get(r):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def resolve_env(store: ObjectStore, pod: JSON, container: JSON) -> dict[str, str]:
    """The container's environment, built like the kubelet's
    makeEnvironmentVariables: base variables (PATH, HOSTNAME, HOME), then
    envFrom sources in order (with prefix; optional sources may be missing),
    then env entries in order, each value ``$(VAR)``-expanded against what is
    defined so far; valueFrom supports secretKeyRef, configMapKeyRef and
    fieldRef. Raises ContainerConfigError with the kubelet's message for a
    missing non-optional source or key."""
    md = pod.get("metadata") or {}
    ns = md.get("namespace", "")
    env: dict[str, str] = {
        "PATH": os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOSTNAME": md.get("name", ""),
        "HOME": "/root",
    }

    def source(kind: str, name: str) -> JSON | None:
        res = SECRETS if kind == "Secret" else CONFIGMAPS
        return store.find(res, ns, name)

    def values(kind: str, obj: JSON) -> dict[str, str]:
        if kind == "Secret":
            return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (obj.get("data") or {}).items()}
        out = dict(obj.get("data") or {})
        for k, v in (obj.get("binaryData") or {}).items():
            out[k] = base64.b64decode(v).decode("utf-8", "replace")
        return out

    for ef in container.get("envFrom") or []:
        prefix = ef.get("prefix", "")
        for kind, key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
            ref = ef.get(key)
            if ref is None:
                continue
            obj = source(kind, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ContainerConfigError(f'{kind.lower()} "{ref.get("name", "")}" not found')
            for k, v in values(kind, obj).items():
                env[prefix + k] = v

    for e in container.get("env") or []:
        name = e["name"]
        if "valueFrom" not in e:
            env[name] = expand(str(e.get("value", "")), env)
            continue
        vf = e["valueFrom"]
        for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            ref = vf.get(key)
            if ref is None:
                continue
            obj = source(kind, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    break
                raise ContainerConfigError(f'{kind.lower()} "{ref.get("name", "")}" not found')
            vals = values(kind, obj)
            if ref["key"] not in vals:
                if ref.get("optional"):
                    break
                raise ContainerConfigError(f"couldn't find key {ref['key']} in {kind} {ns}/{ref.get('name', '')}")
            env[name] = vals[ref["key"]]
            break
        else:
            fr = vf.get("fieldRef")
            if fr is not None:
                env[name] = _field_ref(pod, str(fr.get("fieldPath", "")))
            elif vf.get("resourceFieldRef") is not None:
                env[name] = "0"
    return env


def _field_ref(pod: JSON, path: str) -> str:
    """Downward API fieldRef values (pkg/fieldpath)."""
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple: dict[str, Callable[[], str]] = {
        "metadata.name": lambda: md.get("name", ""),
        "metadata.namespace": lambda: md.get("namespace", ""),
        "metadata.uid": lambda: md.get("uid", ""),
        "spec.nodeName": lambda: spec.get("nodeName") or NODE_NAME,
        "spec.serviceAccountName": lambda: spec.get("serviceAccountName", "default"),
        "status.hostIP": lambda: "127.0.0.1",
        "status.podIP": lambda: "127.0.0.1",
    }
    if path in simple:
        return simple[path]()
    for prefix, key in (("metadata.labels['", "labels"), ("metadata.annotations['", "annotations")):
        if path.startswith(prefix) and path.endswith("']"):
            return str((md.get(key) or {}).get(path[len(prefix) : -2], ""))
    return ""


def record_event(
    store: ObjectStore,
    involved: JSON,
    type_: str,
    reason: str,
    message: str,
    component: str,
    field_path: str | None = None,
) -> None:
    """Store a core/v1 Event about ``involved`` ({kind, namespace, name, uid,
    apiVersion}), as the kubelet and controllers' event recorders do (name
    ``<object>.<hex>``, source.component, first/lastTimestamp, count 1)."""
    ref = dict(involved)
    if field_path:
        ref["fieldPath"] = field_path
    now = time.time()
    ev: JSON = {
        "metadata": {"name": f"{involved['name']}.{os.urandom(8).hex()}", "namespace": involved["namespace"]},
        "involvedObject": ref,
        "reason": reason,
        "message": message,
        "source": {"component": component} | ({"host": NODE_NAME} if component == "kubelet" else {}),
        "firstTimestamp": rfc3339(now),
        "lastTimestamp": rfc3339(now),
        "eventTime": None,
        "count": 1,
        "type": type_,
        "reportingComponent": component,
        "reportingInstance": NODE_NAME if component == "kubelet" else "",
    }
    try:
        store.create(EVENTS, involved["namespace"], store.prepare_new(EVENTS, involved["namespace"], ev))
    except ApiError:
        log.debug("event not recorded", reason=reason)
