"""extract_snapshot: symlinks kept, escapes refused — with and without
tarfile's extraction filters (Python 3.11 before 3.11.4 lacks them)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from supervisord.daemon.backends.local.runner import extract_snapshot


def _tar(members: list[tuple[str, str, str]]) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = value.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = tarfile.SYMTYPE
                info.linkname = value
                tar.addfile(info)
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r:")


@pytest.fixture(params=["filter", "by-hand"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "by-hand":
        # Behave like a Python without PEP 706 filters.
        monkeypatch.delattr(tarfile, "tar_filter", raising=False)
    elif not hasattr(tarfile, "tar_filter"):
        pytest.skip("this Python has no tarfile extraction filters")
    return str(request.param)


def test_files_and_symlinks_are_kept(tmp_path: Path, mode: str) -> None:
    tar = _tar([("file", "a/b.txt", "hi"), ("link", "abs", "/etc/hostname"), ("link", "up", "../x")])
    extract_snapshot(tar, tmp_path)
    assert (tmp_path / "a" / "b.txt").read_text() == "hi"
    assert (tmp_path / "abs").readlink() == Path("/etc/hostname")
    assert (tmp_path / "up").readlink() == Path("../x")


@pytest.mark.parametrize(
    "members",
    [
        [("file", "../escape.txt", "x")],
        [("link", "d", "/tmp"), ("file", "d/escape.txt", "x")],
    ],
)
def test_members_outside_are_refused(tmp_path: Path, mode: str, members: list[tuple[str, str, str]]) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(tarfile.TarError):
        extract_snapshot(_tar(members), dest)
    assert not (tmp_path / "escape.txt").exists()
