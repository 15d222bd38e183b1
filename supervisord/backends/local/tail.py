"""Tailing a run's output file into ``(pos, text)`` log lines.

Positions are byte offsets: ``pos`` is the offset just after a line's
newline, so the newest recorded position is exactly where to resume reading
after a reconnect or a daemon restart (see :func:`store.logsplit.split_lines`).
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from store import LogBlock, split_block, split_lines

__all__ = ["FileTailer", "punch_hole"]

_READ_CHUNK = 1 << 20

# fallocate(2) modes (linux/falloc.h).
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(None, use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


def punch_hole(path: Path, start: int, end: int) -> bool:
    """Free the disk blocks of bytes ``start .. end`` of ``path`` without
    changing its size or any offset (``fallocate(2)`` with
    ``FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE``: the range then reads as
    zeros). Returns False where the filesystem cannot (EOPNOTSUPP) or the
    file is gone; raises OSError otherwise."""
    if end <= start:
        return True
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, end - start) != 0:
            err = ctypes.get_errno()
            if err in (errno.EOPNOTSUPP, errno.ENOSYS):
                return False
            raise OSError(err, f"fallocate(PUNCH_HOLE) of {path}: {os.strerror(err)}")
    finally:
        os.close(fd)
    return True


class FileTailer:
    """Reads complete lines appended to ``path`` from byte ``offset`` on.

    ``read(final=False)`` returns the lines completed since the last call
    (an unterminated last line is held back unless ``final``). A missing file
    reads as empty. Not thread-safe; cheap to call often.
    """

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self._released = 0
        self._fd: int | None = None

    def _open(self) -> int | None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
        return self._fd

    def read(self, *, final: bool = False, max_bytes: int = 8 * _READ_CHUNK) -> list[tuple[str, str]]:
        """Lines appended since the last call, at most about ``max_bytes`` of them."""
        fd = self._open()
        if fd is None:
            return []
        out: list[tuple[str, str]] = []
        budget = max_bytes
        while budget > 0:
            buf = os.pread(fd, min(_READ_CHUNK, budget), self.offset)
            if not buf:
                break
            at_eof = len(buf) < min(_READ_CHUNK, budget)
            lines, consumed = split_lines(buf, self.offset, final and at_eof)
            out.extend(lines)
            self.offset += consumed
            budget -= len(buf)
            if consumed == 0 or at_eof:
                break
        return out

    def read_block(self, stream: str, *, final: bool = False, max_bytes: int = 4 * _READ_CHUNK) -> LogBlock | None:
        """The complete lines appended since the last call, at most about
        ``max_bytes`` of them, as one block (None when there are none):
        one ``pread`` and one cut at the last newline
        (:func:`store.split_block`), no Python object per line. The offset
        moves past them; call :meth:`rewind` if recording them fails."""
        fd = self._open()
        if fd is None:
            return None
        while True:
            buf = os.pread(fd, max_bytes, self.offset)
            if not buf:
                return None
            at_eof = len(buf) < max_bytes
            block, consumed = split_block(buf, self.offset, final and at_eof, stream, stream)
            self.offset += consumed
            if block is not None or consumed == 0:
                return block

    def release(self) -> None:
        """Free the disk space of what was read so far (:func:`punch_hole`
        up to :attr:`offset`): call once it is committed. The file keeps its
        size and offsets; the text is then kept once, in the database."""
        if self.offset > self._released and punch_hole(self.path, self._released, self.offset):
            self._released = self.offset

    def skip_to_end(self) -> int:
        """Move the offset to the end of the file without reading; returns the bytes skipped."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return 0
        skipped = max(0, size - self.offset)
        self.offset += skipped
        return skipped

    def rewind(self, offset: int) -> None:
        """Read again from byte ``offset`` (the newest recorded position)."""
        self.offset = offset

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
