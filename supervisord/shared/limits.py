"""Memory and CPU limits: parsing ``--memory 16G`` / ``--cpus 2``, the
machine's capacity, formatting bytes, and which enforcement applies.

Pure functions and small blocking probes (call those from a worker thread).
"""

from __future__ import annotations

import os
import re
from typing import Any, Final

from supervisord.shared.exceptions import TaskError

__all__ = [
    "ENFORCE_SAMPLER",
    "ENFORCE_SYSTEMD",
    "MIN_MEMORY_BYTES",
    "format_bytes",
    "machine_cpus",
    "machine_memory",
    "parse_cpus",
    "parse_memory",
]

#: The enforcement a limited local run gets: a transient systemd scope
#: (``systemd-run --user --scope``, when a user manager answers at daemon
#: start: supervisord.daemon.scope) or else the daemon's sampler.
ENFORCE_SYSTEMD: Final = "systemd-scope"
ENFORCE_SAMPLER: Final = "sampler"

#: The smallest ``--memory``: less cannot run a shell.
MIN_MEMORY_BYTES: Final = 1 << 20
_UNITS: Final = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_MEMORY: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_memory(value: Any, flag: str = "--memory") -> int:
    """Bytes from ``16G``, ``512M``, ``1.5GiB``, ``2048K`` (binary units: K
    = 1024) or a whole number of bytes. Raises TaskError naming ``flag`` for
    anything else, for 0, and for less than 1 MiB."""
    if isinstance(value, bool):
        raise TaskError(f"{flag}: {value!r} is not a memory size (e.g. 16G, 512M)")
    if isinstance(value, int):
        number, unit = float(value), 1
    else:
        m = _MEMORY.match(str(value))
        if m is None or (m.group(3) and not m.group(2) and m.group(3).lower() != "b"):
            raise TaskError(f"{flag}: {value!r} is not a memory size (e.g. 16G, 512M, 1.5GiB)")
        number, unit = float(m.group(1)), _UNITS[m.group(2).lower()]
    size = int(number * unit)
    if size <= 0:
        raise TaskError(f"{flag}: must be more than 0, got {value!r}")
    if size < MIN_MEMORY_BYTES:
        raise TaskError(f"{flag}: {value!r} is less than 1M")
    return size


def parse_cpus(value: Any, flag: str = "--cpus") -> float:
    """CPUs (cores) as a number > 0, e.g. ``2`` or ``0.5``. Raises TaskError naming ``flag``."""
    if isinstance(value, bool):
        raise TaskError(f"{flag}: {value!r} is not a number of CPUs")
    try:
        cpus = float(value)
    except (TypeError, ValueError):
        raise TaskError(f"{flag}: {value!r} is not a number of CPUs (e.g. 2 or 0.5)") from None
    if not 0 < cpus < float("inf"):
        raise TaskError(f"{flag}: must be more than 0, got {value!r}")
    return round(cpus, 3)


def format_bytes(n: float | None) -> str:
    """``1.5G``, ``512M``, ``12K``, ``900B`` (binary units); ``-`` for None."""
    if n is None:
        return "-"
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{int(n)}B"


def machine_memory() -> int:
    """This machine's physical memory in bytes."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def machine_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0))
