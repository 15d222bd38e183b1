"""The page's server leaves signals to the daemon: while it serves, SIGTERM
and SIGINT keep the handlers the daemon installed (uvicorn's own would take
them over, stop only the page, and raise the signal again afterwards)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from store import EventStore, RunStatus
from supervisord.daemon.ui import UiServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class _NoActions:
    async def resolve(self, ref: str) -> str:
        raise AssertionError("not used")

    async def cancel(self, run_id: str) -> RunStatus:
        raise AssertionError("not used")

    async def rerun(self, run_id: str) -> RunStatus:
        raise AssertionError("not used")

    async def queue(self) -> dict[str, Any] | None:
        return None


async def test_the_page_server_installs_no_signal_handler(tmp_path: Path) -> None:
    store = await EventStore.open(tmp_path / "jobsup.db")
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        page = UiServer(store=store, actions=_NoActions(), state_dir=tmp_path, settings={})
        async with anyio.create_task_group() as tg:
            tg.start_soon(page.serve)
            answer = await page.enable()
            async with httpx.AsyncClient() as client:
                r = await client.get(answer["url"].split("?")[0] + "healthz")
            assert r.status_code in (200, 401, 403, 404)  # the page serves
            during = {sig: signal.getsignal(sig) for sig in before}
            page.shutdown()
            with anyio.fail_after(30):
                while page.port is not None:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
    finally:
        await store.close()
    assert during == before
    assert {sig: signal.getsignal(sig) for sig in before} == before
