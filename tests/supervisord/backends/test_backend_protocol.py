"""The Backend protocol has no leaks: doctor is part of it, a backend gets
what it needs through RunSpec or its constructor, and the local backend
reads nothing of the run's recorded Submitted data."""

from __future__ import annotations

import ast
from pathlib import Path

import anyio
import pytest

from store import EventStore
from supervisord.daemon.backends.base import Backend, RunSpec
from supervisord.daemon.backends.local import LocalBackend
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.exceptions import PreflightError
from supervisord.shared.paths import Paths

ROOT = Path(__file__).resolve().parents[3]


def test_doctor_is_part_of_the_protocol() -> None:
    assert callable(getattr(Backend, "doctor", None))
    assert isinstance(LocalBackend(), Backend)


def test_kubernetes_backend_implements_the_protocol() -> None:
    from supervisord.daemon.backends.kubernetes import KubernetesBackend

    assert isinstance(KubernetesBackend(), Backend)


@pytest.mark.anyio
async def test_local_doctor_wire_shape() -> None:
    checks = await LocalBackend().doctor()
    assert checks and all(set(c) == {"name", "ok", "detail"} for c in checks)
    assert checks[0]["ok"] is True
    missing = await LocalBackend(shell="no-such-shell-here").doctor()
    assert missing[0]["ok"] is False and "no-such-shell-here" in missing[0]["detail"]


def test_local_backend_reads_no_submitted_data() -> None:
    for path in (ROOT / "supervisord" / "daemon" / "backends" / "local").rglob("*.py"):
        tree = ast.parse(path.read_text())
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert "submitted" not in used, path


class _Capture(LocalBackend):
    """A local backend that keeps the spec preflight got, then refuses."""

    specs: list[RunSpec] = []

    async def preflight(self, spec: RunSpec) -> list[str]:
        self.specs.append(spec)
        raise PreflightError("captured")


@pytest.mark.anyio
async def test_run_spec_carries_what_backends_read(tmp_path: Path) -> None:
    submitted = {
        "project": "p",
        "name": "n",
        "backend": "local",
        "command": "true",
        "timeout_s": 5,
        "env": {"A": "hmac-sha256:ab"},
        "manifest": "k8s/job.yaml",
        "source": {"snapshot_sha256": "00"},
    }
    backend = _Capture()
    async with await EventStore.open(tmp_path / "j.db") as store:
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": backend}, Paths(tmp_path, tmp_path / "s.sock"), tg)
            with pytest.raises(PreflightError):
                await sup.submit(submitted, env={"A": "v"})
    (spec,) = backend.specs
    assert spec.env_digests == {"A": "hmac-sha256:ab"} and spec.manifest == "k8s/job.yaml"
    assert spec.env == {"A": "v"}
