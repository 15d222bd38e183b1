"""Reading a run's log: lines, text, positions; archived text read
from its verified archive.

A role of :class:`store.eventstore.EventStore` (its methods keep their
names there)."""

from __future__ import annotations

from typing import Any

import anyio

from store import archive as arc
from store._core import (
    _ARCHIVE_READ_BLOCKS,
    LogArchive,
    LogReplay,
)
from store.archiving import LogArchiving
from store.errors import LogTextDeletedError, StoreError
from store.logblocks import block_lines, lines_after
from store.types import (
    LogLine,
)

__all__ = ["LogReading"]


class LogReading(LogArchiving):
    """Reading a run's log: lines, text, positions; archived text read from
    its verified archive."""

    async def log_lines(
        self, run_id: str, after_line: int = 0, limit: int = 10000, *, replay: LogReplay | None = None
    ) -> list[LogLine]:
        """Up to ``limit`` log lines of ``run_id`` with line_no >
        ``after_line``, in line_no order. Page on with ``page[-1].line_no``.
        Archived lines are read from their verified archive; raises
        LogArchiveError (archive missing or not the recorded file) and
        LogTextDeletedError (retention deleted the text). ``replay``: the
        pages of one replay share it (an empty dict at the start): every
        page after the first reads the archive through the descriptor the
        first verified, whatever happens to the path meanwhile."""
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit!r}")
        archive = await self.log_archive(run_id)
        if archive is not None and after_line < archive.lines:
            rows: list[Any] = []
            cursor, count = after_line, 0
            while count < limit:
                blocks = await self._archived_blocks(archive, cursor, _ARCHIVE_READ_BLOCKS, replay)
                if not blocks:
                    break
                for b in blocks:
                    rows.append((b[0], b[2], b[3], b[4], b[5], b[6], b[7], b[8]))
                    count += b[0] + b[1] - 1 - max(cursor, b[0] - 1)
                    cursor = b[0] + b[1] - 1
            return block_lines(run_id, rows, after_line, limit)
        # The blocks holding lines after_line+1 .. after_line+limit: from the one
        # that holds after_line+1 to the last one starting in that range.
        rows = await self._read(
            "SELECT first_line, seq, stream, source, first_pos, start, positions, text FROM log_blocks"
            " WHERE run_id = ?1 AND first_line <= ?2 + ?3 AND first_line + lines > ?2 + 1 AND first_line >= COALESCE(("
            "SELECT first_line FROM log_blocks WHERE run_id = ?1 AND first_line <= ?2 + 1"
            " ORDER BY first_line DESC LIMIT 1), 1) ORDER BY first_line",
            (run_id, after_line, limit),
        )
        return block_lines(run_id, rows, after_line, limit)

    async def log_text(
        self, run_id: str, after_line: int = 0, max_blocks: int = 8, *, replay: LogReplay | None = None
    ) -> tuple[int, bytes]:
        """The text of the lines of ``run_id`` numbered after ``after_line``,
        from at most ``max_blocks`` blocks, as one UTF-8 bytes object (every
        line ends with ``\n``), and the number of the last line it holds
        (``after_line`` when there is none yet). Page on with that number.
        For plain-text replay: no Python object per line. Archived lines
        come from their verified archive (errors and ``replay`` as
        :meth:`log_lines`)."""
        archive = await self.log_archive(run_id)
        rows: list[Any]
        if archive is not None and after_line < archive.lines:
            rows = [(b[0], b[1], b[8]) for b in await self._archived_blocks(archive, after_line, max_blocks, replay)]
        else:
            rows = await self._read(
                "SELECT first_line, lines, text FROM log_blocks WHERE run_id = ?1 AND first_line + lines > ?2 + 1"
                " AND first_line >= COALESCE(("
                "SELECT first_line FROM log_blocks WHERE run_id = ?1 AND first_line <= ?2 + 1"
                " ORDER BY first_line DESC LIMIT 1), 1) ORDER BY first_line LIMIT ?3",
                (run_id, after_line, max_blocks),
            )
        pieces: list[bytes] = []
        last = after_line
        for first_line, lines, text in rows:
            if first_line + lines - 1 <= after_line:
                continue
            if text is None:
                raise StoreError(f"{self.path}: run {run_id}: the text of lines {first_line}.. is not in the database")
            raw = bytes(text)
            if first_line <= after_line:
                raw = lines_after(raw, after_line + 1 - first_line, lines)
            pieces.append(raw)
            last = first_line + lines - 1
        return last, b"".join(pieces)

    async def tail_line_no(self, run_id: str, n: int) -> int:
        """The ``after_line`` for :meth:`log_lines` that yields the last
        ``n`` lines of ``run_id`` (0 when it has ``n`` lines or fewer)."""
        rows = await self._read(
            "SELECT MAX(COALESCE((SELECT first_line + lines - 1 FROM log_blocks WHERE run_id = ?1"
            " ORDER BY first_line DESC LIMIT 1), 0), COALESCE((SELECT lines FROM log_archives WHERE run_id = ?1), 0))",
            (run_id,),
        )
        return max(0, (int(rows[0][0]) if rows else 0) - max(0, n))

    async def last_log_position(self, run_id: str, source: str) -> str | None:
        """The ``pos`` of the newest recorded line of ``run_id`` from
        ``source`` (where a tailer resumes), or None if there is none."""
        rows = await self._read("SELECT pos FROM log_sources WHERE run_id = ? AND source = ?", (run_id, source))
        return str(rows[0][0]) if rows else None

    async def log_text_bytes(self, run_id: str) -> int:
        """Bytes of log text ``run_id`` keeps in the database."""
        rows = await self._read("SELECT COALESCE(SUM(bytes), 0) FROM log_blocks WHERE run_id = ?", (run_id,))
        return int(rows[0][0])

    async def _archived_blocks(
        self, archive: LogArchive, after_line: int, max_blocks: int, replay: LogReplay | None = None
    ) -> list[tuple[Any, ...]]:
        """Blocks of ``archive`` after ``after_line`` (see
        :meth:`store.archive.ArchiveReader.blocks`), read and verified in a
        worker thread; through ``replay``'s reader of the file when it
        holds one (else the one made is kept there)."""
        path = self.archive_path(archive)
        pinned = replay.get(path) if replay is not None else None
        if pinned is not None and pinned.run_id == archive.run_id:
            return await anyio.to_thread.run_sync(pinned.blocks, after_line, max_blocks, limiter=self._read_limiter)
        if archive.deleted_seq is not None:
            raise LogTextDeletedError(
                f"run {archive.run_id}: its log text (lines 1..{archive.lines}) was deleted at"
                f" {archive.deleted_at} by prune (LogsDeleted, event seq {archive.deleted_seq}, {archive.sha256});"
                f" it was archived at {archive.archived_at} as {archive.file}"
            )

        def read() -> list[tuple[Any, ...]]:
            reader = arc.archive_reader(path, archive.run_id, archive.sha256)
            if replay is not None:
                replay[path] = reader
            return reader.blocks(after_line, max_blocks)

        return await anyio.to_thread.run_sync(read, limiter=self._read_limiter)

    async def check_log_text(self, run_id: str, after_line: int = 0, *, replay: LogReplay | None = None) -> None:
        """Raise what reading the lines after ``after_line`` would raise
        (LogArchiveError, LogTextDeletedError) before a reply starts
        streaming them; checks the archive's digest (once per file
        version). ``replay``: the replay's reads go through the reader
        checked here (see :meth:`log_lines`)."""
        archive = await self.log_archive(run_id)
        if archive is not None and after_line < archive.lines:
            await self._archived_blocks(archive, after_line, 1, replay)
