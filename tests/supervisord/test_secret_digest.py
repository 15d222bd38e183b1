"""One keyed digest for every recorded or printed secret (defect: ``config
show`` and the recorded config used an unkeyed sha256 next to the events'
keyed HMAC)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

import pytest

from supervisord.shared.secret import env_digest, load_digest_key, read_digest_key, redact
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = pytest.mark.timeout(120)

SECRET = "1234"  # short: an unkeyed sha256 of it is reversed by trying 10^4 values


def _unkeyed(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _keyed(value: str, key: bytes) -> str:
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()


def test_config_show_uses_the_daemons_keyed_digest(js: JobsupEnv, tmp_path: Path) -> None:
    js.user_config(f"env:\n  PIN: '{SECRET}'\n")
    js.state_dir.mkdir(parents=True)
    key = load_digest_key(js.state_dir)
    r = js.cli("config", "show", "-o", "json")
    assert _unkeyed(SECRET)[:16] not in r.stdout
    assert json.loads(r.stdout)["env"]["PIN"] == f"<redacted hmac-sha256:{_keyed(SECRET, key)}>"


def test_config_show_without_a_key_shows_no_digest(js: JobsupEnv) -> None:
    js.user_config(f"env:\n  PIN: '{SECRET}'\n")
    r = js.cli("config", "show", "-o", "json")
    assert json.loads(r.stdout)["env"]["PIN"] == "<redacted>"
    assert not (js.state_dir / "digest.key").exists()  # a read-only command creates nothing


def test_recorded_config_has_no_unkeyed_digest(js: JobsupEnv, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "proj", {".jobsup.yaml": f"env:\n  PIN: '{SECRET}'\n"})
    js.start_daemon()
    run_id = js.submit(repo, "--", "true")
    key = read_digest_key(js.state_dir)
    assert key is not None
    events = js.cli("events", run_id, "-o", "json").stdout
    assert _unkeyed(SECRET)[:16] not in events
    submitted = json.loads(events.splitlines()[0])["data"]
    assert submitted["env"]["PIN"] == f"hmac-sha256:{_keyed(SECRET, key)}"
    # The recorded config's copy is the same keyed digest.
    assert submitted["config"]["env"]["PIN"] == f"<redacted {submitted['env']['PIN']}>"


def test_one_digest_function() -> None:
    key = os.urandom(32)
    assert env_digest({"A": SECRET}, key)["A"].removeprefix("hmac-sha256:") == _keyed(SECRET, key)
    assert redact({"env": {"A": SECRET}}, key)["env"]["A"] == f"<redacted {env_digest({'A': SECRET}, key)['A']}>"
