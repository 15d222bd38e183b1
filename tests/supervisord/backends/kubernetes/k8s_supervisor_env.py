"""A supervisor over a real event store driving a real KubernetesBackend on
the simulated cluster, for the backend's end-to-end tests (not a test
module)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from store import EventStore, RecordedEvent, RunStatus
from supervisord.daemon.backends.kubernetes import KubernetesBackend
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared.paths import Paths
from supervisord.shared.secret import env_digest
from supervisord.shared.source import SnapshotStore, resolve_commit
from tests.k8s_sim import SimCluster
from tests.supervisord.backends.kubernetes.k8s_backend_helpers import kube_config, make_backend
from tests.supervisord.jobsup_env import make_repo

#: The env-digest key of these tests' "daemon".
DIGEST_KEY = b"k8s-e2e-digest-key"


class K8sEnv:
    """One daemon's worth of state: store, supervisor, backend, a repo."""

    def __init__(
        self, root: Path, sim: SimCluster, store: EventStore, supervisor: Supervisor, backend: KubernetesBackend
    ) -> None:
        self.root = root
        self.sim = sim
        self.store = store
        self.supervisor = supervisor
        self.backend = backend
        self.repo = root / "repo"
        self.snapshots = SnapshotStore(root / "state" / "snapshots")

    def commit(self, files: Mapping[str, str]) -> str:
        """Commit ``files`` into the env's repository (made on first use)."""
        if not (self.repo / ".git").exists():
            return resolve_commit(make_repo(self.repo, files), "HEAD")
        import subprocess

        for rel, text in files.items():
            (self.repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.repo / rel).write_text(text)
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(self.repo)]
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "more", "--allow-empty"], check=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()

    async def submit(
        self,
        command: str,
        *,
        manifest: str,
        files: Mapping[str, str] | None = None,
        kube: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: int = 600,
        name: str = "t",
        retry: Mapping[str, Any] | None = None,
    ) -> str:
        """Commit ``files``, then submit ``command`` with the manifest at
        repository path ``manifest``; returns the run id."""
        commit = await anyio.to_thread.run_sync(self.commit, dict(files or {}))
        snapshot = await anyio.to_thread.run_sync(self.snapshots.create, self.repo, commit)
        config = kube_config(self.sim, **dict(kube or {}))
        submitted = {
            "project": "k8s-e2e",
            "name": name,
            "backend": "kubernetes",
            "command": command,
            "timeout_s": timeout_s,
            "source": {"repo": str(self.repo), "commit": commit, "snapshot_sha256": snapshot.sha256},
            "config": config,
            "env": env_digest(dict(env or {}), DIGEST_KEY),
            "manifest": manifest,
        }
        if retry is not None:  # a retry policy (supervisord.shared.retry)
            submitted["scheduling"] = {"gpus": 0, "queue": "default", "priority": 0, "after": [], "after_any": [],
                                       "hold": False, "retry": dict(retry)}  # fmt: skip
        return (await self.supervisor.submit(submitted, env=env, force=True)).id

    async def wait_until(self, run_id: str, pred: Callable[[RunStatus], bool], timeout_s: float = 60) -> RunStatus:
        """Block on store notifications until ``pred(run)``."""
        with anyio.fail_after(timeout_s):
            while True:
                run = await self.store.get_run(run_id)
                assert run is not None
                if pred(run):
                    return run
                await self.store.wait_for_events(run.last_seq, run_ids=[run_id], timeout_s=2)

    async def terminal(self, run_id: str, timeout_s: float = 60) -> RunStatus:
        return await self.wait_until(run_id, lambda r: r.terminal, timeout_s)

    async def lines(self, run_id: str) -> list[str]:
        return [line.text for line in await self.store.log_lines(run_id, 0, 1_000_000)]

    async def events(self, run_id: str, type_: str | None = None) -> list[RecordedEvent]:
        return [e for e in await self.store.read_stream(run_id) if type_ is None or e.type == type_]

    async def phases(self, run_id: str) -> list[tuple[str, str | None]]:
        return [(e.data["phase"], e.data.get("reason")) for e in await self.events(run_id, "PhaseChanged")]


@contextlib.asynccontextmanager
async def k8s_env(root: Path, sim: SimCluster, *, reattach: bool = False, **backend_kw: Any) -> AsyncIterator[K8sEnv]:
    """A supervisor with a KubernetesBackend over the store in ``root``
    (reused when it exists: ``reattach`` resumes its runs, as a restarted
    daemon does). Leaving it stops supervision, not the runs."""
    paths = Paths(state_dir=root / "state", socket=root / "s.sock")
    paths.runs_dir.mkdir(parents=True, exist_ok=True)
    store = await EventStore.open(paths.database)
    backend = make_backend(sim, **backend_kw)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(backend.serve)
            supervisor = Supervisor(store, {"kubernetes": backend}, paths, tg)
            if reattach:
                await supervisor.reattach_all()
            yield K8sEnv(root, sim, store, supervisor, backend)
            tg.cancel_scope.cancel()
    finally:
        await backend.aclose()
        await store.close()
