"""The end-to-end harness's fixtures, for every test under tests/supervisord.

* ``js``: a private jobsup environment (:class:`JobsupEnv`); its daemon is
  started when the test, its class or its module is marked
  ``pytest.mark.daemon`` (else the test starts it when it wants), and
  stopped, with every run it started, after the test.
* ``live``: ``js`` with its daemon running.
* ``repo``: a git repository with one committed file to submit from; a
  module that needs other files overrides it with :func:`make_repo`.

A module that shares one environment between its tests (a daemon started
once) defines a module-scoped ``js`` from :func:`jobsup_env`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env, make_repo


@pytest.fixture
def js(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobsupEnv]:
    with jobsup_env(tmp_path, daemon=request.node.get_closest_marker("daemon") is not None) as env:
        yield env


@pytest.fixture
def live(js: JobsupEnv) -> JobsupEnv:
    if js.daemon is None:
        js.start_daemon()
    return js


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"README": "x\n"})
