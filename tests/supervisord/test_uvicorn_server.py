"""What jobsup takes from uvicorn stays in one module
(supervisord/daemon/api/uvicorn_server.py), and what it overrides there still
exists in the installed uvicorn (pyproject.toml bounds its version)."""

from __future__ import annotations

import ast
import inspect
import time
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from supervisord.daemon.api import uvicorn_server

ROOT = Path(__file__).resolve().parents[2]


def test_only_one_module_imports_uvicorn() -> None:
    importers = []
    for path in sorted((ROOT / "supervisord").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "uvicorn" or n.startswith("uvicorn.") for n in names):
                importers.append(str(path.relative_to(ROOT)))
    assert sorted(set(importers)) == ["supervisord/daemon/api/uvicorn_server.py"]


#: What supervisord/daemon/api/uvicorn_server.py overrides of uvicorn's classes.
OVERRIDES = {
    (uvicorn.Server, uvicorn_server.Server): {"__init__", "capture_signals", "startup", "main_loop"},
    (H11Protocol, uvicorn_server.FreshDateProtocol): {"connection_made"},
    (H11Protocol, uvicorn_server.PeerCredProtocol): {"connection_made"},
}


def test_the_overridden_methods_exist_in_the_installed_uvicorn() -> None:
    for (base, sub), names in OVERRIDES.items():
        defined = {n for n, v in vars(sub).items() if callable(v) or isinstance(v, property)}
        assert defined & set(dir(base)) == names, "an override of uvicorn not listed here"
        for name in names:
            theirs, ours = getattr(base, name), getattr(sub, name)
            assert callable(theirs), f"uvicorn's {base.__name__} has no {name} any more"
            # The same parameters: uvicorn calls ours as it would call its own.
            assert list(inspect.signature(theirs).parameters) == list(inspect.signature(ours).parameters), name
    # uvicorn.Server.serve must still go through capture_signals, or the
    # override no longer keeps the daemon's signal handlers.
    assert "capture_signals" in inspect.getsource(uvicorn.Server.serve)
    assert "self.started = True" in inspect.getsource(uvicorn.Server.startup)
    # main_loop's override relies on: _serve calling it, on_tick(0) refreshing
    # the headers and answering should_exit, and should_exit being a plain
    # attribute of uvicorn's (ours is a property that wakes main_loop).
    assert "await self.main_loop()" in inspect.getsource(uvicorn.Server._serve)
    on_tick = inspect.getsource(uvicorn.Server.on_tick)
    assert "counter % 10 == 0" in on_tick and "default_headers" in on_tick and "self.should_exit" in on_tick
    assert "self.should_exit = False" in inspect.getsource(uvicorn.Server.__init__)
    assert "self.server_state.default_headers" in inspect.getsource(H11Protocol.handle_events)


class _CountingServer(uvicorn_server.Server):
    """Counts the main loop's passes."""

    ticks = 0

    async def on_tick(self, counter: int) -> bool:
        self.ticks += 1
        return await super().on_tick(counter)


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.mark.anyio
async def test_an_idle_server_does_not_tick_and_stops_at_once(tmp_path: Path) -> None:
    """uvicorn's main loop woke ten times a second; an idle server here
    sleeps until told to stop, and stops without waiting for a tick."""
    path = str(tmp_path / "api.sock")
    server = _CountingServer(uvicorn_server.Config(_hello, uds=path, lifespan="off", log_config=None))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(30):
            await server.ready.wait()
        await anyio.sleep(1.0)
        assert server.ticks <= 2  # the first pass (and one more on a slow machine); uvicorn's: ~11
        # A request after the idle spell is answered with today's Date.
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path)) as client:
            response = await client.get("http://api/")
        assert response.text == "hello"
        assert abs(parsedate_to_datetime(response.headers["date"]).timestamp() - time.time()) < 30
        assert server.ticks <= 3  # no 0.1 s ticks while the connection was open either
        stopping = time.monotonic()
        server.should_exit = True
    assert time.monotonic() - stopping < 10  # woken, not polled (a deadline, not a tight bound)
    assert server.ticks <= 4
