"""Shared pieces of the local-backend benchmarks (``bench/local_*.py``).

:class:`BenchEnv` is a private jobsup installation: its own state dir, a
socket under a short ``/tmp/jb-*`` folder (Unix socket paths are limited to
108 bytes), ``JOBSUP_NO_AUTOSTART=1``, and the real daemon as a subprocess
(``python -m supervisord daemon``). Leaving its ``with`` block (normally, on
an exception, on SIGINT/SIGTERM) kills the daemon and every runner and job
process group recorded under its state dir, then removes its folders.

Also: process figures read from ``/proc`` (CPU seconds, RSS; proc(5)), a git
repository to submit from (the tests' :func:`make_repo`), percentiles, and
the output every benchmark prints: a short table, then one JSON line with
the numbers.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from supervisord.client.api import Client  # noqa: E402
from supervisord.daemon.backends.local.runner import proc_start_time  # noqa: E402
from supervisord.shared.paths import Paths  # noqa: E402

# The one repository builder, shared with the tests.
from tests.supervisord.jobsup_env import make_repo  # noqa: E402

__all__ = [
    "EMIT_PY",
    "BenchEnv",
    "Figure",
    "PeakRss",
    "cpu_seconds",
    "group_alive",
    "load_average",
    "make_repo",
    "parse_at",
    "percentile",
    "report",
    "rss_bytes",
]

_CLK_TCK = os.sysconf("SC_CLK_TCK")

#: ``python emit.py N MARKER``: writes N numbered lines of 79 bytes to
#: stdout through a 64 KiB buffer, as fast as it can, then writes
#: ``"<start> <end> <bytes>"`` (epoch seconds, bytes written) to MARKER
#: (atomically: temp file, rename) and exits.
EMIT_PY = """\
import os, sys, time
n, marker = int(sys.argv[1]), sys.argv[2]
start = time.time()
out = open(1, "wb", buffering=1 << 16, closefd=False)
size = 0
for i in range(n):
    line = b"line %07d the quick brown fox jumps over the lazy dog 0123456789 abcdefghij\\n" % i
    out.write(line)
    size += len(line)
out.flush()
end = time.time()
with open(marker + ".tmp", "w") as f:
    f.write(f"{start} {end} {size}")
os.rename(marker + ".tmp", marker)
"""


def _stat_fields(pid: int) -> list[bytes]:
    """Fields 3.. of ``/proc/PID/stat`` (after the parenthesised command
    name, which may contain spaces). Raises FileNotFoundError for no such pid."""
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return raw[raw.rindex(b")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """CPU seconds ``pid`` has used so far: utime + stime (``/proc/PID/stat``
    fields 14 and 15, in clock ticks; proc(5)). Children are not included.
    Raises FileNotFoundError when the process is gone."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (``VmRSS`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"/proc/{pid}/status has no VmRSS line")


class PeakRss:
    """Samples the RSS of ``pid`` every 50 ms in a thread; ``peak`` in bytes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, ValueError):
                return

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages (``os.getloadavg``)."""
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def parse_at(at: str) -> float:
    """An event's ``at`` (UTC RFC 3339, e.g. ``2026-01-02T03:04:05.123456Z``)
    as seconds since the epoch (comparable with ``time.time()``)."""
    return dt.datetime.fromisoformat(at).timestamp()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated
    between the closest ranks. Raises ValueError when ``values`` is empty."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Figure:
    """One reported number: ``name``, ``value``, ``unit``, and an optional
    ``target`` text with whether it is ``met`` (None = no target)."""

    def __init__(self, name: str, value: float | int, unit: str, target: str = "", met: bool | None = None) -> None:
        self.name = name
        self.value = value
        self.unit = unit
        self.target = target
        self.met = met


def report(bench: str, figures: Sequence[Figure], extra: Mapping[str, Any]) -> None:
    """Print ``figures`` as a table, then one JSON line: ``{"bench": bench,
    <figure name>: value, ..., **extra}`` (the last line of the output)."""
    width = max(len(f.name) for f in figures)
    print(f"\n{bench}")
    for f in figures:
        value = f"{f.value:,.3f}" if isinstance(f.value, float) else f"{f.value:,}"
        verdict = "" if f.met is None else ("  ok" if f.met else "  MISSED")
        target = f"  (target {f.target})" if f.target else ""
        print(f"  {f.name:<{width}}  {value:>14} {f.unit:<10}{target}{verdict}")
    line: dict[str, Any] = {"bench": bench}
    for f in figures:
        line[f.name] = round(f.value, 4) if isinstance(f.value, float) else f.value
    line.update(extra)
    print(json.dumps(line, sort_keys=False), flush=True)


def _raise_exit(signum: int, frame: types.FrameType | None) -> None:
    raise SystemExit(128 + signum)


class BenchEnv:
    """A private jobsup installation for one benchmark (see the module docstring).

    ``root``: a fresh folder (state dir, home, daemon log, the benchmark's
    own files). ``env``: the environment for the daemon and the CLI.
    ``paths``: the daemon's :class:`~supervisord.shared.paths.Paths`.
    """

    def __init__(self, name: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"jobsup-bench-{name}-"))
        self.sock_dir = Path(tempfile.mkdtemp(prefix="jb-", dir="/tmp"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSUP_", "XDG_", "NOTIFY_SOCKET"))}
        env.update(
            {
                "HOME": str(self.root / "home"),
                "XDG_CONFIG_HOME": str(self.root / "home" / ".config"),
                "XDG_STATE_HOME": str(self.root / "home" / ".local" / "state"),
                "JOBSUP_STATE_DIR": str(self.root / "state"),
                "JOBSUP_SOCKET": str(self.sock_dir / "jobsup.sock"),
                "JOBSUP_NO_AUTOSTART": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.env = env
        (self.root / "home").mkdir()
        self.paths = Paths.from_env(env)
        self.daemon_log = self.root / "daemon.log"
        self.daemon: subprocess.Popen[bytes] | None = None
        self._old_handlers: dict[int, Any] = {}

    # -- lifecycle -------------------------------------------------------------

    def __enter__(self) -> Self:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, _raise_exit)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.cleanup()
        finally:
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)

    def start_daemon(self, timeout_s: float = 60.0, *, profile: Path | None = None) -> int:
        """Start the daemon (under cProfile writing ``profile``, when given)
        and wait until its API answers; returns its pid. Raises RuntimeError
        (with the daemon log's tail) if it exits or does not answer within
        ``timeout_s``."""
        self.spawn_daemon(profile=profile)
        self.wait_ready(timeout_s)
        assert self.daemon is not None
        return self.daemon.pid

    def spawn_daemon(self, *, profile: Path | None = None) -> subprocess.Popen[bytes]:
        """Start the daemon without waiting for it (under cProfile writing
        ``profile``, when given)."""
        profiler = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
        with self.daemon_log.open("ab") as log:
            self.daemon = subprocess.Popen(
                [sys.executable, *profiler, "-m", "supervisord", "daemon"],
                env=self.env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        return self.daemon

    def wait_ready(self, timeout_s: float = 60.0, poll_s: float = 0.01) -> dict[str, Any]:
        """Wait until the daemon's ``/health`` answers; returns the health
        document. Raises RuntimeError as :meth:`start_daemon`."""
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            while time.monotonic() < deadline:
                if self.daemon is not None and self.daemon.poll() is not None:
                    raise RuntimeError(f"the daemon exited {self.daemon.returncode}:\n{self.log_tail()}")
                info = client.health()
                if info is not None:
                    return info
                time.sleep(poll_s)
        raise RuntimeError(f"the daemon did not answer within {timeout_s:g}s:\n{self.log_tail()}")

    def kill_daemon(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the daemon and reap it (waits up to 30 s)."""
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.daemon.send_signal(sig)
        self.daemon.wait(timeout=30)

    def log_tail(self, n: int = 20) -> str:
        """The last ``n`` lines of the daemon log."""
        try:
            return "\n".join(self.daemon_log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def client(self) -> Client:
        """An API client for this daemon (close it, or use it in ``with``)."""
        return Client(self.paths)

    def cli(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``jobsup ARGS`` (the real CLI, ``python -m supervisord``) and
        return it. Raises RuntimeError naming the command when it fails."""
        proc = subprocess.run(
            [sys.executable, "-m", "supervisord", *args],
            env=self.env,
            cwd=cwd or self.root,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"jobsup {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def cli_argv(self, *args: str) -> list[str]:
        """The argv that runs ``jobsup ARGS`` with this interpreter."""
        return [sys.executable, "-m", "supervisord", *args]

    def run_dirs(self) -> Iterator[Path]:
        """The run folders under the state dir."""
        runs = self.paths.runs_dir
        if runs.is_dir():
            yield from sorted(p for p in runs.iterdir() if p.is_dir())

    def leftovers(self) -> list[str]:
        """Runs whose runner or process group is still alive, as
        ``"<run id>: runner PID"`` / ``"<run id>: group PGID"`` texts."""
        alive = []
        for run_dir in self.run_dirs():
            status = _read_status(run_dir)
            pid, start = status.get("runner_pid"), status.get("runner_start")
            if isinstance(pid, int) and start is not None and proc_start_time(pid) == start:
                alive.append(f"{run_dir.name}: runner {pid}")
            pgid = status.get("pgid")
            if status.get("state") == "running" and isinstance(pgid, int) and group_alive(pgid):
                alive.append(f"{run_dir.name}: group {pgid}")
        return alive

    def cleanup(self) -> None:
        """Kill the daemon, every runner still alive (checked by its
        recorded start time, so a reused pid is left alone) and every job
        process group a runner left running; remove the folders."""
        self.kill_daemon(signal.SIGKILL)
        for run_dir in self.run_dirs():
            status = _read_status(run_dir)
            pid, start = status.get("runner_pid"), status.get("runner_start")
            if isinstance(pid, int) and start is not None and proc_start_time(pid) == start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            pgid = status.get("pgid")
            if status.get("state") == "running" and isinstance(pgid, int):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
        shutil.rmtree(self.sock_dir, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- API helpers -------------------------------------------------------------

    def submit_body(self, repo: Path, command: str, *, name: str, timeout_s: int = 3600) -> dict[str, Any]:
        """The ``POST /v1/runs`` body the CLI sends for ``jobsup submit
        --backend local --name NAME -- COMMAND`` run in ``repo`` (no config
        layers)."""
        return {
            "task": {"name": name, "run": command, "backend": "local", "timeout_s": timeout_s, "env": {}},
            "layers": [],
            "cwd": str(repo),
            "rev": "HEAD",
            "force": False,
        }


def _read_status(run_dir: Path) -> dict[str, Any]:
    try:
        # The runner's status: its first line is the JSON (then its MAC).
        data = json.loads((run_dir.parent / ".status" / run_dir.name).read_bytes().split(b"\n", 1)[0])
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
