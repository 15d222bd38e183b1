"""``yaml.safe_dump(value, sort_keys=False)`` without importing PyYAML when
the value is simple, for ``jobsup show`` (importing PyYAML is a tenth of
the CLI's start-up budget).

Simple: nested mappings with string keys and lists, whose scalars are
None, booleans, integers and strings that PyYAML writes plain (no quotes):
ASCII letters, digits and ``_ . / + = - : @``, starting with a letter,
``_`` or ``/``, not a word YAML 1.1 reads as a boolean or null. Anything
else (floats, other strings, a top-level scalar) goes to PyYAML itself, so
the text is always PyYAML's: tests compare the two on generated values.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["dump"]

#: Strings PyYAML writes without quotes: no space, no quote, no YAML
#: indicator at the start, nothing its resolver reads as a number, date,
#: boolean or null. Those start with a digit, a sign, ``.``, ``~``, ``<`` or
#: ``=``, or are one of :data:`_WORDS`; the exceptions allowed here are a
#: ``.`` before a letter (``.jobsup/k8s.yaml``; not ``.inf``, ``.nan``) and
#: digits mixed with letters only (a hash, ``4f2a...``; not ``0x..``,
#: ``0b..``, ``0o..``, which are integers). ``:`` cannot end one (``a:`` is
#: a key). ``~`` alone is null, but ``~/.jobsup`` (``slurm.remote_dir``) is
#: plain. Keys must also be short: PyYAML writes ``? key`` past 128
#: characters (:data:`_MAX_KEY`).
_PLAIN = re.compile(
    r"[A-Za-z_/][A-Za-z0-9_./+=@:-]*"
    r"|\.[A-Za-z_/][A-Za-z0-9_./+=@:-]*"
    r"|(?![0][xXbBoO])(?=[0-9A-Za-z]*[A-Za-z])[0-9][0-9A-Za-z]*"
    r"|~[A-Za-z0-9_./+=@-][A-Za-z0-9_./+=@:-]*"
)
#: YAML 1.1 booleans, nulls and special floats (PyYAML's resolver), in any
#: case, kept for PyYAML.
_WORDS = frozenset({"yes", "no", "true", "false", "on", "off", "null", "y", "n", ".inf", ".nan"})


_MAX_KEY = 100


class _NotSimple(Exception):
    """The value needs PyYAML."""


def dump(value: Any) -> str:
    """The block YAML of ``value``, exactly as ``yaml.safe_dump(value,
    sort_keys=False)`` writes it (an empty ``{}``/``[]`` flow style, lists
    in mappings not indented, two spaces a level)."""
    try:
        if not isinstance(value, (dict, list)):
            raise _NotSimple
        if not value:
            return _scalar(value, set()) + "\n"
        lines: list[str] = []
        _block(value, 0, lines, set())
        return "\n".join(lines) + "\n"
    except _NotSimple:
        import yaml

        return str(yaml.safe_dump(value, sort_keys=False))


def _text(s: str) -> str:
    if not _PLAIN.fullmatch(s) or s.endswith(":") or s.lower() in _WORDS:
        raise _NotSimple
    return s


def _once(value: Any, seen: set[int]) -> None:
    """PyYAML writes an anchor and an alias for a list or mapping met twice."""
    if id(value) in seen:
        raise _NotSimple
    seen.add(id(value))


def _scalar(value: Any, seen: set[int]) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return str(value)
    if type(value) is str:
        return _text(value)
    if isinstance(value, dict) and not value:
        _once(value, seen)
        return "{}"
    if isinstance(value, list) and not value:
        _once(value, seen)
        return "[]"
    raise _NotSimple


def _block(value: dict[Any, Any] | list[Any], indent: int, lines: list[str], seen: set[int]) -> None:
    """Append the lines of the non-empty mapping or list ``value`` at column ``indent``."""
    _once(value, seen)
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str or len(key) > _MAX_KEY:
                raise _NotSimple
            if isinstance(item, dict) and item:
                lines.append(f"{pad}{_text(key)}:")
                _block(item, indent + 2, lines, seen)
            elif isinstance(item, list) and item:
                lines.append(f"{pad}{_text(key)}:")
                _block(item, indent, lines, seen)  # PyYAML does not indent a list in a mapping
            else:
                lines.append(f"{pad}{_text(key)}: {_scalar(item, seen)}")
        return
    for item in value:
        if isinstance(item, (dict, list)) and item:
            first = len(lines)
            _block(item, indent + 2, lines, seen)
            lines[first] = f"{pad}- {lines[first][indent + 2 :]}"
        else:
            lines.append(f"{pad}- {_scalar(item, seen)}")
