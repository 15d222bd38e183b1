"""One delivery attempt's result, shared by command hooks and webhooks."""

from __future__ import annotations

import dataclasses

__all__ = ["OUTPUT_BYTES", "Attempt"]

#: How much of a command's output (or a webhook's response body) an outcome
#: event keeps: the first 4 KiB.
OUTPUT_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What one attempt did.

    ``ok``: delivered. ``retry``: a failure worth trying again (a timeout,
    a connection error, HTTP 5xx/408/429); False for a permanent one.
    ``error``: a short reason for a failure (``"exit code 3"``, ``"timed
    out after 30 s"``, ``"HTTP 500"``). ``exit_code`` (commands) or
    ``status`` (webhooks; None when no response came). ``output``: the
    first :data:`OUTPUT_BYTES` of the command's output or the response body,
    decoded as UTF-8 with replacement. ``duration_s``: wall-clock seconds.
    ``retry_after_s``: the server's ``Retry-After``, in seconds.
    """

    ok: bool
    duration_s: float
    retry: bool = False
    error: str | None = None
    exit_code: int | None = None
    status: int | None = None
    output: str = ""
    retry_after_s: float | None = None
