"""The end-to-end harness's fixtures, for every test under tests/supervisord.

* ``js``: a private jobsup environment (:class:`JobsupEnv`); its daemon is
  started when the test, its class or its module is marked
  ``pytest.mark.daemon`` (else the test starts it when it wants), and
  stopped, with every run it started, after the test.
* ``live``: ``js`` with its daemon running.
* ``repo``: a git repository with one committed file to submit from; a
  module that needs other files overrides it with :func:`make_repo`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervisord.jobsup_env import JobsupEnv, make_repo


@pytest.fixture
def js(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobsupEnv]:
    env = JobsupEnv(tmp_path)
    try:
        if request.node.get_closest_marker("daemon") is not None:
            env.start_daemon()
        yield env
    finally:
        env.close()


@pytest.fixture
def live(js: JobsupEnv) -> JobsupEnv:
    if js.daemon is None:
        js.start_daemon()
    return js


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "proj", {"README": "x\n"})
