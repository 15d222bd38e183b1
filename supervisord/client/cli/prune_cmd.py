"""``jobsup prune``: one retention pass now (see :mod:`supervisord.daemon.retention`)."""

from __future__ import annotations

import re
from typing import Any

import click

from supervisord.client.cli.output import emit, info, output_option
from supervisord.client.cli.reads import connected_client
from supervisord.shared.exceptions import UsageError

__all__ = ["prune"]

_AGE = re.compile(r"^\d{1,9}[smhd]$")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _unless_asked(run_dirs: bool, dry_run: bool) -> str:
    """The note of the rows only ``--run-dirs`` acts on: a dry run counts
    them anyway (what the flag would free), a real pass without it skips them."""
    if run_dirs:
        return ""
    return " (would go with --run-dirs)" if dry_run else " (not asked: --run-dirs)"


@click.command("prune")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Runs that ended longer ago: 90s, 30m, 4h, 30d (0s: every ended run).",
)
@click.option("--dry-run", is_flag=True, help="Only say what each kind would free; change nothing.")
@click.option(
    "--delete-archives", is_flag=True, help="Also delete the archived log text (LogsDeleted keeps its digest)."
)
@click.option("--run-dirs", is_flag=True, help="Also remove those runs' folders and the snapshots no run needs.")
@output_option()
def prune(older_than: str, dry_run: bool, delete_archives: bool, run_dirs: bool, output: str) -> None:
    """Archive the log text of runs that ended longer ago than --older-than
    (one compressed, verified file per run under <state dir>/archive/; a
    LogsArchived event records its sha256; `jobsup logs` reads it as
    before). Events are never deleted."""
    if not _AGE.match(older_than.strip()):
        raise UsageError(f"--older-than: {older_than!r} is not a duration; use e.g. 90s, 30m, 4h or 30d")
    report = connected_client().prune(
        older_than=older_than.strip(), dry_run=dry_run, delete_archives=delete_archives, run_dirs=run_dirs
    )
    if output != "table":
        emit(report, output)
        return
    rows: list[dict[str, Any]] = [
        {"kind": "archive log text", "runs": report["archive"]["runs"], "bytes": _size(report["archive"]["bytes"]),
         "note": f"{report['archive']['lines']} lines leave the database"},
        {"kind": "delete archives", "runs": report["delete_archives"]["runs"],
         "bytes": _size(report["delete_archives"]["bytes"]), "note": "" if delete_archives else "not asked (--delete-archives)"},
        {"kind": "run folders", "runs": report["run_dirs"]["runs"], "bytes": _size(report["run_dirs"]["bytes"]),
         "note": f"{report['run_dirs']['files']} files" + _unless_asked(run_dirs, dry_run)},
        {"kind": "snapshots", "runs": report["snapshots"]["count"], "bytes": _size(report["snapshots"]["bytes"]),
         "note": "unreferenced" + _unless_asked(run_dirs, dry_run)},
    ]  # fmt: skip
    emit(rows, "table", columns=("kind", "runs", "bytes", "note"))
    db = report["database"]
    if not dry_run and db.get("bytes_after") is not None:
        before, after = db["bytes_before"], db["bytes_after"]
        change = f"{_size(before)} -> {_size(after)}" if after != before else f"{_size(after)} (file size unchanged)"
        info(f"freed: database {change}")
    elif dry_run:
        info("dry run: nothing was changed")
    for err in report.get("errors") or []:
        info(f"warning: {err}")
