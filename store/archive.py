"""Log archives: one compressed, verified file per run (retention).

Retention moves the text of a run's log blocks (:mod:`store.logblocks`)
out of the database into ``<archive dir>/<run id>.jslog``; a
``LogsArchived`` event records the file's sha256, and the block rows are
deleted in the same transaction. Events are never touched: every
``LogLines`` event keeps its range, positions and digest.

File layout (all integers little-endian)::

    b"JSUPLOG\\x01"                      magic
    frame*                               zlib streams: the text of consecutive blocks
    index                                zlib stream: JSON (below)
    u64 index offset, u64 index length, b"JSUPEND\\x01"

The index is ``{"version": 1, "run_id", "lines", "bytes", "frames":
[[offset, length, raw_bytes], ...], "blocks": [[frame, offset_in_frame,
first_line, lines, seq, stream, source, first_pos, last_pos, start,
positions, bytes, sha256], ...]}`` (blocks in line order; ``sha256`` is
the ``"sha256:<hex>"`` of the block's text, as its ``LogLines`` event
says).

Reading (:class:`ArchiveReader`) opens the file once, refuses it unless
it is a regular file of this user that group and others cannot write, and
checks the whole file against the sha256 the event recorded: a file that
differs in any byte raises :class:`~store.errors.LogArchiveError` and is
never read as text. Later reads go through the same descriptor. The
check is remembered per (inode, size, mtime, ctime), so paging through a
big archive hashes it once. Everything here is blocking file work: the
store calls it in worker threads.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
import struct
import threading
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from store.errors import LogArchiveError
from store.logblocks import text_digest

__all__ = [
    "ARCHIVE_SUFFIX",
    "ArchiveReader",
    "ArchiveWriter",
    "UntrustedFileError",
    "archive_reader",
    "file_digest",
    "forget_reader",
    "fsync_dir",
    "open_trusted",
    "verify_against",
]

ARCHIVE_SUFFIX: Final = ".jslog"
_MAGIC: Final = b"JSUPLOG\x01"
_END: Final = b"JSUPEND\x01"
_TRAILER: Final = struct.Struct("<QQ")
_TRAILER_BYTES: Final = _TRAILER.size + len(_END)
#: Blocks are grouped into frames of about this much text (bytes): small
#: blocks compress together, a read decompresses at most a frame or so.
FRAME_BYTES: Final = 1 << 20
#: zlib level: 6 is zlib's default; log text compresses 5-20x at it.
_LEVEL: Final = 6

#: A block row as the store reads it: ``first_line, lines, seq, stream,
#: source, first_pos, last_pos, start, positions, bytes, text``.
BlockRow = tuple[int, int, int, str, str, str, str, int | None, str | None, int, bytes]


def fsync_dir(path: Path) -> None:
    """fsync the folder ``path`` (makes a rename or unlink in it durable)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class UntrustedFileError(OSError):
    """An archive path that is not to be read: a symlink, not a regular
    file (a folder, a FIFO, a device), another user's, or writable by group
    or others. ``str()`` says which, as a phrase ("is a symbolic link")."""


def open_trusted(path: Path) -> io.FileIO:
    """Open the archive file ``path`` for reading, unbuffered, only if it
    can be trusted: never following a symlink and never blocking (a FIFO
    is refused, not waited on: ``O_NONBLOCK``), then judged on the opened
    descriptor (:func:`os.fstat`), so what is checked is what is read.
    Raises FileNotFoundError, UntrustedFileError, or another OSError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedFileError("is a symbolic link") from None
        raise
    try:
        problem = _untrusted(os.fstat(fd))
        if problem is not None:
            raise UntrustedFileError(problem)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return io.FileIO(fd, "rb", closefd=True)


def file_digest(path: Path) -> str:
    """``"sha256:<hex>"`` of the archive file at ``path``, opened with
    :func:`open_trusted` (whose errors it raises)."""
    with open_trusted(path) as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def _untrusted(st: os.stat_result) -> str | None:
    """Why an archive file with stat ``st`` must not be read: not a regular
    file, another user's, or writable by group or others (anything another
    local user could write is checked before it is trusted). None if fine."""
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a regular file"
    if stat.S_ISFIFO(st.st_mode):
        return "is a FIFO, not a regular file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    me = os.geteuid()
    if st.st_uid != me:
        return f"belongs to uid {st.st_uid}, not to this user (uid {me})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class ArchiveWriter:
    """Writes one run's archive to ``<final>.partial``; :meth:`finish`
    fsyncs it, renames it to ``final`` and fsyncs the folder. Feed block
    rows in line order with :meth:`add`."""

    def __init__(self, final: Path, run_id: str) -> None:
        self.final = final
        self.partial = final.with_name(final.name + ".partial")
        self.run_id = run_id
        if not final.parent.is_dir():
            final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fsync_dir(final.parent.parent)  # the new folder's own entry is durable too
        self._f = open(self.partial, "wb")  # noqa: SIM115 - closed by finish/abort
        self._f.write(_MAGIC)
        self._offset = len(_MAGIC)
        self._frames: list[list[int]] = []
        self._blocks: list[list[Any]] = []
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.lines = 0
        self.bytes = 0
        self.sources: dict[str, list[Any]] = {}

    def add(self, rows: Iterable[BlockRow]) -> None:
        """Append blocks (their text is compressed into frames)."""
        for first_line, lines, seq, stream, source, first_pos, last_pos, start, positions, nbytes, text in rows:
            raw = bytes(text)
            if first_line != self.lines + 1:
                raise LogArchiveError(
                    f"run {self.run_id}: lines {self.lines + 1}..{first_line - 1} are missing from the database;"
                    " nothing was archived"
                )
            self._blocks.append([len(self._frames), self._pending_bytes, first_line, lines, seq, stream, source,
                                 first_pos, last_pos, start, positions, nbytes, text_digest(raw)])  # fmt: skip
            self._pending.append(raw)
            self._pending_bytes += len(raw)
            self.lines = first_line + lines - 1
            self.bytes += len(raw)
            self.sources[source] = [last_pos, self.lines]
            if self._pending_bytes >= FRAME_BYTES:
                self._flush_frame()

    def digests(self) -> list[tuple[int, str]]:
        """``(first_line, "sha256:<hex>")`` of every block added, in order."""
        return [(int(b[2]), str(b[12])) for b in self._blocks]

    def _flush_frame(self) -> None:
        if not self._pending:
            return
        raw = b"".join(self._pending)
        packed = zlib.compress(raw, _LEVEL)
        self._f.write(packed)
        self._frames.append([self._offset, len(packed), len(raw)])
        self._offset += len(packed)
        self._pending, self._pending_bytes = [], 0

    def finish(self) -> tuple[str, int]:
        """Write the index and trailer, fsync, rename into place, fsync the
        folder. Returns the file's ``(sha256, size)``."""
        self._flush_frame()
        index = {"version": 1, "run_id": self.run_id, "lines": self.lines, "bytes": self.bytes,
                 "frames": self._frames, "blocks": self._blocks}  # fmt: skip
        packed = zlib.compress(json.dumps(index, separators=(",", ":"), ensure_ascii=False).encode(), _LEVEL)
        self._f.write(packed)
        self._f.write(_TRAILER.pack(self._offset, len(packed)) + _END)
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self.partial, self.final)
        fsync_dir(self.final.parent)
        return file_digest(self.final), self.final.stat().st_size

    def abort(self) -> None:
        """Drop the partial file."""
        self._f.close()
        self.partial.unlink(missing_ok=True)


class ArchiveReader:
    """One verified archive file, open for reads (thread-safe).

    The file is opened once (not following a symlink) and must be a regular
    file of this process's user that neither group nor others may write:
    only then is it hashed, through the same descriptor every later read
    uses, so the text read is the text verified even if the path is
    replaced meanwhile. Raises LogArchiveError (missing, not trusted,
    unreadable, digest mismatch, damaged)."""

    def __init__(self, path: Path, run_id: str, sha256: str) -> None:
        self.path = path
        self.run_id = run_id
        self._lock = threading.Lock()
        try:
            # Owned by the reader from here: closed when the reader is collected.
            self._file = open_trusted(path)
        except FileNotFoundError:
            raise LogArchiveError(
                f"run {run_id}: its log archive {path} is missing (the LogsArchived event records {sha256})"
            ) from None
        except UntrustedFileError as exc:
            raise LogArchiveError(
                f"run {run_id}: its log archive {path} {exc}; nothing was read from it"
                " (it must be a regular file of yours that group and others cannot write)"
            ) from None
        except OSError as exc:
            raise LogArchiveError(f"run {run_id}: cannot read its log archive {path}: {exc}") from exc
        try:
            self.key, index = self._verify(sha256)
        except BaseException:
            self._file.close()
            raise
        self.lines: int = index["lines"]
        self.bytes: int = index["bytes"]
        self._frames: list[list[int]] = index["frames"]
        self._blocks: list[list[Any]] = index["blocks"]
        self._first_lines = [b[2] for b in self._blocks]
        self._cached: tuple[int, bytes] | None = None

    def _verify(self, sha256: str) -> tuple[tuple[int, int, int, int], Any]:
        """Check the open file against ``sha256`` and read its index:
        ``((inode, size, mtime_ns, ctime_ns), index)``. Raises LogArchiveError."""
        path, run_id, fd = self.path, self.run_id, self._file.fileno()
        try:
            st = os.fstat(fd)
            actual = "sha256:" + hashlib.file_digest(self._file, "sha256").hexdigest()
        except OSError as exc:
            raise LogArchiveError(f"run {run_id}: cannot read its log archive {path}: {exc}") from exc
        if actual != sha256:
            raise LogArchiveError(
                f"run {run_id}: its log archive {path} does not match the digest recorded when it was archived"
                f" ({sha256}, the file is {actual}): the file was changed or damaged; nothing was read from it"
            )
        try:
            if st.st_size < _TRAILER_BYTES:
                raise ValueError("no trailer")
            tail = os.pread(fd, _TRAILER_BYTES, st.st_size - _TRAILER_BYTES)
            if tail[-len(_END) :] != _END:
                raise ValueError("no trailer")
            offset, length = _TRAILER.unpack(tail[: _TRAILER.size])
            index = json.loads(zlib.decompress(os.pread(fd, length, offset)))
        except (OSError, ValueError, zlib.error) as exc:
            raise LogArchiveError(f"run {run_id}: its log archive {path} cannot be read: {exc}") from exc
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns), index

    def digests(self) -> list[tuple[int, str]]:
        """``(first_line, "sha256:<hex>")`` of every block, in order."""
        return [(int(b[2]), str(b[12])) for b in self._blocks]

    def _frame(self, n: int) -> bytes:
        cached = self._cached
        if cached is not None and cached[0] == n:
            return cached[1]
        offset, length, _raw = self._frames[n]
        try:
            raw = zlib.decompress(os.pread(self._file.fileno(), length, offset))
        except (OSError, zlib.error) as exc:
            raise LogArchiveError(f"run {self.run_id}: its log archive {self.path} is damaged: {exc}") from exc
        self._cached = (n, raw)
        return raw

    def _block_at(self, line: int) -> int:
        """Index of the block holding ``line`` (or the first after it)."""
        import bisect

        i = bisect.bisect_right(self._first_lines, line) - 1
        return max(i, 0)

    def blocks(self, after_line: int, max_blocks: int, *, check: bool = False) -> list[tuple[Any, ...]]:
        """Up to ``max_blocks`` blocks holding lines after ``after_line``,
        each as ``(first_line, lines, seq, stream, source, first_pos,
        start, positions, text)``. With ``check`` each block's text is also
        checked against its recorded digest (the whole file was checked
        against the event's sha256 when this reader was made, and
        :func:`archive_reader` makes a new one when the file changes)."""
        out: list[tuple[Any, ...]] = []
        with self._lock:
            i = self._block_at(after_line + 1)
            while i < len(self._blocks) and len(out) < max_blocks:
                (
                    frame,
                    at,
                    first_line,
                    lines,
                    seq,
                    stream,
                    source,
                    first_pos,
                    _last,
                    start,
                    positions,
                    nbytes,
                    digest,
                ) = self._blocks[i]
                i += 1
                if first_line + lines - 1 <= after_line:
                    continue
                text = self._frame(frame)[at : at + nbytes]
                if check and text_digest(text) != digest:
                    raise LogArchiveError(
                        f"run {self.run_id}: lines {first_line}.. in its log archive {self.path} do not match"
                        " their recorded digest; nothing was read from it"
                    )
                out.append((first_line, lines, seq, stream, source, first_pos, start, positions, text))
        return out


_READERS: dict[Path, ArchiveReader] = {}
_READERS_LOCK = threading.Lock()
_MAX_READERS: Final = 8


def archive_reader(path: Path, run_id: str, sha256: str) -> ArchiveReader:
    """A verified :class:`ArchiveReader` of ``path``: reused while the file
    is unchanged (same inode, size, mtime and ctime), else checked again.
    Raises LogArchiveError (missing, unreadable, digest mismatch)."""
    with _READERS_LOCK:
        reader = _READERS.get(path)
    if reader is not None:
        try:
            st = path.stat()
            key: tuple[int, ...] | None = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None
        if key == reader.key and reader.run_id == run_id:
            return reader
    reader = ArchiveReader(path, run_id, sha256)
    with _READERS_LOCK:
        if len(_READERS) >= _MAX_READERS:
            _READERS.pop(next(iter(_READERS)))
        _READERS[path] = reader
    return reader


def forget_reader(path: Path) -> None:
    """Drop the cached reader of ``path`` (after the file is deleted)."""
    with _READERS_LOCK:
        _READERS.pop(path, None)


def verify_against(path: Path, run_id: str, sha256: str, digests: Sequence[tuple[int, str]]) -> None:
    """Read the archive back from disk and check it holds exactly the
    blocks ``digests`` (``(first_line, "sha256:<hex>")`` in order), each
    block's text matching. Raises LogArchiveError."""
    forget_reader(path)
    reader = ArchiveReader(path, run_id, sha256)
    if reader.digests() != list(digests):
        raise LogArchiveError(f"run {run_id}: the archive {path} read back differs from the database's blocks")
    after = 0
    while True:
        blocks = reader.blocks(after, 4, check=True)
        if not blocks:
            break
        after = blocks[-1][0] + blocks[-1][1] - 1
    forget_reader(path)
