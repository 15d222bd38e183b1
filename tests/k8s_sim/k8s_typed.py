"""The untyped entry points of the kubernetes client the tests use, as Any,
so that ``mypy --strict`` checks the tests without ignoring whole files."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as _client
from kubernetes import stream as _stream
from kubernetes import watch as _watch

Watch: Any = _watch.Watch
"""kubernetes.watch.Watch."""

iter_resp_lines: Any = _watch.watch.iter_resp_lines
"""kubernetes.watch.watch.iter_resp_lines."""

exec_stream: Any = _stream.stream
"""kubernetes.stream.stream (WebSocket exec)."""


def status_body(exc: BaseException) -> dict[str, Any]:
    """The metav1.Status body of an ApiException, decoded."""
    body = getattr(exc, "body", None)
    if not body:
        raise AssertionError(f"the exception carries no Status body: {exc!r}")
    out: dict[str, Any] = json.loads(body)
    return out


def to_dict(obj: Any) -> dict[str, Any]:
    """A client model (or a dict) as the JSON the server sent."""
    if isinstance(obj, dict):
        return obj
    sanitize: Any = _client.ApiClient().sanitize_for_serialization
    out: dict[str, Any] = sanitize(obj)
    return out
