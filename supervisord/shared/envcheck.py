"""Can these environment variables be given to a process at all?

execve(2) takes the environment as NUL-terminated ``NAME=VALUE`` strings:
a NUL byte inside a value cannot be passed, one string may be at most
``MAX_ARG_STRLEN`` (32 pages: 131072 bytes on Linux, including the
terminating NUL), and arguments plus environment together at most
``sysconf(_SC_ARG_MAX)`` bytes (each string also costs a pointer). A run
whose env breaks these would be recorded and then fail to start without
naming the variable: :func:`check_env` refuses it at submit instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from supervisord.shared.exceptions import TaskError

__all__ = ["MAX_ARG_STRLEN", "check_env"]

#: Linux's limit on one argument or environment string, NUL included
#: (include/uapi/linux/binfmts.h: 32 * PAGE_SIZE with 4 KiB pages).
MAX_ARG_STRLEN = 32 * 4096

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POINTER = 8


def _arg_max() -> int:
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        value = -1
    return value if value > 0 else 2 * 1024 * 1024


def check_env(env: Mapping[str, str], *, command: str = "", inherited: Mapping[str, str] | None = None) -> None:
    """Refuse an environment that execve(2) cannot pass (see the module doc).

    ``env``: the run's variables (names and values as given); ``command``:
    the run's command text (passed as an argument of ``bash -c``);
    ``inherited``: the rest of the process environment the run gets (the
    daemon's, default ``os.environ``), counted toward the total.

    Raises TaskError naming the variable (never its value): a name that is
    not a valid variable name, a value holding a NUL byte or text that is
    not Unicode scalar values (so no UTF-8 form), a variable over
    :data:`MAX_ARG_STRLEN`, or a total over ``sysconf(_SC_ARG_MAX)`` (then
    naming the largest variable).
    """
    sizes: dict[str, int] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise TaskError(f"env: {str(name)[:64]!r} is not a valid environment variable name")
        if not isinstance(value, str):
            raise TaskError(f"env.{name}: the value must be text")
        if "\0" in value:
            raise TaskError(f"env.{name}: the value holds a NUL byte, which no process environment can carry")
        try:
            size = len(name) + 1 + len(value.encode("utf-8")) + 1
        except UnicodeEncodeError:
            raise TaskError(f"env.{name}: the value is not valid Unicode text (a lone surrogate)") from None
        if size > MAX_ARG_STRLEN:
            raise TaskError(
                f"env.{name}: NAME=VALUE is {size} bytes; the kernel passes at most {MAX_ARG_STRLEN} "
                "bytes per variable (MAX_ARG_STRLEN): put the value in a file instead"
            )
        sizes[name] = size
    base = os.environ if inherited is None else inherited
    total = sum(sizes.values()) + len(sizes) * _POINTER
    total += sum(len(k) + len(v) + 2 + _POINTER for k, v in base.items() if k not in sizes)
    total += len(command.encode("utf-8", "replace")) + 64 + 4 * _POINTER  # bash -c COMMAND, argv[0]
    limit = _arg_max()
    if total > limit and sizes:
        largest = max(sizes, key=lambda k: sizes[k])
        raise TaskError(
            f"env: the run's environment and command take {total} bytes, over the kernel's limit of {limit} "
            f"(ARG_MAX); the largest variable is env.{largest} ({sizes[largest]} bytes)"
        )
