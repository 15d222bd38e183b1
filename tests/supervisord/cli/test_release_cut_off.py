"""C18: a ``release`` (or ``hold``) of many runs cut off by a daemon crash
said only "lost the jobsup daemon". It now says which runs it released
before, whether the one in flight was released (from its events, once a
daemon answers again), and which were not (a client that loses its daemon
at a chosen request: the crash cannot be timed from outside)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from supervisord.client.cli import queue_cmd
from supervisord.client.cli.main import main
from supervisord.shared.exceptions import DaemonUnreachableError

IDS = [f"{i:04x}00000000" for i in range(1, 6)]


class CutOff:
    """Releases runs until request number ``dies_at``, which is recorded
    (``recorded``) or not before the daemon is lost; then the daemon is
    back (``back``) or not."""

    def __init__(self, dies_at: int, *, recorded: bool, back: bool = True) -> None:
        self.dies_at, self.recorded, self.back = dies_at, recorded, back
        self.released: list[str] = []
        self.lost = False

    def release(self, run_id: str) -> dict[str, Any]:
        if self.lost:
            raise DaemonUnreachableError("lost again")
        if len(self.released) == self.dies_at:
            if self.recorded:
                self.released.append(run_id)
            self.lost = True
            raise DaemonUnreachableError("lost the jobsup daemon on /x.sock: connection reset")
        self.released.append(run_id)
        return {"id": run_id, "phase": "QUEUED", "reason": None}

    def hold_or_release(self, action: str, run_id: str) -> dict[str, Any]:
        assert action == "release"
        return {"run": self.release(run_id)}

    def connect(self) -> dict[str, Any]:
        if not self.back:
            raise DaemonUnreachableError("no daemon")
        self.lost = False
        return {}

    def events(self, *, run: str) -> Iterator[dict[str, Any]]:
        yield {"type": "Submitted"}
        yield {"type": "Held"}
        if run in self.released:
            yield {"type": "HoldReleased"}


def _release(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fake: CutOff) -> tuple[int, str]:
    monkeypatch.setattr(queue_cmd, "connected_client", lambda: fake)
    monkeypatch.setattr(queue_cmd, "resolve_runs", lambda client, refs, only_queued: [{"id": r} for r in refs])
    monkeypatch.setattr(queue_cmd, "_LOST_WAIT_S", 0.0)
    with pytest.raises(SystemExit) as exited:
        main(["release", *IDS])
    return int(exited.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("recorded", [True, False])
def test_a_release_cut_off_says_what_was_released(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], recorded: bool
) -> None:
    code, err = _release(monkeypatch, capsys, CutOff(2, recorded=recorded))
    assert code == 69, err
    error = err.splitlines()[-1]
    assert error.startswith("error: lost the jobsup daemon"), err
    assert f"released before it went away: {IDS[0]}, {IDS[1]}" in error, error
    if recorded:
        assert f"run {IDS[2]} was released" in error and f"NOT released: {IDS[3]}, {IDS[4]}" in error, error
    else:
        assert f"NOT released: {IDS[2]}, {IDS[3]}, {IDS[4]}" in error, error
    assert f"jobsup release {' '.join(IDS[3 if recorded else 2 :])}" in error, error


def test_without_a_daemon_since_the_run_in_flight_is_unknown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _release(monkeypatch, capsys, CutOff(0, recorded=True, back=False))
    error = err.splitlines()[-1]
    assert code == 69 and "released before" not in error, err
    assert f"whether run {IDS[0]} was released is unknown" in error, error
    assert f"NOT released: {', '.join(IDS[1:])}" in error, error
