"""``jobsup runs`` and ``show`` ask the daemon once: no health check
first (supervisord.client.cli.reads.read_command). On a loaded machine each
round trip waits for the daemon to be scheduled; the health check doubled
the wall time of ``runs --sweep`` (bench/sweep_submit.py). A missing
daemon is still found, started or reported as before."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv

_RUNS = {"runs": [], "storage": None, "output": None}
_SWEEP = {
    "sweep": {"id": "s0123456789a", "name": "x", "count": 0},
    "params": [],
    "metrics": [],
    "rows": [],
    "counts": {},
}


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A Unix socket answering every request with a canned JSON body (by
    path); yields the socket and the request lines it got."""
    folder = tmp_path / "sock"
    folder.mkdir(mode=0o700)
    path = folder / "jobsup.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    os.chmod(path, 0o600)
    srv.listen(8)
    seen: list[str] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                line = data.split(b"\r\n", 1)[0].decode()
                seen.append(line)
                target = line.split()[1]
                body = json.dumps(_SWEEP if "/sweeps/" in target else _RUNS).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path, seen
    finally:
        srv.close()


@pytest.mark.parametrize("args", [["runs", "-o", "json"], ["runs", "--sweep", "s0123456789a", "-o", "json"]])
def test_runs_asks_the_daemon_once(js: JobsupEnv, fake_daemon: tuple[Path, list[str]], args: list[str]) -> None:
    sock, seen = fake_daemon
    env = {**js.env, "JOBSUP_SOCKET": str(sock)}
    r = subprocess.run(
        [sys.executable, "-m", "supervisord", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert len(seen) == 1 and "/health" not in seen[0], seen


def test_without_a_daemon_runs_still_reports_it_and_exits_69(js: JobsupEnv) -> None:
    r = js.cli("runs", "-o", "json", check=False)
    assert r.returncode == 69, r.stderr
    assert "JOBSUP_NO_AUTOSTART" in r.stderr and r.stdout == ""
    r = js.cli("show", "abcd1234", check=False)
    assert r.returncode == 69, r.stderr
