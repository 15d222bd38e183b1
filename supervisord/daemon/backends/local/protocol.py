"""What the local runner writes and the daemon reads: the run's status file
and its output record. Standard library only, imported lazily where it costs
(no ``json``/``hmac`` at import): the detached runner imports this module
from its folder (``python -I -S``, see :func:`runner.command`), the daemon
as ``supervisord.daemon.backends.local.protocol``.

The status file (``status_path``, preallocated, rewritten in place)::

    <status JSON>\\n<hex HMAC-SHA256 of the JSON text under status_key>\\n<spaces to 4096 bytes>

The output record in the run folder: ``output.log``, the bytes of the job's
stdout and stderr in the order the runner read them, and ``output.idx``, one
8-byte entry ``<data offset: 7 bytes big-endian><stream: b"1" | b"2">`` each
time the stream changes, written before the data it describes (the runner's
module docstring tells the whole story).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not loaded at run time
    from typing import Any

__all__ = [
    "INDEX_ENTRY",
    "OUTPUT_DATA",
    "OUTPUT_INDEX",
    "STATUS_SIZE",
    "STDERR",
    "STDOUT",
    "decode_status",
    "encode_status",
    "status_mac",
]

#: Size of the status file: preallocated once, rewritten in place.
STATUS_SIZE = 4096

#: The output record: the data file and its stream index.
OUTPUT_DATA = "output.log"
OUTPUT_INDEX = "output.idx"
#: One index entry: the data offset (7 bytes, big-endian) from which on the
#: bytes are of one stream, then the stream byte.
INDEX_ENTRY = 8
#: Stream bytes in the index: the job's file descriptor number, in ASCII.
STDOUT = 0x31  # b"1"
STDERR = 0x32  # b"2"


def status_mac(key: bytes, body: bytes) -> str:
    """HMAC-SHA256 (RFC 2104) of ``body`` under ``key``, as hex: the same as
    ``hmac.new(key, body, hashlib.sha256).hexdigest()``, built on the
    interpreter's own ``_sha256`` so the runner loads neither ``hmac`` nor
    OpenSSL (``hashlib``)."""
    from _sha256 import sha256  # type: ignore[import-not-found]  # the interpreter's own SHA-256 (no OpenSSL)

    if len(key) > 64:
        key = sha256(key).digest()
    key = key.ljust(64, b"\0")
    inner = sha256(bytes(b ^ 0x36 for b in key) + body).digest()
    return str(sha256(bytes(b ^ 0x5C for b in key) + inner).hexdigest())


def _json_value(value: object) -> str:
    from _json import encode_basestring_ascii

    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    return str(encode_basestring_ascii(str(value)))


def encode_status(status: dict[str, Any], key: bytes) -> bytes:
    """The status file's content for ``status`` (flat: str, int, bool, None
    values): JSON text, newline, its MAC, newline, spaces up to
    :data:`STATUS_SIZE` bytes. An over-long ``message`` is cut to fit."""
    while True:
        body = ("{" + ", ".join(f"{_json_value(k)}: {_json_value(v)}" for k, v in status.items()) + "}").encode()
        if len(body) + 66 <= STATUS_SIZE or len(str(status.get("message") or "")) < 16:
            break
        message = str(status["message"])
        status = {**status, "message": message[: max(0, len(message) - (len(body) + 66 - STATUS_SIZE) - 16)] + "..."}
    data = body + b"\n" + status_mac(key, body).encode() + b"\n"
    return data.ljust(STATUS_SIZE, b" ")


def decode_status(data: bytes, key: bytes | None) -> dict[str, Any] | None:
    """The status in a status file's ``data``, or None when it is not one the
    runner wrote: torn (read during a rewrite), not JSON, or without a valid
    MAC under ``key``. ``key=None`` reads an unsigned plain-JSON status (of a
    runner from before signed statuses: runs still in flight across an
    upgrade). Runs in the daemon (uses ``json`` and ``hmac``)."""
    import hmac
    import json

    if key is None:
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None
    body, sep, rest = data.partition(b"\n")
    mac = rest.split(b"\n", 1)[0].strip()
    if not sep or not hmac.compare_digest(mac, status_mac(key, body).encode()):
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
