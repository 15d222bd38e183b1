"""Errors at the daemon and API boundaries: one exception tree, store errors
wrapped, a typed wire codec, a run's reason that is the backend's and never a
Kubernetes Status reason."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from store import EventStore
from store.errors import StorageFullError, StoreLockedError
from supervisord.daemon.backends.base import RunReporter, RunSpec
from supervisord.daemon.supervisor import Supervisor
from supervisord.shared import exceptions as exc
from supervisord.shared.paths import Paths
from supervisord.shared.wire import from_wire, to_wire
from tests.supervisord.jobsup_env import JobsupEnv

pytestmark = pytest.mark.timeout(120)


# -- defect 1: a corrupt database at daemon start ------------------------------


def test_daemon_on_corrupt_database_prints_one_error_line(js: JobsupEnv) -> None:
    js.state_dir.mkdir(parents=True)
    db = js.state_dir / "jobsup.db"
    db.write_bytes(b"this is not an SQLite database, just some bytes\n" * 200)
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", "daemon"], env=js.env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert str(db) in errors[0] and "JOBSUP_STATE_DIR" in errors[0]
    assert db.read_bytes().startswith(b"this is not an SQLite database")  # left untouched


# -- defect 2: store errors from the daemon reach the CLI as JobsupErrors -------


def _runs_answer(store_error: Exception, *, last_seq_fails: bool = False) -> tuple[int, Any]:
    """``(HTTP status, JSON body)`` of ``GET /v1/runs`` over a store whose
    ``list_runs`` raises ``store_error`` (and ``last_seq`` too, with
    ``last_seq_fails``)."""
    from starlette.testclient import TestClient

    from supervisord.daemon.api.server import create_app

    class BrokenStore:
        async def list_runs(self, **kwargs: Any) -> Any:
            raise store_error

        async def last_seq(self) -> int:
            if last_seq_fails:
                raise store_error
            return 0

    async def doctor() -> list[dict[str, Any]]:
        return []

    app = create_app(supervisor=None, planner=None, store=BrokenStore(), info={}, doctor=doctor)  # type: ignore[arg-type]
    with TestClient(app) as http:
        resp = http.get("/v1/runs")
    return resp.status_code, resp.json()


@pytest.mark.parametrize(
    "store_error", [StorageFullError("database or disk is full"), StoreLockedError("database is locked")]
)
def test_store_error_at_api_boundary_is_a_storage_error(tmp_path: Path, store_error: Exception) -> None:
    status, body = _runs_answer(store_error, last_seq_fails=True)
    assert status == 503
    err = from_wire(status, body)
    assert isinstance(err, exc.StorageError) and isinstance(err, exc.JobsupError)
    assert err.store_error == type(store_error).__name__
    assert str(store_error) in str(err)


def test_deleted_log_text_at_api_boundary_is_410_logs_deleted_not_a_storage_error() -> None:
    """Log text deleted by retention is not an event-store failure: its own
    type, HTTP 410 (a retry gets the same answer), the store's message as is."""
    from store.errors import LogTextDeletedError

    message = "run r1: its log text (lines 1..8) was deleted at T by prune (LogsDeleted, event seq 9, sha256:ab)"
    status, body = _runs_answer(LogTextDeletedError(message))
    assert status == 410, body
    assert body["error"]["type"] == "LogsDeletedError"
    err = from_wire(status, body)
    assert type(err) is exc.LogsDeletedError and not isinstance(err, exc.StorageError)
    assert str(err) == message and err.errors == [message]


def test_damaged_log_archive_at_api_boundary_is_500_logs_damaged_not_a_retry() -> None:
    """A tampered, missing or untrusted log archive is not a transient
    store fault: HTTP 500 with its own type (a StorageError still, for
    clients that catch those), the store's message as is; 503 would tell
    clients to retry."""
    from store.errors import LogArchiveError

    message = (
        "run r1: its log archive /s/archive/r1.jslog does not match the digest recorded when it was archived"
        " (sha256:aa, the file is sha256:bb): the file was changed or damaged; nothing was read from it"
    )
    status, body = _runs_answer(LogArchiveError(message))
    assert status == 500, body
    assert body["error"]["type"] == "LogsDamagedError"
    err = from_wire(status, body)
    assert type(err) is exc.LogsDamagedError and isinstance(err, exc.StorageError)
    assert err.store_error == "LogArchiveError"
    assert str(err) == message and err.errors == [message]
    # A client that knows only StorageError still gets one (the wire's bases).
    older = from_wire(500, {"error": {**body["error"], "type": "SomeNewerName"}})
    assert type(older) is exc.StorageError and str(older) == message


def _serve(path: Path, status: int, body: Mapping[str, Any]) -> None:
    """An HTTP server on a Unix socket that answers ``/v1/health`` like a
    daemon and every other request with ``status`` and ``body``."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
    srv.settimeout(60)

    def answer(conn: socket.socket) -> None:
        request = conn.recv(65536)
        code, payload = (200, b'{"ok": true}') if b" /v1/health " in request else (status, json.dumps(body).encode())
        conn.sendall(
            f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + payload
        )

    def run() -> None:
        with srv:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                with conn:
                    answer(conn)

    threading.Thread(target=run, daemon=True).start()


def test_cli_prints_storage_error_and_exits_1(js: JobsupEnv) -> None:
    wrapped = exc.StorageError(
        "the jobsup daemon's event store failed: database or disk is full", store_error="StorageFullError"
    )
    _serve(js.socket, *to_wire(wrapped))
    r = js.cli("cancel", "abcd1234", check=False)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [f"error: {wrapped}"]


def test_wire_never_rebuilds_a_store_class() -> None:
    """The old codec rebuilt ``StorageFullError`` by name from the re-exported
    store classes: not a JobsupError, so the CLI printed a traceback."""
    err = from_wire(503, {"error": {"type": "StorageFullError", "message": "disk full", "errors": ["disk full"]}})
    assert isinstance(err, exc.JobsupError)
    assert isinstance(err, exc.RemoteError) and err.remote_type == "StorageFullError" and err.http_status == 503


# -- defect 3: unknown or typed errors round-trip, with a documented fallback ----


def _tree() -> list[type[exc.JobsupError]]:
    return [getattr(exc, name) for name in exc.__all__ if isinstance(getattr(exc, name), type)]


def _instance(cls: type[exc.JobsupError]) -> exc.JobsupError:
    if cls is exc.KubernetesApiError:
        return cls("get Job/x: not found", status=404, reason="NotFound", retry_after_s=1.5)
    if cls is exc.StorageError:
        return cls("disk full", store_error="StorageFullError")
    if cls is exc.RemoteError:
        return cls("odd", remote_type="Odd", http_status=418)
    if cls is exc.RunFailed:
        return cls("boom", "CreateFailed", ["boom", "and more"])
    if cls is exc.StagingError:
        return cls("boom", "ImagePullBackOff", ["boom", "and more"])
    if issubclass(cls, exc.BackendError):
        return cls("boom", ["boom", "and more"], run_reason="StagingFailed")
    return cls("bad thing", ["bad thing", "second problem"])


@pytest.mark.parametrize("cls", _tree(), ids=lambda c: c.__name__)
def test_every_error_round_trips_through_the_wire(cls: type[exc.JobsupError]) -> None:
    err = _instance(cls)
    status, body = to_wire(err)
    back = from_wire(status, json.loads(json.dumps(body)))
    assert type(back) is cls
    assert str(back) == str(err) and back.errors == err.errors
    assert back.wire_fields() == err.wire_fields()
    assert body["error"]["errors"]  # every error carries an errors list


def test_kubernetes_api_error_keeps_its_type_and_status() -> None:
    status, body = to_wire(exc.KubernetesApiError("create Job/x: forbidden", status=403, reason="Forbidden"))
    assert status == exc.BackendError.http_status == 502
    back = from_wire(status, body)
    assert isinstance(back, exc.KubernetesApiError)
    assert (back.status, back.reason, back.run_reason) == (403, "Forbidden", "BackendError")


def test_unknown_subclass_decodes_to_its_nearest_known_base() -> None:
    class KubernetesGoneError(exc.KubernetesApiError):
        pass

    status, body = to_wire(KubernetesGoneError("watch: too old", status=410, reason="Expired"))
    body["error"]["type"] = "SomeNewerKubernetesError"  # a class this client does not know
    back = from_wire(status, body)
    assert type(back) is KubernetesGoneError or type(back) is exc.KubernetesApiError
    assert isinstance(back, exc.KubernetesApiError) and back.status == 410


def test_unknown_type_decodes_to_remote_error() -> None:
    back = from_wire(500, {"error": {"type": "Weird", "message": "m", "errors": ["m"]}})
    assert isinstance(back, exc.RemoteError) and back.remote_type == "Weird" and back.http_status == 500
    odd = from_wire(502, "<html>bad gateway</html>")
    assert isinstance(odd, exc.RemoteError) and odd.http_status == 502


def test_non_jobsup_exception_travels_as_internal_error() -> None:
    status, body = to_wire(RuntimeError("bug"))
    assert status == 500 and body["error"]["type"] == "InternalError" and body["error"]["errors"]
    back = from_wire(status, body)
    assert isinstance(back, exc.RemoteError) and back.remote_type == "InternalError"


# -- defect 4: a Kubernetes Status reason is never the run's reason -------------


class _FailingBackend:
    name = "local"

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def preflight(self, spec: RunSpec) -> list[str]:
        return []

    async def start(self, spec: RunSpec, reporter: RunReporter) -> Mapping[str, Any]:
        raise self.error

    async def supervise(self, spec: RunSpec, handle: Mapping[str, Any], reporter: RunReporter) -> None:
        raise AssertionError("not reached")

    async def cancel(self, spec: RunSpec, handle: Mapping[str, Any]) -> None:
        pass

    async def doctor(self) -> list[dict[str, Any]]:
        return []

    async def serve(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (exc.KubernetesApiError('get Job/x: jobs.batch "x" not found', status=404, reason="NotFound"), "BackendError"),
        (exc.BackendError("staging failed", run_reason="StagingFailed"), "StagingFailed"),
        (exc.BackendError("plain"), "BackendError"),
    ],
)
async def test_backend_error_records_the_runs_reason(tmp_path: Path, error: Exception, reason: str) -> None:
    submitted = {
        "project": "p",
        "name": "n",
        "backend": "local",
        "command": "true",
        "timeout_s": 60,
        "source": {"commit": "c", "snapshot_sha256": "00"},
    }
    async with await EventStore.open(tmp_path / "j.db") as store:
        async with anyio.create_task_group() as tg:
            sup = Supervisor(store, {"local": _FailingBackend(error)}, Paths(tmp_path, tmp_path / "s.sock"), tg)  # type: ignore[dict-item]
            run = await sup.submit(submitted)
            with anyio.fail_after(30):
                while not (await sup.get(run.id)).terminal:
                    await anyio.sleep(0.01)
            final = await sup.get(run.id)
        assert (final.phase, final.reason) == ("ERROR", reason)
        assert final.message == str(error)


def test_store_error_in_a_scheduler_route_is_a_storage_error() -> None:
    """The scheduler's routes (queue, hold, release, rerun) share the API
    boundary: a store error there is a 503 StorageError too, not a 500."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from supervisord.daemon.api.server import create_app

    class BrokenScheduler:
        def view(self) -> Any:
            raise StorageFullError("database or disk is full")

    async def doctor() -> list[dict[str, Any]]:
        return []

    planner = SimpleNamespace(digest_key=b"k" * 32, source_at=None)
    app = create_app(
        supervisor=None,  # type: ignore[arg-type]
        planner=planner,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        info={},
        doctor=doctor,
        scheduler=BrokenScheduler(),  # type: ignore[arg-type]
    )
    with TestClient(app) as http:
        resp = http.get("/v1/queue")
    assert resp.status_code == 503, resp.text
    err = from_wire(resp.status_code, resp.json())
    assert isinstance(err, exc.StorageError) and err.store_error == "StorageFullError"


# -- each error class carries its HTTP status and CLI exit code -----------------

#: What the three maps said before the classes did (wire.ERROR_STATUS,
#: cli.reads.error_exit_code), and the classes brought into the tree since.
EXPECTED = {
    exc.JobsupError: (500, 1),
    exc.UsageError: (400, 2),
    exc.TaskError: (400, 2),
    exc.ConfigError: (400, 2),
    exc.UiConfigError: (400, 2),
    exc.SourceError: (400, 2),
    exc.ManifestError: (400, 2),
    exc.RunNotFoundError: (404, 2),
    exc.AmbiguousRunError: (409, 2),
    exc.RunInFlightError: (409, 1),
    exc.UnsafePathError: (500, 1),
    exc.BackendError: (502, 1),
    exc.PreflightError: (424, 1),
    exc.PreflightConfigError: (424, 2),
    exc.RunFailed: (502, 1),
    exc.StagingError: (502, 1),
    exc.KubernetesApiError: (502, 1),
    exc.StorageError: (503, 1),
    exc.LogsDamagedError: (500, 1),
    exc.LogsDeletedError: (410, 1),
    exc.DaemonError: (500, 1),
    exc.OutputError: (500, 1),
    exc.DaemonUnreachableError: (500, 69),
    exc.DaemonStoppingError: (503, 69),
    exc.RemoteError: (500, 1),
}


def test_every_error_class_has_its_status_and_exit_code() -> None:
    assert set(EXPECTED) == set(_tree())
    got = {cls: (cls.http_status, cls.exit_code) for cls in _tree()}
    assert got == EXPECTED
    assert to_wire(_instance(exc.PreflightConfigError))[0] == 424


def test_the_drawn_tree_names_every_error_class() -> None:
    drawn = exc.__doc__ or ""
    assert [cls.__name__ for cls in _tree() if f" {cls.__name__} " not in drawn] == []


def test_the_error_classes_live_in_one_module() -> None:
    """Modules re-export the tree's classes; they define none of their own
    beside it (the Kubernetes API errors by status subclass KubernetesApiError)."""
    import supervisord.daemon.backends.kubernetes.runstate as runstate
    import supervisord.daemon.backends.kubernetes.staging as staging
    import supervisord.daemon.ui.server as ui_server
    import supervisord.shared.ownership as ownership

    assert ownership.UnsafePathError is exc.UnsafePathError
    assert ui_server.UiConfigError is exc.UiConfigError
    assert staging.StagingError is exc.StagingError
    assert runstate.RunFailed is exc.RunFailed
