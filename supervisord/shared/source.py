"""Git source snapshots: the recorded commit, and ``git archive`` of it.

A run never sees the working tree: submit resolves ``--rev`` (default
``HEAD``) to a full commit id, and the run's source is ``git archive`` of that
commit, stored content-addressed (sha256) under ``<state dir>/snapshots``
with mode 0600. Uncommitted changes never run.

All functions here block (they run ``git``); async callers run them in a
worker thread.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from supervisord.shared.exceptions import SourceError, StorageError

__all__ = [
    "ARCHIVE_TIMEOUT_S",
    "Snapshot",
    "SnapshotStore",
    "archive_failed",
    "archive_timed_out",
    "disk_full",
    "is_dirty",
    "is_disk_full",
    "is_no_space",
    "read_file_at",
    "repo_root",
    "resolve_commit",
    "submodule_paths",
    "untracked_files",
]

_GIT_TIMEOUT_S = 60.0


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise SourceError("git is not installed (or not on PATH); jobsup needs it to snapshot sources") from None
    except subprocess.TimeoutExpired:
        raise SourceError(f"git {' '.join(args)} in {repo} took longer than {_GIT_TIMEOUT_S:.0f}s") from None
    if check and proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise SourceError(f"git {' '.join(args)} failed in {repo}: {err}")
    return proc


def repo_root(path: str | os.PathLike[str]) -> Path:
    """The top-level folder of the git work tree holding ``path`` (a file or folder).

    Raises SourceError (saying what to do) when ``path`` is not inside a git
    repository.
    """
    p = Path(path).resolve()
    folder = p if p.is_dir() else p.parent
    proc = _git(folder, "rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        raise SourceError(
            f"{folder} is not inside a git repository: jobsup runs a committed snapshot of your code. "
            "Run `git init && git add -A && git commit -m init` there, or run jobsup from inside your repository."
        )
    return Path(proc.stdout.decode().strip())


def resolve_commit(repo: Path, rev: str = "HEAD") -> str:
    """The full 40-hex commit id that ``rev`` names in ``repo``.

    Raises SourceError naming the revision when it does not name a commit
    (including ``HEAD`` in a repository without commits).
    """
    proc = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if proc.returncode != 0:
        hint = " (the repository has no commits yet: commit your code first)" if rev == "HEAD" else ""
        raise SourceError(f"--rev {rev!r} does not name a commit in {repo}{hint}")
    return proc.stdout.decode().strip()


def is_dirty(repo: Path) -> bool:
    """True when tracked files differ from HEAD (staged or not); untracked files are ignored."""
    return bool(_git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip())


def untracked_files(repo: Path) -> list[str]:
    """Files git does not track and does not ignore: they are not in any
    snapshot (``git ls-files --others --exclude-standard``)."""
    out = _git(repo, "ls-files", "--others", "--exclude-standard", "-z").stdout
    return [p.decode("utf-8", "replace") for p in out.split(b"\0") if p]


def submodule_paths(repo: Path, commit: str) -> list[str]:
    """The paths of the submodules (gitlinks) in ``commit``: ``git archive``
    leaves them as empty folders in the snapshot."""
    out = _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit).stdout
    paths: list[str] = []
    for entry in out.split(b"\0"):
        meta, _, path = entry.partition(b"\t")
        if meta.split(b" ")[1:2] == [b"commit"]:
            paths.append(path.decode("utf-8", "replace"))
    return paths


def read_file_at(repo: Path, commit: str, path: str) -> bytes | None:
    """The bytes of repository-relative ``path`` at ``commit``, or None when
    the commit has no such file (``git show COMMIT:PATH``)."""
    rel = path.removeprefix("./")
    if _git(repo, "cat-file", "-e", f"{commit}:{rel}", check=False).returncode != 0:
        return None
    return _git(repo, "show", f"{commit}:{rel}").stdout


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One stored source archive: ``sha256`` of the tar bytes, its ``path``
    and ``size`` in bytes."""

    sha256: str
    path: Path
    size: int


class SnapshotStore:
    """Content-addressed tar archives under ``root`` (created 0700, files 0600).

    The same commit always yields the same archive bytes, so a commit snapshotted
    twice is stored once.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, sha256: str) -> Path:
        """Where the archive with this digest lives (it may not exist)."""
        return self.root / sha256[:2] / f"{sha256}.tar"

    def archive_command(self, repo: Path, commit: str) -> list[str]:
        """The git command that writes ``commit`` of ``repo`` as a tar on stdout."""
        return ["git", "-C", str(repo), "archive", "--format=tar", commit]

    def new_temp(self) -> tuple[int, Path]:
        """A new private temp file in the store for an archive being
        written: ``(fd, path)``; :meth:`adopt` moves it into place."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".archive-", dir=self.root)
        return fd, Path(tmp_name)

    def adopt(self, tmp: Path) -> Snapshot:
        """Hash the finished (fsynced) archive ``tmp`` and rename it to its
        content address, mode 0600. Returns the Snapshot."""
        digest = hashlib.sha256()
        size = 0
        with tmp.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
        sha = digest.hexdigest()
        final = self.path_for(sha)
        final.parent.mkdir(mode=0o700, exist_ok=True)
        os.chmod(tmp, 0o600)
        os.replace(tmp, final)
        return Snapshot(sha256=sha, path=final, size=size)

    def create(self, repo: Path, commit: str) -> Snapshot:
        """``git archive --format=tar COMMIT`` into the store; returns the Snapshot.

        Raises SourceError when git fails. A partial archive is never left
        behind under its final name (written to a temp file, then renamed).
        Blocking; the daemon uses a cancellable form built from the same
        parts (``supervisord.daemon.submit.Planner._snapshot``).
        """
        fd, tmp = self.new_temp()
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    proc = subprocess.run(
                        self.archive_command(repo, commit),
                        stdout=out,
                        stderr=subprocess.PIPE,
                        timeout=ARCHIVE_TIMEOUT_S,
                        check=False,
                    )
                except subprocess.TimeoutExpired:
                    raise archive_timed_out(repo, commit) from None
                if proc.returncode != 0:
                    raise archive_failed(repo, commit, proc.stderr, store_root=self.root)
                out.flush()
                os.fsync(out.fileno())
            return self.adopt(tmp)
        except OSError as err:
            if is_no_space(err):
                raise disk_full(self.root, f"the source snapshot of {commit[:12]} could not be written") from err
            raise
        finally:
            tmp.unlink(missing_ok=True)


#: Seconds ``git archive`` may take (git filters and LFS can be slow).
ARCHIVE_TIMEOUT_S = _GIT_TIMEOUT_S * 5


def archive_timed_out(repo: Path, commit: str) -> SourceError:
    """The error for a ``git archive`` that ran past ARCHIVE_TIMEOUT_S."""
    return SourceError(f"git archive {commit} in {repo} timed out")


def archive_failed(
    repo: Path, commit: str, stderr: bytes | None, *, store_root: Path | None = None
) -> SourceError | StorageError:
    """The error for a ``git archive`` that failed, with git's message; a
    StorageError naming the state dir when the snapshot store's disk
    (``store_root``) is what failed (a full disk is not bad input)."""
    err = (stderr or b"").decode("utf-8", "replace").strip()
    if store_root is not None and ("No space left on device" in err or is_disk_full(store_root)):
        return disk_full(store_root, f"git archive could not write the source snapshot of {commit[:12]}")
    return SourceError(f"git archive {commit} failed in {repo}: {err}")


def is_disk_full(folder: Path) -> bool:
    """Whether the file system of ``folder`` (or of its nearest existing
    parent) has no block left for this user."""
    for where in (folder, *folder.parents):
        try:
            return os.statvfs(where).f_bavail == 0
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return False


def disk_full(store_root: Path, doing: str) -> StorageError:
    """The error of a write to the state dir (the parent of the snapshot
    store ``store_root``) that found its disk full: the CLI exits 1 naming
    the state dir."""
    state_dir = store_root.parent
    return StorageError(
        f"the disk of the state dir {state_dir} is full: {doing}; free space there and submit again "
        "(nothing was recorded)",
        store_error="StorageFullError",
    )


def is_no_space(err: OSError) -> bool:
    """Whether ``err`` says the disk is full (ENOSPC, EDQUOT)."""
    return err.errno in (errno.ENOSPC, errno.EDQUOT)
