"""Secret values: the daemon's digest key, the one keyed digest, and redaction.

The rule (README, "Events"): secret values (env values, tokens) never enter
events, logs or daemon output; names and a hash are recorded. The hash is always
:func:`digest`, an HMAC-SHA256 keyed with the daemon's 32-byte secret
``<state dir>/digest.key`` (RFC 2104): equal values give equal digests (a
changed secret shows), but without the key a short or guessable value
cannot be brute-forced from the database or from a printed config. There is
no unkeyed hash anywhere: a plain sha256 of a short secret next to the keyed
one would undo the protection.

Users: the Submitted event's ``env`` (:func:`env_digest`) and recorded
``config`` (:func:`redact`), the Kubernetes env Secret's ObjectCreated, and
``jobsup config show`` (which reads the same key file; without one it prints
``<redacted>`` alone).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

__all__ = [
    "DIGEST_PREFIX",
    "KEY_FILE",
    "digest",
    "env_digest",
    "load_digest_key",
    "looks_secret",
    "read_digest_key",
    "redact",
    "redacted_value",
]

#: Every recorded digest starts with this.
DIGEST_PREFIX: Final = "hmac-sha256:"
#: The key's file name in the state dir.
KEY_FILE: Final = "digest.key"
_KEY_BYTES: Final = 32

_SECRET_NAME = re.compile(r"(?i)(password|passwd|token|secret|api_?key|credential|private_?key)")
_REFERENCE_NAME = re.compile(r"(?i)(name|ref|mounts|path|seconds)$")


def digest(value: Any, key: bytes) -> str:
    """``hmac-sha256:<64 hex>`` of ``value`` (UTF-8 text for a string, sorted
    JSON otherwise) keyed with ``key``."""
    raw = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return DIGEST_PREFIX + hmac.new(key, raw.encode("utf-8"), hashlib.sha256).hexdigest()


def env_digest(env: Mapping[str, str], key: bytes) -> dict[str, str]:
    """NAME -> :func:`digest` of the value, names sorted: what events record
    instead of env values."""
    return {k: digest(v, key) for k, v in sorted(env.items())}


def load_digest_key(state_dir: Path) -> bytes:
    """The daemon's digest key: 32 random bytes in ``<state dir>/digest.key``
    (mode 0600), created on first use (``O_EXCL``: two daemons racing agree).

    Raises DaemonError when the file exists with the wrong size."""
    path = state_dir / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = read_digest_key(state_dir)
        assert key is not None
        return key
    key = secrets.token_bytes(_KEY_BYTES)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
        f.flush()
        os.fsync(f.fileno())
    return key


def read_digest_key(state_dir: Path) -> bytes | None:
    """The daemon's digest key if the file exists (None otherwise; nothing is
    created). Raises DaemonError when it has the wrong size."""
    path = state_dir / KEY_FILE
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(key) != _KEY_BYTES:
        from supervisord.shared.exceptions import DaemonError

        raise DaemonError(f"{path} is damaged ({len(key)} bytes, expected {_KEY_BYTES}); remove it to make a new key")
    return key


def looks_secret(key: str) -> bool:
    """Whether a key's name looks like it holds a secret (token, password,
    secret, API key, credential, private key) rather than a reference to one
    (``secretName``, ``secretKeyRef``, ``secret_mounts``, ``tokenPath``)."""
    return bool(_SECRET_NAME.search(key)) and not _REFERENCE_NAME.search(key)


def redacted_value(value: Any, key: bytes | None) -> str:
    """``"<redacted hmac-sha256:<hex>>"`` (:func:`digest` with ``key``), so
    two records can be compared without showing the secret; ``"<redacted>"``
    when there is no key."""
    return f"<redacted {digest(value, key)}>" if key is not None else "<redacted>"


def redact(config: Mapping[str, Any], key: bytes | None) -> dict[str, Any]:
    """A copy of ``config`` with secret values replaced by
    :func:`redacted_value`: every value of an ``env`` mapping (the run's
    environment), the ``value`` of every item of an ``env`` list (container
    env inside ``pod_config``), and every scalar under a key that
    :func:`looks_secret` (booleans such as ``automountServiceAccountToken``
    are kept). Names and structure are kept; the input is not modified."""
    result = _redact(config, key)
    assert isinstance(result, dict)
    return result


def _redact(value: Any, key: bytes | None) -> Any:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for name, sub in value.items():
            if name == "env" and isinstance(sub, Mapping):
                out[name] = {k: (redacted_value(v, key) if v is not None else None) for k, v in sub.items()}
            elif name == "env" and isinstance(sub, list):
                out[name] = [_redact_env_item(item, key) for item in sub]
            elif isinstance(name, str) and looks_secret(name) and _is_secret_scalar(sub):
                out[name] = redacted_value(sub, key)
            else:
                out[name] = _redact(sub, key)
        return out
    if isinstance(value, list):
        return [_redact(v, key) for v in value]
    return value


def _redact_env_item(item: Any, key: bytes | None) -> Any:
    if isinstance(item, Mapping):
        redacted = _redact(item, key)
        if item.get("value") is not None:
            redacted["value"] = redacted_value(item["value"], key)
        return redacted
    return _redact(item, key)


def _is_secret_scalar(value: Any) -> bool:
    return value is not None and not isinstance(value, (bool, Mapping, list))
