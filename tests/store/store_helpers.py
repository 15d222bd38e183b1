"""Event builders and raw-SQLite snapshots shared by the store tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from store import HANDLE_RECORDED, LOG_LINES, PHASE_CHANGED, SUBMITTED, NewEvent


def submitted(project: str = "proj", name: str = "train", backend: str = "local") -> NewEvent:
    return NewEvent(SUBMITTED, {"project": project, "name": name, "backend": backend, "command": "python train.py"})


def phase(value: str, reason: str | None = None, message: str | None = None, exit_code: int | None = None) -> NewEvent:
    data: dict[str, Any] = {"phase": value}
    if reason is not None:
        data["reason"] = reason
    if message is not None:
        data["message"] = message
    if exit_code is not None:
        data["exit_code"] = exit_code
    return NewEvent(PHASE_CHANGED, data)


def handle(**fields: Any) -> NewEvent:
    return NewEvent(HANDLE_RECORDED, {"handle": fields})


def lines(pairs: list[tuple[str, str]], stream: str = "stdout", source: str = "stdout") -> NewEvent:
    return NewEvent(LOG_LINES, {"stream": stream, "source": source, "lines": [list(p) for p in pairs]})


def snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every projection row, read with plain sqlite3, in primary-key order."""
    conn = sqlite3.connect(path)
    try:
        return {
            "runs": conn.execute("SELECT * FROM runs ORDER BY id").fetchall(),
            "log_blocks": conn.execute("SELECT * FROM log_blocks ORDER BY run_id, first_line").fetchall(),
            "log_sources": conn.execute("SELECT * FROM log_sources ORDER BY run_id, source").fetchall(),
        }
    finally:
        conn.close()
