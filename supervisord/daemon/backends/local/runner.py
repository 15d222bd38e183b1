"""The detached per-run runner of the local backend.

Started as ``python -I -S -c "...import runner..." RUN_DIR`` (:func:`command`; isolated: no site packages,
no user environment's Python settings; this file imports only the standard
library, never the daemon's stack) with the run's spec as one JSON object on
stdin::

    {"run_id": str, "command": str, "env": {NAME: value}, "timeout_s": int,
     "kill_grace_s": int, "shell": "bash", "snapshot": "/path/source.tar",
     "status_path": "/path/ID.status", "status_key": hex, "lock_fd": int,
     "env_from": "submitter" | "daemon", "links": JSON text | ""}

``lock_fd``: a descriptor the daemon passes down with an exclusive
``flock`` on the run's launch lock, taken before it started the launcher;
the runner keeps it open (close-on-exec: the job never gets it) so the lock
is held exactly while a process of this launch lives.

``env_from: submitter``: ``env`` is the job's whole environment (the
submitting shell's); otherwise ``env`` goes on top of the runner's own
(the daemon's, ``JOBSUP_*`` dropped). ``links`` are made as symlinks in
``RUN_DIR/repo`` after the snapshot is extracted (:func:`make_links`).

Three processes take part, so the runner that stays keeps little memory
(each idle runner's ``Private_Dirty`` stays under 4 MB):

1. the launcher (what the daemon starts) reads the spec, forks, prints
   ``{"pid": P, "start": T}`` (the runner's pid and its start time in clock
   ticks since boot, field 22 of ``/proc/P/stat``) and exits, so the daemon
   never reaps it and the runner is re-parented to init;
2. the forked child makes itself its job's child subreaper (prctl(2), through
   ctypes) and execs a fresh isolated interpreter on this file with
   ``--runner`` (the subreaper setting survives execve(2); ctypes' and json's
   memory do not), handing it the spec in a memfd in a NUL-separated form
   that needs no ``json`` to read;
3. the runner: extracts the snapshot into ``RUN_DIR/repo`` (in a short-lived
   child, so ``tarfile`` never loads in the runner), starts the command with
   the shell there in its own process group (fork and exec: no
   ``subprocess``), enforces the timeout (SIGTERM to the whole group, SIGKILL
   after the grace period) and writes its status at each step.

The job's output (README.md, "Output of a local run"): the job's stdout and stderr are two
pipes that the runner reads (``select``, one move of up to 64 KiB per ready
pipe per wake-up, with ``splice(2)``: the bytes do not pass through the
runner's memory) into one ordered record of two files:

* ``RUN_DIR/output.log``: the bytes of both streams, each read appended as it
  came -- what a terminal would have shown, to the extent the kernel tells:
  within one pipe the order is the job's own; across the two pipes it is the
  order in which the runner received the reads (bytes written to stdout and
  to stderr while the runner was not looking arrive in one read each, and
  the read of stdout comes first);
* ``RUN_DIR/output.idx``: where each stream's bytes begin: one 8-byte entry
  ``<data offset: 7 bytes big-endian><stream: b"1" stdout | b"2" stderr>``
  each time the stream changes, written *before* the data it describes, so
  a reader that reads data and then the index knows the stream of every
  byte it read.

Byte offsets in ``output.log`` are the lines' positions (where the daemon
resumes after a restart), and a run of one stream is contiguous there, so
the daemon records it in large blocks without a Python object per line.
While a write fails (a full disk) the runner stops reading (the job blocks
on its full pipe: nothing is lost) and retries with back-off. After the job's shell exits the runner keeps reading while
it stops what is left of the job, then reads the pipes to the end, and only
then writes the final status: once the daemon sees it, the record is
complete. If the runner itself dies (kill -9), the job's next write fails
(SIGPIPE) -- the run is then ``Lost`` and its processes are killed anyway.

Status. The status lives at ``status_path``, outside
the job's working tree (``RUN_DIR/repo``), in one file preallocated at start
and rewritten in place, so the final status never needs a new disk block (a
full disk cannot turn a finished run into a lost one; a write that fails
anyway is retried with back-off until it succeeds). Its content::

    <status JSON>\\n<hex HMAC-SHA256 of the JSON text under status_key>\\n<spaces to 4096 bytes>

    {"state": "staging", ...}
    {"state": "running", "pid": child, "pgid": child, "started_at": ...}
    {"state": "exited", "exit_code": int|None, "signal": int|None,
     "reason": "Completed"|"NonZeroExit"|"Signaled"|"DeadlineExceeded"|"Canceled"
               |"StagingFailed"|"StartFailed"|"RunnerFailed",
     "message": str, "finished_at": ...}

Threat model: the job runs as the same user as the runner and the daemon, so
file modes cannot keep it from any file the daemon can read or write (nor
from the daemon's API). What the design guarantees: nothing a job does in its
own tree (``../status.json``, ``rm -rf ..``, a tool writing a status file)
changes what jobsup records, and the daemon takes only a status that carries
a valid MAC under the run's key, which the daemon derives from a key file in
the state dir and hands the runner on stdin: never in the job's environment,
argv or run folder. A job that deliberately reads that key file (or, where
ptrace is allowed, the runner's memory) could forge a status, as it could
call the API; that is out of scope.

Pause (``jobsup pause``): SIGUSR1 to the runner stops the job (SIGSTOP to
its process group and every descendant) and SIGUSR2 lets it go on
(SIGCONT); the runner itself keeps running, reading output and writing its
status, which carries ``"pausable": true`` (a runner that takes these
signals), ``"paused": bool``, ``"paused_s"`` (the total, seconds) and
``"last_pause_s"``. Paused time does not count toward the timeout: the
deadline moves by each pause's length. A cancel of a paused job sends
SIGTERM then SIGCONT, so the job can act on it.

SIGTERM to the runner is a cancel: the group gets SIGTERM, then SIGKILL after
the grace period, and the final status is written only once no process of the
group remains. As child subreaper the runner also stops processes that left
the group (setsid, a double-forked daemon) -- on cancel, on timeout, and when
the job's shell exits.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing/pathlib/tarfile are not loaded at run time
    import signal
    import tarfile
    from pathlib import Path
    from typing import Any
else:
    # The C module under ``signal``: the same functions and constants, without
    # the enum classes (and the ~0.9 MB that importing ``enum`` costs).
    import _signal as signal

# The formats the daemon reads (status file, output record) are in
# protocol.py beside this file: imported as part of the package in the
# daemon, from this folder when the runner runs isolated (:func:`command`).
if TYPE_CHECKING or __package__:
    from .protocol import (
        INDEX_ENTRY,
        OUTPUT_DATA,
        OUTPUT_INDEX,
        STATUS_SIZE,
        STDERR,
        STDOUT,
        decode_status,
        encode_status,
        status_mac,
    )
else:
    from protocol import (
        INDEX_ENTRY,
        OUTPUT_DATA,
        OUTPUT_INDEX,
        STATUS_SIZE,
        STDERR,
        STDOUT,
        decode_status,
        encode_status,
        status_mac,
    )

__all__ = [
    "INDEX_ENTRY",
    "OUTPUT_DATA",
    "OUTPUT_INDEX",
    "STATUS_SIZE",
    "STDERR",
    "STDOUT",
    "command",
    "decode_status",
    "encode_status",
    "extract_snapshot",
    "group_alive",
    "job_umask",
    "main",
    "make_links",
    "open_verified_snapshot",
    "proc_start_time",
    "status_mac",
]

_PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1_000_000):06d}Z"


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat``
    field 22, proc(5)), or None when no such process exists (or it is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
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
    import tarfile

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


def make_links(dest: Path, links_json: str) -> None:
    """Make the task's ``links`` (JSON text: relative path -> absolute
    target, checked at submit by supervisord.shared.links) as symlinks under the
    extracted source ``dest``, creating missing folders on the way. Raises
    OSError naming a link whose folder would leave ``dest`` (a symlink
    there) or that cannot be made."""
    import json

    root = dest.resolve()
    for rel, target in json.loads(links_json).items():
        path = root / rel
        parent = path.parent
        parent.mkdir(parents=True, exist_ok=True)
        if not parent.resolve().is_relative_to(root):
            raise OSError(f"links.{rel}: its folder leaves the source folder")
        try:
            os.symlink(target, path)
        except OSError as err:
            raise OSError(f"links.{rel}: cannot make the link to {target}: {err.strerror}") from None


def is_empty_archive(f: Any) -> bool:
    """Whether the tar archive ``f`` (a binary file at its start, left
    there) holds no member but pax global headers: what ``git archive``
    writes for a commit with no files (a global header with the commit id,
    then the end-of-archive zero blocks), which tarfile refuses as "end of
    file header" (POSIX.1-2001 ustar: a 512-byte header, type flag at byte
    156, octal size at 124..136, the data padded to 512-byte blocks)."""
    try:
        while True:
            header = f.read(512)
            if len(header) < 512 or header.count(0) == 512:
                return True
            if header[156:157] != b"g":
                return False
            try:
                size = int(header[124:136].strip(b"\0 ") or b"0", 8)
            except ValueError:
                return False  # not a plain octal size: tarfile reads it
            f.seek((size + 511) // 512 * 512, os.SEEK_CUR)
    finally:
        f.seek(0)


def open_verified_snapshot(path: str, sha256: str | None) -> Any:
    """Open the snapshot archive at ``path`` (the spec's ``snapshot``) and
    check its bytes against ``sha256`` (the spec's ``snapshot_sha256``, hex,
    recorded at submit), reading through the descriptor that is then
    extracted (so the file cannot be swapped between the check and the
    extraction). Returns the binary file, positioned at its start. Runs in
    the short-lived staging child (hashlib loads there, not in the runner).

    Raises tarfile.TarError naming both digests on a mismatch (the run ends
    ``StagingFailed``), OSError when it cannot be read. With no recorded
    digest (a run submitted by an older jobsup) nothing is checked.
    """
    import hashlib
    import tarfile

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


class _StatusWriter:
    """The runner's status file: created and preallocated once, then
    rewritten in place (pwrite of the whole record, fdatasync)."""

    def __init__(self, path: str, key: bytes) -> None:
        self.key = key
        self.path = path
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self.fd = self._open()
        self.last: dict[str, Any] | None = None
        self.data = b""
        self.ino = -1

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.posix_fallocate(fd, 0, STATUS_SIZE)
        return fd

    def write(self, status: dict[str, Any]) -> None:
        """One write attempt; raises OSError."""
        data = encode_status(status, self.key)
        os.pwrite(self.fd, data, 0)
        os.fdatasync(self.fd)
        self.last = status
        self.data = data
        self.ino = os.fstat(self.fd).st_ino

    def restore(self) -> None:
        """Rewrite the last status if something else changed, replaced or
        removed the file since (a job is not meant to reach it, but could):
        the daemon then sees the runner's word again within one check. The
        content is compared, not the mtime: a write in the same clock tick
        as ours would leave the mtime unchanged."""
        if self.last is None:
            return
        try:
            if os.stat(self.path).st_ino != self.ino:
                raise FileNotFoundError  # replaced: take the path back
            if os.pread(self.fd, STATUS_SIZE + 1, 0) == self.data:
                return
        except FileNotFoundError:
            try:
                fd = self._open()
            except OSError:
                return
            os.close(self.fd)
            self.fd = fd
        except OSError:
            return
        _note("the status file was changed by something else: rewritten")
        try:
            os.ftruncate(self.fd, STATUS_SIZE)
            self.write(self.last)
        except OSError as err:
            _note(f"cannot rewrite the status ({err})")

    def write_final(self, status: dict[str, Any]) -> None:
        """Write the final status, retrying with back-off (0.1 s doubling to
        5 s) until it is written: the daemon must never see the runner gone
        without it."""
        delay = 0.1
        while True:
            try:
                self.write(status)
                return
            except OSError as err:
                _note(f"cannot write the final status ({err}); retrying in {delay:g}s")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _note(text: str) -> None:
    """A line in runner.log (our stderr); a failed write (full disk) is dropped."""
    with contextlib.suppress(OSError):
        os.write(2, f"{_now()} {text}\n".encode(errors="replace"))


# -- process helpers -------------------------------------------------------------


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
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _descendants() -> set[int]:
    """Every live (not zombie) process below this one. Walks down from this
    process through ``/proc/PID/task/TID/children`` (proc(5)): a cost in
    the runner's own descendants, not in every process on the machine (a
    cancel of 500 runs had each runner read all of /proc, twice: minutes of
    CPU on 2 cores). Falls back to reading every ``/proc/PID/stat`` where
    the kernel has no ``children`` files."""
    me = os.getpid()
    if not os.path.exists(f"/proc/{me}/task/{me}/children"):
        return _descendants_by_scan()
    found: set[int] = set()
    todo = [me]
    while todo:
        pid = todo.pop()
        for child in _children(pid):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {pid for pid in found if not _zombie(pid)}


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (none once it is gone)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(word) for word in f.read().split())
        except OSError:
            continue
    return out


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie, or gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return True
    return raw[raw.rindex(b")") + 2 :].split()[0] == b"Z"


def _descendants_by_scan() -> set[int]:
    """:func:`_descendants` from the parent pid of every process in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
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
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _pause(seconds: float, output: _Output | None) -> None:
    """Sleep ``seconds`` while pumping the job's output (what is left of the
    job may still write: it must not block on a full pipe meanwhile)."""
    if output is None:
        time.sleep(seconds)
        return
    end = time.monotonic() + seconds
    while True:
        now = time.monotonic()
        if now >= end:
            return
        retry = output.timeout(now)
        wait = end - now if retry is None else min(end - now, retry)
        try:
            ready, _, _ = select.select(output.readable(), [], [], wait)
        except InterruptedError:
            ready = []
        output.pump(ready)


def _stop_tree(pgid: int, grace: float, output: _Output | None = None) -> None:
    """SIGTERM what is left of the job, SIGKILL after ``grace`` seconds, and
    return once nothing of it remains (all reaped), pumping ``output``
    meanwhile."""

    def left() -> bool:
        _reap(-1)
        return group_alive(pgid) or bool(_descendants())

    if not left():
        return
    _signal_tree(pgid, signal.SIGTERM)
    end = time.monotonic() + grace
    while left() and time.monotonic() < end:
        _pause(0.05, output)
    while left():
        _signal_tree(pgid, signal.SIGKILL)
        _pause(0.02, output)


def scope_cgroup(pid: int, proc: str = "/proc") -> str | None:
    """The cgroup (v2) folder of ``pid`` when it is in a ``.scope`` (None
    otherwise, or when the process is gone)."""
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::") and line.rstrip().endswith(".scope"):
            return "/sys/fs/cgroup/" + line[3:].strip().lstrip("/")
    return None


def oom_kills(cgroup: str) -> int | None:
    """The ``oom_kill`` count in ``cgroup``'s ``memory.events`` (None when
    it cannot be read: the scope is gone)."""
    try:
        with open(os.path.join(cgroup, "memory.events")) as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _children_usage() -> dict[str, Any]:
    """What the processes this runner reaped used (the whole job: as child
    subreaper it reaps every descendant), as flat status fields:
    ``{"usage_cpu_ms": user + system milliseconds, "usage_max_rss_bytes":
    the largest one process's peak RSS}`` -- the usage of a run too short
    for the daemon's sampler to see."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "usage_cpu_ms": round((ru.ru_utime + ru.ru_stime) * 1000),
        "usage_max_rss_bytes": int(ru.ru_maxrss) * 1024,
    }


def _signal_name(sig: int) -> str:
    """``SIGKILL`` for 9 (what ``signal.Signals(sig).name`` gives, without enum)."""
    for name, value in vars(signal).items():
        if name.startswith("SIG") and not name.startswith("SIG_") and value == sig:
            return name
    return str(sig)


def _child_error(wfd: int, what: str, err: BaseException) -> None:
    """In a forked child: report ``err`` through ``wfd`` and exit 127."""
    try:
        os.write(wfd, f"{what}: {err}".encode(errors="replace"))
    finally:
        os._exit(127)


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


# -- the job's output ------------------------------------------------------------

#: One move from a pipe (the size of a default pipe buffer).
_PIPE_READ = 65536


class _Output:
    """The job's stdout and stderr pipes, pumped into the output record.

    Each move from a pipe (up to 64 KiB: what the pipe holds) is appended
    to ``RUN_DIR/output.log`` as it came -- with ``splice(2)``, so the bytes
    never pass through this process (a plain read and write where the file
    system cannot splice); when its stream differs from the previous move's,
    an index entry ``(offset, stream)`` is written to ``RUN_DIR/output.idx``
    first (so whoever reads data and then the index knows the stream of
    every byte it read). Both files are written at explicit offsets, so a
    short or failed write is simply written again. While a write fails (a
    full disk) the pipes are not read -- the job blocks on a full pipe:
    nothing is lost -- and the write is retried with back-off (0.1 s
    doubling to 5 s). At most one read is held in memory (the fallback).
    """

    def __init__(self, run_dir: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        self.data = os.open(os.path.join(run_dir, OUTPUT_DATA), flags, 0o600)
        self.index = os.open(os.path.join(run_dir, OUTPUT_INDEX), flags, 0o600)
        self.size = os.fstat(self.data).st_size
        self.index_size = os.fstat(self.index).st_size // INDEX_ENTRY * INDEX_ENTRY
        self.stream = -1
        self.pipes: dict[int, int] = {}  # read end -> stream byte
        self.child_ends: tuple[int, int] = (-1, -1)
        self.pending: tuple[int, bytes] | None = None  # (stream, read bytes not yet written: the fallback)
        self.blocked = False  # a write failed: retry at retry_at, read nothing meanwhile
        self.retry_at = 0.0
        self.delay = 0.1
        self.use_splice = hasattr(os, "splice")

    def open_pipes(self) -> tuple[int, int]:
        """Create the two pipes; returns the write ends (for the child's fds 1
        and 2; close them with :meth:`close_child_ends` once it has started)."""
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        self.pipes = {out_r: STDOUT, err_r: STDERR}
        self.child_ends = (out_w, err_w)
        return out_w, err_w

    def close_child_ends(self) -> None:
        for fd in self.child_ends:
            if fd >= 0:
                os.close(fd)
        self.child_ends = (-1, -1)

    def readable(self) -> list[int]:
        """The pipes to wait on: none while a write is to be retried."""
        return [] if self.blocked else list(self.pipes)

    def timeout(self, now: float) -> float | None:
        """Seconds until the next write retry, if one is due."""
        return max(0.0, self.retry_at - now) if self.blocked else None

    def pump(self, ready: list[int]) -> bool:
        """Retry a failed write when its time has come, then one move from
        each pipe in ``ready`` (in that order) into the record. Returns
        whether anything was moved (or a pipe reached its end)."""
        if self.blocked:
            if time.monotonic() < self.retry_at:
                return False
            self.blocked = False
            if self.pending is not None:
                stream, chunk = self.pending
                self.pending = None
                if not self._write(stream, chunk):
                    return False
        moved = False
        for fd in ready:
            if self.blocked:
                break
            if fd in self.pipes:
                moved = self._move(fd) or moved
        return moved

    def _failed(self, err: OSError) -> None:
        if self.delay == 0.1:
            _note(f"cannot write the job's output ({err}); retrying")
        self.blocked = True
        self.retry_at = time.monotonic() + self.delay
        self.delay = min(self.delay * 2, 5.0)

    def _entry(self, stream: int) -> None:
        """The index entry for a change to ``stream`` (raises OSError)."""
        if stream != self.stream:
            entry = self.size.to_bytes(7, "big") + bytes((stream,))
            if os.pwrite(self.index, entry, self.index_size) != INDEX_ENTRY:
                raise OSError("short write of an output index entry")
            self.index_size += INDEX_ENTRY
            self.stream = stream

    def _move(self, fd: int) -> bool:
        """One move from pipe ``fd``; False when it had nothing."""
        stream = self.pipes[fd]
        try:
            if self.use_splice:
                # The entry goes first (it may then describe no bytes, e.g.
                # at the pipe's end: a reader applies the last entry at an offset).
                self._entry(stream)
                try:
                    n = os.splice(fd, self.data, _PIPE_READ, offset_dst=self.size, flags=os.SPLICE_F_NONBLOCK)
                except BlockingIOError:
                    return False
                except OSError as err:
                    if err.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        raise
                    self.use_splice = False  # this file system cannot: read and write
                else:
                    if n == 0:
                        self._close_pipe(fd)
                    self.size += n
                    self.delay = 0.1
                    return True
        except OSError as err:
            if isinstance(err, BlockingIOError):
                return False
            self._failed(err)
            return False
        try:
            chunk = os.read(fd, _PIPE_READ)
        except BlockingIOError:
            return False
        if not chunk:
            self._close_pipe(fd)
            return True
        self._write(stream, chunk)
        return True

    def _write(self, stream: int, chunk: bytes) -> bool:
        """Write ``chunk`` of ``stream`` (the fallback); on a failed write keep the rest pending."""
        try:
            self._entry(stream)
            while chunk:
                n = os.pwrite(self.data, chunk, self.size)
                self.size += n
                chunk = chunk[n:]
        except OSError as err:
            self.pending = (stream, chunk)
            self._failed(err)
            return False
        self.delay = 0.1
        return True

    def _close_pipe(self, fd: int) -> None:
        os.close(fd)
        del self.pipes[fd]

    def drain(self) -> None:
        """Everything still in the pipes, once no writer is left (the job's
        tree is gone): moved until each pipe is empty or at its end (never
        blocking: a pipe still held elsewhere is read while it has data),
        waiting out a failing write (retried until it succeeds)."""
        while self.pipes or self.blocked:
            if self.blocked:
                time.sleep(max(0.0, self.retry_at - time.monotonic()))
                self.pump([])
                continue
            ready = list(self.pipes)
            if not self.pump(ready) and not self.blocked:
                break
        for fd in list(self.pipes):
            self._close_pipe(fd)

    def close(self) -> None:
        for fd in list(self.pipes):
            os.close(fd)
        self.pipes = {}
        self.close_child_ends()
        for fd in (self.data, self.index):
            with contextlib.suppress(OSError):
                os.close(fd)


# -- the runner ------------------------------------------------------------------


class _Runner:
    def __init__(self, run_dir: str, spec: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.spec = spec
        self.base: dict[str, Any] = {
            "runner_pid": os.getpid(),
            "runner_start": proc_start_time(os.getpid()),
            "pausable": True,
        }
        self.cancel_requested = False
        self.want_paused = False
        # Limits in a systemd scope: the argv prefix (``systemd-run --user
        # --scope ... --``, US-separated in the spec; empty: none), the
        # scope's cgroup folder once seen and its oom_kill count.
        self.scope = [a for a in str(spec.get("scope") or "").split("\x1f") if a]
        self.cgroup: str | None = None
        self.oom_kills = 0
        self.status_file = _StatusWriter(spec["status_path"], bytes.fromhex(spec["status_key"]))
        self.output: _Output
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake_r = rfd
        signal.set_wakeup_fd(wfd)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGUSR1, self._on_pause)
        signal.signal(signal.SIGUSR2, self._on_resume)
        # SIGCHLD must have a handler for the wakeup fd to see it.
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _on_term(self, signum: int, frame: object) -> None:
        self.cancel_requested = True

    def _on_pause(self, signum: int, frame: object) -> None:
        self.want_paused = True

    def _on_resume(self, signum: int, frame: object) -> None:
        self.want_paused = False

    def status(self, **fields: Any) -> None:
        """A step's status; a failed write is left for the next step (the
        record carries every field so far)."""
        try:
            self.status_file.write({**self.base, **fields})
        except OSError as err:
            _note(f"cannot write the status ({err}); the next step's will carry it")

    def final(self, **fields: Any) -> None:
        self.status_file.write_final({**self.base, "state": "exited", **fields, "finished_at": _now()})

    def stage(self) -> str:
        """Extract the snapshot into RUN_DIR/repo in a child process (tarfile
        loads there, not here). Raises OSError with the child's error."""
        self.status(state="staging", at=_now())
        repo = os.path.join(self.run_dir, "repo")
        os.makedirs(repo, exist_ok=True)
        rfd, wfd = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            try:
                import pathlib
                import tarfile

                with open_verified_snapshot(self.spec["snapshot"], self.spec.get("snapshot_sha256")) as f:
                    if not is_empty_archive(f):
                        with tarfile.open(fileobj=f, mode="r:") as tar:
                            extract_snapshot(tar, pathlib.Path(repo))
                if self.spec.get("links"):
                    make_links(pathlib.Path(repo), self.spec["links"])
            except BaseException as err:  # noqa: BLE001 -- a forked child: report anything, then _exit
                _child_error(wfd, "cannot extract the source snapshot", err)
            os._exit(0)
        os.close(wfd)
        error = _read_all(rfd)
        os.waitpid(pid, 0)
        if error:
            raise OSError(error.decode(errors="replace"))
        return repo

    def run(self) -> int:
        try:
            repo = self.stage()
        except OSError as exc:
            self.final(exit_code=None, signal=None, reason="StagingFailed", message=str(exc))
            return 1
        if self.cancel_requested:
            self.final(exit_code=None, signal=None, reason="Canceled", message="canceled before start")
            return 0
        if self.spec.get("env_from") == "submitter":
            env = {}  # the submitting shell's environment is all in the spec's env
        else:
            env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSUP_")}
        env.update(self.spec["env"])
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["JOBSUP_RUN_ID"] = self.spec["run_id"]
        # Where the job reports its progress (supervisord.shared.progress reads it).
        env["JOBSUP_PROGRESS_FILE"] = os.path.join(self.run_dir, "progress")
        shell = self.spec["shell"] or "bash"
        try:
            pid = self._spawn(shell, repo, env)
        except OSError as exc:
            self.final(exit_code=None, signal=None, reason="StartFailed", message=f"cannot start {shell}: {exc}")
            return 1
        self.spec["env"] = {}  # the values stay with the job only
        del env
        self.base.update(pid=pid, pgid=pid, child_start=proc_start_time(pid), started_at=_now())
        self.status(state="running")
        return self.supervise(pid, pid)

    def _spawn(self, shell: str, cwd: str, env: dict[str, str]) -> int:
        """Fork and exec ``shell -c command`` in ``cwd`` with ``env``, in its
        own process group, stdin from /dev/null, stdout and stderr the pipes
        of :attr:`output`, default signal dispositions. Raises OSError when
        the exec (or the set-up before it) failed."""
        self.output = _Output(self.run_dir)
        out, err = self.output.open_pipes()
        rfd, wfd = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(rfd)
                    for sig in (
                        signal.SIGTERM,
                        signal.SIGUSR1,
                        signal.SIGUSR2,
                        signal.SIGCHLD,
                        signal.SIGINT,
                        signal.SIGHUP,
                        signal.SIGPIPE,
                        signal.SIGXFSZ,
                    ):
                        signal.signal(sig, signal.SIG_DFL)
                    signal.set_wakeup_fd(-1)
                    signal.pthread_sigmask(signal.SIG_SETMASK, [])
                    os.setpgid(0, 0)
                    mask = job_umask(self.spec)
                    if mask >= 0:
                        os.umask(mask)
                    devnull = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(devnull, 0)
                    os.dup2(out, 1)
                    os.dup2(err, 2)
                    os.chdir(cwd)
                    argv = [*self.scope, shell, "-c", self.spec["command"]]
                    os.execvpe(argv[0], argv, env)
                except BaseException as exc:  # noqa: BLE001 -- a forked child: report anything, then _exit
                    _child_error(wfd, "exec", exc)
            os.close(wfd)
            wfd = -1
            failure = _read_all(rfd)  # EOF at exec (close-on-exec): started
        finally:
            self.output.close_child_ends()
            if wfd >= 0:
                os.close(wfd)
        if failure:
            os.waitpid(pid, 0)
            raise OSError(failure.decode(errors="replace").removeprefix("exec: "))
        return pid

    def _watch_scope(self, child: int) -> None:
        """Find the job's scope (systemd-run moves it there before the exec)
        and keep its oom_kill count: a job the kernel killed for its
        MemoryMax ends OOMKilled."""
        if self.cgroup is None:
            self.cgroup = scope_cgroup(child)
        if self.cgroup is not None:
            count = oom_kills(self.cgroup)
            if count is not None:
                self.oom_kills = max(self.oom_kills, count)

    def supervise(self, child: int, pgid: int) -> int:
        deadline = time.monotonic() + float(self.spec["timeout_s"])
        grace = float(self.spec["kill_grace_s"])
        outcome: str | None = None
        kill_at: float | None = None
        output = self.output
        restored_at = time.monotonic()
        paused_at: float | None = None
        code = _reap(child)
        while code is None:
            now = time.monotonic()
            if outcome is None and self.cancel_requested:
                outcome = "Canceled"
            if outcome is None and paused_at is None and self.want_paused:
                _signal_tree(pgid, signal.SIGSTOP)
                paused_at = now
                self.base["paused"] = True
                self.status(state="running")
            elif paused_at is not None and (not self.want_paused or outcome is not None):
                if outcome is None:
                    _signal_tree(pgid, signal.SIGCONT)
                # Paused time does not count toward the timeout.
                deadline += now - paused_at
                self.base.update(
                    paused=False,
                    last_pause_s=round(now - paused_at, 3),
                    paused_s=round(float(self.base.get("paused_s") or 0.0) + now - paused_at, 3),
                )
                paused_at = None
                self.status(state="running")
                if outcome is not None:
                    # Stopped processes act on SIGTERM only once continued.
                    _signal_tree(pgid, signal.SIGTERM)
                    _signal_tree(pgid, signal.SIGCONT)
                    kill_at = now + grace
            if outcome is None and paused_at is None and now >= deadline:
                outcome = "DeadlineExceeded"
            if outcome is not None and kill_at is None:
                _signal_tree(pgid, signal.SIGTERM)
                kill_at = now + grace
            if kill_at is not None and now >= kill_at:
                _signal_tree(pgid, signal.SIGKILL)
            wake = [t for t in (deadline if outcome is None and paused_at is None else None, kill_at) if t is not None]
            code, restored_at = self._wait_and_reap(child, wake, now, restored_at)
            if self.scope:
                self._watch_scope(child)
        if paused_at is not None:  # the shell was killed from outside while paused
            _signal_tree(pgid, signal.SIGCONT)
            self.base["paused"] = False
        # The run is over when its shell exits: stop everything it left
        # behind — its process group, and any descendant that left the group
        # (setsid, double fork): as child subreaper the runner inherits those
        # -- reading their output meanwhile, then what is left in the pipes.
        if self.scope:
            self._watch_scope(child)  # the count after the end, while the scope's folder may still be there
        _stop_tree(pgid, grace, output)
        output.drain()
        output.close()
        exit_code = code if code >= 0 else None
        sig = -code if code < 0 else None
        if outcome is None and self.oom_kills and code != 0:
            reason = "OOMKilled"
            message = (
                f"killed by the kernel's OOM killer in its systemd scope ({self.oom_kills} process(es)), "
                "over its --memory limit"
            )
            self.final(exit_code=exit_code, signal=sig, reason=reason, message=message, **_children_usage())
            return 0
        reason, message = _ending(outcome, code, int(self.spec["timeout_s"]))
        self.final(exit_code=exit_code, signal=sig, reason=reason, message=message, **_children_usage())
        return 0

    def _wait_and_reap(self, child: int, wake: list[float], now: float, restored_at: float) -> tuple[int | None, float]:
        """Wait until a wake-up, output, or the first of ``wake``
        (time.monotonic() instants); pump the output that came; after a
        wake-up (or a second since ``restored_at``) reap ``child`` and
        restore the status file. Returns (the shell's wait code, None while
        it runs; when the status file was last restored)."""
        output = self.output
        # SIGCHLD and SIGTERM wake the select through the wakeup fd; the
        # cap bounds how long a missed wake-up, or a status file changed
        # by something else (restored below), could go unnoticed.
        retry = output.timeout(now)
        timeout = min([max(0.0, t - now) for t in wake] + [2.0] + ([] if retry is None else [retry]))
        # The job's output: one read of each pipe that has data, in the
        # order select lists them, appended to the record as it comes.
        try:
            ready, _, _ = select.select([self.wake_r, *output.readable()], [], [], timeout)
        except InterruptedError:
            ready = []
        output.pump([fd for fd in ready if fd != self.wake_r])
        if not (self.wake_r in ready or not ready or now - restored_at >= 1.0):
            return None, restored_at
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        code = _reap(child)
        self.status_file.restore()
        return code, now


def _ending(outcome: str | None, code: int, timeout_s: int) -> tuple[str, str]:
    """(reason, message) of a run whose shell ended with wait code ``code``
    (negative: killed by that signal), after ``outcome`` (Canceled,
    DeadlineExceeded or None)."""
    if outcome == "Canceled":
        return "Canceled", "canceled"
    if outcome == "DeadlineExceeded":
        return "DeadlineExceeded", f"the run exceeded its timeout of {timeout_s}s"
    if code == 0:
        return "Completed", "exit code 0"
    if code < 0:
        return "Signaled", f"killed by signal {_signal_name(-code)}"
    return "NonZeroExit", f"exit code {code}"


# -- start-up ------------------------------------------------------------------------


def command() -> list[str]:
    """The argv that starts this module isolated: ``python -I -S -c ...``
    importing it from its folder (so its compiled ``.pyc`` is used: running
    the file as a script would compile it in every runner), then
    ``main(sys.argv[1:])``. Append the arguments."""
    folder = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {folder!r}); from runner import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-I", "-S", "-c", code]


_SPEC_FIELDS = (
    "run_id",
    "command",
    "shell",
    "snapshot",
    "status_path",
    "status_key",
    "timeout_s",
    "kill_grace_s",
    "snapshot_sha256",
    "umask",
    "lock_fd",
    "env_from",
    "links",
    "scope",
)


def _pack_spec(spec: dict[str, Any]) -> bytes:
    """The spec as NUL-separated fields (``_SPEC_FIELDS`` in order, then
    NAME, value pairs of the env): what the runner reads without ``json``."""
    items = [str(spec.get(k) if spec.get(k) is not None else "") for k in _SPEC_FIELDS]
    for k, v in (spec.get("env") or {}).items():
        items += [str(k), str(v)]
    return b"\0".join(os.fsencode(i) for i in items)


def _unpack_spec(data: bytes) -> dict[str, Any]:
    items = [os.fsdecode(i) for i in data.split(b"\0")]
    spec: dict[str, Any] = dict(zip(_SPEC_FIELDS, items, strict=False))  # the env pairs follow
    spec["timeout_s"] = int(spec["timeout_s"])
    spec["kill_grace_s"] = int(spec["kill_grace_s"] or 10)
    rest = items[len(_SPEC_FIELDS) :]
    spec["env"] = dict(zip(rest[::2], rest[1::2], strict=True))
    return spec


def _become_subreaper() -> None:
    """Make orphaned descendants re-parent to this process, not to init
    (prctl PR_SET_CHILD_SUBREAPER; kept across execve), so a job cannot
    escape by daemonizing."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def _launch(run_dir: str) -> int:
    """The launcher (steps 1 and 2 of the module docstring)."""
    import json

    spec = json.loads(sys.stdin.buffer.read())
    spec_fd = os.memfd_create("jobsup-runner-spec", 0)  # inherited across exec
    os.write(spec_fd, _pack_spec(spec))
    pid = os.fork()
    if pid == 0:
        # The runner-to-be: detach stdio from the daemon's pipes.
        try:
            log = os.open(os.path.join(run_dir, "runner.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(devnull)
            os.close(log)
            _become_subreaper()
            os.execv(sys.executable, [*command(), "--runner", run_dir, str(spec_fd)])
        except BaseException as exc:  # noqa: BLE001 -- a forked child: note anything, then _exit
            _note(f"runner start failed: {exc!r}")
        os._exit(127)
    start = None
    for _ in range(200):
        start = proc_start_time(pid)
        if start is not None:
            break
        time.sleep(0.005)
    sys.stdout.write(json.dumps({"pid": pid, "start": start}) + "\n")
    sys.stdout.flush()
    return 0


def _run(run_dir: str, spec_fd: int) -> int:
    """The runner (step 3)."""
    size = os.fstat(spec_fd).st_size
    data = os.pread(spec_fd, size, 0)
    os.close(spec_fd)
    spec = _unpack_spec(data)
    del data
    if spec.get("lock_fd"):
        # The launch lock (see the daemon's LocalBackend.start): held by this
        # process for its life, never by the job.
        os.set_inheritable(int(spec["lock_fd"]), False)
    runner: _Runner | None = None
    try:
        runner = _Runner(run_dir, spec)
        return runner.run()
    except BaseException as exc:  # last resort: leave a final status, never a silent death
        _note(f"runner failed: {exc!r}")
        if runner is not None:
            runner.final(exit_code=None, signal=None, reason="RunnerFailed", message=f"runner failed: {exc!r}")
        raise


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring. Returns the process exit code."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--runner":
        return _run(args[1], int(args[2]))
    return _launch(args[0])


if __name__ == "__main__":
    sys.exit(main())
