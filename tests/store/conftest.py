"""Fixtures for the event store tests: a fresh store on a real SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from store import EventStore


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "jobsup.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[EventStore]:
    s = await EventStore.open(db_path)
    try:
        yield s
    finally:
        await s.close()
