"""Click parameter types stricter than click's own.

click's ``INT``/``IntRange`` convert with Python's ``int()``, which also
takes ``1_000``, surrounding blanks and digits of any script (``"\u0663"``
is 3): a typo or a pasted character then becomes a number nobody wrote.
:class:`WholeNumber` takes only ASCII digits with an optional sign.
"""

from __future__ import annotations

import re
from typing import Any

import click

__all__ = ["WholeNumber"]

_WHOLE = re.compile(r"[+-]?[0-9]+")


class WholeNumber(click.IntRange):
    """``click.IntRange`` that accepts only ``[+-]?[0-9]+`` in ASCII (an int
    passed in from Python code is taken as it is); bounds as IntRange's."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The int; fails (click's usage error, exit 2) naming the value."""
        if isinstance(value, str) and not _WHOLE.fullmatch(value):
            self.fail(f"{value!r} is not a whole number (ASCII digits, optionally signed)", param, ctx)
        return super().convert(value, param, ctx)
