"""Query parameters of the daemon's HTTP endpoints (the socket API and the
web page), read one way: a bad value is a :class:`UsageError` (HTTP 400)
naming the parameter and its value (``query parameter limit='-1' must be
in 1..9223372036854775807``), raised before any response starts.

Works on any ``Mapping[str, str]`` (starlette's ``request.query_params``);
imports nothing of starlette.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from supervisord.shared.exceptions import UsageError

__all__ = ["INT_MAX", "flag_param", "float_param", "int_param"]

#: The largest value an integer query parameter may have: SQLite's INTEGER
#: (a signed 64-bit number); every integer parameter is a count, a cursor,
#: a line number or a limit.
INT_MAX: Final = 2**63 - 1


def _shown(raw: str) -> str:
    """The value as a message shows it: quoted, at most 40 characters."""
    return repr(raw[:40])


def flag_param(params: Mapping[str, str], name: str) -> bool:
    """Whether parameter ``name`` is ``1``, ``true`` or ``yes`` (any case);
    absent or anything else is False."""
    return params.get(name, "").lower() in ("1", "true", "yes")


def int_param(
    params: Mapping[str, str], name: str, default: int | None = None, *, minimum: int = 0, maximum: int = INT_MAX
) -> int | None:
    """Parameter ``name`` as a whole number in ``minimum..maximum``, or
    ``default`` when absent or empty. Raises UsageError naming it."""
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"query parameter {name}={_shown(raw)} must be an integer") from None
    if not minimum <= value <= maximum:
        raise UsageError(f"query parameter {name}={_shown(raw)} must be in {minimum}..{maximum}")
    return value


def float_param(params: Mapping[str, str], name: str) -> float | None:
    """Parameter ``name`` as a finite number of at least 0 (seconds), or
    None when absent or empty. Raises UsageError naming it."""
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"query parameter {name}={_shown(raw)} must be a number") from None
    if not 0 <= value < float("inf"):
        raise UsageError(f"query parameter {name}={_shown(raw)} must be a finite number, not negative")
    return value
