"""``jobsup outputs RUN`` and ``jobsup which FILE...``: a run's outputs
folder and files, and which run produced a file (by its sha256).

They talk to the daemon only through :class:`supervisord.client.api.Client`;
``which`` hashes the files here and sends only their digests.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from supervisord.client.cli.output import echo, emit, info, output_option, warn
from supervisord.client.cli.reads import connected_client
from supervisord.shared.exceptions import UsageError
from supervisord.shared.runref import check_run_refs

__all__ = ["EXIT_NOT_FOUND", "outputs", "which"]

#: ``jobsup which`` exit code when a file was produced by no recorded run.
EXIT_NOT_FOUND = 1

_FILE_COLUMNS = ("path", "bytes", "sha256", "mtime")
_WHICH_COLUMNS = ("file", "run", "project", "name", "commit", "config_digest", "recorded_at")


@click.command("outputs")
@click.argument("run")
@click.option("--path", "path_only", is_flag=True, help="Print the run's outputs folder (JOBSUP_OUTPUT_DIR) only.")
@output_option()
def outputs(run: str, path_only: bool, output: str) -> None:
    """The files RUN left in its outputs folder: path, bytes, sha256, mtime
    (recorded when the run ended; symlinks and special files are listed as
    skipped, never followed)."""
    check_run_refs([run])
    doc = connected_client().outputs(run)
    if path_only:
        if not doc.get("dir"):
            raise UsageError(f"run {doc['run']} has no outputs folder (only local runs have one)")
        echo(doc["dir"])
        return
    if output != "table":
        emit(doc, output)
        return
    state = doc.get("state")
    if state == "none":
        info(f"run {doc['run']} has no outputs folder (only local runs have one)")
        return
    if state == "pending":
        info(f"run {doc['run']} is {doc['phase']}: its outputs are listed once it has ended (folder {doc['dir']})")
        return
    files = doc.get("files") or []
    emit([{k: f.get(k) for k in _FILE_COLUMNS} for f in files], "table", columns=_FILE_COLUMNS)
    for s in doc.get("skipped") or []:
        warn(f"skipped {s['path']}: {s['kind']}")
    for v in doc.get("vanished") or []:
        warn(f"vanished while listed: {v}")
    more = f", {doc['omitted']} more not listed" if doc.get("omitted") else ""
    info(f"{doc.get('total_files', 0)} file(s), {doc.get('total_bytes', 0)} bytes in {doc['dir']}{more}")


@click.command("which")
@click.argument("files", metavar="FILE...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@output_option()
def which(files: tuple[str, ...], output: str) -> None:
    """Which run produced FILE: found by its sha256 among the outputs jobsup
    recorded (run id, name, commit, config digest, when). Exits 1 when a
    file was produced by no recorded run."""
    from supervisord.shared.outputscan import sha256_file

    digests = []
    for f in files:
        try:
            digests.append(sha256_file(f)[0])
        except OSError as err:
            raise UsageError(f"{f}: {err.strerror or err}") from None
    doc = connected_client().which(digests)
    result: list[dict[str, Any]] = [
        {"file": f, **entry} for f, entry in zip(files, doc.get("files") or [], strict=True)
    ]
    missing = [r["file"] for r in result if not r["runs"]]
    if output != "table":
        emit({"files": result}, output)
    else:
        rows = [{"file": r["file"], **m, "commit": (m.get("commit") or "")[:12]} for r in result for m in r["runs"]]
        if rows:
            emit(rows, "table", columns=_WHICH_COLUMNS)
        for f in missing:
            warn(f"{f}: no recorded run produced this file (no output with its sha256)")
    if missing:
        sys.exit(EXIT_NOT_FOUND)
