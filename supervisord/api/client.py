"""The daemon API client: HTTP over the Unix socket (httpx), used by the CLI.

Every call has a timeout. Streams (logs, events, wait) use a read timeout of
three server heartbeats, so a daemon that dies mid-stream is noticed.
When no daemon answers, :meth:`Client.connect` starts one in the background
(unless ``JOBSUP_NO_AUTOSTART=1``), logging to ``<state dir>/daemon.log``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import httpcore
import httpx

from supervisord.api.wire import API_PREFIX, decode_error
from supervisord.exceptions import DaemonUnreachableError
from supervisord.ownership import UnsafePathError, check_private_dir, peer_cred
from supervisord.paths import Paths

__all__ = ["Client"]

_CALL_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
_STREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=20.0, write=10.0, pool=5.0)
_AUTOSTART_WAIT_S = 30.0
#: How long to keep trying a daemon whose process lives but does not answer
#: (it is stopping, or not ready yet).
_STOPPING_WAIT_S = 10.0


class Client:
    """A connection to the daemon at ``paths.socket``."""

    def __init__(self, paths: Paths | None = None) -> None:
        self.paths = paths or Paths.from_env()
        self._http = httpx.Client(
            transport=_checked_transport(self.paths.socket),
            base_url="http://jobsup" + API_PREFIX,
            timeout=_CALL_TIMEOUT,
        )

    #: The daemon's storage problem reported with the last :meth:`runs`
    #: (``{"kind", "message", "since", "waiting", "summary"}``), or None.
    storage: dict[str, Any] | None = None

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connection ----------------------------------------------------------

    def health(self) -> dict[str, Any] | None:
        """The daemon's health document, or None when nothing answers."""
        try:
            resp = self._http.get("/health", timeout=httpx.Timeout(5.0))
        except (httpx.TransportError, OSError):
            return None
        return resp.json() if resp.status_code == 200 else None

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
        logf = os.fdopen(fd, "ab")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "supervisord", "daemon"],
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
                    f" see {self.paths.daemon_log}:\n" + _tail(self.paths.daemon_log)
                )
            time.sleep(0.05)
        raise DaemonUnreachableError(
            f"a jobsup daemon was started but did not answer on {self.paths.socket} within "
            f"{_AUTOSTART_WAIT_S:.0f}s; see {self.paths.daemon_log}"
        )

    # -- calls ---------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except (httpx.TransportError, OSError) as err:
            raise DaemonUnreachableError(f"lost the jobsup daemon on {self.paths.socket}: {err}") from None
        body = _json(resp)
        if resp.status_code >= 400:
            raise decode_error(resp.status_code, body)
        return body

    def _stream(
        self, path: str, params: Mapping[str, Any] | list[tuple[str, Any]]
    ) -> Iterator[dict[str, Any]]:
        query = list(params.items()) if isinstance(params, Mapping) else params
        try:
            with self._http.stream("GET", path, params=query, timeout=_STREAM_TIMEOUT) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise decode_error(resp.status_code, _json(resp))
                yield from _ndjson(resp)
        except (httpx.TransportError, OSError) as err:
            raise DaemonUnreachableError(f"lost the jobsup daemon on {self.paths.socket}: {err}") from None

    def submit(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /runs``: ``{"run": Run, "warnings": [...]}``."""
        return dict(self._call("POST", "/runs", json=dict(body), timeout=httpx.Timeout(300.0, connect=5.0)))

    def runs(self, *, all: bool = False, project: str | None = None, phase: str | None = None) -> list[dict[str, Any]]:
        """``GET /runs``: the run objects, newest first."""
        params = {k: v for k, v in {"all": "1" if all else None, "project": project, "phase": phase}.items() if v}
        doc = self._call("GET", "/runs", params=params)
        self.storage = doc.get("storage")
        return list(doc["runs"])

    def show(self, ref: str) -> dict[str, Any]:
        """``GET /runs/{ref}``: ``{"run": Run, "submitted": {...}}``."""
        return dict(self._call("GET", f"/runs/{ref}"))

    def cancel(self, ref: str) -> dict[str, Any]:
        """``POST /runs/{ref}/cancel``: the run after cancel."""
        return dict(self._call("POST", f"/runs/{ref}/cancel", timeout=httpx.Timeout(120.0, connect=5.0))["run"])

    def logs(
        self, ref: str, *, follow: bool = False, tail: int | None = None, after_line: int = 0, format: str = "ndjson"
    ) -> Iterator[dict[str, Any]]:
        """Stream ``GET /runs/{ref}/logs`` as ``format`` ``ndjson`` (line
        objects) or ``blocks`` (``{"first_line", "last_line", "text"}``),
        with heartbeats and ``{"end": Run}`` when following."""
        params: dict[str, Any] = {"follow": "1" if follow else "0", "after_line": after_line, "format": format}
        if tail is not None:
            params["tail"] = tail
        return self._stream(f"/runs/{ref}/logs", params)

    def logs_text(
        self, ref: str, *, tail: int | None = None, after_line: int = 0, limit: int | None = None
    ) -> Iterator[bytes]:
        """``GET /runs/{ref}/logs`` as plain text: the stored lines (UTF-8,
        each ending with a newline) in chunks as they arrive."""
        params: dict[str, Any] = {"after_line": after_line, "format": "text"}
        if tail is not None:
            params["tail"] = tail
        if limit is not None:
            params["limit"] = limit
        try:
            with self._http.stream("GET", f"/runs/{ref}/logs", params=params, timeout=_STREAM_TIMEOUT) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise decode_error(resp.status_code, _json(resp))
                yield from resp.iter_raw()
        except (httpx.TransportError, OSError) as err:
            raise DaemonUnreachableError(f"lost the jobsup daemon on {self.paths.socket}: {err}") from None

    def wait(self, refs: list[str], *, for_: str = "terminal", after: int | None = None, timeout: float | None = None) -> Iterator[dict[str, Any]]:
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

    def queue(self) -> dict[str, Any]:
        """``GET /queue``: ``{"waiting": [...], "gpus": [...], "queues": [...]}``."""
        return dict(self._call("GET", "/queue"))

    def hold(self, ref: str) -> dict[str, Any]:
        """``POST /runs/{ref}/hold``: the run after the hold."""
        return dict(self._call("POST", f"/runs/{ref}/hold")["run"])

    def release(self, ref: str) -> dict[str, Any]:
        """``POST /runs/{ref}/release``: the run after the release."""
        return dict(self._call("POST", f"/runs/{ref}/release")["run"])

    def rerun(self, ref: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /runs/{ref}/rerun`` with ``{"env", "hold", "force"}``:
        ``{"run": Run, "rerun_of": id, "missing_env": [NAME]}``."""
        return dict(self._call("POST", f"/runs/{ref}/rerun", json=dict(body)))

    def ui(self, *, port: int | None = None, stop: bool = False) -> dict[str, Any]:
        """``POST /ui``: serve the web page (``{"url", "port"}``, the URL with
        a new one-time token) or, with ``stop``, switch it off (``{}``)."""
        body: dict[str, Any] = {"stop": True} if stop else ({"port": port} if port is not None else {})
        return dict(self._call("POST", "/ui", json=body))

    def doctor(self) -> list[dict[str, Any]]:
        """``GET /doctor``: the daemon's checks."""
        return list(self._call("GET", "/doctor", timeout=httpx.Timeout(120.0, connect=5.0))["checks"])

    def hooks(self) -> list[dict[str, Any]]:
        """``GET /hooks``: every hook with its checkpoint, lag and last outcome."""
        return list(self._call("GET", "/hooks")["hooks"])


class _CheckedUnixBackend(httpcore.SyncBackend):
    """httpcore's network backend, refusing a Unix socket jobsup must not
    trust before a byte is sent: its folder must belong to this user and be
    writable by nobody else (so no other user can have put the socket
    there), and the process listening on it must run as this user
    (``SO_PEERCRED``). Raises UnsafePathError naming the socket."""

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        folder = Path(path).parent
        try:
            check_private_dir(folder, what="socket folder", fix=f"refusing to send anything to {path}")
        except FileNotFoundError:
            raise httpcore.ConnectError(f"no socket folder {folder}") from None
        stream = super().connect_unix_socket(path, timeout, socket_options)
        sock = stream.get_extra_info("socket")
        cred = peer_cred(sock)
        if cred.uid != os.getuid():
            stream.close()
            raise UnsafePathError(
                f"the process answering on {path} (pid {cred.pid}) runs as uid {cred.uid}, not as you "
                f"(uid {os.getuid()}); refusing to send anything to it"
            )
        return stream


def _checked_transport(socket_path: Path) -> httpx.HTTPTransport:
    """httpx's transport over ``socket_path`` whose connections go through
    :class:`_CheckedUnixBackend` (httpx has no parameter for a network
    backend: its connection pool is built again with one)."""
    transport = httpx.HTTPTransport(uds=str(socket_path))
    transport._pool = httpcore.ConnectionPool(uds=str(socket_path), network_backend=_CheckedUnixBackend())
    return transport


def _ndjson(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    """The objects of a newline-delimited JSON body, as they arrive.

    Lines end at ``\n`` only. ``Response.iter_lines`` would also end them
    at U+2028, U+2029 and U+0085 (it follows ``str.splitlines``), which
    JSON leaves unescaped inside strings: a log line holding one of them
    would cut its object in two. Raises ValueError on a line that is not
    JSON."""
    pending = b""
    for chunk in resp.iter_bytes():
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return {"error": {"type": "JobsupError", "message": resp.text[:500]}}


def _tail(path: Any, n: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            lines = f.read()[-8192:].decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


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
