"""Tailing a run's output file into ``(pos, text)`` log lines.

Positions are byte offsets: ``pos`` is the offset just after a line's
newline, so the newest recorded position is exactly where to resume reading
after a reconnect or a daemon restart (see :func:`store.logsplit.split_lines`).
"""

from __future__ import annotations

import os
from pathlib import Path

from store import LogBlock, split_block, split_lines

__all__ = ["FileTailer"]

_READ_CHUNK = 1 << 20


class FileTailer:
    """Reads complete lines appended to ``path`` from byte ``offset`` on.

    ``read(final=False)`` returns the lines completed since the last call
    (an unterminated last line is held back unless ``final``). A missing file
    reads as empty. Not thread-safe; cheap to call often.
    """

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
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

    def rewind(self, offset: int) -> None:
        """Read again from byte ``offset`` (the newest recorded position)."""
        self.offset = offset

    def close(self) -> None:
        """Close the file descriptor (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
