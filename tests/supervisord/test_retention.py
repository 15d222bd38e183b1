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
from pathlib import Path
from typing import Any

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
    assert js.cli("logs", run_id, "--tail", "5", "-o", "json", check=False).returncode == 1


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
    deleted = [e for e in _events(js, run_id) if e["type"] == "LogsDeleted"][0]
    out = js.cli("logs", run_id, check=False)
    assert out.returncode == 1
    assert f"deleted at {deleted['at']}" in out.stderr and deleted["data"]["sha256"] in out.stderr
    assert js.show(run_id)["phase"] == "COMPLETED"  # the run and its events stay


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
