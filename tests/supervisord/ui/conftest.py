"""Fixtures for the web page's tests: a real daemon serving the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo


@pytest.fixture
def js(js: JobsupEnv) -> JobsupEnv:
    """The harness's environment (tests/supervisord/conftest.py), with its
    daemon running for every page test."""
    js.start_daemon()
    return js


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(
        tmp_path / "proj",
        {
            # Interleaved stdout/stderr until cancelled; a marker file says how far it got.
            "chatty.sh": 'i=0\nwhile true; do i=$((i+1)); echo "out $i"; echo "err $i" >&2; sleep 0.05; done\n',
            "many.sh": 'i=0\nwhile [ $i -lt 2500 ]; do i=$((i+1)); echo "line $i"; done\n',
            "quick.sh": "echo hello\n",
        },
    )


def page_url(js: JobsupEnv, *args: str) -> str:
    """``jobsup ui --no-open [args]``: the printed URL (with its token)."""
    out = js.cli("ui", "--no-open", *args).stdout.strip()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{20,}", out), out
    return out
