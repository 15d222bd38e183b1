"""Scanning log text, and the store's optional C accelerator.

``_textscan`` (``_textscan.c`` here) is built by setup.py where a C compiler
is; :func:`scan` and :func:`count_newlines` use it when it is there, else
the ``bytes`` methods, with the same results. The C module lives in a package
of its own: import graphs (grimp, import-linter) take an extension module for
its parent package, and under ``store`` itself that made an import cycle
through ``store/__init__``.

``JOBSUP_STORE_NO_ACCEL=1`` in the environment keeps the C module unused (the
fallback runs, as on an install without a compiler): CI runs the store's
tests that way too (tests/ci.py)."""

from __future__ import annotations

import os
from typing import Final

try:
    from store._accel import _textscan as _c
except ImportError:  # installed without a C compiler
    _c = None  # type: ignore[assignment]
if os.environ.get("JOBSUP_STORE_NO_ACCEL", "") not in ("", "0"):
    _c = None  # type: ignore[assignment]

__all__ = ["ACCELERATED", "count_newlines", "scan"]

#: Whether the C accelerator is in use.
ACCELERATED: Final = _c is not None


def count_newlines(text: bytes, start: int = 0, end: int | None = None) -> int:
    """The number of ``\\n`` bytes in ``text[start:end]`` (``start``, ``end``
    >= 0): ``text.count(b"\\n", start, end)``, vectorised (10-30 GB/s
    against ``bytes.count``'s 1.3 GB/s). A range is counted through a
    memoryview, without a copy."""
    if _c is None:
        return text.count(b"\n", start, len(text) if end is None else end)
    if start == 0 and (end is None or end >= len(text)):
        return _c.count_newlines(text)
    with memoryview(text) as view:
        return _c.count_newlines(view[start:end])


def scan(text: bytes, window: int) -> tuple[int, bool, bool, int]:
    """One pass over ``text``: ``(newlines, has_return, ascii, bare_windows)``
    -- how many ``\\n`` bytes it holds, whether it holds a ``\\r``, whether
    it is all ASCII, and how many of its whole ``window``-byte windows (at
    0, window, 2 * window...) hold no ``\\n``. ValueError for window <= 0."""
    if _c is not None:
        return _c.scan(text, window)
    if window <= 0:
        raise ValueError(f"scan: window must be > 0, got {window}")
    bare = sum(1 for k in range(0, len(text) - window + 1, window) if text.find(b"\n", k, k + window) < 0)
    return text.count(b"\n"), text.find(b"\r") >= 0, text.isascii(), bare
