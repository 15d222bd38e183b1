"""Retention through the real daemon and CLI:
`jobsup prune` archives the log text of ended runs into verified files,
`jobsup logs` reads them as before (whole, --tail, -o json), a changed
archive is an error, `--delete-archives` leaves a digest and a date, run
folders and unreferenced snapshots go with `--run-dirs`, `--dry-run`
changes nothing, events are never deleted, and a daemon killed (SIGKILL)
in the middle of archiving loses nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env, make_repo

pytestmark = [pytest.mark.timeout(300), pytest.mark.daemon]  # js: the daemon runs

N = 30_000
EMIT = (
    "import sys\n"
    "sys.stdout.write(''.join('line %07d the quick brown fox %s\\n' % (i, 'x' * (i % 50)) for i in range(30000)))\n"
    "sys.stderr.write('warning: done\\n')\n"
)


def _events(js: JobsupEnv, run_id: str | None = None) -> list[dict[str, Any]]:
    args = ["events", "-o", "json"] + ([run_id] if run_id else [])
    return [json.loads(line) for line in js.cli(*args).stdout.splitlines()]


def _reads(js: JobsupEnv, run_id: str) -> dict[str, str]:
    return {
        "all": js.cli("logs", run_id).stdout,
        "tail": js.cli("logs", run_id, "--tail", "100").stdout,
        "json": js.cli("logs", run_id, "-o", "json").stdout,
        "follow": js.cli("logs", run_id, "-f", "--tail", "1000").stdout,
    }


def _prune(js: JobsupEnv, *args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(js.cli("prune", "--older-than", "0s", *args, "-o", "json").stdout)
    return doc


def _db_blocks(js: JobsupEnv, run_id: str) -> int:
    conn = sqlite3.connect(js.state_dir / "jobsup.db")
    try:
        return int(conn.execute("SELECT COUNT(*) FROM log_blocks WHERE run_id = ?", (run_id,)).fetchone()[0])
    finally:
        conn.close()


def test_prune_archives_and_logs_reads_the_archive_identically(js: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"emit.py": EMIT})
    run_id = js.submit(repo, "--", "python3 emit.py")
    js.cli("wait", run_id, "--timeout", "120s")
    before = _reads(js, run_id)
    assert before["all"].count("\n") == N + 1 and before["tail"].count("\n") == 100
    events_before = _events(js)

    dry = _prune(js, "--dry-run")
    assert dry["dry_run"] and dry["archive"]["run_ids"] == [run_id] and dry["archive"]["bytes"] > 1_000_000
    assert dry["run_dirs"]["run_ids"] == [run_id] and dry["run_dirs"]["bytes"] > 0
    assert dry["snapshots"]["count"] == 1  # only this ended run used it
    assert _db_blocks(js, run_id) > 0 and not (js.state_dir / "archive").exists()  # nothing changed
    assert (js.state_dir / "runs" / run_id).is_dir() and list((js.state_dir / "snapshots").glob("*/*.tar"))

    report = _prune(js)
    assert report["archive"]["run_ids"] == [run_id] and not report["errors"]
    assert _db_blocks(js, run_id) == 0
    # The database shrank by about the text it gave away (incremental vacuum, then a WAL checkpoint).
    db = report["database"]
    assert db["bytes_before"] - db["bytes_after"] > 0.8 * report["archive"]["bytes"], db
    assert (js.state_dir / "jobsup.db").stat().st_size <= db["bytes_after"] + 65536
    archive = js.state_dir / "archive" / f"{run_id}.jslog"
    assert archive.is_file()
    events_after = _events(js)
    assert events_after[: len(events_before)] == events_before  # events never change
    [archived] = [e for e in events_after if e["type"] == "LogsArchived"]
    assert archived["data"]["lines"] == N + 1 and archived["data"]["sha256"].startswith("sha256:")
    assert _reads(js, run_id) == before
    assert _prune(js)["archive"]["runs"] == 0  # once

    # A restart reads the archive too; then a changed archive is an error, not text.
    js.stop_daemon()
    js.start_daemon()
    assert _reads(js, run_id) == before
    raw = bytearray(archive.read_bytes())
    raw[100] ^= 0xFF
    archive.write_bytes(bytes(raw))
    bad = js.cli("logs", run_id, check=False)
    assert bad.returncode == 1 and bad.stdout == ""
    assert "does not match the digest" in bad.stderr and archived["data"]["sha256"] in bad.stderr
    assert "event store failed" not in bad.stderr
    assert js.cli("logs", run_id, "--tail", "5", "-o", "json", check=False).returncode == 1
    # Not a transient fault: 500 with its own type (a 503 would tell clients to retry).
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(js.socket)), base_url="http://jobsup/v1") as http:
        for query in ("", "?tail=5"):
            resp = http.get(f"/runs/{run_id}/logs{query}")
            assert resp.status_code == 500, (query, resp.text)
            err = resp.json()["error"]
            assert err["type"] == "LogsDamagedError" and err["store_error"] == "LogArchiveError", err
            assert "StorageError" in err["bases"] and "does not match the digest" in err["message"]


def test_delete_archives_and_run_dirs(js: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"emit.py": EMIT})
    run_id = js.submit(repo, "--", "python3 emit.py")
    js.cli("wait", run_id, "--timeout", "120s")
    run_dir = js.state_dir / "runs" / run_id
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    (run_dir / "link-out").symlink_to(outside)  # never followed
    report = _prune(js, "--delete-archives", "--run-dirs")
    assert report["archive"]["run_ids"] == [run_id] and report["delete_archives"]["run_ids"] == [run_id]
    assert report["run_dirs"]["run_ids"] == [run_id] and not run_dir.exists()
    assert (outside / "precious").read_text() == "keep me"
    assert not (js.state_dir / "archive" / f"{run_id}.jslog").exists()
    types = [e["type"] for e in _events(js, run_id)]
    assert types[-3:] == ["LogsArchived", "LogsDeleted", "RunDirRemoved"]
    deleted = next(e for e in _events(js, run_id) if e["type"] == "LogsDeleted")
    out = js.cli("logs", run_id, check=False)
    assert out.returncode == 1 and out.stdout == ""
    # A deliberate deletion, said as such: not an event-store failure.
    assert out.stderr.startswith(f"error: run {run_id}: its log text (lines 1..{N + 1}) was deleted at {deleted['at']}")
    assert f"by prune (LogsDeleted, event seq {deleted['seq']}, {deleted['data']['sha256']})" in out.stderr
    assert "event store failed" not in out.stderr
    # The API answers 410 Gone with its own type (503 would tell clients to retry).
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(js.socket)), base_url="http://jobsup/v1") as http:
        for query in ("", "?tail=5", "?follow=1"):
            resp = http.get(f"/runs/{run_id}/logs{query}")
            assert resp.status_code == 410, (query, resp.text)
            err = resp.json()["error"]
            assert err["type"] == "LogsDeletedError" and "event store failed" not in err["message"], err
            assert err["message"].startswith(f"run {run_id}: its log text (lines 1..{N + 1}) was deleted at")
    assert js.show(run_id)["phase"] == "COMPLETED"  # the run and its events stay


def test_delete_archives_refuses_a_changed_archive(js: JobsupEnv, tmp_path: Path) -> None:
    """A changed archive file is not deleted (nor recorded as deleted with a
    digest it no longer has): the prune report names the file and both
    digests, the file stays, and it is deleted once it is right again."""
    repo = make_repo(tmp_path / "proj", {"emit.py": "for i in range(200): print('line', i)\n"})
    run_id = js.submit(repo, "--", "python3 emit.py")
    js.cli("wait", run_id, "--timeout", "120s")
    assert _prune(js)["archive"]["run_ids"] == [run_id]
    [archived] = [e for e in _events(js, run_id) if e["type"] == "LogsArchived"]
    archive = js.state_dir / "archive" / f"{run_id}.jslog"
    good = archive.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    archive.write_bytes(bytes(bad))
    out = js.cli("prune", "--older-than", "0s", "--delete-archives", "-o", "json")
    report = json.loads(out.stdout)
    assert report["delete_archives"]["run_ids"] == [] and report["delete_archives"]["runs"] == 0
    [line] = report["errors"]
    assert line.startswith(f"run {run_id}: its log archive {archive} does not match the digest"), line
    assert archived["data"]["sha256"] in line and "the file is sha256:" in line and "not deleting it" in line
    assert archive.read_bytes() == bytes(bad)  # kept for the operator
    assert "LogsDeleted" not in [e["type"] for e in _events(js, run_id)]
    text = js.cli("prune", "--older-than", "0s", "--delete-archives", check=False)
    assert text.returncode == 0 and f"warning: run {run_id}: its log archive {archive}" in text.stderr
    logs = js.cli("logs", run_id, check=False)
    assert logs.returncode == 1 and "does not match the digest" in logs.stderr and "the file is sha256:" in logs.stderr
    archive.write_bytes(good)  # restored: now it is deleted
    assert _prune(js, "--delete-archives")["delete_archives"]["run_ids"] == [run_id]
    assert not archive.exists()
    [deleted] = [e for e in _events(js, run_id) if e["type"] == "LogsDeleted"]
    assert deleted["data"]["sha256"] == archived["data"]["sha256"]


def test_dry_run_delete_archives_reports_what_the_real_run_would_refuse(js: JobsupEnv, tmp_path: Path) -> None:
    """``prune --dry-run --delete-archives`` checks each archive as the real
    run does: a changed or missing file is a warning naming it (the very
    line the real run reports) and is not counted as freed; a good one is;
    nothing changes (no event, the files as they were)."""
    repo = make_repo(tmp_path / "proj", {"emit.py": "for i in range(200): print('line', i)\n"})
    good, changed, missing = (js.submit(repo, "--name", n, "--", "python3 emit.py") for n in ("good", "chg", "gone"))
    js.cli("wait", good, changed, missing, "--timeout", "120s")
    assert sorted(_prune(js)["archive"]["run_ids"]) == sorted([good, changed, missing])
    folder = js.state_dir / "archive"
    bad = bytearray((folder / f"{changed}.jslog").read_bytes())
    bad[len(bad) // 2] ^= 0xFF
    (folder / f"{changed}.jslog").write_bytes(bytes(bad))
    (folder / f"{missing}.jslog").unlink()
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    events = _events(js)
    dry = _prune(js, "--dry-run", "--delete-archives")
    assert dry["delete_archives"]["run_ids"] == [good], dry
    assert dry["delete_archives"]["runs"] == 1
    assert dry["delete_archives"]["bytes"] == len(files[f"{good}.jslog"])
    assert len(dry["errors"]) == 2, dry["errors"]
    [chg_line] = [e for e in dry["errors"] if e.startswith(f"run {changed}: ")]
    assert f"{folder / changed}.jslog does not match the digest" in chg_line and "the file is sha256:" in chg_line
    [gone_line] = [e for e in dry["errors"] if e.startswith(f"run {missing}: ")]
    assert f"{folder / missing}.jslog is missing" in gone_line
    text = js.cli("prune", "--older-than", "0s", "--dry-run", "--delete-archives")
    assert f"warning: {chg_line}\n" in text.stderr and f"warning: {gone_line}\n" in text.stderr
    assert "dry run: nothing was changed" in text.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    assert _events(js) == events
    # The real run refuses exactly those, with the same lines.
    real = _prune(js, "--delete-archives")
    assert real["delete_archives"]["run_ids"] == [good] and sorted(real["errors"]) == sorted(dry["errors"])


def test_snapshots_no_run_needs_are_removed(js: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {"emit.py": "print('hi')\n"})
    run_id = js.submit(repo, "--", "python3 emit.py")
    js.cli("wait", run_id, "--timeout", "120s")
    [snap] = list((js.state_dir / "snapshots").glob("*/*.tar"))
    held = js.submit(repo, "--name", "held", "--hold", "--", "python3 emit.py")  # same commit, not terminal
    os.utime(snap, (1, 1))  # as if written long ago
    first = _prune(js, "--run-dirs")
    assert first["snapshots"]["count"] == 0 and snap.exists()  # the held run needs it
    assert first["run_dirs"]["run_ids"] == [run_id]  # never a run that is not terminal
    js.cli("cancel", held)
    report = _prune(js, "--run-dirs")
    assert report["snapshots"]["files"] == [str(snap)] and not snap.exists()


def test_the_table_says_which_rows_need_run_dirs(js: JobsupEnv, tmp_path: Path) -> None:
    """A dry run without --run-dirs counts folders and snapshots (what the
    flag would free) and says so; the real pass without it says they were
    not asked, not that none were found; an unchanged database says so
    (a tester found the dry run promising what the same command skipped)."""
    repo = make_repo(tmp_path / "proj", {"emit.py": "print('hi')\n"})
    run_id = js.submit(repo, "--", "python3 emit.py")
    js.cli("wait", run_id, "--timeout", "120s")

    def rows(*args: str) -> tuple[dict[str, str], str]:
        r = js.cli("prune", "--older-than", "0s", *args)
        found = {}
        for line in r.stdout.splitlines()[1:]:
            kind = next(
                (k for k in ("archive log text", "delete archives", "run folders", "snapshots") if line.startswith(k)),
                None,
            )
            if kind:
                found[kind] = line
        return found, r.stderr

    dry, _ = rows("--dry-run")
    assert "(would go with --run-dirs)" in dry["run folders"], dry
    assert dry["run folders"].split()[2] == "1", dry  # counted
    assert "unreferenced (would go with --run-dirs)" in dry["snapshots"], dry
    assert "not asked (--delete-archives)" in dry["delete archives"], dry
    real, err = rows()
    assert real["run folders"].split()[2] == "0" and "(not asked: --run-dirs)" in real["run folders"], real
    assert "unreferenced (not asked: --run-dirs)" in real["snapshots"], real
    again, err = rows()
    assert "(file size unchanged)" in err, err  # nothing left to archive: the database did not change
    # -o json says the same: what each kind would free, and whether this pass acts on it.
    dry = _prune(js, "--dry-run")
    assert dry["run_dirs"]["asked"] is False and dry["snapshots"]["asked"] is False
    assert dry["run_dirs"]["runs"] == 1 and dry["delete_archives"]["asked"] is False
    asked = _prune(js, "--dry-run", "--run-dirs", "--delete-archives")
    assert asked["run_dirs"]["asked"] and asked["snapshots"]["asked"] and asked["delete_archives"]["asked"]


@pytest.mark.parametrize("step", ["writing", "renamed", "committed"])
def test_daemon_killed_mid_archive_loses_nothing(js: JobsupEnv, tmp_path: Path, step: str) -> None:
    repo = make_repo(tmp_path / "proj", {"emit.py": EMIT})
    run_id = js.submit(repo, "--", "python3 emit.py")
    js.cli("wait", run_id, "--timeout", "120s")
    before = _reads(js, run_id)
    js.stop_daemon()
    js.start_daemon(extra_env={"JOBSUP_FAULT_ARCHIVE": step})
    js.cli("prune", "--older-than", "0s", check=False)  # the daemon dies under it
    assert js.daemon is not None and js.daemon.wait(timeout=60) == -9
    js.start_daemon()
    assert _reads(js, run_id) == before  # from the database, or from the verified archive
    _prune(js)  # completes or redoes it
    assert _reads(js, run_id) == before
    assert _db_blocks(js, run_id) == 0
    assert [e["type"] for e in _events(js, run_id)].count("LogsArchived") == 1
    assert sorted(p.name for p in (js.state_dir / "archive").iterdir()) == [f"{run_id}.jslog"]


def test_retention_config_is_validated_naming_the_key(tmp_path: Path) -> None:
    with jobsup_env(tmp_path) as js:  # no daemon needed
        config = tmp_path / "daemon.yaml"
        config.write_text("retention:\n  archive_logs_after: 30 days\n")
        js.env["JOBSUP_DAEMON_CONFIG"] = str(config)
        r = js.cli("config", "validate", check=False)
        assert r.returncode == 2 and "retention.archive_logs_after" in r.stderr, r.stderr
        config.write_text("retention:\n  archive_logs_after: 30d\n  run_dirs_after: 7d\n")
        assert js.cli("config", "validate", check=False).returncode == 0
        bad = js.cli("prune", "--older-than", "soon", check=False)
        assert bad.returncode == 2 and "--older-than" in bad.stderr


@pytest.mark.anyio
async def test_mcp_logs_of_deleted_text_is_the_same_clear_error(js: JobsupEnv, tmp_path: Path) -> None:
    """The MCP `logs` tool says what `jobsup logs` says: deleted by prune, not a store failure."""
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    repo = make_repo(tmp_path / "proj", {"emit.py": "for i in range(20): print('line', i)\n"})
    run_id = js.submit(repo, "--", "python3 emit.py")
    js.cli("wait", run_id, "--timeout", "120s")
    assert _prune(js, "--delete-archives")["delete_archives"]["run_ids"] == [run_id]
    cli = js.cli("logs", run_id, check=False)
    assert cli.returncode == 1
    params = StdioServerParameters(command=sys.executable, args=["-m", "supervisord", "mcp"], env=js.env, cwd=str(repo))
    with (tmp_path / "mcp-stderr.log").open("a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("logs", {"run": run_id})
    assert isinstance(result, types.CallToolResult) and result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith(f"run {run_id}: its log text (lines 1..20) was deleted at") and "by prune" in text
    assert "event store failed" not in text and cli.stderr == f"error: {text}\n"
