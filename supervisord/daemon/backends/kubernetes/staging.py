"""Staging the source snapshot into the pod through the exec API (jobsup
docs/kubernetes.md, "What a submit does").

Two exec sessions on the script container, each judged only by the exec
status channel:

1. **upload**: ``sh -c`` reads exactly the snapshot's byte count from stdin
   with ``head -c N`` into ``source.tar.part`` (so it ends even where stdin
   cannot be closed: the ``v4.channel.k8s.io`` protocol has no half-close),
   then checks the size (``wc -c``) and the sha256 (``sha256sum``) there;
2. **commit**, only after the upload's status said ``Success``: moves the
   file to ``source.tar`` and creates ``source.tar.ready``, which the gated
   script waits for (:mod:`.script`).

The exec protocol is the API server's WebSocket remotecommand protocol
(``v5.channel.k8s.io``, else ``v4.channel.k8s.io``; k8s.io/apimachinery
wsstream): binary frames whose first byte is the channel — 0 stdin, 1
stdout, 2 stderr, 3 status (a ``metav1.Status``), 255 close (v5). A session
whose status channel is empty or does not hold a ``Status`` is a failure,
never a success. The image needs ``sh``, ``head``, ``wc``, ``sha256sum``,
``mv`` and ``touch`` (coreutils or busybox), as well as ``bash`` and ``tar``
for the script.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisord.daemon.backends.kubernetes.client.access import Cluster
from supervisord.shared.exceptions import StagingError
from supervisord.shared.manifest.script import READY_MARKER, SOURCE_TAR, STAGING_DIR

__all__ = [
    "COMMIT_SCRIPT",
    "UPLOAD_SCRIPT",
    "ExecResult",
    "StagingError",
    "exec_command",
    "stage_source",
    "upload_timeout_s",
]

_CHUNK = 64 * 1024
_KEEP_OUTPUT = 64 * 1024
_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")

_DIR = f'd="${{JOBSUP_STAGING_DIR:-{STAGING_DIR}}}"'

#: argv[1]: byte count, argv[2]: sha256 hex. Exit 3: short upload, 4: digest mismatch.
UPLOAD_SCRIPT = "\n".join(
    [
        "set -eu",
        _DIR,
        'mkdir -p "$d"',
        f'head -c "$1" > "$d/{SOURCE_TAR}.part"',
        f'n=$(wc -c < "$d/{SOURCE_TAR}.part" | tr -d " ")',
        'if [ "$n" != "$1" ]; then echo "jobsup: received $n of $1 bytes" >&2; exit 3; fi',
        f'sum=$(sha256sum "$d/{SOURCE_TAR}.part" | cut -d" " -f1)',
        'if [ "$sum" != "$2" ]; then echo "jobsup: sha256 of the upload is $sum, expected $2" >&2; exit 4; fi',
        "echo verified",
    ]
)

#: Exit 5: nothing verified to commit.
COMMIT_SCRIPT = "\n".join(
    [
        "set -eu",
        _DIR,
        f'[ -f "$d/{SOURCE_TAR}.part" ] || {{ echo "jobsup: no verified upload to commit" >&2; exit 5; }}',
        f'mv -f "$d/{SOURCE_TAR}.part" "$d/{SOURCE_TAR}"',
        f'touch "$d/{READY_MARKER}"',
        "echo ready",
    ]
)


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """One exec session's outcome: the parsed status channel (None when it
    was empty or not a ``Status``), stdout and stderr (first 64 KiB each),
    and the raw status text."""

    status: Mapping[str, Any] | None
    stdout: bytes
    stderr: bytes
    raw_status: bytes

    @property
    def success(self) -> bool:
        """True only for an explicit ``{"status": "Success"}``."""
        return self.status is not None and self.status.get("status") == "Success"

    def describe(self) -> str:
        """Why it is not a success, in one line."""
        err = self.stderr.decode("utf-8", "replace").strip()
        if self.status is None:
            what = (
                "the exec status channel was empty (the session ended without a result)"
                if not self.raw_status.strip()
                else f"the exec status channel held no Status: {self.raw_status[:200].decode('utf-8', 'replace')!r}"
            )
        elif self.status.get("status") == "Success":
            return "success"
        else:
            what = str(self.status.get("message") or self.status.get("reason") or self.status)
        return what + (f"; stderr: {err[-500:]}" if err else "")


def exec_command(
    cluster: Cluster,
    namespace: str,
    pod: str,
    container: str,
    command: Sequence[str],
    *,
    stdin: Path | None = None,
    timeout_s: float,
) -> ExecResult:
    """Run ``command`` in ``container`` of ``pod`` through ``pods/exec``
    (blocking; call it in a worker thread) and return its
    :class:`ExecResult`. ``stdin``: a file whose bytes are sent as stdin.
    The whole session is bounded by ``timeout_s`` seconds.

    Raises StagingError when the session cannot be opened (the API's
    answer is in the message) or times out.
    """
    import websocket

    deadline = time.monotonic() + timeout_s
    url, options, sslopt = _exec_session(cluster, namespace, pod, container, command, stdin, timeout_s)
    ws: Any = websocket.WebSocket(sslopt=sslopt, skip_utf8_validation=True)
    try:
        try:
            ws.connect(url, **options)
        except websocket.WebSocketBadStatusException as exc:
            body = getattr(exc, "resp_body", b"") or b""
            detail = _status_message(body) or str(exc)
            raise StagingError(f"exec into pod {pod}: {detail}") from None
        except (websocket.WebSocketException, OSError) as exc:
            raise StagingError(f"exec into pod {pod}: cannot connect ({type(exc).__name__}: {exc})") from None
        if stdin is not None:
            _send_stdin(ws, stdin, deadline, ws.getsubprotocol() or "v4.channel.k8s.io")
        out, err, status = _receive_channels(ws, pod, deadline, timeout_s)
    finally:
        try:
            ws.close(timeout=1)
        except Exception:  # noqa: BLE001 - the session is over either way; the close handshake is a courtesy
            ws.shutdown()
    return ExecResult(_parse_status(status), out, err, status)


def _exec_session(
    cluster: Cluster,
    namespace: str,
    pod: str,
    container: str,
    command: Sequence[str],
    stdin: Path | None,
    timeout_s: float,
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(the ``ws(s)://`` URL of the exec, the connect options: auth and
    subprotocol headers, timeout, proxy; the TLS options) for
    :func:`exec_command`."""
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/exec"
    query: list[tuple[str, Any]] = [("command", c) for c in command]
    query += [("container", container), ("stdin", "true" if stdin else "false"), ("stdout", "true"), ("stderr", "true")]
    _method, url, headers, _body, _post = cluster.api_client.param_serialize(
        "GET", path, query_params=query, header_params={}, auth_settings=["BearerToken"]
    )
    if url.startswith("https://"):
        url = "wss://" + url[len("https://") :]
    elif url.startswith("http://"):
        url = "ws://" + url[len("http://") :]
    header = [f"{k}: {v}" for k, v in headers.items() if k.lower() == "authorization"]
    header.append("sec-websocket-protocol: " + ",".join(_PROTOCOLS))
    sslopt: dict[str, Any] = {}
    if cluster.ssl_context is not None:
        sslopt["context"] = cluster.ssl_context
        if cluster.configuration.tls_server_name:
            sslopt["server_hostname"] = cluster.configuration.tls_server_name
    options: dict[str, Any] = {"header": header, "timeout": max(1.0, min(30.0, timeout_s))}
    if cluster.configuration.proxy:
        from urllib.parse import urlparse

        proxy = urlparse(cluster.configuration.proxy)
        options.update(http_proxy_host=proxy.hostname, http_proxy_port=proxy.port, proxy_type="http")
    return url, options, sslopt


def _send_stdin(ws: Any, stdin: Path, deadline: float, protocol: str) -> None:
    """Send the file ``stdin`` on channel 0, each chunk by ``deadline``
    (time.monotonic()); with the v5 protocol, then close stdin."""
    with stdin.open("rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            ws.settimeout(max(0.1, deadline - time.monotonic()))
            ws.send_binary(b"\x00" + chunk)
    if protocol == "v5.channel.k8s.io":
        ws.send_binary(bytes([255, 0]))  # close stdin


def _receive_channels(ws: Any, pod: str, deadline: float, timeout_s: float) -> tuple[bytes, bytes, bytes]:
    """(stdout, stderr, status channel) of the session until it closes, the
    first two cut at :data:`_KEEP_OUTPUT`. Raises StagingError at
    ``deadline`` or when the session breaks."""
    import websocket

    out, err, status = bytearray(), bytearray(), bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StagingError(f"exec into pod {pod}: no result within {timeout_s:g}s")
        ws.settimeout(left)
        try:
            opcode, frame = ws.recv_data_frame(True)
        except websocket.WebSocketTimeoutException:
            raise StagingError(f"exec into pod {pod}: no result within {timeout_s:g}s") from None
        except websocket.WebSocketConnectionClosedException:
            break
        except (websocket.WebSocketException, OSError) as exc:
            raise StagingError(f"exec into pod {pod}: the session broke ({type(exc).__name__}: {exc})") from None
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            break
        if opcode not in (websocket.ABNF.OPCODE_BINARY, websocket.ABNF.OPCODE_TEXT):
            continue
        data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
        if not data:
            continue
        channel, payload = data[0], data[1:]
        if channel == 1 and len(out) < _KEEP_OUTPUT:
            out += payload
        elif channel == 2 and len(err) < _KEEP_OUTPUT:
            err += payload
        elif channel == 3:
            status += payload
    return bytes(out), bytes(err), bytes(status)


def _parse_status(raw: bytes) -> Mapping[str, Any] | None:
    if not raw.strip():
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or parsed.get("status") not in ("Success", "Failure"):
        return None
    return parsed


def _status_message(body: bytes) -> str | None:
    if not body:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip() or None
    if isinstance(parsed, dict):
        return str(parsed.get("message") or parsed.get("reason") or "") or None
    return None


def upload_timeout_s(size: int) -> float:
    """Seconds allowed for staging ``size`` bytes: 60 s plus one second per
    MiB (an upload slower than 1 MiB/s is treated as stuck)."""
    return 60.0 + size / 2**20


def stage_source(
    cluster: Cluster,
    namespace: str,
    pod: str,
    container: str,
    snapshot: Path,
    sha256: str,
    *,
    timeout_s: float,
) -> None:
    """Upload ``snapshot`` (whose sha256 hex is ``sha256``) into ``pod`` and,
    after a verified upload, create the ready marker (blocking; run it in a
    worker thread under the cluster's exec limiter). At most ``timeout_s``
    seconds for both sessions. Raises StagingError saying which step failed
    and why."""
    deadline = time.monotonic() + timeout_s
    size = snapshot.stat().st_size
    upload = exec_command(
        cluster,
        namespace,
        pod,
        container,
        ["sh", "-c", UPLOAD_SCRIPT, "jobsup-stage", str(size), sha256],
        stdin=snapshot,
        timeout_s=max(1.0, deadline - time.monotonic()),
    )
    if not upload.success:
        raise StagingError(f"uploading the source ({size} bytes) into pod {pod} failed: {upload.describe()}")
    commit = exec_command(
        cluster,
        namespace,
        pod,
        container,
        ["sh", "-c", COMMIT_SCRIPT, "jobsup-commit"],
        timeout_s=max(1.0, deadline - time.monotonic()),
    )
    if not commit.success:
        raise StagingError(
            f"marking the source ready in pod {pod} failed: {commit.describe()} ({shlex.quote(STAGING_DIR)})"
        )
