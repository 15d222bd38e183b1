"""The detached per-run runner of the local backend.

Run as ``python -m supervisord.backends.local.runner RUN_DIR`` with the run's
spec as one JSON object on stdin::

    {"command": str, "env": {NAME: value}, "timeout_s": int,
     "kill_grace_s": int, "shell": "bash", "snapshot": "/path/source.tar"}

It forks once: the first process prints ``{"pid": P, "start": T}`` (the
runner's pid and its start time in clock ticks since boot, field 22 of
``/proc/P/stat``) on stdout and exits, so the daemon never has to reap it;
the second (the runner) is re-parented to init and outlives the daemon.

The runner extracts the snapshot into ``RUN_DIR/repo``, runs the command
with the shell there (in its own process group), appends its stdout and
stderr to ``RUN_DIR/stdout.log`` and ``RUN_DIR/stderr.log`` (the child writes
to those files directly: nothing is lost if the runner or the daemon dies),
enforces the timeout (SIGTERM to the whole group, SIGKILL after the grace
period) and writes ``RUN_DIR/status.json`` atomically (temp file, fsync,
rename) at each step:

    {"state": "staging", ...}
    {"state": "running", "pid": child, "pgid": child, "started_at": ...}
    {"state": "exited", "exit_code": int|None, "signal": int|None,
     "reason": "Completed"|"NonZeroExit"|"Signaled"|"DeadlineExceeded"|"Canceled"|"StagingFailed",
     "message": str, "finished_at": ...}

SIGTERM to the runner is a cancel: the group gets SIGTERM, then SIGKILL after
the grace period, and the final status is written only once no process of the
group remains. The runner is its job's child subreaper (prctl(2)), so a
process that leaves the group (setsid, a double-forked daemon) is re-parented
to the runner and stopped with the rest — on cancel, on timeout, and when the
job's shell exits.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import json
import os
import select
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["main", "extract_snapshot", "group_alive", "proc_start_time", "write_status"]


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat``
    field 22, proc(5)), or None when no such process exists (or it is a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces.
    fields = raw[raw.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":
        return None
    return int(fields[19])


def extract_snapshot(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract a ``git archive`` into ``dest``, keeping symlinks as git
    recorded them (even absolute ones or ones pointing up) but refusing any
    member that would land outside ``dest`` — through ``..``, an absolute
    name, or a symlink extracted earlier — and device files.

    These are the rules of tarfile's ``"tar"`` extraction filter (PEP 706),
    applied by hand where the Python lacks it (3.11 before 3.11.4, e.g.
    Debian 12's). Raises tarfile.TarError naming the member.
    """
    if hasattr(tarfile, "tar_filter"):
        tar.extractall(dest, filter="tar")
        return
    root = dest.resolve()
    for member in tar:
        if member.isdev():
            raise tarfile.TarError(f"{member.name}: device files are not extracted")
        # Resolved against what is already on disk, so a symlink extracted
        # earlier cannot carry a later member outside dest.
        target = (root / member.name.lstrip("/")).resolve()
        if member.name.startswith("/") or not target.is_relative_to(root):
            raise tarfile.TarError(f"{member.name}: would be extracted outside the source folder")
        tar.extract(member, root, set_attrs=not member.issym())


def open_verified_snapshot(path: str, sha256: str | None) -> BinaryIO:
    """Open the snapshot archive at ``path`` (the spec's ``snapshot``) and
    check its bytes against ``sha256`` (the spec's ``snapshot_sha256``, hex,
    recorded at submit), reading through the descriptor that
    is then extracted (so the file cannot be swapped between the check and
    the extraction). Returns the file, positioned at its start.

    Raises tarfile.TarError naming both digests on a mismatch (the run ends
    ``StagingFailed``), OSError when it cannot be read. With no recorded
    digest (a run submitted by an older jobsup) nothing is checked.
    """
    import hashlib

    f = open(path, "rb")  # noqa: SIM115 - returned to the caller
    if sha256:
        digest = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
        if digest.hexdigest() != sha256:
            f.close()
            raise tarfile.TarError(
                f"the snapshot {path} has sha256 {digest.hexdigest()}, not the recorded {sha256}: "
                "it was changed after submit; refusing to run it"
            )
        f.seek(0)
    return f


def job_umask(spec: dict[str, Any]) -> int:
    """The umask the job runs with: the submitting shell's (the spec's
    ``umask``, octal text recorded at submit), else -1 (keep the runner's,
    which is the daemon's private 077)."""
    raw = spec.get("umask")
    return int(raw, 8) if isinstance(raw, str) and raw else -1


def write_status(run_dir: Path, status: dict[str, Any]) -> None:
    """Write ``RUN_DIR/status.json`` atomically and durably."""
    tmp = run_dir / ".status.json.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(status, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / "status.json")
    dfd = os.open(run_dir, os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is alive (kill(2) with
    signal 0; EPERM means it exists)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


_PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def _become_subreaper() -> None:
    """Make orphaned descendants re-parent to this process, not to init
    (prctl PR_SET_CHILD_SUBREAPER), so a job cannot escape by daemonizing."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def _descendants() -> set[int]:
    """Every live process below this one (by parent pid, from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        if fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def _reap(main_pid: int) -> int | None:
    """Reap every exited child (the job and re-parented orphans); the job's
    exit code (negative: killed by that signal) once it has exited."""
    code: int | None = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if pid == main_pid:
            code = os.waitstatus_to_exitcode(status)


def _signal_tree(pgid: int, sig: int) -> None:
    """Send ``sig`` to the job's process group and to every descendant."""
    _signal_group(pgid, sig)
    for pid in _descendants():
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _stop_tree(pgid: int, grace: float) -> None:
    """SIGTERM what is left of the job, SIGKILL after ``grace`` seconds, and
    return once nothing of it remains (all reaped)."""
    def left() -> bool:
        _reap(-1)
        return group_alive(pgid) or bool(_descendants())

    if not left():
        return
    _signal_tree(pgid, signal.SIGTERM)
    end = time.monotonic() + grace
    while left() and time.monotonic() < end:
        time.sleep(0.05)
    while left():
        _signal_tree(pgid, signal.SIGKILL)
        time.sleep(0.02)


class _Runner:
    def __init__(self, run_dir: Path, spec: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.spec = spec
        self.base: dict[str, Any] = {"runner_pid": os.getpid(), "runner_start": proc_start_time(os.getpid())}
        self.cancel_requested = False
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake_r = rfd
        signal.set_wakeup_fd(wfd)
        signal.signal(signal.SIGTERM, self._on_term)
        # SIGCHLD must have a handler for the wakeup fd to see it.
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        _become_subreaper()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _on_term(self, signum: int, frame: object) -> None:
        self.cancel_requested = True

    def status(self, **fields: Any) -> None:
        write_status(self.run_dir, {**self.base, **fields})

    def stage(self) -> Path:
        self.status(state="staging", at=_now())
        repo = self.run_dir / "repo"
        repo.mkdir(exist_ok=True)
        with open_verified_snapshot(self.spec["snapshot"], self.spec.get("snapshot_sha256")) as f, \
                tarfile.open(fileobj=f, mode="r:") as tar:
            extract_snapshot(tar, repo)
        return repo

    def run(self) -> int:
        try:
            repo = self.stage()
        except (OSError, tarfile.TarError) as exc:
            self.status(state="exited", exit_code=None, signal=None, reason="StagingFailed",
                        message=f"cannot extract the source snapshot: {exc}", finished_at=_now())
            return 1
        if self.cancel_requested:
            self.status(state="exited", exit_code=None, signal=None, reason="Canceled",
                        message="canceled before start", finished_at=_now())
            return 0
        env = dict(os.environ)
        for key in [k for k in env if k.startswith("JOBSUP_")]:
            del env[key]
        env.update(self.spec.get("env") or {})
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["JOBSUP_RUN_ID"] = self.run_dir.name
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        out = os.open(self.run_dir / "stdout.log", flags, 0o600)
        err = os.open(self.run_dir / "stderr.log", flags, 0o600)
        try:
            child = subprocess.Popen(
                [self.spec.get("shell") or "bash", "-c", self.spec["command"]],
                cwd=repo,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                process_group=0,
                restore_signals=True,
                umask=job_umask(self.spec),
            )
        except OSError as exc:
            self.status(state="exited", exit_code=None, signal=None, reason="StartFailed",
                        message=f"cannot start {self.spec.get('shell') or 'bash'}: {exc}", finished_at=_now())
            return 1
        finally:
            os.close(out)
            os.close(err)
        pgid = child.pid
        self.base.update(pid=child.pid, pgid=pgid, child_start=proc_start_time(child.pid), started_at=_now())
        self.status(state="running")
        return self.supervise(child, pgid)

    def supervise(self, child: subprocess.Popen[bytes], pgid: int) -> int:
        deadline = time.monotonic() + float(self.spec["timeout_s"])
        grace = float(self.spec.get("kill_grace_s", 10))
        outcome: str | None = None
        kill_at: float | None = None
        code = _reap(child.pid)
        while code is None:
            now = time.monotonic()
            if outcome is None and self.cancel_requested:
                outcome = "Canceled"
            if outcome is None and now >= deadline:
                outcome = "DeadlineExceeded"
            if outcome is not None and kill_at is None:
                _signal_tree(pgid, signal.SIGTERM)
                kill_at = now + grace
            if kill_at is not None and now >= kill_at:
                _signal_tree(pgid, signal.SIGKILL)
            wake = [t for t in (deadline if outcome is None else None, kill_at) if t is not None]
            # SIGCHLD and SIGTERM wake the select through the wakeup fd; the
            # cap only bounds how long a missed wake-up could go unnoticed.
            timeout = min([max(0.0, t - now) for t in wake] + [5.0])
            try:
                select.select([self.wake_r], [], [], timeout)
            except InterruptedError:
                pass
            try:
                while os.read(self.wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            code = _reap(child.pid)
        child.returncode = code
        # The run is over when its shell exits: stop everything it left
        # behind — its process group, and any descendant that left the group
        # (setsid, double fork): as child subreaper the runner inherits those.
        _stop_tree(pgid, grace)
        exit_code = code if code >= 0 else None
        sig = -code if code < 0 else None
        if outcome == "Canceled":
            reason, message = "Canceled", "canceled"
        elif outcome == "DeadlineExceeded":
            reason = "DeadlineExceeded"
            message = f"the run exceeded its timeout of {int(self.spec['timeout_s'])}s"
        elif code == 0:
            reason, message = "Completed", "exit code 0"
        elif sig is not None:
            reason, message = "Signaled", f"killed by signal {signal.Signals(sig).name}"
        else:
            reason, message = "NonZeroExit", f"exit code {code}"
        self.status(state="exited", exit_code=exit_code, signal=sig, reason=reason,
                    message=message, finished_at=_now())
        return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring. Returns the process exit code."""
    args = sys.argv[1:] if argv is None else argv
    run_dir = Path(args[0])
    spec = json.loads(sys.stdin.buffer.read())
    pid = os.fork()
    if pid > 0:
        # First process: report the runner and exit, so the daemon never
        # waits on the runner and the runner is re-parented to init.
        start = None
        for _ in range(200):
            start = proc_start_time(pid)
            if start is not None:
                break
            time.sleep(0.005)
        sys.stdout.write(json.dumps({"pid": pid, "start": start}) + "\n")
        sys.stdout.flush()
        os._exit(0)
    # The runner: detach stdio from the daemon's pipes.
    log = os.open(run_dir / "runner.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)
    try:
        return _Runner(run_dir, spec).run()
    except BaseException as exc:  # last resort: leave a final status, never a silent death
        write_status(run_dir, {"state": "exited", "exit_code": None, "signal": None,
                               "reason": "RunnerFailed", "message": f"runner failed: {exc!r}",
                               "finished_at": _now()})
        raise


if __name__ == "__main__":
    sys.exit(main())
