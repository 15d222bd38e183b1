"""Webhooks: one POST of ``{event, run}`` per attempt, with httpx.

Headers: ``Content-Type: application/json``, ``X-Jobsup-Event: <seq>`` (the
idempotency key: the same for every attempt at one event, also after a
daemon restart) and, when the hook has a secret,
``X-Jobsup-Signature: sha256=<hex HMAC-SHA256 of the body>`` (the scheme
GitHub uses for ``X-Hub-Signature-256``). Sent with the lean HTTP/1.1
client of :mod:`supervisord.daemon.hooks.http1` (kept-alive connections), or with
httpx where an environment proxy applies. Certificates are verified for
https (httpx's default context: certifi's CA bundle); redirects are not
followed (a redirected POST is not a delivery).

Outcome: 2xx delivered; 408, 429 and 5xx, timeouts and connection errors
are retried; any other status (4xx, 3xx, 1xx) is a permanent failure.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import hmac
import time

import httpx

from supervisord.daemon.hooks.attempt import OUTPUT_BYTES, Attempt
from supervisord.daemon.hooks.http1 import Http1Client, HttpError, HttpTimeout
from supervisord.shared.hooksconfig import WebhookTarget

__all__ = ["RETRIED_STATUSES", "post_event", "retry_after_seconds", "signature"]

#: Statuses below 500 that are worth retrying (RFC 9110 15.5.9, RFC 6585 4).
RETRIED_STATUSES = frozenset({408, 429})


def signature(secret: bytes, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256 of body keyed with secret>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def retry_after_seconds(value: str | None, now: dt.datetime | None = None) -> float | None:
    """A ``Retry-After`` header (RFC 9110 10.2.3: delay-seconds or an
    HTTP-date) in seconds from now (>= 0), or None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - (now or dt.datetime.now(dt.UTC))).total_seconds())


def _describe_error(exc: httpx.HTTPError, target: WebhookTarget) -> str:
    """A short reason for a transport error, never with the URL (its path
    may be the secret of a chat webhook)."""
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {target.timeout_s:g} s ({type(exc).__name__})"
    text = str(exc).replace(target.url, target.shown_url())
    return f"{type(exc).__name__}: {text}"[:300]


async def post_event(
    client: Http1Client | httpx.AsyncClient,
    target: WebhookTarget,
    body: bytes,
    event_seq: int,
    secret: bytes | None,
    user_agent: str = "jobsup",
) -> Attempt:
    """POST ``body`` (JSON) to ``target.url`` once and classify the answer
    (see the module doc). Reads at most :data:`OUTPUT_BYTES` of the
    response body. Raises nothing for network or HTTP failures.

    ``client``: the lean :class:`~supervisord.daemon.hooks.http1.Http1Client`, or
    an httpx client for a URL an environment proxy applies to
    (:func:`~supervisord.daemon.hooks.http1.proxied`)."""
    headers = {"Content-Type": "application/json", "User-Agent": user_agent}  # the same for every event
    fresh = {"X-Jobsup-Event": str(event_seq)}  # this event's
    if secret is not None:
        fresh["X-Jobsup-Signature"] = signature(secret, body)
    started = time.monotonic()
    if isinstance(client, Http1Client):
        try:
            answer = await client.post(
                target.url, body, headers, timeout_s=target.timeout_s, excerpt_bytes=OUTPUT_BYTES, fresh=fresh
            )
        except HttpError as exc:
            error = str(exc).replace(target.url, target.shown_url())[:300]
            if isinstance(exc, HttpTimeout):
                error = f"no answer within {target.timeout_s:g} s (timeout)"
            return Attempt(ok=False, duration_s=time.monotonic() - started, retry=True, error=error)
        return _classify(answer.status, answer.excerpt, answer.headers.get("retry-after"), time.monotonic() - started)
    try:
        async with client.stream(
            "POST", target.url, content=body, headers={**headers, **fresh}, timeout=target.timeout_s
        ) as response:
            excerpt = bytearray()
            async for chunk in response.aiter_raw():
                excerpt.extend(chunk[: OUTPUT_BYTES - len(excerpt)])
                if len(excerpt) >= OUTPUT_BYTES:
                    break
            status = response.status_code
    except httpx.HTTPError as exc:
        return Attempt(ok=False, duration_s=time.monotonic() - started, retry=True, error=_describe_error(exc, target))
    return _classify(status, bytes(excerpt), response.headers.get("Retry-After"), time.monotonic() - started)


def _classify(status: int, excerpt: bytes, retry_after_header: str | None, duration: float) -> Attempt:
    """The attempt an HTTP answer makes (see the module doc)."""
    retry_after = retry_after_seconds(retry_after_header)
    text = excerpt.decode("utf-8", errors="replace")
    if 200 <= status < 300:
        return Attempt(ok=True, duration_s=duration, status=status, output=text)
    retry = status >= 500 or status in RETRIED_STATUSES
    return Attempt(
        ok=False, duration_s=duration, retry=retry, error=f"HTTP {status}", status=status,
        output=text, retry_after_s=retry_after if retry else None,
    )  # fmt: skip
