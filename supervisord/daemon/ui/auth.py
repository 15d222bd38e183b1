"""Who may use the web page: one-time tokens, session cookies, CSRF tokens.

The flow (issue "A web page for runs"):

1. ``jobsup ui`` asks the daemon for a one-time *token* and prints
   ``http://127.0.0.1:PORT/?token=TOKEN``. A token is valid once, for
   :data:`TOKEN_TTL_S` seconds, and lives only in the daemon's memory.
2. ``GET /?token=TOKEN`` exchanges it for a *session cookie*
   (``HttpOnly; SameSite=Strict; Path=/``) and redirects to the bare URL, so
   the token does not stay in the address bar or the history.
3. Every request without a valid cookie gets 401. A cookie is
   ``<expires>.<nonce>.<mac>`` with ``mac = HMAC-SHA256(key, expires.nonce)``
   under a key kept in ``<state dir>/ui.key`` (0600), so sessions survive a
   daemon restart and nobody can mint one without reading that file.
4. State-changing requests are POSTs that must carry the session's *CSRF
   token* (``HMAC(key, "csrf:" + nonce)``) in the form field ``csrf`` or the
   ``X-CSRF-Token`` header, and an ``Origin`` (when the browser sends one)
   equal to the page's own. SameSite=Strict already keeps the cookie off
   cross-site requests; the CSRF token is the second, independent lock
   (OWASP CSRF Prevention Cheat Sheet: "synchronizer token pattern").
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["COOKIE_NAME", "SESSION_TTL_S", "TOKEN_TTL_S", "UiAuth", "load_ui_key"]

COOKIE_NAME = "jobsup_session"
#: How long a printed one-time token stays valid (seconds).
TOKEN_TTL_S = 600.0
#: How long a session cookie stays valid (seconds): a working week.
SESSION_TTL_S = 7 * 24 * 3600


def load_ui_key(state_dir: Path) -> bytes:
    """The page's signing key: 32 random bytes in ``<state dir>/ui.key``,
    created 0600 on first use (O_EXCL, so two daemons never race to two
    keys). Raises OSError when the file cannot be read or created."""
    path = state_dir / "ui.key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) >= 32:
            return key
        raise OSError(f"{path}: the key is truncated ({len(key)} bytes); remove it to make a new one") from None
    try:
        key = secrets.token_bytes(32)
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


class UiAuth:
    """Tokens and cookies for one daemon. ``clock`` gives seconds since the
    epoch (injectable for tests)."""

    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._tokens: dict[str, float] = {}  # token -> expiry (epoch s)
        self._now = clock

    def _mac(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def new_token(self) -> str:
        """A fresh one-time token (URL-safe, 256 bits)."""
        now = self._now()
        self._tokens = {t: exp for t, exp in self._tokens.items() if exp > now}
        token = secrets.token_urlsafe(32)
        self._tokens[token] = now + TOKEN_TTL_S
        return token

    def redeem(self, token: str) -> str | None:
        """Consume ``token``: the new session cookie's value, or None when the
        token is unknown, used or expired."""
        expiry = self._tokens.pop(token, None)
        if expiry is None or expiry < self._now():
            return None
        expires = int(self._now() + SESSION_TTL_S)
        body = f"{expires}.{secrets.token_hex(16)}"
        return f"{body}.{self._mac(body)}"

    def session(self, cookie: str | None) -> str | None:
        """The session nonce of a valid, unexpired ``cookie``, else None."""
        if not cookie or cookie.count(".") != 2:
            return None
        expires, nonce, mac = cookie.split(".")
        if not hmac.compare_digest(mac, self._mac(f"{expires}.{nonce}")):
            return None
        try:
            if int(expires) < self._now():
                return None
        except ValueError:
            return None
        return nonce

    def csrf_token(self, nonce: str) -> str:
        """The CSRF token of the session ``nonce``."""
        return self._mac(f"csrf:{nonce}")

    def csrf_ok(self, nonce: str, given: str | None) -> bool:
        """Whether ``given`` is the CSRF token of session ``nonce``."""
        return bool(given) and hmac.compare_digest(str(given), self.csrf_token(nonce))
