"""Who owns jobsup's files and who is on the other end of its socket.

Shared by the CLI's API client (checks before sending anything), the daemon
(checks its state dir at start) and the API server (records who asked).
Pure functions over ``os.stat`` and ``SO_PEERCRED`` (unix(7)); no jobsup
imports besides the exception tree.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from pathlib import Path
from typing import NamedTuple

from supervisord.shared.exceptions import UnsafePathError

__all__ = [
    "PeerCred",
    "UnsafePathError",
    "check_private_dir",
    "check_state_dir",
    "peer_cred",
    "remove_snapshot_leftovers",
    "unsafe_reason",
]


class PeerCred(NamedTuple):
    """The credentials of a Unix socket's peer (``SO_PEERCRED``): the
    process id, user id and group id it had when it connected (client) or
    called ``listen`` (server). A named tuple: the CLI imports this module,
    and :mod:`dataclasses` would import :mod:`inspect`."""

    pid: int
    uid: int
    gid: int


def peer_cred(sock: socket.socket) -> PeerCred:
    """``SO_PEERCRED`` of a connected ``AF_UNIX`` socket (unix(7): three
    native ints, pid, uid, gid). Raises OSError when the socket has no peer."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCred(pid=pid, uid=uid, gid=gid)


def unsafe_reason(st: os.stat_result, *, uid: int | None = None) -> str | None:
    """Why a file or folder with stat ``st`` must not be trusted by user
    ``uid`` (default: this process's): it belongs to another user, or group
    or others may write it. None when it is safe."""
    me = os.getuid() if uid is None else uid
    if st.st_uid != me:
        return f"belongs to uid {st.st_uid}, not to you (uid {me})"
    if (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_private_dir(path: Path, *, what: str, fix: str | None = None) -> None:
    """Refuse folder ``path`` (not following a final symlink) unless it
    belongs to this user and neither group nor others may write it.

    ``what`` names it in the message ("socket folder", "state dir"...);
    ``fix`` is the advice appended (default: ``chmod 700`` / ``chown``).
    Raises UnsafePathError; FileNotFoundError when it does not exist.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        # A symlink's own mode says nothing: judge what it points at, and the
        # link itself must be ours (another user's link could be re-pointed).
        if st.st_uid != os.getuid():
            raise UnsafePathError(f"{what} {path} is a symlink that belongs to uid {st.st_uid}, not to you")
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{what} {path} is not a folder")
    reason = unsafe_reason(st)
    if reason is not None:
        advice = fix or (
            f"run `chmod 700 {path}`" if st.st_uid == os.getuid() else "remove it or `chown` it to yourself"
        )
        raise UnsafePathError(f"{what} {path} {reason}; {advice}")


#: Folders of the state dir whose entries are checked one level further down
#: (``snapshots/xx/<sha>.tar``, archived logs). Run folders are checked
#: themselves but not their content: a job may do what it likes in its own
#: working directory.
_DEEP_FOLDERS = ("snapshots", "archive")


def check_state_dir(state_dir: Path) -> None:
    """Refuse a state dir another user could tamper with: the folder itself,
    everything directly in it, every run folder (``runs/<id>``) and
    everything in ``snapshots/`` and ``archive/`` down to their files must
    belong to this user, and no folder or file among them may be writable
    by group or others (a folder others can write lets them swap a snapshot
    between submit and extraction).

    Raises UnsafePathError naming the first offending path and the fix.
    """
    check_private_dir(state_dir, what="state dir")

    def check(path: Path) -> os.stat_result:
        st = os.lstat(path)
        reason = unsafe_reason(st)
        if reason is not None:
            advice = f"run `chmod go-w {path}`" if st.st_uid == os.getuid() else "remove it or `chown` it to yourself"
            raise UnsafePathError(f"{path} (in the state dir {state_dir}) {reason}; {advice}")
        return st

    def entries(folder: Path) -> list[Path]:
        try:
            return sorted(folder.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []

    for entry in entries(state_dir):
        st = check(entry)
        if not stat.S_ISDIR(st.st_mode):
            continue
        if entry.name == "runs":
            for run in entries(entry):
                check(run)
        elif entry.name in _DEEP_FOLDERS:
            for sub in entries(entry):
                if stat.S_ISDIR(check(sub).st_mode):
                    for leaf in entries(sub):
                        check(leaf)


def remove_snapshot_leftovers(snapshots_dir: Path) -> list[Path]:
    """Delete ``snapshots/.archive-*``: temp files of snapshots whose submit
    was interrupted (a daemon killed mid ``git archive``). Only a daemon
    holding the state-dir lock may call this (no submit is in progress).
    Returns what was removed."""
    removed: list[Path] = []
    for tmp in sorted(snapshots_dir.glob(".archive-*")):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed
