"""Fault-injection knobs of the simulated cluster.

Every knob is a small method on :class:`Faults`, safe to call from the test's
thread; the simulator's event loop reads the fields and is woken through
``notify`` when a knob that pods wait on changes (scheduling).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .util import SimError


@dataclass
class RequestFailure:
    """Answer ``status`` (500 or 429) to matching API requests: ``remaining``
    requests (None: unlimited) until ``until`` (Unix seconds; None: no end).
    ``path_contains`` limits it to URLs containing that text; ``methods`` to
    those HTTP methods (upper case); the first ``skip`` matching requests
    pass untouched (e.g. a dry run before the create that should fail)."""

    status: int
    remaining: int | None
    until: float | None
    path_contains: str | None
    methods: frozenset[str] | None
    retry_after_s: int
    skip: int = 0


@dataclass
class LogStreamFault:
    """Stall (``mode="stall"``: the stream stays open and sends nothing more),
    cut (``mode="cut"``: the connection is aborted mid-body) or end
    (``mode="end"``: the body ends cleanly, as an idle or server timeout ends
    a follow while the container still runs) a pods/log stream
    after ``after_lines`` lines, for the next ``remaining`` matching requests
    (None: every one until cleared). ``pod`` limits it to one pod name."""

    mode: Literal["stall", "cut", "end"]
    after_lines: int
    pod: str | None
    remaining: int | None


class Faults:
    """The fault knobs. Create through :class:`~tests.k8s_sim.SimCluster`
    (``sim.faults``); every method may be called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.notify: Callable[[], None] = lambda: None
        """Set by the cluster: wakes the kubelet after a scheduling knob changes."""
        self.request_failures: list[RequestFailure] = []
        self.log_faults: list[LogStreamFault] = []
        self.exec_empty_status = False
        """When true, exec sessions end without a message on the status channel
        (channel 3), as a broken proxy would."""
        self.unschedulable_pods: str | None = None
        """None: pods schedule. "" : every new pod stays Pending/Unschedulable;
        else only pods whose name starts with this prefix."""
        self.schedule_delay_s = 0.0
        """Seconds a new pod stays Pending without a node before it is bound."""
        self.start_delay_s = 0.0
        """Seconds a bound pod's containers stay waiting in ContainerCreating."""

    # ------------------------------------------------------------ API errors

    def fail_requests(
        self,
        status: int = 500,
        *,
        count: int | None = None,
        seconds: float | None = None,
        path_contains: str | None = None,
        methods: tuple[str, ...] | None = None,
        retry_after_s: int = 1,
        skip: int = 0,
    ) -> None:
        """Answer ``status`` (500 InternalError or 429 TooManyRequests with
        ``Retry-After``) to the next ``count`` matching requests and/or for
        ``seconds``; with neither, until :meth:`clear_request_failures`.
        The first ``skip`` matching requests are let through first.

        Raises SimError when ``status`` is not 500 or 429 or a bound is negative.
        """
        if status not in (429, 500):
            raise SimError(f"fail_requests: status must be 429 or 500, not {status}")
        if (count is not None and count < 0) or (seconds is not None and seconds < 0) or skip < 0:
            raise SimError("fail_requests: count, seconds and skip must be >= 0")
        with self._lock:
            self.request_failures.append(
                RequestFailure(
                    status=status,
                    remaining=count,
                    until=None if seconds is None else time.time() + seconds,
                    path_contains=path_contains,
                    methods=None if methods is None else frozenset(m.upper() for m in methods),
                    retry_after_s=retry_after_s,
                    skip=skip,
                )
            )

    def clear_request_failures(self) -> None:
        """Stop failing API requests."""
        with self._lock:
            self.request_failures.clear()

    def take_request_failure(self, method: str, path: str) -> RequestFailure | None:
        """The failure to answer this request with, if any (consumes one count)."""
        now = time.time()
        with self._lock:
            for f in list(self.request_failures):
                if f.until is not None and now >= f.until:
                    self.request_failures.remove(f)
                    continue
                if f.path_contains is not None and f.path_contains not in path:
                    continue
                if f.methods is not None and method.upper() not in f.methods:
                    continue
                if f.skip > 0:
                    f.skip -= 1
                    continue
                if f.remaining is not None:
                    if f.remaining <= 0:
                        self.request_failures.remove(f)
                        continue
                    f.remaining -= 1
                    if f.remaining == 0:
                        self.request_failures.remove(f)
                return f
        return None

    # ------------------------------------------------------------------- logs

    def stall_logs(self, after_lines: int, *, pod: str | None = None, count: int | None = 1) -> None:
        """The next ``count`` pods/log streams (of ``pod`` when given) send
        ``after_lines`` lines and then nothing, keeping the connection open."""
        self._add_log_fault("stall", after_lines, pod, count)

    def cut_logs(self, after_lines: int, *, pod: str | None = None, count: int | None = 1) -> None:
        """The next ``count`` pods/log streams (of ``pod`` when given) are aborted
        (connection closed mid-body) after ``after_lines`` lines."""
        self._add_log_fault("cut", after_lines, pod, count)

    def end_logs(self, after_lines: int, *, pod: str | None = None, count: int | None = 1) -> None:
        """The next ``count`` pods/log streams (of ``pod`` when given) end
        cleanly (a complete chunked body, no error) after ``after_lines``
        lines although the container still runs: what the kubelet's or a
        proxy's idle/stream timeout does to a ``follow=true`` request."""
        self._add_log_fault("end", after_lines, pod, count)

    def clear_log_faults(self) -> None:
        """Log streams behave again."""
        with self._lock:
            self.log_faults.clear()

    def _add_log_fault(
        self, mode: Literal["stall", "cut", "end"], after_lines: int, pod: str | None, count: int | None
    ) -> None:
        if after_lines < 0:
            raise SimError(f"{mode}_logs: after_lines must be >= 0, not {after_lines}")
        with self._lock:
            self.log_faults.append(LogStreamFault(mode, after_lines, pod, count))

    def take_log_fault(self, pod: str) -> LogStreamFault | None:
        """The fault for a new log stream of ``pod``, if any (consumes one count)."""
        with self._lock:
            for f in list(self.log_faults):
                if f.pod is not None and f.pod != pod:
                    continue
                if f.remaining is not None:
                    f.remaining -= 1
                    if f.remaining <= 0:
                        self.log_faults.remove(f)
                return f
        return None

    # ------------------------------------------------------------ scheduling

    def set_unschedulable(self, pod_prefix: str | None = "") -> None:
        """New pods (all with ``""``, or those whose name starts with
        ``pod_prefix``) stay Pending with PodScheduled=False reason
        Unschedulable; ``None`` lets them (and the waiting ones) schedule."""
        self.unschedulable_pods = pod_prefix
        self.notify()

    def set_schedule_delay(self, seconds: float) -> None:
        """New pods wait ``seconds`` Pending without a node before binding."""
        if seconds < 0:
            raise SimError(f"set_schedule_delay: seconds must be >= 0, not {seconds}")
        self.schedule_delay_s = seconds

    def set_start_delay(self, seconds: float) -> None:
        """Bound pods' containers wait ``seconds`` in ContainerCreating."""
        if seconds < 0:
            raise SimError(f"set_start_delay: seconds must be >= 0, not {seconds}")
        self.start_delay_s = seconds

    def set_exec_empty_status(self, on: bool = True) -> None:
        """Exec sessions end without a status-channel message (see
        :attr:`exec_empty_status`)."""
        self.exec_empty_status = on

    def is_unschedulable(self, pod_name: str) -> bool:
        """Whether a pod of this name may not be bound now."""
        prefix = self.unschedulable_pods
        return prefix is not None and pod_name.startswith(prefix)
