"""Listing a run's outputs folder with the sha256 of every file.

:func:`scan` walks the folder without following symlinks: regular files
are hashed (``hashlib.sha256``, large reads into one buffer: the hash runs
outside the GIL, so a worker thread does not hold up the daemon's loop),
symlinks and special files (FIFOs, sockets, devices) are listed as
skipped, and a file that disappears between the listing and its read is
listed as vanished (never an error). What it returns is the data of an
``OutputsRecorded`` event.

Pure and blocking: run it in a worker thread. No anyio, no store.
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

__all__ = ["MAX_FILES", "READ_BYTES", "Stopped", "scan", "sha256_file"]

#: One read's size: 1 MiB reads into a reused buffer hash at the speed of
#: sha256 itself (bench/outputs_hash.py).
READ_BYTES: Final = 1 << 20
#: At most this many files are listed (and hashed); the rest are counted in ``omitted``.
MAX_FILES: Final = 100_000

_KINDS: Final = (
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


class Stopped(Exception):
    """:func:`scan` was asked to stop (the daemon is stopping)."""


def _when(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "other"


def _hash_fd(fd: int, buf: bytearray, should_stop: Callable[[], bool] | None = None) -> tuple[str, int]:
    h = hashlib.sha256()
    view = memoryview(buf)
    size = 0
    while True:
        n = os.readv(fd, [buf])
        if n <= 0:
            break
        h.update(view[:n])
        size += n
        if should_stop is not None and should_stop():
            raise Stopped
    return h.hexdigest(), size


def sha256_file(path: str | os.PathLike[str], buf: bytearray | None = None) -> tuple[str, int]:
    """``(hex sha256, bytes read)`` of the file at ``path`` (following
    symlinks: the caller names the file it means). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _hash_fd(fd, buf if buf is not None else bytearray(READ_BYTES))
    finally:
        os.close(fd)


def scan(root: Path, *, max_files: int = MAX_FILES, should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """The ``OutputsRecorded`` data of folder ``root``::

        {"dir": str, "files": [{"path", "bytes", "sha256", "mtime"}],
         "total_bytes": int, "total_files": int,
         "skipped": [{"path", "kind"}], "vanished": [str], "omitted": int}

    Paths are relative to ``root`` (``/``-separated), sorted. ``mtime`` is
    UTC RFC 3339. ``skipped``: symlinks (never followed), special files,
    folders that could not be read (``kind`` says which). ``omitted``:
    files past ``max_files``, counted but not listed. Raises OSError only
    when ``root`` itself cannot be listed, :class:`Stopped` when
    ``should_stop`` returned True (checked after each read)."""
    files: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    vanished: list[str] = []
    omitted = 0
    total = 0
    buf = bytearray(READ_BYTES)
    pending: list[tuple[str, str]] = [(os.fspath(root), "")]
    first = True
    while pending:
        folder, rel = pending.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            if first:
                raise
            vanished.append(rel)
            continue
        except OSError as err:
            if first:
                raise
            skipped.append({"path": rel, "kind": f"unreadable folder ({err.strerror})"})
            continue
        first = False
        subfolders: list[tuple[str, str]] = []
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                vanished.append(name)
                continue
            except OSError as err:
                skipped.append({"path": name, "kind": f"unreadable ({err.strerror})"})
                continue
            if stat.S_ISDIR(st.st_mode):
                subfolders.append((entry.path, name))
            elif not stat.S_ISREG(st.st_mode):
                skipped.append({"path": name, "kind": _kind(st.st_mode)})
            elif len(files) >= max_files:
                omitted += 1
            else:
                item = _hash_entry(entry.path, name, buf, skipped, vanished, should_stop)
                if item is not None:
                    files.append(item)
                    total += item["bytes"]
        pending.extend(reversed(subfolders))
    files.sort(key=lambda f: str(f["path"]))
    data: dict[str, Any] = {
        "dir": os.fspath(root),
        "files": files,
        "total_bytes": total,
        "total_files": len(files),
        "skipped": sorted(skipped, key=lambda s: s["path"]),
        "vanished": sorted(vanished),
    }
    if omitted:
        data["omitted"] = omitted
    return data


def _hash_entry(
    path: str,
    name: str,
    buf: bytearray,
    skipped: list[dict[str, str]],
    vanished: list[str],
    should_stop: Callable[[], bool] | None,
) -> dict[str, Any] | None:
    """Hash one regular file, opened without following a symlink and without
    blocking on a FIFO (either may have replaced it since the listing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        vanished.append(name)
        return None
    except OSError as err:
        # ELOOP: a symlink now stands there.
        skipped.append(
            {"path": name, "kind": "symlink" if err.errno == errno.ELOOP else f"unreadable ({err.strerror})"}
        )
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            skipped.append({"path": name, "kind": _kind(st.st_mode)})
            return None
        digest, size = _hash_fd(fd, buf, should_stop)
        st = os.fstat(fd)
    except OSError as err:
        skipped.append({"path": name, "kind": f"unreadable ({err.strerror})"})
        return None
    finally:
        os.close(fd)
    return {"path": name, "bytes": size, "sha256": digest, "mtime": _when(st.st_mtime_ns)}
