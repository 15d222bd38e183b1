"""Every backend passes the same scenarios (see conformance.py)."""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import pytest

from supervisord.backends.local import LocalBackend
from tests.supervisord.backends.conformance import SCENARIOS, BackendHarness, SupervisorHarness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

HARNESSES = {
    "local": lambda: BackendHarness(name="local", make=lambda: LocalBackend(kill_grace_s=2)),
}


@pytest.fixture(params=sorted(HARNESSES))
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SupervisorHarness]:
    async for h in SupervisorHarness.open(tmp_path, HARNESSES[request.param]()):
        yield h


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_backend_conformance(harness: SupervisorHarness, scenario: str) -> None:
    await SCENARIOS[scenario](harness)
