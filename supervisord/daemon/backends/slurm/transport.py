"""How the Slurm backend reaches the cluster: one class, two implementations.

:class:`Transport` runs a bash script on the cluster's login side and reads
a file from a byte offset. :class:`LocalTransport` runs on this machine
(``slurm.host`` empty); :class:`SshTransport` runs over OpenSSH with the
user's own config and keys, ``BatchMode=yes`` (never a prompt), through one
multiplexed connection (``ControlMaster``) that every call reuses: started
on first use, restarted when it drops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio
import structlog

from supervisord.shared.exceptions import BackendError

__all__ = ["Completed", "LocalTransport", "SshTransport", "Transport", "TransportError"]

log = structlog.get_logger("jobsup.slurm")

#: At most this many commands in flight per transport (an sshd allows 10
#: sessions per connection by default).
_MAX_CALLS = 8


class TransportError(BackendError):
    """The cluster could not be reached (ssh failed, a command timed out)."""


@dataclasses.dataclass(frozen=True)
class Completed:
    """A finished command: exit ``code``, ``stdout`` and ``stderr`` bytes."""

    code: int
    stdout: bytes
    stderr: bytes

    @property
    def err(self) -> str:
        """stderr as text, stripped (for messages)."""
        return self.stderr.decode(errors="replace").strip()

    @property
    def out(self) -> str:
        """stdout as text."""
        return self.stdout.decode(errors="replace")


async def _exec(argv: Sequence[str], stdin: bytes | None, timeout_s: float) -> Completed:
    """Run ``argv`` in a session of its own; kill its group on timeout or
    cancel. Raises TransportError on timeout, FileNotFoundError when the
    program is missing."""
    proc = await anyio.open_process(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    out = bytearray()
    err = bytearray()
    try:
        with anyio.fail_after(timeout_s):
            async with anyio.create_task_group() as tg:

                async def feed() -> None:
                    assert proc.stdin is not None
                    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                        await proc.stdin.send(stdin or b"")
                    await proc.stdin.aclose()

                async def drain(stream: anyio.abc.ByteReceiveStream | None, into: bytearray) -> None:
                    if stream is None:
                        return
                    async for chunk in stream:
                        into.extend(chunk)

                if stdin is not None:
                    tg.start_soon(feed)
                tg.start_soon(drain, proc.stdout, out)
                tg.start_soon(drain, proc.stderr, err)
            code = await proc.wait()
    except TimeoutError:
        raise TransportError(f"{shlex.join(argv[:3])}... did not finish within {timeout_s:.0f} s") from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with anyio.CancelScope(shield=True):
                await proc.wait()
        await proc.aclose()
    return Completed(code, bytes(out), bytes(err))


class Transport:
    """Runs commands where the Slurm commands are. ``name``: for messages."""

    name = "transport"

    def __init__(self) -> None:
        self._limiter = anyio.CapacityLimiter(_MAX_CALLS)
        self.calls = 0
        """Commands run so far (tests and the bench count them)."""

    async def run(self, script: str, *, stdin: bytes | None = None, timeout_s: float = 60.0) -> Completed:
        """Run ``script`` with bash; ``stdin`` feeds it. Raises TransportError
        when the cluster cannot be reached or the call times out."""
        async with self._limiter:
            self.calls += 1
            return await self._run(script, stdin, timeout_s)

    async def _run(self, script: str, stdin: bytes | None, timeout_s: float) -> Completed:
        raise NotImplementedError

    async def read_from(self, path: str, offset: int, max_bytes: int, *, timeout_s: float = 60.0) -> bytes:
        """Up to ``max_bytes`` of the file ``path`` from byte ``offset`` (b""
        when it is missing or shorter). Raises TransportError."""
        script = f"tail -c +{offset + 1} -- {shlex.quote(path)} 2>/dev/null | head -c {max_bytes}"
        return (await self.run(script, timeout_s=timeout_s)).stdout

    async def aclose(self) -> None:
        """Release what the transport holds (the ssh connection)."""


class LocalTransport(Transport):
    """The Slurm commands of this machine (``slurm.host`` empty)."""

    name = "this machine"

    async def _run(self, script: str, stdin: bytes | None, timeout_s: float) -> Completed:
        return await _exec(["bash", "-c", script], stdin, timeout_s)

    async def read_from(self, path: str, offset: int, max_bytes: int, *, timeout_s: float = 60.0) -> bytes:
        """Read the file directly (no process)."""

        def read() -> bytes:
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    return f.read(max_bytes)
            except FileNotFoundError:
                return b""

        return await anyio.to_thread.run_sync(read)


class SshTransport(Transport):
    """``ssh`` to ``host`` with the user's OpenSSH config, BatchMode, one
    multiplexed connection. ``ssh_options``: extra options before the host
    (e.g. ``["-F", path]``); ``connect_timeout_s``: ssh's ConnectTimeout."""

    def __init__(self, host: str, *, ssh_options: Sequence[str] = (), connect_timeout_s: int = 15) -> None:
        super().__init__()
        self.host = host
        self.name = f"ssh {host}"
        self._dir = Path(tempfile.mkdtemp(prefix="jobsup-ssh-"))
        self._control = str(self._dir / "cm")
        self._options = [
            *ssh_options,
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={connect_timeout_s}",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=3",
            "-o",
            f"ControlPath={self._control}",
        ]
        self._master_lock = anyio.Lock()
        self.masters_started = 0
        """How many times the shared connection was (re)started."""

    def _argv(self, *extra: str) -> list[str]:
        return ["ssh", *self._options, *extra]

    async def _ensure_master(self, timeout_s: float) -> None:
        """Start the shared connection unless its socket answers (a master
        that died leaves its socket behind: removed, and a new one starts)."""
        async with self._master_lock:
            if _socket_answers(self._control):
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._control)
            argv = self._argv("-o", "ControlMaster=yes", "-o", "ControlPersist=600", "-f", "-N", self.host)
            # The master stays in the background: its stdio must not be our pipes.
            with tempfile.TemporaryFile() as err:
                proc = await anyio.run_process(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, check=False
                )
                err.seek(0)
                message = err.read().decode(errors="replace").strip()
            if proc.returncode != 0:
                raise TransportError(
                    f"cannot reach the Slurm login node over ssh {self.host}: {message or 'ssh failed'}"
                )
            self.masters_started += 1
            log.info("ssh connection started", host=self.host)

    async def _run(self, script: str, stdin: bytes | None, timeout_s: float) -> Completed:
        with anyio.fail_after(timeout_s + 5):
            await self._ensure_master(timeout_s)
        argv = self._argv("-o", "ControlMaster=no", self.host, "bash -c " + shlex.quote(script))
        done = await _exec(argv, stdin, timeout_s)
        if done.code == 255:
            # ssh's own failure (the command's 255 is rare): drop a dead
            # master's socket so the next call starts a new connection.
            self._forget_master()
            raise TransportError(f"ssh {self.host} failed: {done.err or 'exit 255'}")
        return done

    def _forget_master(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if not _socket_answers(self._control):
                os.unlink(self._control)

    async def master_pid(self) -> int | None:
        """The shared connection's pid (``ssh -O check``), or None."""
        proc = await anyio.run_process(self._argv("-O", "check", self.host), check=False)
        text = proc.stderr.decode(errors="replace")
        start = text.find("pid=")
        if proc.returncode != 0 or start < 0:
            return None
        return int("".join(c for c in text[start + 4 :] if c.isdigit()) or 0) or None

    async def aclose(self) -> None:
        """Stop the shared connection (the jobs keep running)."""
        if os.path.exists(self._control):  # noqa: ASYNC240 - one stat at shutdown
            with anyio.move_on_after(10, shield=True):
                await anyio.run_process(self._argv("-O", "exit", self.host), check=False)
        shutil.rmtree(self._dir, ignore_errors=True)


def _socket_answers(path: str) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True
