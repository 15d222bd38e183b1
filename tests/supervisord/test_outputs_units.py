"""Units of runs in the user's world: the outputs listing (manifest), the
recorder driven from the log (a daemon stopped mid-hash finishes after its
restart), links checks, the shell environment's checks."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from store import EventStore, NewEvent
from supervisord.daemon.outputs import check_outputs_root, outputs_root
from supervisord.daemon.outputs.recorder import CHECKPOINT, OutputsRecorder
from supervisord.shared import outputscan as manifest_mod
from supervisord.shared.events import OUTPUTS_RECORDED
from supervisord.shared.exceptions import ConfigError, TaskError
from supervisord.shared.links import check_against_snapshot, resolve_links
from supervisord.shared.outputscan import Stopped, scan
from supervisord.shared.shellenv import capture, check_shell_env, shell_env_digest

pytestmark = pytest.mark.timeout(60)


# -- the listing -------------------------------------------------------------------


def test_scan_lists_hashes_and_skips(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    (tmp_path / "d" / "e").mkdir(parents=True)
    big = os.urandom(3 * manifest_mod.READ_BYTES + 17)
    (tmp_path / "d" / "e" / "big").write_bytes(big)
    os.symlink(tmp_path / "a", tmp_path / "ln")
    os.symlink(tmp_path / "d", tmp_path / "dirlink")  # a symlink to a folder: not followed
    os.mkfifo(tmp_path / "fifo")
    data = scan(tmp_path)
    assert [f["path"] for f in data["files"]] == ["a", "d/e/big"]
    assert data["files"][1]["sha256"] == hashlib.sha256(big).hexdigest()
    assert data["total_bytes"] == 3 + len(big) and data["total_files"] == 2
    assert {s["path"]: s["kind"] for s in data["skipped"]} == {"ln": "symlink", "dirlink": "symlink", "fifo": "fifo"}
    assert data["vanished"] == [] and "omitted" not in data
    assert data["files"][0]["mtime"].endswith("Z")


def test_scan_a_file_deleted_while_listed_is_vanished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).write_text(name)
    real = manifest_mod._hash_entry

    def deleting(path: str, name: str, *rest: Any) -> Any:
        if name == "a":
            os.unlink(tmp_path / "b")  # b was listed, then goes before it is read
        return real(path, name, *rest)

    monkeypatch.setattr(manifest_mod, "_hash_entry", deleting)
    data = scan(tmp_path)
    assert [f["path"] for f in data["files"]] == ["a", "c"] and data["vanished"] == ["b"]


def test_scan_caps_the_list_and_stops_when_asked(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}").write_text("x")
    data = scan(tmp_path, max_files=3)
    assert data["total_files"] == 3 and data["omitted"] == 2
    with pytest.raises(Stopped):
        scan(tmp_path, should_stop=lambda: True)
    with pytest.raises(FileNotFoundError):
        scan(tmp_path / "nope")


# -- the recorder, driven from the log ------------------------------------------------


async def _terminal_run(store: EventStore, run_id: str, root: Path) -> None:
    submitted = {"project": "p", "name": "n", "backend": "local", "outputs_root": str(root)}
    await store.append(run_id, 0, [NewEvent("Submitted", submitted)])
    await store.append(run_id, 1, [NewEvent("PhaseChanged", {"phase": "RUNNING"})])
    await store.append(run_id, 2, [NewEvent("PhaseChanged", {"phase": "COMPLETED"})])


async def _until_recorded(store: EventStore, run_id: str) -> list[Any]:
    with anyio.fail_after(30):
        while True:
            found = await store.read_all(0, run_id=run_id, types=[OUTPUTS_RECORDED])
            if found:
                return found
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_recorder_lists_a_run_that_ended_while_it_was_not_running(tmp_path: Path) -> None:
    """A terminal run with an outputs folder and no OutputsRecorded (a daemon
    killed mid-hash leaves exactly that) is listed when the recorder starts,
    once; a second start records nothing more; runs without a folder are passed over."""
    root = tmp_path / "outputs"
    (root / "p" / "aaaaaaaaaaaa").mkdir(parents=True)
    (root / "p" / "aaaaaaaaaaaa" / "model.bin").write_bytes(b"weights")
    store = await EventStore.open(tmp_path / "db.sqlite")
    try:
        await _terminal_run(store, "aaaaaaaaaaaa", root)
        await _terminal_run(store, "bbbbbbbbbbbb", root)  # its folder was never made
        async with anyio.create_task_group() as tg:
            tg.start_soon(OutputsRecorder(store).run)
            found = await _until_recorded(store, "aaaaaaaaaaaa")
            tg.cancel_scope.cancel()
        # The checkpoint moved with the listing, in its transaction.
        assert await store.get_checkpoint(CHECKPOINT) == (await store.read_stream("aaaaaaaaaaaa"))[2].seq
        assert found[0].data["files"][0]["sha256"] == hashlib.sha256(b"weights").hexdigest()
        assert found[0].data["dir"] == str(root / "p" / "aaaaaaaaaaaa")
        assert await store.read_all(0, run_id="bbbbbbbbbbbb", types=[OUTPUTS_RECORDED]) == []
        # Restarted: nothing is listed twice.
        recorder = OutputsRecorder(store)
        with anyio.move_on_after(0.5):
            await recorder.run()
        assert recorder.recorded == 0
        assert len(await store.read_all(0, types=[OUTPUTS_RECORDED])) == 1
    finally:
        await store.close()


@pytest.mark.anyio
async def test_recorder_stopped_mid_hash_records_nothing_and_lists_after_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "outputs"
    folder = root / "p" / "cccccccccccc"
    folder.mkdir(parents=True)
    (folder / "ckpt").write_bytes(b"x" * (4 * manifest_mod.READ_BYTES))
    reading = threading.Event()
    real = manifest_mod._hash_fd

    def slow(fd: int, buf: bytearray, should_stop: Any = None) -> Any:
        reading.set()
        while should_stop is not None and not should_stop():
            threading.Event().wait(0.01)  # hashing "forever" until the stop
        return real(fd, buf, should_stop)

    store = await EventStore.open(tmp_path / "db.sqlite")
    try:
        await _terminal_run(store, "cccccccccccc", root)
        monkeypatch.setattr(manifest_mod, "_hash_fd", slow)
        async with anyio.create_task_group() as tg:
            tg.start_soon(OutputsRecorder(store).run)
            with anyio.fail_after(30):
                while not reading.is_set():
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()  # the daemon stops mid-hash
        assert await store.read_all(0, types=[OUTPUTS_RECORDED]) == []
        monkeypatch.setattr(manifest_mod, "_hash_fd", real)
        async with anyio.create_task_group() as tg:
            tg.start_soon(OutputsRecorder(store).run)
            found = await _until_recorded(store, "cccccccccccc")
            tg.cancel_scope.cancel()
        assert found[0].data["total_bytes"] == 4 * manifest_mod.READ_BYTES
    finally:
        await store.close()


# -- outputs dir -----------------------------------------------------------------------


def test_outputs_root_default_and_key(tmp_path: Path) -> None:
    assert outputs_root({}, {"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "jobsup" / "outputs"
    assert outputs_root({"local": {"outputs_dir": str(tmp_path / "o")}}) == tmp_path / "o"
    with pytest.raises(ConfigError, match="local.outputs_dir"):
        outputs_root({"local": {"outputs_dir": "relative/o"}})
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    check_outputs_root(shared)
    check_outputs_root(tmp_path / "not-yet")
    shared.chmod(0o775)
    with pytest.raises(ConfigError, match="writable by other users"):
        check_outputs_root(shared)


# -- links -------------------------------------------------------------------------


def _snapshot(tmp_path: Path, files: dict[str, str], symlinks: dict[str, str] | None = None) -> Path:
    repo = tmp_path / "r"
    repo.mkdir()
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    for rel, target in (symlinks or {}).items():
        os.symlink(target, repo / rel)
    out = tmp_path / "snap.tar"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@x"]
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    with out.open("wb") as f:
        subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", "HEAD"], stdout=f, check=True)
    assert tarfile.is_tarfile(out)
    return out


def test_links_resolution_and_refusals(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    cwd = tmp_path / "work"
    cwd.mkdir()
    home = tmp_path
    assert resolve_links({"d": "~/data", "e/f": "../data"}, str(cwd), str(home)) == {
        "d": str(data),
        "e/f": str(data),
    }
    cases = {
        "../up": ("escapes the snapshot", str(data)),
        "/abs": ("relative to the snapshot", str(data)),
        "a/../../b": ("escapes the snapshot", str(data)),
        ".git/hooks": ("inside .git", str(data)),
        "m": ("does not exist", str(tmp_path / "missing")),
    }
    for key, (message, target) in cases.items():
        with pytest.raises(TaskError, match=message) as err:
            resolve_links({key: target}, str(cwd), str(home))
        assert f"links.{key}" in str(err.value)
    with pytest.raises(TaskError, match="inside another link"):
        resolve_links({"a": str(data), "a/b": str(data)}, str(cwd), str(home))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o000)
    try:
        if not os.access(locked, os.R_OK):  # root reads everything
            with pytest.raises(TaskError, match="not readable"):
                resolve_links({"l": str(locked)}, str(cwd), str(home))
    finally:
        locked.chmod(0o700)


def test_links_against_the_snapshot(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, {"README": "x", "src/a.py": "1"}, {"lnk": "src"})
    check_against_snapshot({"data": "/x", "src/data": "/x"}, snap)
    for path, message in {
        "README": "clashes with the committed file README",
        "src": "clashes with the committed folder src",
        "README/x": "README is a committed file",
        "lnk/x": "lnk is a committed symlink",
    }.items():
        with pytest.raises(TaskError, match=message):
            check_against_snapshot({path: "/x"}, snap)


# -- the shell environment ----------------------------------------------------------------


def test_shell_env_checks_and_digests() -> None:
    assert check_shell_env({"BASH_FUNC_module%%": "() { :; }", "JOBSUP_STATE_DIR": "/x", "A": ""}) == {
        "BASH_FUNC_module%%": "() { :; }",
        "A": "",
    }
    for bad, message in (
        ({"A": "x\0y"}, "A: the value holds a NUL byte"),
        ({"B": "x" * 200_000}, "B: NAME=VALUE is"),
        ({"": "x"}, "is not a name"),
        ({"C": 1}, "C: the value must be text"),
        ([], "must map names"),
    ):
        with pytest.raises(TaskError, match=message) as err:
            check_shell_env(bad)
        assert "xxxx" not in str(err.value)
    assert capture({"JOBSUP_SOCKET": "s", "PATH": "/bin"}) == {"PATH": "/bin"}
    digests = shell_env_digest({"B": "secret", "A": "\udcff latin-1 bytes"}, b"k" * 32)
    assert list(digests) == ["A", "B"] and all(d.startswith("hmac-sha256:") for d in digests.values())
    assert "secret" not in str(digests)


def test_only_local_runs_with_env_from_submitter_take_the_shell() -> None:
    from supervisord.daemon.submit import _shell_env

    sent = {"PATH": "/venv/bin"}
    assert _shell_env("local", {}, sent) == sent
    assert _shell_env("local", {"local": {"env_from": "submitter"}}, sent) == sent
    assert _shell_env("local", {"local": {"env_from": "daemon"}}, sent) is None
    assert _shell_env("kubernetes", {}, sent) is None  # never for Kubernetes
    assert _shell_env("local", {}, None) is None  # a client that sent none
