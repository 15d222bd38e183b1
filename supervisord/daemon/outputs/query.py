"""Reading recorded outputs: ``jobsup outputs RUN`` and ``jobsup which FILE``.

Read side only (the store's events): nothing here writes.

``outputs`` document (``GET /v1/runs/{ref}/outputs``, schema ``outputs``)::

    {"run": id, "phase": str, "dir": str | None,
     "state": "recorded" | "pending" | "none",
     "recorded_at": str | None, ...the OutputsRecorded data when recorded}

``which`` document (``POST /v1/which`` ``{"sha256": [HEX...]}``, schema ``which``)::

    {"files": [{"sha256": hex, "runs": [{"run", "project", "name", "commit",
                "config_digest", "path", "bytes", "mtime", "recorded_at"}]}]}
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from store import EventStore
from supervisord.daemon.outputs import run_outputs_dir
from supervisord.shared.events import OUTPUTS_RECORDED
from supervisord.shared.exceptions import RunNotFoundError, UsageError

__all__ = ["MAX_DIGESTS", "config_digest", "run_outputs", "which"]

#: The most digests one ``which`` asks about.
MAX_DIGESTS: Final = 1000
_HEX = re.compile(r"^[0-9a-f]{64}$")


def config_digest(config: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a run's recorded (redacted) effective config as
    canonical JSON (sorted keys, no spaces): equal digests, equal configs."""
    raw = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(raw.encode("utf-8")).hexdigest()


async def run_outputs(store: EventStore, run_id: str) -> dict[str, Any]:
    """The ``outputs`` document of ``run_id`` (a full id). Raises RunNotFoundError."""
    status = await store.get_run(run_id)
    firsts = await store.first_events([run_id])
    if status is None or run_id not in firsts:
        raise RunNotFoundError(f"no run {run_id}")
    folder = run_outputs_dir(firsts[run_id].data, run_id)
    doc: dict[str, Any] = {
        "run": run_id,
        "phase": status.phase,
        "dir": str(folder) if folder is not None else None,
        "state": "none" if folder is None else "pending",
        "recorded_at": None,
    }
    if folder is None:
        return doc
    recorded = await store.read_all(0, limit=1, run_id=run_id, types=[OUTPUTS_RECORDED])
    if recorded:
        doc.update(recorded[0].data)
        doc["dir"] = str(folder)
        doc["state"] = "recorded"
        doc["recorded_at"] = recorded[0].at
    return doc


def check_digests(digests: Sequence[str]) -> list[str]:
    """The digests asked about, lower-cased, each 64 hex characters, at
    most :data:`MAX_DIGESTS`. Raises UsageError naming a bad one."""
    if not digests:
        raise UsageError("which: give at least one sha256")
    if len(digests) > MAX_DIGESTS:
        raise UsageError(f"which: at most {MAX_DIGESTS} files at a time, got {len(digests)}")
    out = []
    for d in digests:
        low = d.strip().lower().removeprefix("sha256:")
        if not _HEX.match(low):
            raise UsageError(f"which: {d[:80]!r} is not a sha256 (64 hex characters)")
        out.append(low)
    return out


async def which(store: EventStore, digests: Sequence[str]) -> dict[str, Any]:
    """The ``which`` document: for each digest (in the order given), every
    recorded output file with that sha256, oldest first (from the store's
    ``output_files`` index). Raises UsageError for a bad digest."""
    wanted = check_digests(digests)
    # The store's index of output files by sha256 (store.outputindex): one
    # range read per digest, not a scan of every OutputsRecorded event.
    indexed = await store.outputs_by_sha256(wanted)
    found: dict[str, list[dict[str, Any]]] = {d: [dict(m) for m in indexed.get(d, [])] for d in wanted}
    runs = {m["run"] for matches in found.values() for m in matches}
    firsts = await store.first_events(runs) if runs else {}
    for matches in found.values():
        for m in matches:
            sub = firsts[m["run"]].data if m["run"] in firsts else {}
            source = sub.get("source") or {}
            m.update(
                project=sub.get("project"),
                name=sub.get("name"),
                commit=source.get("commit") if isinstance(source, Mapping) else None,
                config_digest=config_digest(sub.get("config") or {}),
            )
    return {"files": [{"sha256": d, "runs": found[d]} for d in wanted]}
