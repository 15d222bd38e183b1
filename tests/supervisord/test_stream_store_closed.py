"""A stream whose store closes under it (the daemon is stopping) ends with
a DaemonStoppingError record, which clients take as a lost daemon and
reconnect from, not with the store error, which ended ``jobsup wait``
with exit 69 while the next daemon was starting (CI, under load)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import pytest

from store.errors import StoreClosedError
from supervisord.daemon.api.boundary import _ends_with_error_record
from supervisord.shared.exceptions import DaemonStoppingError, DaemonUnreachableError, StorageError
from supervisord.shared.wire import raise_error_record


async def _lines(error: Exception) -> list[bytes]:
    async def body() -> AsyncIterator[str]:
        yield '{"after": 1}\n'
        raise error

    return [chunk async for chunk in _ends_with_error_record(body(), "/v1/wait")]


def test_a_store_closed_under_a_stream_is_a_stopping_daemon() -> None:
    lines = anyio.run(_lines, StoreClosedError("/x/jobsup.db: the store was closed while waiting"))
    assert lines[0] == b'{"after": 1}\n'
    with pytest.raises(DaemonStoppingError) as info:
        raise_error_record(json.loads(lines[-1]))
    assert isinstance(info.value, DaemonUnreachableError)  # what the CLI reconnects on


def test_other_store_errors_stay_storage_errors() -> None:
    from store.errors import StorageFullError

    lines = anyio.run(_lines, StorageFullError("database or disk is full"))
    with pytest.raises(StorageError):
        raise_error_record(json.loads(lines[-1]))
