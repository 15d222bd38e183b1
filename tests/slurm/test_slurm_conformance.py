"""The backend conformance suite on the real one-node Slurm, over the local
commands and over ssh (tests/supervisord/backends/conformance.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.slurm.slurm_env import SlurmCluster
from tests.supervisord.backends.conformance import SCENARIOS, BackendHarness, SupervisorHarness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@pytest.fixture
async def harness(slurm: SlurmCluster, transport: str, tmp_path: Path) -> AsyncIterator[SupervisorHarness]:
    h = BackendHarness(
        name="slurm",
        make=slurm.backend,
        config=slurm.config(transport, tmp_path),
        stderr_stream="stdout",
    )
    async for sh in SupervisorHarness.open(tmp_path, h):
        yield sh


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_slurm_conformance(harness: SupervisorHarness, scenario: str) -> None:
    await SCENARIOS[scenario](harness)
