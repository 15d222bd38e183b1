"""The backend conformance suite: every backend must pass these scenarios.

A backend joins by providing a :class:`BackendHarness` (see
``test_conformance.py``): how to build the backend and any per-run config.
Scenarios drive the real :class:`~supervisord.daemon.supervisor.Supervisor` over a
real event store on a temporary SQLite file, so what is checked is what the
daemon records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from store import EventStore, RunStatus
from supervisord.daemon.backends.base import Backend
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.paths import Paths
from supervisord.shared.source import SnapshotStore, resolve_commit
from tests.supervisord.jobsup_env import make_repo

__all__ = ["BackendHarness", "SupervisorHarness"]


@dataclasses.dataclass
class BackendHarness:
    """How a backend takes part: ``make()`` builds a fresh backend; ``config``
    is the effective config each run gets (e.g. kubernetes.namespace)."""

    name: str
    make: Callable[[], Backend]
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Extra per-run files (e.g. the Kubernetes manifest) committed to the repo.
    repo_files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Submitted-event extras (e.g. {"manifest": ".jobsup/k8s.yaml"}).
    submitted: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # The stream stderr lines are recorded under: "stdout" where the backend
    # reads one merged log (the Kubernetes pods/log API serves both streams
    # as one unless a cluster enables the alpha PodLogsQuerySplitStreams).
    stderr_stream: str = "stderr"


class SupervisorHarness:
    """A supervisor over a real store, with one backend, in a task group."""

    def __init__(self, root: Path, harness: BackendHarness, store: EventStore, supervisor: Supervisor) -> None:
        self.root = root
        self.harness = harness
        self.store = store
        self.supervisor = supervisor
        self.repo = root / "repo"
        files = {
            "hello.sh": "echo hello-out\necho hello-err >&2\nprintf 'tail-no-newline'\n",
            **harness.repo_files,
        }
        self.commit = resolve_commit(make_repo(self.repo, files), "HEAD")
        self.snapshot = SnapshotStore(root / "state" / "snapshots").create(self.repo, self.commit)

    @classmethod
    async def open(cls, root: Path, harness: BackendHarness) -> AsyncIterator[SupervisorHarness]:
        """Async generator fixture body: yields a ready harness, cleans up after."""
        paths = Paths(state_dir=root / "state", socket=root / "s.sock")
        paths.runs_dir.mkdir(parents=True, exist_ok=True)
        store = await EventStore.open(paths.database)
        backend = harness.make()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(backend.serve)
                sup = Supervisor(store, {harness.name: backend}, paths, tg)
                yield cls(root, harness, store, sup)
                tg.cancel_scope.cancel()
        finally:
            await backend.aclose()
            await store.close()

    async def submit(
        self, command: str, *, timeout_s: int = 600, name: str = "t", env: Mapping[str, str] | None = None
    ) -> str:
        submitted = {
            "project": "conformance",
            "name": name,
            "backend": self.harness.name,
            "command": command,
            "timeout_s": timeout_s,
            "source": {"repo": str(self.repo), "commit": self.commit, "snapshot_sha256": self.snapshot.sha256},
            "config": dict(self.harness.config),
            **self.harness.submitted,
        }
        return (await self.supervisor.submit(submitted, env=env, force=True)).id

    async def wait_until(self, run_id: str, pred: Callable[[RunStatus], bool], timeout_s: float = 120) -> RunStatus:
        """Block (on store notifications) until ``pred(run)``; fail after ``timeout_s``."""
        with anyio.fail_after(timeout_s):
            while True:
                run = await self.store.get_run(run_id)
                assert run is not None
                if pred(run):
                    return run
                await self.store.wait_for_events(run.last_seq, run_ids=[run_id], timeout_s=5)

    async def terminal(self, run_id: str, timeout_s: float = 120) -> RunStatus:
        return await self.wait_until(run_id, lambda r: r.terminal, timeout_s)

    async def lines(self, run_id: str) -> list[tuple[str, str]]:
        return [(l.stream, l.text) for l in await self.store.log_lines(run_id, 0, 100000)]

    async def phases(self, run_id: str) -> list[str]:
        return [e.data["phase"] for e in await self.store.read_stream(run_id) if e.type == "PhaseChanged"]


Scenario = Callable[[SupervisorHarness], Awaitable[None]]


async def scenario_completes_with_logs(h: SupervisorHarness) -> None:
    run_id = await h.submit("bash hello.sh")
    run = await h.terminal(run_id)
    assert run.phase == "COMPLETED" and run.exit_code == 0, run
    lines = await h.lines(run_id)
    assert ("stdout", "hello-out") in lines and (h.harness.stderr_stream, "hello-err") in lines
    assert ("stdout", "tail-no-newline") in lines
    assert len(lines) == 3
    phases = await h.phases(run_id)
    assert phases[-2:] == ["RUNNING", "COMPLETED"], phases


async def scenario_nonzero_exit(h: SupervisorHarness) -> None:
    run_id = await h.submit("echo bye; exit 3")
    run = await h.terminal(run_id)
    assert run.phase == "ERROR" and run.exit_code == 3, run


async def scenario_deadline(h: SupervisorHarness) -> None:
    run_id = await h.submit("sleep 120", timeout_s=2)
    run = await h.terminal(run_id, timeout_s=90)
    assert run.phase == "ERROR" and run.reason == "DeadlineExceeded", run


async def scenario_cancel(h: SupervisorHarness) -> None:
    run_id = await h.submit("echo started; sleep 300")
    await h.wait_until(run_id, lambda r: r.phase == "RUNNING")
    run = await h.supervisor.cancel(run_id)
    assert run.phase == "CANCELED", run
    again = await h.supervisor.cancel(run_id)
    assert again.phase == "CANCELED" and again.version == run.version


async def scenario_env_is_passed_not_recorded(h: SupervisorHarness) -> None:
    run_id = await h.submit('echo "token=$API_TOKEN"', env={"API_TOKEN": "v4lue-zz"})
    await h.terminal(run_id)
    assert ("stdout", "token=v4lue-zz") in await h.lines(run_id)
    for ev in await h.store.read_stream(run_id):
        if ev.type != "LogLines":
            assert "v4lue-zz" not in str(ev.data)


SCENARIOS: dict[str, Scenario] = {
    "completes_with_logs": scenario_completes_with_logs,
    "nonzero_exit": scenario_nonzero_exit,
    "deadline": scenario_deadline,
    "cancel": scenario_cancel,
    "env_is_passed_not_recorded": scenario_env_is_passed_not_recorded,
}
