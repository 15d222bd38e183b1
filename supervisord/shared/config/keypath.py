"""Key paths: how a place in a config document is named in errors, origins and
``--config KEY.PATH=VALUE`` pairs.

A key path is a tuple of segments: ``str`` for a mapping key, ``int`` for a
list index. Written out, segments are joined with ``.``, list indexes appear as
``[N]``, and a key that contains ``.``, ``"``, ``[``, ``]``, ``=`` or whitespace
is double-quoted::

    kubernetes.tolerations[0].key
    kubernetes.node_selector."cloud.google.com/gke-nodepool"

:func:`parse_key` reads the ``--config`` form, where a list index is a bare
numeric segment (``kubernetes.tolerations.0.key``) and quoting lets a key hold
dots (Kubernetes label keys such as ``example.com/gpu``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from supervisord.shared.exceptions import ConfigError

__all__ = ["KeyPath", "Segment", "format_path", "parse_key"]

#: One step into a document: a mapping key or a list index.
Segment = str | int
#: A place in a document, from the top.
KeyPath = tuple[Segment, ...]

_NEEDS_QUOTES = re.compile(r'[.\s"\[\]=]')
_UNQUOTED = re.compile(r'[^.\s"=]+')
_QUOTED = re.compile(r'"([^"]+)"')


def format_path(path: Sequence[Segment]) -> str:
    """Write ``path`` out for a user: ``a.b[0].c``; ``(top level)`` when empty."""
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
            continue
        text = f'"{seg}"' if (not seg or _NEEDS_QUOTES.search(seg)) else seg
        out += f".{text}" if out else text
    return out or "(top level)"


def parse_key(key: str, *, what: str = "--config") -> tuple[str | int, ...]:
    """Split a ``--config`` key at ``.`` into segments.

    A segment is either unquoted (one or more characters other than ``.``,
    ``"``, ``=`` and whitespace) or double-quoted (anything but ``"``, dots
    included). An unquoted segment made only of digits becomes an ``int``: a
    list index (it never names a mapping key ``"0"``). Raises ConfigError
    naming ``what`` and the key for an empty key, an empty segment or stray
    quotes.
    """
    segments: list[str | int] = []
    pos = 0
    if not key:
        raise ConfigError(f"{what}: empty key; expected KEY.PATH=VALUE")
    while True:
        quoted = _QUOTED.match(key, pos)
        if quoted:
            segments.append(quoted.group(1))
            pos = quoted.end()
        else:
            plain = _UNQUOTED.match(key, pos)
            if not plain:
                raise ConfigError(
                    f"{what}: {key!r} is not a valid key path: expected a key at position {pos + 1} "
                    '(keys are separated by "."; quote a key that holds dots: a."b.c")'
                )
            text = plain.group(0)
            segments.append(int(text) if text.isdigit() else text)
            pos = plain.end()
        if pos == len(key):
            return tuple(segments)
        if key[pos] != ".":
            raise ConfigError(f"{what}: {key!r} is not a valid key path: unexpected {key[pos]!r} at position {pos + 1}")
        pos += 1
        if pos == len(key):
            raise ConfigError(f"{what}: {key!r} is not a valid key path: it ends with '.'")
