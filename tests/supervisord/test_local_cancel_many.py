"""``jobsup cancel`` of several runs stops them together: every cancel is
requested before any run is stopped (one after the other, 500 runs took
minutes: each waited for the previous to end)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import jobsup_env, make_repo

pytestmark = pytest.mark.timeout(300)

# Ignores SIGTERM: each run ends only at SIGKILL, kill_grace_s after the cancel.
JOB = "trap '' TERM; echo up; while :; do sleep 0.2; done"


def test_cancel_of_many_runs_is_requested_at_once(tmp_path: Path) -> None:
    with jobsup_env(tmp_path, daemon=True) as js:
        repo = make_repo(tmp_path / "repo", {"README": "x\n"})
        ids = [js.submit(repo, "--name", f"t{i}", "--config", "local.kill_grace_s=4", "--", JOB) for i in range(4)]
        js.cli("wait", "--for", "running", *ids, timeout=120, check=False)
        out = js.cli("cancel", *ids, "-o", "json", timeout=200)
        assert [r["phase"] for r in json.loads(out.stdout)] == ["CANCELED"] * 4
        events = [json.loads(line) for line in js.cli("events", "-o", "json").stdout.splitlines() if line.strip()]
        requested = [e["seq"] for e in events if e["type"] == "CancelRequested"]
        ended = [e["seq"] for e in events if e["type"] == "PhaseChanged" and e["data"].get("phase") == "CANCELED"]
        assert len(requested) == 4 and len(ended) == 4, events
        assert max(requested) < min(ended), f"a run ended before every cancel was requested: {requested} {ended}"


def test_one_request_names_every_bad_ref_and_cancels_none(tmp_path: Path) -> None:
    """``POST /v1/cancel`` resolves every ref before it cancels anything; the
    answer holds each run once, in the order named."""
    with jobsup_env(tmp_path, daemon=True) as js:
        repo = make_repo(tmp_path / "repo", {"README": "x\n"})
        ids = [js.submit(repo, "--name", f"t{i}", "--", "sleep 600") for i in range(2)]
        js.cli("wait", "--for", "running", *ids, timeout=120, check=False)
        bad = js.cli("cancel", ids[0], "0000", "ffff", ids[1], check=False)
        assert bad.returncode == 2, bad
        assert "'0000'" in bad.stderr and "'ffff'" in bad.stderr and "nothing was done" in bad.stderr, bad.stderr
        events = [json.loads(line) for line in js.cli("events", "-o", "json").stdout.splitlines() if line.strip()]
        assert not [e for e in events if e["type"] == "CancelRequested"], events
        out = js.cli("cancel", ids[1], ids[0], ids[1][:6], "-o", "json", timeout=200)
        assert [(r["id"], r["phase"]) for r in json.loads(out.stdout)] == [(ids[1], "CANCELED"), (ids[0], "CANCELED")]
