"""Log archiving (retention): a run's log text moved out of the database
into its archive file, deleted on purpose, and the archive folder kept clean
(the file formats: :mod:`store.archive`).

A role of :class:`store.eventstore.EventStore` (its methods keep their
names there)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from store import archive as arc
from store._core import (
    _ARCHIVE_READ_BLOCKS,
    _BLOCK_ROW,
    LogArchive,
    StoreCore,
    _fault,
    _unlink_durably,
    log,
)
from store.errors import LogArchiveError
from store.types import (
    LOGS_ARCHIVED,
    LOGS_DELETED,
    RecordedEvent,
)
from store.writer import PreparedEvent

__all__ = ["LogArchiving"]


class LogArchiving(StoreCore):
    """Log archiving (retention): a run's log text moved out of the database
    into its archive file, deleted on purpose, and the archive folder kept
    clean (the file formats: :mod:`store.archive`)."""

    async def log_archive(self, run_id: str) -> LogArchive | None:
        """Where the archived log text of ``run_id`` is, or None when none
        of its text was archived."""
        rows = await self._read(
            "SELECT run_id, file, sha256, lines, bytes, archived_seq, archived_at, deleted_seq, deleted_at"
            " FROM log_archives WHERE run_id = ?",
            (run_id,),
        )
        return LogArchive(*rows[0]) if rows else None

    async def log_archives(self) -> list[LogArchive]:
        """Every ``log_archives`` row, by run id."""
        rows = await self._read(
            "SELECT run_id, file, sha256, lines, bytes, archived_seq, archived_at, deleted_seq, deleted_at"
            " FROM log_archives ORDER BY run_id"
        )
        return [LogArchive(*r) for r in rows]

    def archive_path(self, archive: LogArchive) -> Path:
        """The file of ``archive`` (refuses a name that leaves the archive folder)."""
        name = archive.file
        if "/" in name or name in ("", ".", "..") or "\0" in name:
            raise LogArchiveError(f"run {archive.run_id}: its LogsArchived event names a bad file {name!r}")
        return self.archive_dir / name

    async def archive_logs(self, run_id: str) -> RecordedEvent | None:
        """Move the log text of ``run_id`` out of the database into one
        compressed file (:mod:`store.archive`), keeping the audit trail:

        1. write ``<archive dir>/<run>.jslog.partial`` from the blocks (read
           in small steps; compression in a worker thread), fsync it;
        2. rename it to ``<run>.jslog``, fsync the folder;
        3. read it back from disk and check every block's text against the
           digest computed from the database;
        4. append ``LogsArchived`` (the file's sha256, line count...) and
           delete the archived block rows in that same transaction.

        A crash before step 4 commits leaves the text in the database (the
        next call writes the file again); after it, the text is in a
        verified file. Events are never changed. Returns the
        ``LogsArchived`` event, or None when the run has no text in the
        database or was archived already. The caller picks runs that are
        terminal and done ingesting. Raises LogArchiveError (verification
        failed: nothing removed), OSError (the archive folder), and what
        :meth:`append` raises.
        """
        self._check_open()
        async with self._archive_lock:
            if await self.log_archive(run_id) is not None:
                return None
            first = await self._read(
                "SELECT first_line FROM log_blocks WHERE run_id = ? ORDER BY first_line LIMIT 1", (run_id,)
            )
            if not first:
                return None
            final = self.archive_dir / f"{run_id}{arc.ARCHIVE_SUFFIX}"
            writer = await anyio.to_thread.run_sync(arc.ArchiveWriter, final, run_id, limiter=self._archive_limiter)
            digests: list[tuple[int, str]] = []
            blocks = 0
            try:
                cursor = 0
                while True:
                    rows = await self._read(
                        f"SELECT {_BLOCK_ROW} FROM log_blocks WHERE run_id = ? AND first_line > ?"
                        " ORDER BY first_line LIMIT ?",
                        (run_id, cursor, _ARCHIVE_READ_BLOCKS),
                    )
                    if not rows:
                        break
                    for r in rows:
                        if r[10] is None:
                            raise LogArchiveError(f"run {run_id}: lines {r[0]}.. have no text in the database")
                    block_rows: list[Any] = [tuple(r) for r in rows]
                    await anyio.to_thread.run_sync(writer.add, block_rows, limiter=self._archive_limiter)
                    blocks += len(rows)
                    cursor = int(rows[-1][0])
                digests = writer.digests()
                _fault("writing")
                sha256, size = await anyio.to_thread.run_sync(writer.finish, limiter=self._archive_limiter)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(writer.abort)
                raise
            _fault("renamed")
            await anyio.to_thread.run_sync(
                arc.verify_against, final, run_id, sha256, digests, limiter=self._archive_limiter
            )
            lines = writer.lines
            data = {"file": final.name, "sha256": sha256, "lines": lines, "bytes": writer.bytes,
                    "file_bytes": size, "blocks": blocks, "sources": writer.sources}  # fmt: skip

            async def drop_blocks(conn: aiosqlite.Connection) -> None:
                await conn.execute(
                    "DELETE FROM log_blocks WHERE run_id = ? AND first_line + lines - 1 <= ?", (run_id, lines)
                )

            data_json = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
            recorded = await self._writer.append(
                run_id, None, [PreparedEvent(LOGS_ARCHIVED, data_json, json.loads(data_json), 1)], effect=drop_blocks
            )
            log.info("store.logs_archived", run_id=run_id, lines=lines, bytes=writer.bytes, file_bytes=size)
            _fault("committed")
            return recorded[0]

    async def delete_archived_logs(self, run_id: str) -> RecordedEvent | None:
        """Delete the archived log text of ``run_id``: append
        ``LogsDeleted`` (the archive's file name, sha256 and line count),
        then remove the file and fsync the folder (a crash in between
        leaves a file :meth:`clean_archive_dir` removes). Returns the event,
        or None when the run has no archive or it is deleted already.

        The file is checked against the sha256 its ``LogsArchived`` event
        recorded first: a missing, unreadable or changed file is not
        deleted and nothing is recorded (LogArchiveError naming the file and
        both digests), so a ``LogsDeleted`` event never vouches for a digest
        the deleted file did not have, and the changed file stays for the
        operator to inspect."""
        self._check_open()
        async with self._archive_lock:
            archive = await self.log_archive(run_id)
            if archive is None or archive.deleted_seq is not None:
                return None
            path = await self._check_archive_before_delete(archive)
            data = {"file": archive.file, "sha256": archive.sha256, "lines": archive.lines}
            data_json = json.dumps(data, separators=(",", ":"))
            recorded = await self._writer.append(run_id, None, [PreparedEvent(LOGS_DELETED, data_json, data, 1)])
            await anyio.to_thread.run_sync(_unlink_durably, path)
            log.info("store.logs_deleted", run_id=run_id, file=archive.file, sha256=archive.sha256)
            return recorded[0]

    async def check_archive_before_delete(self, run_id: str) -> LogArchive | None:
        """What :meth:`delete_archived_logs` checks before it deletes, and
        nothing else (``prune --dry-run --delete-archives``): returns the
        run's archive, or None when it has none or it is deleted already.
        Raises LogArchiveError, with the very message the delete would
        raise, when the file is missing, unreadable or does not match the
        sha256 its ``LogsArchived`` event recorded."""
        self._check_open()
        async with self._archive_lock:
            archive = await self.log_archive(run_id)
            if archive is None or archive.deleted_seq is not None:
                return None
            await self._check_archive_before_delete(archive)
            return archive

    async def _check_archive_before_delete(self, archive: LogArchive) -> Path:
        """The path of ``archive``'s file once it is checked against its
        recorded sha256 (in a worker thread); LogArchiveError naming the
        file and both digests (or why it cannot be read) otherwise. The
        caller holds the archive lock."""
        run_id = archive.run_id
        path = self.archive_path(archive)
        try:
            actual = await anyio.to_thread.run_sync(arc.file_digest, path, limiter=self._archive_limiter)
        except FileNotFoundError:
            raise LogArchiveError(
                f"run {run_id}: its log archive {path} is missing (the LogsArchived event records"
                f" {archive.sha256}); not deleting: nothing was recorded"
            ) from None
        except arc.UntrustedFileError as exc:
            raise LogArchiveError(
                f"run {run_id}: its log archive {path} {exc} (it must be a regular file of yours that group"
                " and others cannot write); not deleting: nothing was recorded"
            ) from None
        except OSError as exc:
            raise LogArchiveError(
                f"run {run_id}: cannot read its log archive {path} to check it before deleting: {exc};"
                " not deleting: nothing was recorded"
            ) from exc
        if actual != archive.sha256:
            raise LogArchiveError(
                f"run {run_id}: its log archive {path} does not match the digest recorded when it was archived"
                f" ({archive.sha256}, the file is {actual}): the file was changed or damaged; not deleting it,"
                " nothing was recorded"
            )
        return path

    async def clean_archive_dir(self) -> list[Path]:
        """Remove what an interrupted archive or delete left in the archive
        folder: ``*.partial`` files, and files no ``LogsArchived`` event
        points at (the text is still in the database) or whose text a
        ``LogsDeleted`` event deleted. Returns the removed paths."""
        self._check_open()
        async with self._archive_lock:
            keep = {a.file for a in await self.log_archives() if a.deleted_seq is None}

            def clean() -> list[Path]:
                removed: list[Path] = []
                if not self.archive_dir.is_dir():
                    return removed
                for entry in self.archive_dir.iterdir():
                    ours = entry.name.endswith((arc.ARCHIVE_SUFFIX, ".partial"))
                    if ours and entry.is_file() and not entry.is_symlink() and entry.name not in keep:
                        entry.unlink()
                        arc.forget_reader(entry)
                        removed.append(entry)
                if removed:
                    arc.fsync_dir(self.archive_dir)
                return removed

            return await anyio.to_thread.run_sync(clean, limiter=self._archive_limiter)
