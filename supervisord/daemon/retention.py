"""Retention: what the daemon gives back of runs that ended long ago,
without ever touching an event.

Three kinds, each recorded by an event of the run (its stream keeps the
audit trail; the events table is append-only):

* **archive** (``retention.archive_logs_after``, ``jobsup prune``): the log
  text of a run moves out of the database into one compressed, verified
  file under ``<state dir>/archive/`` (``LogsArchived``, with its sha256:
  see :meth:`store.EventStore.archive_logs`); reads stay transparent. The
  freed database pages are given back in small incremental-vacuum steps
  between append batches.
* **delete archives** (``jobsup prune --delete-archives``): the archived
  text is deleted (``LogsDeleted`` keeps its digest); reads then say when.
* **run folders** (``retention.run_dirs_after``, ``jobsup prune
  --run-dirs``): a terminal run's folder (its extracted source and what
  the job wrote there) is removed (``RunDirRemoved``), and so are source
  snapshots no run references any more: none of a run that is not
  terminal, none of a run that ended within the window (and none written
  within it, so a submit in flight keeps its own).

A run counts from when it *ended* (its first terminal ``PhaseChanged``);
a run still recording its output backlog (``log_ingest`` pending) is left
alone. Symlinks are never followed: a run folder that is a symlink is
skipped, and removal goes through :func:`shutil.rmtree`, which removes
links without following them.

The daemon runs one pass at start (after a minute) and then every
:data:`PASS_INTERVAL_S` in the background: file work (compression,
hashing, removal) runs in worker threads, database writes are short
transactions between append batches.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import anyio
import structlog

from store import TERMINAL_PHASES, EventStore, LogArchiveError, RunStatus
from supervisord.daemon.crashpoints import crash_point
from supervisord.daemon.readside import ReadSide
from supervisord.shared.events import RUN_DIR_REMOVED
from supervisord.shared.exceptions import UsageError
from supervisord.shared.paths import Paths

__all__ = ["PASS_INTERVAL_S", "Retention", "RetentionSettings", "parse_age"]

log = structlog.get_logger("jobsup.retention")

#: Seconds between two background passes.
PASS_INTERVAL_S: Final = 3600.0
#: Seconds after start before the first background pass.
FIRST_PASS_S: Final = 60.0
#: Bytes of free pages given back per incremental-vacuum step (8 MiB:
#: 2048 pages of 4 KiB, 128 of 64 KiB).
VACUUM_BYTES: Final = 8 << 20
_AGE: Final = re.compile(r"^\s*(\d{1,9})\s*([smhd])\s*$")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str, *, what: str, allow_zero: bool = False) -> int:
    """``90s``, ``30m``, ``4h``, ``30d`` -> seconds. Raises UsageError naming
    ``what`` (the flag or config key)."""
    match = _AGE.match(str(text))
    if not match:
        raise UsageError(f"{what}: {text!r} is not a duration; use a whole number with a unit: 90s, 30m, 4h or 30d")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds == 0 and not allow_zero:
        raise UsageError(f"{what}: {text!r} must be longer than 0")
    return seconds


@dataclasses.dataclass(frozen=True)
class RetentionSettings:
    """``retention.archive_logs_after`` and ``retention.run_dirs_after`` in
    seconds (None: off, the default)."""

    archive_logs_after_s: int | None = None
    run_dirs_after_s: int | None = None

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> RetentionSettings:
        """From the effective daemon config. Raises UsageError naming the key."""
        section = data.get("retention") or {}
        values: dict[str, int | None] = {}
        for key in ("archive_logs_after", "run_dirs_after"):
            raw = section.get(key)
            values[f"{key}_s"] = None if raw is None else parse_age(str(raw), what=f"retention.{key}")
        return cls(**values)

    @property
    def enabled(self) -> bool:
        return self.archive_logs_after_s is not None or self.run_dirs_after_s is not None


def _tree_size(path: Path) -> tuple[int, int]:
    """``(bytes, files)`` under ``path`` (lstat: links are not followed)."""
    total = files = 0
    for root, dirs, names in os.walk(path, followlinks=False):
        for name in names + dirs:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                total += st.st_blocks * 512 if st.st_blocks else st.st_size
                files += 1
    return total, files


def _make_writable(func: Any, path: str, exc_info: Any) -> None:
    """rmtree's error hook: a job may leave read-only folders; make the
    parent writable and retry once (never through a symlink)."""
    parent = os.path.dirname(path)
    st = os.lstat(parent)
    if stat.S_ISDIR(st.st_mode):
        os.chmod(parent, st.st_mode | stat.S_IRWXU)
        func(path)
    else:
        raise exc_info[1]


def _rmtree(folder: Path) -> None:
    shutil.rmtree(folder, onerror=_make_writable)


class Retention:
    """Retention passes over one store and state dir."""

    def __init__(self, store: EventStore, paths: Paths, settings: RetentionSettings | None = None) -> None:
        self.store = store
        self.reads = ReadSide(store)
        self.paths = paths
        self.settings = settings or RetentionSettings()
        self._lock = anyio.Lock()  # one pass at a time (prune and the background pass)

    # -- what ended when -------------------------------------------------------

    async def _ended(self, runs: list[RunStatus]) -> dict[str, str]:
        """``{run id: at}`` of each terminal run's first terminal PhaseChanged."""
        out: dict[str, str] = {}
        for run in runs:
            if not run.terminal:
                continue
            cursor = 0
            while run.id not in out:
                page = await self.reads.timeline(run.id, after=cursor, limit=1000)
                if not page:
                    break
                for e in page:
                    if e.data.get("phase") in TERMINAL_PHASES:
                        out[run.id] = e.at
                        break
                cursor = page[-1].seq
        return out

    @staticmethod
    def _cutoff(older_than_s: int) -> str:
        when = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than_s)
        return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    # -- passes -------------------------------------------------------------------

    async def prune(
        self,
        *,
        older_than_s: int | None = None,
        run_dirs_older_than_s: int | None = None,
        dry_run: bool = False,
        delete_archives: bool = False,
    ) -> dict[str, Any]:
        """One pass. Runs that ended more than ``older_than_s`` ago get their
        log text archived (and deleted with ``delete_archives``); runs that
        ended more than ``run_dirs_older_than_s`` ago lose their folders,
        and unreferenced snapshots go. With ``dry_run`` nothing changes and
        the report says what each kind would free (with ``dry_run`` and no
        ``run_dirs_older_than_s``, folders are counted at ``older_than_s``).

        Returns ``{"dry_run", "archive": {runs, lines, bytes, run_ids},
        "delete_archives": {asked, runs, bytes, run_ids}, "run_dirs":
        {asked, runs, bytes, files, run_ids}, "snapshots": {asked, count,
        bytes, files},
        "database": {bytes_before, bytes_after} (pages x page size), "errors": [str]}``
        (``bytes``: what is freed -- database text, archive files, folder
        and snapshot files; ``asked``: whether this pass acts on that kind:
        a dry run also counts folders and snapshots when not asked)."""
        async with self._lock:
            return await self._prune(older_than_s, run_dirs_older_than_s, dry_run, delete_archives)

    async def _prune(
        self, older_than_s: int | None, dirs_s: int | None, dry_run: bool, delete_archives: bool
    ) -> dict[str, Any]:
        store = self.store
        runs = await store.list_runs()
        ended = await self._ended(runs)
        archives = {a.run_id: a for a in await store.log_archives()}
        report: dict[str, Any] = {
            "dry_run": dry_run,
            "archive": {"runs": 0, "lines": 0, "bytes": 0, "run_ids": []},
            "delete_archives": {"asked": delete_archives, "runs": 0, "bytes": 0, "run_ids": []},
            "run_dirs": {"asked": dirs_s is not None, "runs": 0, "bytes": 0, "files": 0, "run_ids": []},
            "snapshots": {"asked": dirs_s is not None, "count": 0, "bytes": 0, "files": []},
            "database": {"bytes_before": await _db_bytes(store), "bytes_after": None},
            "errors": [],
        }
        if older_than_s is not None:
            cutoff = self._cutoff(older_than_s)
            for run in runs:
                at = ended.get(run.id)
                if at is None or at > cutoff or run.log_ingest == "pending":
                    continue
                archive = archives.get(run.id)
                if archive is None and run.log_lines > 0:
                    sizes = await store.log_text_bytes(run.id)
                    report["archive"]["runs"] += 1
                    report["archive"]["lines"] += run.log_lines
                    report["archive"]["bytes"] += sizes
                    report["archive"]["run_ids"].append(run.id)
                    if not dry_run:
                        try:
                            event = await store.archive_logs(run.id)
                            crash_point("retention.archived")
                        except Exception as exc:  # noqa: BLE001 - one run's trouble does not stop the pass
                            log.warning("retention.archive_failed", run_id=run.id, error=str(exc))
                            report["errors"].append(f"run {run.id}: archiving its log failed: {exc}")
                            continue
                        archive = await store.log_archive(run.id) if event is not None else None
                if delete_archives and (archive is not None or (dry_run and run.id in report["archive"]["run_ids"])):
                    if archive is not None and archive.deleted_seq is not None:
                        continue
                    size = 0
                    if archive is not None:
                        try:
                            size = store.archive_path(archive).stat().st_size
                        except OSError:
                            size = 0
                    if archive is not None:
                        try:
                            if dry_run:  # the same check, so the same refusals, and nothing changes
                                await store.check_archive_before_delete(run.id)
                            else:
                                await store.delete_archived_logs(run.id)
                                crash_point("retention.archive_deleted")
                        except LogArchiveError as exc:  # a changed/missing file is kept and reported
                            log.warning("retention.delete_refused", run_id=run.id, error=str(exc), dry_run=dry_run)
                            report["errors"].append(str(exc))
                            continue
                    report["delete_archives"]["runs"] += 1
                    report["delete_archives"]["bytes"] += size
                    report["delete_archives"]["run_ids"].append(run.id)
            if not dry_run:
                await self.vacuum()
        if dirs_s is None and dry_run:
            dirs_s = older_than_s
        if dirs_s is not None:
            await self._run_dirs(runs, ended, dirs_s, dry_run, report)
        if not dry_run:
            for path in await store.clean_archive_dir():
                log.info("retention.removed_leftover", path=str(path))
        report["database"]["bytes_after"] = await _db_bytes(store)
        return report

    async def vacuum(self) -> None:
        """Give the database's free pages back in small steps (each a short
        write transaction between append batches), yielding between them."""
        pages = max(1, VACUUM_BYTES // (await self.store.database_pages())["page_size"])
        while True:
            if not await self.store.vacuum_step(pages):
                return
            await anyio.sleep(0.05)  # room for the append batches between two steps

    async def _run_dirs(
        self, runs: list[RunStatus], ended: dict[str, str], older_than_s: int, dry_run: bool, report: dict[str, Any]
    ) -> None:
        cutoff = self._cutoff(older_than_s)
        runs_dir = self.paths.runs_dir
        keep_snapshots: set[str] = set()
        for run in runs:
            at = ended.get(run.id)
            old = run.terminal and at is not None and at <= cutoff
            if not old:
                submitted = await self.reads.submitted(run.id)
                sha = str((submitted.get("source") or {}).get("snapshot_sha256") or "")
                if sha:
                    keep_snapshots.add(sha)
                continue
            folder = runs_dir / run.id
            try:
                st = os.lstat(folder)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):  # a symlink (or a file) in its place: never followed
                report["errors"].append(f"run {run.id}: {folder} is not a folder (left alone)")
                continue
            size, files = await anyio.to_thread.run_sync(_tree_size, folder)
            report["run_dirs"]["runs"] += 1
            report["run_dirs"]["bytes"] += size
            report["run_dirs"]["files"] += files
            report["run_dirs"]["run_ids"].append(run.id)
            if dry_run:
                continue
            try:
                await anyio.to_thread.run_sync(_rmtree, folder)
                crash_point("retention.run_dir_removed")
            except OSError as exc:
                log.warning("retention.run_dir_failed", run_id=run.id, path=str(folder), error=str(exc))
                report["errors"].append(f"run {run.id}: removing {folder} failed: {exc}")
                continue
            await self.store.append(
                run.id, None, [RUN_DIR_REMOVED({"path": str(folder), "bytes": size, "files": files})],
                wait_for_storage=True,
            )  # fmt: skip
            log.info("retention.run_dir_removed", run_id=run.id, bytes=size, files=files)
        await self._snapshots(keep_snapshots, cutoff, dry_run, report)

    async def _snapshots(self, keep: set[str], cutoff: str, dry_run: bool, report: dict[str, Any]) -> None:
        root = self.paths.snapshots_dir
        if not root.is_dir():
            return
        cutoff_ts = dt.datetime.strptime(cutoff, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC).timestamp()
        for sub in sorted(root.iterdir()):
            if sub.is_symlink() or not sub.is_dir():
                continue
            for tar in sorted(sub.iterdir()):
                st = os.lstat(tar)
                if not stat.S_ISREG(st.st_mode) or not tar.name.endswith(".tar"):
                    continue
                if tar.name[: -len(".tar")] in keep or st.st_mtime > cutoff_ts:
                    continue
                report["snapshots"]["count"] += 1
                report["snapshots"]["bytes"] += st.st_size
                report["snapshots"]["files"].append(str(tar))
                if not dry_run:
                    tar.unlink()
                    log.info("retention.snapshot_removed", path=str(tar), bytes=st.st_size)

    async def run(self) -> None:
        """The background passes (module docstring); returns at once when
        retention is off. Errors are logged, never raised: the next pass
        tries again."""
        if not self.settings.enabled:
            return
        await anyio.sleep(FIRST_PASS_S)
        while True:
            try:
                report = await self.prune(
                    older_than_s=self.settings.archive_logs_after_s,
                    run_dirs_older_than_s=self.settings.run_dirs_after_s,
                )
                log.info("retention.pass", archived=report["archive"]["runs"], run_dirs=report["run_dirs"]["runs"],
                         snapshots=report["snapshots"]["count"], errors=len(report["errors"]))  # fmt: skip
            except Exception:
                log.exception("retention.pass_failed")
            await anyio.sleep(PASS_INTERVAL_S)


async def _db_bytes(store: EventStore) -> int:
    """The database's size as SQLite counts it (pages x page size): the
    file's size once the WAL is checkpointed."""
    pages = await store.database_pages()
    return pages["page_count"] * pages["page_size"]
