"""The supervisor over a real store: run-id resolution and phase rules."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from store import EventStore, NewEvent
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.exceptions import AmbiguousRunError, RunNotFoundError, UsageError
from supervisord.shared.paths import Paths

pytestmark = pytest.mark.anyio


def _submitted(name: str) -> NewEvent:
    return NewEvent("Submitted", {"project": "p", "name": name, "backend": "local"})


async def test_resolve_prefixes(tmp_path: Path) -> None:
    async with await EventStore.open(tmp_path / "j.db") as store:
        for rid in ("abcd00000001", "abcd00000002", "abce00000003"):
            await store.append(rid, 0, [_submitted(rid)])
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {}, Paths(tmp_path, tmp_path / "s.sock"), tg)
            assert await sup.resolve("abce") == "abce00000003"
            assert await sup.resolve("ABCD00000002") == "abcd00000002"
            with pytest.raises(AmbiguousRunError, match="abcd00000001, abcd00000002"):
                await sup.resolve("abcd")
            with pytest.raises(RunNotFoundError):
                await sup.resolve("ffff")
            with pytest.raises(UsageError, match="4\\+"):
                await sup.resolve("abc")
            with pytest.raises(UsageError):
                await sup.resolve("not-hex!")
