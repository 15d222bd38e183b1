"""The daemon API client: HTTP/1.1 over the Unix socket, used by the CLI.

Every call has a timeout. Streams (logs, events, wait) use a read timeout of
three server heartbeats, so a daemon that dies mid-stream is noticed.
When no daemon answers, :meth:`Client.connect` starts one in the background
(unless ``JOBSUP_NO_AUTOSTART=1``), logging to ``<state dir>/daemon.log``,
with a clean environment (:mod:`supervisord.client.daemonenv`).

Why not httpx (nor :mod:`http.client`): every CLI command is a new
process, and what it imports is paid on every call by the scripts and
agents that drive jobsup (target: 100 ms for ``jobsup runs``). The
transport is :mod:`supervisord.client.transport`, the little of HTTP/1.1 one
local socket needs, on the standard library's :mod:`socket`. The daemon
side uses starlette and uvicorn.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from supervisord.client.transport import Response, UnixConnection, quote_path, urlencode
from supervisord.shared.exceptions import DaemonUnreachableError
from supervisord.shared.paths import Paths
from supervisord.shared.wire import API_PREFIX, from_wire, raise_error_record

__all__ = ["Client"]

#: Seconds: to connect, to wait for a call's answer, between two reads of a stream.
_CONNECT_TIMEOUT_S = 5.0
_CALL_TIMEOUT_S = 60.0
_STREAM_TIMEOUT_S = 20.0
_AUTOSTART_WAIT_S = 30.0
#: How long to keep trying a daemon whose process lives but does not answer
#: (it is stopping, or not ready yet).
_STOPPING_WAIT_S = 10.0
#: Errors that mean the daemon is not (or no longer) there.
_TRANSPORT_ERRORS = (OSError,)


class Client:
    """A connection to the daemon at ``paths.socket``: one request at a
    time, a fresh socket for each (connecting to a local socket costs tens
    of microseconds)."""

    def __init__(self, paths: Paths | None = None) -> None:
        self.paths = paths or Paths.from_env()

    #: The daemon's storage problem reported with the last :meth:`runs`
    #: (``{"kind", "message", "since", "waiting", "summary"}``), or None.
    storage: dict[str, Any] | None = None
    #: The running local runs whose output waits for space, reported with
    #: the last :meth:`runs` (``{"kind", "where", "runs", "summary"}``), or None.
    output: dict[str, Any] | None = None

    def close(self) -> None:
        """Nothing to release between calls (kept for ``with`` and callers)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connection ----------------------------------------------------------

    def health(self) -> dict[str, Any] | None:
        """The daemon's health document, or None when nothing answers."""
        try:
            status, body = self._request("GET", "/health", timeout=5.0)
        except _TRANSPORT_ERRORS:
            return None
        return body if status == 200 and isinstance(body, dict) else None

    def connect(self, *, autostart: bool | None = None) -> dict[str, Any]:
        """Make sure a daemon answers; start one when allowed.

        Raises DaemonUnreachableError (naming the socket, and the daemon
        log when a started daemon failed).
        """
        info = self.health()
        if info is None:
            info = self._wait_for_live_daemon()
        if info is not None:
            return info
        if autostart is None:
            autostart = os.environ.get("JOBSUP_NO_AUTOSTART", "") not in ("1", "true", "yes")
        if not autostart:
            raise DaemonUnreachableError(
                f"no jobsup daemon answers on {self.paths.socket} (JOBSUP_NO_AUTOSTART is set: "
                "start one with `jobsup daemon` or `systemctl --user start jobsup`)"
            )
        return self._start_daemon()

    def live_daemon_pid(self) -> int | None:
        """The pid of a live daemon on this state dir (the pid it wrote in
        ``daemon.lock``, if that process exists), else None."""
        try:
            pid = int(self.paths.state_dir.joinpath("daemon.lock").read_text().strip() or 0)
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        # The pid may have been reused since that daemon exited.
        return pid if b"daemon" in cmdline else None

    def _wait_for_live_daemon(self) -> dict[str, Any] | None:
        """Nothing answers, but a daemon may be stopping (or still starting):
        while its process lives, try again for up to :data:`_STOPPING_WAIT_S`.
        Returns its health once it answers, None once no daemon process is
        left (the caller may start one). Raises DaemonUnreachableError when
        the daemon process lives on without its socket file."""
        deadline = time.monotonic() + _STOPPING_WAIT_S
        while True:
            pid = self.live_daemon_pid()
            if pid is None:
                return None
            info = self.health()
            if info is not None:
                return info
            if time.monotonic() > deadline:
                if not self.paths.socket.exists():
                    raise DaemonUnreachableError(
                        f"daemon pid {pid} lost its socket {self.paths.socket} (was the file deleted?); "
                        f"restart it: `kill {pid}` (runs keep going), then any jobsup command starts a new one"
                    )
                return None
            time.sleep(0.1)

    def _start_daemon(self) -> dict[str, Any]:
        self.paths.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The daemon's log may hold paths and errors of private runs: 0600,
        # also when an older jobsup left it readable by others.
        fd = os.open(self.paths.daemon_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)
        log_start = os.fstat(fd).st_size  # what this daemon writes comes after: a failure shows only that
        logf = os.fdopen(fd, "ab")
        import subprocess  # here: only a command that starts a daemon pays for it

        from supervisord.client.daemonenv import daemon_env

        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "supervisord", "daemon"],
                # A clean environment: never the first shell's variables.
                env=daemon_env(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            logf.close()
        deadline = time.monotonic() + _AUTOSTART_WAIT_S
        while time.monotonic() < deadline:
            info = self.health()
            if info is not None:
                print(f"started jobsup daemon (pid {info.get('pid')}, log {self.paths.daemon_log})", file=sys.stderr)
                return info
            if proc.poll() is not None:
                # It may have lost a race with another daemon that now answers.
                info = self.health()
                if info is not None:
                    return info
                raise DaemonUnreachableError(
                    f"the jobsup daemon failed to start (exit {proc.returncode}){_disk_full(self.paths.state_dir)};"
                    f" see {self.paths.daemon_log}:\n" + _tail(self.paths.daemon_log, log_start)
                )
            time.sleep(0.05)
        raise DaemonUnreachableError(
            f"a jobsup daemon was started but did not answer on {self.paths.socket} within "
            f"{_AUTOSTART_WAIT_S:.0f}s; see {self.paths.daemon_log}"
        )

    # -- calls ---------------------------------------------------------------

    def _open(
        self, method: str, path: str, *, query: Any = None, json_body: Any = None, timeout: float = _CALL_TIMEOUT_S
    ) -> tuple[UnixConnection, Response]:
        """Send one request to ``API_PREFIX + path`` and return the
        connection and its response (headers read, body not). Raises
        OSError, or UnsafePathError for a socket not to be trusted."""
        url = quote_path(API_PREFIX + path) + (f"?{urlencode(query)}" if query else "")
        headers = {"Host": "jobsup", "Accept": "application/json"}
        payload = None
        if json_body is not None:
            payload = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        conn = UnixConnection(str(self.paths.socket), timeout=timeout, connect_timeout=_CONNECT_TIMEOUT_S)
        try:
            return conn, conn.request(method, url, body=payload, headers=headers)
        except BaseException:
            conn.close()
            raise

    def _request(
        self, method: str, path: str, *, query: Any = None, json_body: Any = None, timeout: float = _CALL_TIMEOUT_S
    ) -> tuple[int, Any]:
        """``(status, parsed JSON body)`` of one call."""
        conn, resp = self._open(method, path, query=query, json_body=json_body, timeout=timeout)
        try:
            return resp.status, _json(resp.read())
        finally:
            conn.close()

    def _call(
        self, method: str, path: str, *, query: Any = None, json_body: Any = None, timeout: float = _CALL_TIMEOUT_S
    ) -> Any:
        try:
            status, body = self._request(method, path, query=query, json_body=json_body, timeout=timeout)
        except _TRANSPORT_ERRORS as err:
            raise DaemonUnreachableError(f"lost the jobsup daemon on {self.paths.socket}: {err}") from None
        if status >= 400:
            raise from_wire(status, body)
        return body

    def _stream(self, path: str, params: Mapping[str, Any] | list[tuple[str, Any]]) -> Iterator[dict[str, Any]]:
        query = list(params.items()) if isinstance(params, Mapping) else params
        try:
            conn, resp = self._open("GET", path, query=query, timeout=_STREAM_TIMEOUT_S)
            try:
                if resp.status >= 400:
                    raise from_wire(resp.status, _json(resp.read()))
                yield from _ndjson(resp)
            finally:
                conn.close()
        except _TRANSPORT_ERRORS as err:
            raise DaemonUnreachableError(f"lost the jobsup daemon on {self.paths.socket}: {err}") from None

    def submit(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /runs``: ``{"run": Run, "warnings": [...]}``."""
        return dict(self._call("POST", "/runs", json_body=dict(body), timeout=300.0))

    def runs(
        self,
        *,
        all: bool = False,
        project: str | None = None,
        phase: str | None = None,
        labels: Mapping[str, str] | None = None,
        name: str | None = None,
        sweep: str | None = None,
    ) -> list[dict[str, Any]]:
        """``GET /runs``: the run objects, newest first (filtered by
        ``labels``, a ``name`` glob, a ``sweep``)."""
        given = {"all": "1" if all else None, "project": project, "phase": phase, "name": name, "sweep": sweep}
        params: list[tuple[str, Any]] = [(k, v) for k, v in given.items() if v]
        params += [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        doc = self._call("GET", "/runs", query=params)
        self.storage = doc.get("storage")
        self.output = doc.get("output")
        return list(doc["runs"])

    def sweep(self, ref: str, *, runs: bool = False) -> dict[str, Any]:
        """``GET /sweeps/{ref}``: the sweep document (supervisord.daemon.sweepread)."""
        return dict(self._call("GET", f"/sweeps/{ref}", query={"runs": "1"} if runs else None))

    def cancel_sweep(self, ref: str) -> list[dict[str, Any]]:
        """``POST /sweeps/{ref}/cancel``: every run of the sweep after cancel."""
        return list(self._call("POST", f"/sweeps/{ref}/cancel", timeout=600.0)["runs"])

    def cancel_many(self, refs: list[str]) -> list[dict[str, Any]]:
        """``POST /cancel``: the runs of ``refs`` (run ids, prefixes, sweep
        ids) after cancel, each once, canceled together. Raises UsageError
        naming every ref that names no run (nothing canceled)."""
        return list(self._call("POST", "/cancel", json_body={"runs": list(refs)}, timeout=600.0)["runs"])

    def show(self, ref: str) -> dict[str, Any]:
        """``GET /runs/{ref}``: ``{"run": Run, "submitted": {...}}``."""
        return dict(self._call("GET", f"/runs/{ref}"))

    def cancel(self, ref: str) -> dict[str, Any]:
        """``POST /runs/{ref}/cancel``: the run after cancel."""
        return dict(self._call("POST", f"/runs/{ref}/cancel", timeout=120.0)["run"])

    def logs(
        self,
        ref: str,
        *,
        follow: bool = False,
        tail: int | None = None,
        after_line: int = 0,
        format: str = "ndjson",
        attempt: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Stream ``GET /runs/{ref}/logs`` as ``format`` ``ndjson`` (line
        objects) or ``blocks`` (``{"first_line", "last_line", "text"}``),
        with heartbeats and ``{"end": Run}`` when following; ``attempt``:
        only that attempt's lines (a retried run)."""
        params: dict[str, Any] = {"follow": "1" if follow else "0", "after_line": after_line, "format": format}
        if tail is not None:
            params["tail"] = tail
        if attempt is not None:
            params["attempt"] = attempt
        return self._stream(f"/runs/{ref}/logs", params)

    def logs_text(
        self,
        ref: str,
        *,
        tail: int | None = None,
        after_line: int = 0,
        limit: int | None = None,
        attempt: int | None = None,
    ) -> Iterator[bytes]:
        """``GET /runs/{ref}/logs`` as plain text: the stored lines (UTF-8,
        each ending with a newline) in chunks as they arrive.

        Plain text has no room for an error record: a daemon whose read
        fails after the first bytes cuts the body off. Then this asks the
        daemon once more for the lines after the last whole line received
        (``format=blocks``): the daemon's error, when it has one there, is
        raised (LogsDamagedError, StorageError...); DaemonUnreachableError
        when it is gone or answers."""
        params: dict[str, Any] = {"after_line": after_line, "format": "text"}
        if tail is not None:
            params["tail"] = tail
        if limit is not None:
            params["limit"] = limit
        if attempt is not None:
            params["attempt"] = attempt
        query = list(params.items())
        cursor: int | None = None  # the last whole line received, once the body started
        try:
            conn, resp = self._open("GET", f"/runs/{ref}/logs", query=query, timeout=_STREAM_TIMEOUT_S)
            try:
                if resp.status >= 400:
                    raise from_wire(resp.status, _json(resp.read()))
                first = resp.headers.get("x-jobsup-first-line", "")
                cursor = int(first) - 1 if first.isdigit() and int(first) > 0 else None
                while True:
                    chunk = resp.read1(1 << 20)
                    if not chunk:
                        break
                    if cursor is not None:
                        cursor += chunk.count(b"\n")
                    yield chunk
            finally:
                conn.close()
        except _TRANSPORT_ERRORS as err:
            lost = DaemonUnreachableError(f"lost the jobsup daemon on {self.paths.socket}: {err}")
            if cursor is not None:
                self._raise_stream_error(ref, cursor, lost)
            raise lost from None

    def _raise_stream_error(self, ref: str, cursor: int, lost: DaemonUnreachableError) -> None:
        """Ask for the log lines of ``ref`` after ``cursor`` (one block) and
        raise the daemon's error for them, if any; return when it has none."""
        try:
            for _ in self._stream(f"/runs/{ref}/logs", {"after_line": cursor, "format": "blocks", "limit": 1}):
                pass
        except DaemonUnreachableError:
            raise lost from None

    def wait(
        self, refs: list[str], *, for_: str = "terminal", after: int | None = None, timeout: float | None = None
    ) -> Iterator[dict[str, Any]]:
        """Stream ``GET /wait``: heartbeats, then ``{"result": ...}``."""
        params: list[tuple[str, Any]] = [("run", r) for r in refs] + [("for", for_)]
        if after is not None:
            params.append(("after", after))
        if timeout is not None:
            params.append(("timeout", timeout))
        return self._stream("/wait", params)

    def events(self, *, run: str | None = None, after: int = 0, follow: bool = False) -> Iterator[dict[str, Any]]:
        """Stream ``GET /events``: recorded events oldest first (and heartbeats when following)."""
        params: dict[str, Any] = {"after": after, "follow": "1" if follow else "0"}
        if run:
            params["run"] = run
        return self._stream("/events", params)

    def outputs(self, ref: str) -> dict[str, Any]:
        """``GET /runs/{ref}/outputs``: the run's outputs folder and, once
        recorded, its files (supervisord.daemon.outputs.query)."""
        return dict(self._call("GET", f"/runs/{ref}/outputs"))

    def which(self, digests: Sequence[str]) -> dict[str, Any]:
        """``POST /which`` with ``{"sha256": [HEX...]}``: the recorded output
        files with each digest (supervisord.daemon.outputs.query)."""
        return dict(self._call("POST", "/which", json_body={"sha256": list(digests)}))

    def queue(self) -> dict[str, Any]:
        """``GET /queue``: ``{"waiting": [...], "gpus": [...], "queues": [...]}``."""
        return dict(self._call("GET", "/queue"))

    def top(self) -> dict[str, Any]:
        """``GET /top``: the running local runs' usage now (``jobsup top``)."""
        return dict(self._call("GET", "/top"))

    def hold(self, ref: str) -> dict[str, Any]:
        """``POST /runs/{ref}/hold``: the run after the hold."""
        return dict(self.hold_or_release("hold", ref)["run"])

    def release(self, ref: str) -> dict[str, Any]:
        """``POST /runs/{ref}/release``: the run after the release."""
        return dict(self.hold_or_release("release", ref)["run"])

    def hold_or_release(self, action: str, ref: str) -> dict[str, Any]:
        """``POST /runs/{ref}/hold`` or ``/release`` (``action``): ``{"run":
        the run after it, "warnings": [str]}``, the warnings only when
        nothing changed (already held / not held)."""
        if action not in ("hold", "release"):
            raise ValueError(f"action must be hold or release, got {action!r}")
        return dict(self._call("POST", f"/runs/{ref}/{action}"))

    def queue_set(self, name: str, max_parallel: int | None, *, from_config: bool = False) -> dict[str, Any]:
        """``POST /queues/{name}``: ``{"queue": its row of the queue view, "new": bool}``."""
        body: dict[str, Any] = {"from_config": True} if from_config else {"max_parallel": max_parallel}
        return dict(self._call("POST", f"/queues/{name}", json_body=body))

    def update(self, refs: list[str], changes: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /update`` (``changes``: priority, gpus, queue, timeout):
        ``{"runs": [Run], "updated": {id: {"old", "new"}}}``."""
        return dict(self._call("POST", "/update", json_body={"runs": list(refs), **dict(changes)}))

    def pause(self, ref: str) -> dict[str, Any]:
        """``POST /runs/{ref}/pause``: the run after the pause."""
        return dict(self._call("POST", f"/runs/{ref}/pause")["run"])

    def resume(self, ref: str) -> dict[str, Any]:
        """``POST /runs/{ref}/resume``: the run after the resume."""
        return dict(self._call("POST", f"/runs/{ref}/resume")["run"])

    def rerun(self, ref: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /runs/{ref}/rerun`` with ``{"env", "hold", "force"}``:
        ``{"run": Run, "rerun_of": id, "missing_env": [NAME]}``."""
        return dict(self._call("POST", f"/runs/{ref}/rerun", json_body=dict(body)))

    def ui(self, *, port: int | None = None, stop: bool = False) -> dict[str, Any]:
        """``POST /ui``: serve the web page (``{"url", "port"}``, the URL with
        a new one-time token) or, with ``stop``, switch it off (``{}``)."""
        body: dict[str, Any] = {"stop": True} if stop else ({"port": port} if port is not None else {})
        return dict(self._call("POST", "/ui", json_body=body))

    def doctor(self) -> list[dict[str, Any]]:
        """``GET /doctor``: the daemon's checks."""
        return list(self._call("GET", "/doctor", timeout=120.0)["checks"])

    def prune(
        self, *, older_than: str, dry_run: bool = False, delete_archives: bool = False, run_dirs: bool = False
    ) -> dict[str, Any]:
        """``POST /prune``: one retention pass now; the report of
        :meth:`supervisord.daemon.retention.Retention.prune`."""
        body = {"older_than": older_than, "dry_run": dry_run, "delete_archives": delete_archives, "run_dirs": run_dirs}
        return dict(self._call("POST", "/prune", json_body=body, timeout=3600.0))

    def hooks(self) -> list[dict[str, Any]]:
        """``GET /hooks``: every hook with its checkpoint, lag and last outcome."""
        return list(self.hooks_doc()["hooks"])

    def hooks_doc(self) -> dict[str, Any]:
        """``GET /hooks``: ``{"hooks": [...], "config_changed": [str]}``."""
        return dict(self._call("GET", "/hooks"))

    def daemon_control(self, action: str, *, restart: bool = False) -> dict[str, Any]:
        """``POST /daemon/{action}`` (``stop``, with ``restart``; ``reload``)."""
        return dict(self._call("POST", f"/daemon/{action}", json_body={"restart": restart}, timeout=120.0))


def _ndjson(resp: Response) -> Iterator[dict[str, Any]]:
    """The objects of a newline-delimited JSON body, as they arrive.

    Lines end at ``\n`` only (``readline`` on bytes), never at U+2028,
    U+2029 or U+0085, which JSON leaves unescaped inside strings. Raises
    ValueError on a line that is not JSON, and the daemon's error when the
    stream ends with an error record (:func:`~supervisord.shared.wire.raise_error_record`)."""
    while True:
        line = resp.readline()
        if not line:
            return
        if line.strip():
            obj = json.loads(line)
            raise_error_record(obj)
            yield obj


def _json(raw: bytes) -> Any:
    """The parsed body; its text when it is not JSON (from_wire then makes a
    RemoteError naming the HTTP status)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")[:500]


def _tail(path: Any, start: int, n: int = 15) -> str:
    """The last ``n`` lines (of the last 8 KiB) that ``path`` holds past
    byte ``start``: what the daemon that just failed wrote, not the lines
    of earlier daemons before it (or a note that it wrote nothing)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(start, os.fstat(f.fileno()).st_size - 8192))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:]) if lines else "(it wrote nothing to its log)"


def _disk_full(folder: Any) -> str:
    """``": the disk holding FOLDER is full ..."`` when its file system has
    no free space (the daemon's own log, on that disk, may then be empty)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return ""
    if st.f_bavail * st.f_frsize < 64 * 1024:
        return f": the disk holding {folder} is full (free some space; the daemon could not write its log)"
    return ""
