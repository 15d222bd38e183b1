"""Secret redaction for recorded and printed configs (DESIGN.md: secret values
never enter events, logs or daemon output; record names and a hash).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

__all__ = ["redact", "redacted_value", "looks_secret"]

_SECRET_NAME = re.compile(r"(?i)(password|passwd|token|secret|api_?key|credential|private_?key)")
_REFERENCE_NAME = re.compile(r"(?i)(name|ref|mounts|path|seconds)$")


def looks_secret(key: str) -> bool:
    """Whether a key's name looks like it holds a secret (token, password,
    secret, API key, credential, private key) rather than a reference to one
    (``secretName``, ``secretKeyRef``, ``secret_mounts``, ``tokenPath``)."""
    return bool(_SECRET_NAME.search(key)) and not _REFERENCE_NAME.search(key)


def redacted_value(value: Any) -> str:
    """``"<redacted sha256:0123456789abcdef>"``: the first 16 hex digits of the
    SHA-256 of the value (UTF-8 text for a string, JSON otherwise), so two
    records can be compared without showing the secret."""
    raw = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return f"<redacted sha256:{hashlib.sha256(raw.encode('utf-8')).hexdigest()[:16]}>"


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with secret values replaced by
    :func:`redacted_value`: every value of an ``env`` mapping (the run's
    environment), the ``value`` of every item of an ``env`` list (container
    env inside ``pod_config``), and every scalar under a key that
    :func:`looks_secret` (booleans such as ``automountServiceAccountToken``
    are kept). Names and structure are kept; the input is not modified."""
    result = _redact(config)
    assert isinstance(result, dict)
    return result


def _redact(value: Any) -> Any:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            if key == "env" and isinstance(sub, Mapping):
                out[key] = {name: (redacted_value(v) if v is not None else None) for name, v in sub.items()}
            elif key == "env" and isinstance(sub, list):
                out[key] = [_redact_env_item(item) for item in sub]
            elif isinstance(key, str) and looks_secret(key) and _is_secret_scalar(sub):
                out[key] = redacted_value(sub)
            else:
                out[key] = _redact(sub)
        return out
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def _redact_env_item(item: Any) -> Any:
    if isinstance(item, Mapping):
        redacted = _redact(item)
        if item.get("value") is not None:
            redacted["value"] = redacted_value(item["value"])
        return redacted
    return _redact(item)


def _is_secret_scalar(value: Any) -> bool:
    return value is not None and not isinstance(value, (bool, Mapping, list))
