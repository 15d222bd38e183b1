"""Helpers for end-to-end tests: a private jobsup environment (state dir,
socket, config dirs), a git repository to submit from, the real daemon as a
subprocess and the real CLI as subprocesses."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["HOST_VARIABLES", "JobsupEnv", "jobsup_env", "live_pids_with_arg", "make_repo"]


def make_repo(path: Path, files: Mapping[str, str]) -> Path:
    """A git repository at ``path`` with ``files`` (relative path -> text)
    committed on branch ``main``; the one repository builder of the tests
    and of bench/. Raises CalledProcessError when git fails."""
    path.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        f = path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main", str(path)], check=True)
    subprocess.run([*git, "-C", str(path), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(path), "commit", "-qm", "init"], check=True)
    return path


@contextmanager
def jobsup_env(root: Path, *, daemon: bool = False) -> Iterator[JobsupEnv]:
    """A :class:`JobsupEnv` under ``root``, its daemon started when
    ``daemon``; closed (daemon stopped) on leaving. The ``js`` fixture of
    every scope comes from here (tests/supervisord/conftest.py)."""
    env = JobsupEnv(root)
    try:
        if daemon:
            env.start_daemon()
        yield env
    finally:
        env.close()


#: Prefixes of the host's environment variables a test environment drops:
#: jobsup's own, the XDG dirs, systemd's, the session bus (with
#: XDG_RUNTIME_DIR gone, no user systemd manager answers: limits are the
#: sampler's on every host), the kubeconfig and in-cluster variables, and
#: the GPU selections (CUDA_VISIBLE_DEVICES...).
HOST_VARIABLES = (
    "JOBSUP_",
    "XDG_",
    "NOTIFY_SOCKET",
    "DBUS_SESSION_BUS_ADDRESS",
    "KUBECONFIG",
    "KUBERNETES_",
    "CUDA_",
    "NVIDIA_",
    "SLURM_",
)
#: The host's tools a test daemon must not find unless its test gives them
#: (:meth:`JobsupEnv.host_slurm`): its GPUs, and a Slurm cluster (the
#: machine may have one: CI starts one for tests/slurm).
HOST_TOOLS = ("nvidia-smi", "sbatch", "sinfo", "squeue", "sacct", "scontrol", "scancel", "srun", "salloc")

#: PATH folder -> a copy of it (symbolic links) without some tools, made
#: once per test process (see :func:`_path_without`).
_SHADOWS: dict[tuple[str, tuple[str, ...]], str] = {}


def _path_without(tools: tuple[str, ...], path: str) -> list[str]:
    """The folders of ``path``, each one that holds one of ``tools`` replaced
    by a private folder of symbolic links to all its other entries: the
    tools of the host stay, ``tools`` are not found (the suite's daemons
    must not see the host's ``nvidia-smi`` or Slurm). The private folders
    live until the process exits."""
    out = []
    for folder in path.split(os.pathsep):
        if not folder or not any(os.access(os.path.join(folder, tool), os.X_OK) for tool in tools):
            out.append(folder)
            continue
        key = (folder, tools)
        if key not in _SHADOWS:
            shadow = tempfile.mkdtemp(prefix="js-path-")
            atexit.register(shutil.rmtree, shadow, True)
            for name in os.listdir(folder):
                if name not in tools:
                    os.symlink(os.path.join(folder, name), os.path.join(shadow, name))
            _SHADOWS[key] = shadow
        out.append(_SHADOWS[key])
    return [f for f in out if f]


def live_pids_with_arg(marker: str) -> list[int]:
    """PIDs of live (not zombie) processes whose NUL-separated command line
    contains ``marker`` (e.g. ``"sleep\\x001021"``): to check what a run left
    behind."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd and b") Z " not in state:
            pids.append(int(entry))
    return pids


class JobsupEnv:
    """A private jobsup installation: run the daemon and the CLI against it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Unix socket paths are limited to 108 bytes: keep the socket short.
        self.sock_dir = Path(tempfile.mkdtemp(prefix="js-", dir="/tmp"))
        # Independent of the host: no GPUs (a private bin dir first on PATH,
        # any nvidia-smi of the host's PATH hidden), no kubeconfig, no
        # cluster, a private HOME and config dirs.
        self.bin_dir = root / "js-bin"
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(HOST_VARIABLES)}
        self.env.update(
            {
                "PATH": os.pathsep.join([str(self.bin_dir), *_path_without(HOST_TOOLS, os.environ.get("PATH", ""))]),
                "HOME": str(root / "home"),
                "XDG_CONFIG_HOME": str(root / "home" / ".config"),
                "XDG_STATE_HOME": str(root / "home" / ".local" / "state"),
                "JOBSUP_STATE_DIR": str(root / "state"),
                "JOBSUP_SOCKET": str(self.sock_dir / "jobsup.sock"),
                "JOBSUP_NO_AUTOSTART": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        (root / "home").mkdir(parents=True, exist_ok=True)
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_log = root / "daemon-test.log"

    def host_slurm(self) -> dict[str, str]:
        """The environment that gives a daemon the host's Slurm (its
        commands on PATH, ``SLURM_CONF``): for ``start_daemon(extra_env=)``
        in tests of the Slurm backend, which give it a cluster of their own
        (tests/slurm)."""
        path = os.pathsep.join([str(self.bin_dir), *_path_without(("nvidia-smi",), os.environ.get("PATH", ""))])
        return {"PATH": path, **{k: v for k, v in os.environ.items() if k.startswith("SLURM_")}}

    def fake_nvidia_smi(self, output: str) -> Path:
        """Put an ``nvidia-smi`` printing ``output`` (its ``csv,noheader``
        query answer, e.g. ``"0, GPU-aaaa, NVIDIA Fake, 81920 MiB\\n"``) in
        this environment's bin dir, first on its PATH: the GPUs a daemon
        started afterwards finds."""
        smi = self.bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\ncat <<'EOF'\n" + output + "EOF\n")
        smi.chmod(0o755)
        return smi

    @property
    def socket(self) -> Path:
        return Path(self.env["JOBSUP_SOCKET"])

    @property
    def state_dir(self) -> Path:
        return Path(self.env["JOBSUP_STATE_DIR"])

    def user_config(self, text: str) -> Path:
        """Write the user's config file (``$XDG_CONFIG_HOME/jobsup/config.yaml``)."""
        return self._write_config("config.yaml", text)

    def daemon_config(self, text: str) -> Path:
        """Write the daemon's config file (``$XDG_CONFIG_HOME/jobsup/daemon.yaml``)."""
        return self._write_config("daemon.yaml", text)

    def _write_config(self, name: str, text: str) -> Path:
        path = Path(self.env["XDG_CONFIG_HOME"]) / "jobsup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def start_daemon(self, *, extra_env: dict[str, str] | None = None, wait: bool = True) -> subprocess.Popen[bytes]:
        env = {**self.env, **(extra_env or {})}
        log = self.daemon_log.open("ab")
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "supervisord", "daemon"],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        if wait:
            self.wait_ready()
        return self.daemon

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.daemon is not None
            if self.daemon.poll() is not None:
                raise AssertionError(f"daemon exited {self.daemon.returncode}:\n{self.daemon_log.read_text()}")
            r = self.cli("runs", "-o", "json", check=False)
            if r.returncode == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready:\n{self.daemon_log.read_text()}")

    def kill_daemon(self, sig: int = signal.SIGKILL) -> None:
        assert self.daemon is not None
        self.daemon.send_signal(sig)
        self.daemon.wait(timeout=30)

    def stop_daemon(self) -> int:
        if self.daemon is None or self.daemon.poll() is not None:
            return self.daemon.returncode if self.daemon else 0
        self.daemon.send_signal(signal.SIGTERM)
        return self.daemon.wait(timeout=30)

    def cli(
        self,
        *args: str,
        cwd: Path | None = None,
        check: bool = True,
        timeout: float = 120,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "supervisord", *args],
            env={**self.env, **(extra_env or {})},
            cwd=cwd or self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"jobsup {' '.join(args)} exited {proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
            )
        return proc

    def popen(self, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
        """The CLI with ``args`` started in the background (stdout and
        stderr piped, text), for a test that acts while it runs."""
        return subprocess.Popen(
            [sys.executable, "-m", "supervisord", *args],
            env=self.env,
            cwd=cwd or self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def submit(self, repo: Path, *args: str) -> str:
        out = self.cli("submit", *args, cwd=repo).stdout.strip()
        assert len(out) == 12, out
        return out

    def show(self, run_id: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.cli("show", run_id, "-o", "json").stdout)
        return doc

    def runner_status(self, run_id: str) -> dict[str, Any]:
        """The local runner's last status of ``run_id`` (its JSON line; the
        MAC is checked by the daemon, not here)."""
        raw = (self.state_dir / "runs" / ".status" / run_id).read_bytes()
        doc: dict[str, Any] = json.loads(raw.split(b"\n", 1)[0])
        return doc

    def close(self) -> None:
        self.stop_daemon()
        shutil.rmtree(self.sock_dir, ignore_errors=True)
