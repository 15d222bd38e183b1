"""Command hooks: run an argv as the daemon's user, without a shell.

The child gets the daemon's own environment plus the run's fields
(:func:`hook_env`), the run's last log lines on stdin, and its own process
group. Its output (stdout and stderr, interleaved) is read while it runs;
the first :data:`~supervisord.daemon.hooks.attempt.OUTPUT_BYTES` are kept. At the
timeout (or when the daemon stops meanwhile) the whole process group is
killed (SIGKILL), and with it every process of this user that carries the
attempt's ``JOBSUP_HOOK_ATTEMPT`` marker in its environment: also those the
hook moved out of its group (``setsid``, a double fork), which a group kill
misses. A process that clears its environment escapes this (as it would a
run's). A hook that exits normally keeps any background process it started
(e.g. a notification daemon); only its own output pipe is waited for, at
most half a second.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import structlog

from supervisord.daemon.hooks.attempt import OUTPUT_BYTES, Attempt
from supervisord.daemon.procenv import pids_with_env

__all__ = ["ATTEMPT_MARKER", "hook_env", "marked_processes", "run_command"]

log = structlog.get_logger("jobsup.hooks")

#: How long the output pipe is read after the hook exited (a background
#: child may hold it open).
_PIPE_GRACE_S = 0.5


def hook_env(base: Mapping[str, str], run: Mapping[str, Any], event_seq: int, hook: str) -> dict[str, str]:
    """The environment of a command hook: ``base`` (the daemon's own
    environment; nothing of the run's env, whose values are secrets) plus
    ``JOBSUP_RUN_ID``, ``JOBSUP_PHASE``, ``JOBSUP_REASON``,
    ``JOBSUP_EXIT_CODE``, ``JOBSUP_NAME``, ``JOBSUP_PROJECT``,
    ``JOBSUP_BACKEND``, ``JOBSUP_EVENT_SEQ`` and ``JOBSUP_HOOK`` (empty
    strings for missing values). ``run`` holds the phase change's fields
    (phase, reason, exit_code) over the run object's."""

    def text(value: Any) -> str:
        return "" if value is None else str(value)

    env = dict(base)
    env.update(
        {
            "JOBSUP_RUN_ID": text(run.get("id")),
            "JOBSUP_PHASE": text(run.get("phase")),
            "JOBSUP_REASON": text(run.get("reason")),
            "JOBSUP_EXIT_CODE": text(run.get("exit_code")),
            "JOBSUP_NAME": text(run.get("name")),
            "JOBSUP_PROJECT": text(run.get("project")),
            "JOBSUP_BACKEND": text(run.get("backend")),
            "JOBSUP_EVENT_SEQ": str(event_seq),
            "JOBSUP_HOOK": hook,
        }
    )
    return env


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


#: The environment variable that marks every process of one hook attempt.
ATTEMPT_MARKER = "JOBSUP_HOOK_ATTEMPT"


def marked_processes(token: str) -> list[int]:
    """Pids of this user's processes (not this one) whose environment
    carries ``JOBSUP_HOOK_ATTEMPT=<token>`` (``/proc/PID/environ``)."""
    return pids_with_env(ATTEMPT_MARKER, token)


def _kill_marked(token: str) -> None:
    """SIGKILL every process of the attempt ``token`` until none is left
    (at most ~2 s: one could keep forking; what is left is logged)."""
    for _ in range(100):
        pids = marked_processes(token)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    log.warning("hook.survivors", pids=marked_processes(token))


async def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    stdin: bytes,
    timeout_s: float,
    cwd: str | None = None,
) -> Attempt:
    """Run ``argv`` once (see the module doc) and say how it went: ``ok``
    for exit code 0; a non-zero exit, a signal, a timeout or a command that
    cannot start is a permanent failure (command hooks are not retried).
    Cancelling the caller kills the process group. Raises nothing else."""
    started = time.monotonic()
    if cwd is not None and not os.path.isdir(cwd):  # noqa: ASYNC240 - one stat per hook run
        cwd = None  # the submit's folder is gone: run from the daemon's
    token = secrets.token_hex(8)
    try:
        proc = await anyio.open_process(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**env, ATTEMPT_MARKER: token},
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        return Attempt(
            ok=False, duration_s=time.monotonic() - started,
            error=f"cannot start {argv[0]!r}: {exc.strerror or exc}",
        )  # fmt: skip
    output = bytearray()
    drained = anyio.Event()

    async def feed() -> None:
        assert proc.stdin is not None
        try:
            if stdin:
                await proc.stdin.send(stdin)
            await proc.stdin.aclose()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, BrokenPipeError, ConnectionResetError):
            pass  # the hook does not read its stdin

    async def drain() -> None:
        assert proc.stdout is not None
        try:
            async for chunk in proc.stdout:
                if len(output) < OUTPUT_BYTES:
                    output.extend(chunk[: OUTPUT_BYTES - len(output)])
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            drained.set()

    timed_out = False
    try:
        with anyio.move_on_after(timeout_s) as deadline:
            async with anyio.create_task_group() as tg:
                tg.start_soon(feed)
                tg.start_soon(drain)
                await proc.wait()
                with anyio.move_on_after(_PIPE_GRACE_S):
                    await drained.wait()
                tg.cancel_scope.cancel()
        timed_out = deadline.cancelled_caught
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            if proc.returncode is None:  # timed out, or the daemon is stopping
                _kill_group(proc.pid)
                await anyio.to_thread.run_sync(_kill_marked, token)
            await proc.aclose()
    duration = time.monotonic() - started
    text = bytes(output).decode("utf-8", errors="replace")
    if timed_out:
        return Attempt(
            ok=False,
            duration_s=duration,
            error=f"timed out after {timeout_s:g} s; its process group was killed",
            output=text,
        )
    code = proc.returncode
    if code == 0:
        return Attempt(ok=True, duration_s=duration, exit_code=0, output=text)
    if code is not None and code < 0:
        return Attempt(ok=False, duration_s=duration, error=f"killed by signal {-code}", exit_code=code, output=text)
    return Attempt(ok=False, duration_s=duration, error=f"exit code {code}", exit_code=code, output=text)
