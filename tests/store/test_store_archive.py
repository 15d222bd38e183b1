"""Retention in the store: a run's log text moves into one verified archive
file (``LogsArchived``), reads go on transparently and identically, a
changed archive is an error (never text), deleted text says when and its
digest, the database shrinks, events are never touched, and a crash
(SIGKILL) at any step of archiving loses nothing."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from store_helpers import lines, phase, snapshot, submitted

from store import EventStore, LogArchiveError, LogBlock, LogTextDeletedError
from store.eventstore import LogReplay

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
_MAGIC_PREFIX = b"JSUPLOG\x01"


def _output(n: int, width: int = 60) -> bytes:
    return b"".join(b"line %07d %s\n" % (i, b"x" * (i % width)) for i in range(1, n + 1))


async def _fill(store: EventStore, run_id: str, n: int, *, blocks: int = 7) -> bytes:
    """A terminal run whose stdout carries ``n`` lines in ``blocks`` blocks,
    plus a few explicit-position stderr lines. Returns the whole text in
    line order."""
    [sub] = await store.append(run_id, 0, [submitted(name=run_id)])
    version = sub.version
    data = _output(n)
    cuts = [0, *sorted({data.index(b"\n", len(data) * k // blocks) + 1 for k in range(1, blocks)}), len(data)]
    text = b""
    for k, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        piece = data[a:b]
        recorded = await store.append_log(run_id, version, [LogBlock("stdout", "stdout", piece, start=a)])
        version = recorded[-1].version
        text += piece
        if k == 2:
            err = await store.append(run_id, version, [lines([("t#1", "warn é"), ("t#2", "second")], "stderr", "pod")])
            version = err[-1].version
            text += "warn é\nsecond\n".encode()
    await store.append(run_id, version, [phase("RUNNING"), phase("COMPLETED", exit_code=0)])
    return text


async def _read_all_text(store: EventStore, run_id: str) -> bytes:
    out, cursor = [], 0
    while True:
        last, text = await store.log_text(run_id, cursor, 2)
        if last == cursor:
            return b"".join(out)
        out.append(text)
        cursor = last


async def _views(store: EventStore, run_id: str) -> dict[str, object]:
    """Everything a reader can see of the run's log."""
    all_lines = await store.log_lines(run_id, 0, 10**6)
    run = await store.get_run(run_id)
    assert run is not None
    return {
        "text": await _read_all_text(store, run_id),
        "lines": [ln.to_json() for ln in all_lines],
        "middle": [ln.to_json() for ln in await store.log_lines(run_id, 1234, 777)],
        "text_from_1500": await store.log_text(run_id, 1500, 1),
        "tail": [ln.to_json() for ln in await store.log_lines(run_id, await store.tail_line_no(run_id, 100))],
        "log_lines": run.log_lines,
        "sources": {s: await store.last_log_position(run_id, s) for s in ("stdout", "pod")},
    }


async def test_archive_moves_the_text_out_reads_stay_identical_and_events_are_untouched(tmp_path: Path) -> None:
    db = tmp_path / "state" / "jobsup.db"
    async with await EventStore.open(db) as store:
        # Enough text for many free pages at any page size (64 KiB: ~50).
        expected = await _fill(store, "r1", 80_000)
        await _fill(store, "r2", 300)
        before = await _views(store, "r1")
        assert before["text"] == expected
        events_before = await store.read_all(0, limit=10_000)
        pages_before = await store.database_pages()

        event = await store.archive_logs("r1")
        assert event is not None and event.type == "LogsArchived"
        path = store.archive_dir / "r1.jslog"
        assert event.data["file"] == "r1.jslog" and event.data["lines"] == 80_002
        assert event.data["sha256"].startswith("sha256:") and path.stat().st_size == event.data["file_bytes"]
        assert path.stat().st_size < len(expected) / 3  # compressed
        assert await store.archive_logs("r1") is None  # once
        # The text left the database; the other run's did not.
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT COUNT(*) FROM log_blocks WHERE run_id = 'r1'").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM log_blocks WHERE run_id = 'r2'").fetchone()[0] > 0
        conn.close()
        # Events: the same rows plus the LogsArchived one.
        events_after = await store.read_all(0, limit=10_000)
        assert events_after[: len(events_before)] == events_before
        assert [e.type for e in events_after[len(events_before) :]] == ["LogsArchived"]
        assert await _views(store, "r1") == before
        # Incremental vacuum gives the pages back, in small steps of 8 pages.
        free = (await store.database_pages())["freelist_count"]
        assert free > 40
        steps = 1
        while await store.vacuum_step(pages=8):
            steps += 1
        assert steps <= free // 8 + 2  # each step frees its 8 pages, not one
        pages_after = await store.database_pages()
        assert pages_after["freelist_count"] == 0
        assert pages_after["page_count"] < pages_before["page_count"]
        # rebuild() gives the same projection rows without the blocks.
    snap = snapshot(db)
    async with await EventStore.open(db) as store:
        assert await _views(store, "r1") == before  # after a restart
        await store.rebuild()
    assert snapshot(db) == snap


async def test_a_changed_archive_is_an_error_never_text(tmp_path: Path) -> None:
    async with await EventStore.open(tmp_path / "jobsup.db") as store:
        await _fill(store, "r1", 2000)
        await store.archive_logs("r1")
        path = store.archive_dir / "r1.jslog"
        assert (await store.log_lines("r1", 0, 3))[0].text.startswith("line 0000001")
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        path.write_bytes(bytes(raw))
        for read in (store.log_lines("r1", 0, 3), store.log_text("r1", 0), store.check_log_text("r1")):
            with pytest.raises(LogArchiveError, match="does not match the digest"):
                await read
        path.unlink()
        with pytest.raises(LogArchiveError, match="missing"):
            await store.log_text("r1", 10)


async def test_an_archive_others_could_write_is_refused_whenever_it_is_read(tmp_path: Path) -> None:
    """The mode and owner of an archive are checked at every (re)open, not
    only at daemon start: a file made group- or world-writable later, or
    swapped for a symlink, is an error naming it, never text."""
    async with await EventStore.open(tmp_path / "jobsup.db") as store:
        await _fill(store, "r1", 2000)
        await store.archive_logs("r1")
        path = store.archive_dir / "r1.jslog"
        first = (await store.log_lines("r1", 0, 3))[0].text
        for mode in (0o620, 0o602):
            path.chmod(mode)
            with pytest.raises(LogArchiveError, match=f"is writable by other users \\(mode {mode:o}\\)"):
                await store.log_text("r1", 0)
            # Deleting checks the same: a file it could not vouch for stays.
            with pytest.raises(LogArchiveError, match="writable by other users.*not deleting"):
                await store.check_archive_before_delete("r1")
        path.chmod(0o600)
        assert (await store.log_lines("r1", 0, 3))[0].text == first
        real = path.with_name("real.jslog")
        path.rename(real)
        # A symlink (even to the right file), a folder, a FIFO: refused at
        # once, without following, hanging on the FIFO, or an internal error.
        for make, what in (
            (lambda: path.symlink_to(real), "is a symbolic link"),
            (path.mkdir, "is a folder"),
            (lambda: os.mkfifo(path), "is a FIFO"),
        ):
            make()
            with pytest.raises(LogArchiveError, match=f"r1.jslog {what}.*nothing was read"):
                await store.log_text("r1", 0)
            with pytest.raises(LogArchiveError, match=f"r1.jslog {what}.*not deleting"):
                await store.check_archive_before_delete("r1")
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        real.rename(path)
        assert (await store.log_lines("r1", 0, 3))[0].text == first


async def test_a_reader_reads_the_file_it_verified_even_if_the_path_is_replaced(tmp_path: Path) -> None:
    """Reads go through the descriptor whose content was hashed: a file
    renamed over the path after the check is never read as the run's text."""
    from store.archive import ArchiveReader

    async with await EventStore.open(tmp_path / "jobsup.db") as store:
        text = await _fill(store, "r1", 3000)
        event = await store.archive_logs("r1")
        assert event is not None
        path = store.archive_dir / "r1.jslog"
        reader = ArchiveReader(path, "r1", event.data["sha256"])
        good = path.read_bytes()
        forged = bytearray(good)
        forged[len(_MAGIC_PREFIX) :] = bytes(len(forged) - len(_MAGIC_PREFIX))
        tmp = path.with_name("forged")
        tmp.write_bytes(bytes(forged))
        tmp.replace(path)
        got = b"".join(bytes(b[-1]) for b in reader.blocks(0, 10**6))
        assert got == text


async def test_deleted_archives_say_when_and_keep_the_digest(tmp_path: Path) -> None:
    async with await EventStore.open(tmp_path / "jobsup.db") as store:
        await _fill(store, "r1", 500)
        archived = await store.archive_logs("r1")
        assert archived is not None
        deleted = await store.delete_archived_logs("r1")
        assert deleted is not None and deleted.type == "LogsDeleted"
        assert deleted.data["sha256"] == archived.data["sha256"]
        assert not (store.archive_dir / "r1.jslog").exists()
        with pytest.raises(LogTextDeletedError, match=f"deleted at {deleted.at}.*{archived.data['sha256']}"):
            await store.log_lines("r1")
        assert await store.delete_archived_logs("r1") is None
        run = await store.get_run("r1")
        assert run is not None and run.log_lines == 502


@pytest.mark.parametrize("step", ["writing", "renamed", "committed"])
async def test_kill_9_at_any_step_of_archiving_loses_nothing(tmp_path: Path, step: str) -> None:
    db = tmp_path / "jobsup.db"
    async with await EventStore.open(db) as store:
        await _fill(store, "r1", 20_000, blocks=12)
        before = await _views(store, "r1")
    env = {**os.environ, "JOBSUP_FAULT_ARCHIVE": step}
    proc = subprocess.run(
        [sys.executable, str(HERE / "store_proc.py"), "archive", str(db), "r1"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    async with await EventStore.open(db) as store:
        archive = await store.log_archive("r1")
        assert (archive is not None) == (step == "committed")
        assert await _views(store, "r1") == before  # from the database, or from the verified archive
        if archive is None:
            removed = await store.clean_archive_dir()
            assert removed  # the leftover file (partial or complete) is gone
            assert await store.archive_logs("r1") is not None  # redone
        assert await _views(store, "r1") == before
        assert len(await store.read_all(0, limit=10_000, types=["LogsArchived"])) == 1


async def test_a_replay_reads_on_through_its_descriptor_when_the_archive_is_swapped(tmp_path: Path) -> None:
    """C16: an archive swapped (or deleted) during a replay made the next
    page raise, after a correct prefix: the stream was cut ("lost the
    jobsup daemon"). The pages of one replay now share the reader its first
    page verified; a new replay sees the swap (an error, never text)."""
    async with await EventStore.open(tmp_path / "jobsup.db") as store:
        text = await _fill(store, "r1", 3000)
        await store.archive_logs("r1")
        path = store.archive_dir / "r1.jslog"
        forged = bytearray(path.read_bytes())
        forged[len(_MAGIC_PREFIX) :] = bytes(len(forged) - len(_MAGIC_PREFIX))
        for swap in ("replace", "delete"):
            replay: LogReplay = {}
            await store.check_log_text("r1", 0, replay=replay)
            cursor, out = 0, []
            last, page = await store.log_text("r1", cursor, 1, replay=replay)
            out.append(page)
            cursor = last
            good = path.read_bytes()
            if swap == "replace":
                path.with_name("forged").write_bytes(bytes(forged))
                path.with_name("forged").replace(path)
            else:
                path.unlink()
            with pytest.raises(LogArchiveError):
                await store.log_text("r1", cursor, 1)  # a read of its own sees the swap
            while True:
                last, page = await store.log_text("r1", cursor, 1, replay=replay)
                if last == cursor:
                    break
                out.append(page)
                cursor = last
            assert b"".join(out) == text, swap
            lines = await store.log_lines("r1", 2990, 100, replay=replay)
            assert [ln.line_no for ln in lines] == list(range(2991, 3003))
            path.write_bytes(good)
            path.chmod(0o600)
