"""Task key ``links:``: symlinks in a local run's snapshot to data outside git.

``links: {data: ~/datasets/cifar10, ckpt: ../shared-ckpt}`` makes
``<snapshot>/data`` and ``<snapshot>/ckpt`` symlinks. Targets are resolved
at submit (:func:`resolve_links`): ``~`` expanded, a relative target taken
against the folder ``submit`` ran in; the result is recorded in
``Submitted.links``. A link is refused at submit, naming its key, when its
path leaves the snapshot, clashes with a committed file or folder (or sits
under a committed file or symlink), or its target does not exist or cannot
be read. The runner makes the links after extracting the snapshot.

Blocking (it stats files and reads the snapshot's member list): call it
from a worker thread.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisord.shared.exceptions import TaskError

__all__ = ["check_against_snapshot", "check_links_shape", "link_path", "links_json", "resolve_links"]


def check_links_shape(value: object, *, where: str = "links") -> dict[str, str]:
    """``value`` as ``{path: target}``, both non-empty text without NUL.
    Raises TaskError naming ``where``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TaskError(f"{where}: must map paths in the snapshot to targets ({{data: ~/datasets/x}})")
    out: dict[str, str] = {}
    for key, target in value.items():
        if not isinstance(key, str) or not key or "\0" in key:
            raise TaskError(f"{where}: {str(key)[:64]!r} is not a path")
        if not isinstance(target, str) or not target or "\0" in target:
            raise TaskError(f"{where}.{key}: the target must be a path")
        out[key] = target
    return out


def link_path(key: str) -> str:
    """The normalised relative path of link ``key`` in the snapshot. Raises
    TaskError when it is absolute or leaves the snapshot."""
    if key.startswith(("/", "~")):
        raise TaskError(f"links.{key}: the link path must be relative to the snapshot's top")
    norm = posixpath.normpath(key)
    if norm in (".", "") or norm == ".." or norm.startswith("../") or "/../" in f"/{norm}/":
        raise TaskError(f"links.{key}: the link path escapes the snapshot")
    if norm == ".git" or norm.startswith(".git/"):
        raise TaskError(f"links.{key}: the link path may not be inside .git")
    return norm


def resolve_links(links: Mapping[str, str], cwd: str, home: str | None = None) -> dict[str, str]:
    """``{normalised path: absolute target}`` for the task's ``links``
    (``cwd``: the folder ``submit`` ran in; ``home``: what ``~`` means, default
    this process's). Raises TaskError naming the key: a path leaving the
    snapshot, two links one inside the other, a target that does not exist
    or that this user cannot read."""
    out: dict[str, str] = {}
    for key, target in links.items():
        path = link_path(key)
        if path in out:
            raise TaskError(f"links.{key}: the same path as another link")
        if target == "~" or target.startswith("~/"):
            target = (home or os.path.expanduser("~")) + target[1:]
        else:
            target = os.path.expanduser(target)
        resolved = os.path.normpath(os.path.join(cwd, target))
        try:
            os.stat(resolved)
        except FileNotFoundError:
            raise TaskError(f"links.{key}: the target {resolved} does not exist") from None
        except OSError as err:
            raise TaskError(f"links.{key}: the target {resolved} cannot be reached: {err.strerror}") from None
        if not os.access(resolved, os.R_OK):
            raise TaskError(f"links.{key}: the target {resolved} is not readable by you")
        out[path] = resolved
    paths = sorted(out)
    for a in paths:
        for b in paths:
            if b != a and b.startswith(a + "/"):
                raise TaskError(f"links.{b}: inside another link ({a})")
    return out


def _members(snapshot: Path) -> dict[str, str]:
    """Member name (no trailing ``/``) -> ``dir``, ``file`` or ``symlink``."""
    import tarfile  # here only: the CLI imports this module for check_links_shape

    kinds: dict[str, str] = {}
    if snapshot.stat().st_size == 0:
        return kinds
    try:
        with tarfile.open(snapshot, mode="r:") as tar:
            for m in tar:
                name = m.name.rstrip("/")
                kinds[name] = "dir" if m.isdir() else "symlink" if m.issym() or m.islnk() else "file"
    except tarfile.ReadError as err:
        if "empty" in str(err):  # an archive of an empty tree (end-of-archive blocks only)
            return kinds
        raise
    return kinds


def check_against_snapshot(links: Mapping[str, str], snapshot: Path) -> None:
    """Refuse a link that clashes with what the snapshot ``snapshot`` (a tar
    of the commit) holds: the path itself, or a folder on its way that is a
    committed file or symlink. Raises TaskError naming the key."""
    if not links:
        return
    kinds = _members(snapshot)
    for path in links:
        if path in kinds:
            what = {"dir": "folder", "file": "file", "symlink": "symlink"}[kinds[path]]
            raise TaskError(f"links.{path}: clashes with the committed {what} {path}")
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            kind = kinds.get(parent)
            if kind is not None and kind != "dir":
                raise TaskError(f"links.{path}: {parent} is a committed {kind}, not a folder")


def links_json(links: Mapping[str, Any]) -> str:
    """The runner's ``links`` spec field (JSON text)."""
    import json

    return json.dumps(dict(links), sort_keys=True)
