"""The page and the socket API rerun through the one command path
(:class:`supervisord.daemon.commands.Commands`): the same run, rerun from either,
records the same task (only where the environment comes from differs: the
CLI sends its shell's, the page has none)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx

from tests.supervisord.jobsup_env import JobsupEnv
from tests.supervisord.ui.conftest import page_url

#: What differs between a rerun from the CLI and one from the page by design.
_ENVIRONMENT_KEYS = ("env_from", "shell_env")


def _submitted(js: JobsupEnv, run_id: str) -> dict[str, Any]:
    lines = js.cli("events", run_id, "-o", "json").stdout.splitlines()
    [submitted] = [e["data"] for e in map(json.loads, lines) if e["type"] == "Submitted"]
    return {k: v for k, v in submitted.items() if k not in _ENVIRONMENT_KEYS}


def test_a_rerun_from_the_page_records_what_one_from_the_cli_does(js: JobsupEnv, repo: Path) -> None:
    first = js.submit(repo, "--name", "again", "--", "sh quick.sh")
    js.cli("wait", first, "--timeout", "60s")
    from_cli = js.cli("rerun", first, cwd=repo).stdout.strip()
    js.cli("wait", from_cli, "--timeout", "60s")

    url = page_url(js)
    parts = url.split("/?token=")
    with httpx.Client(base_url=parts[0], follow_redirects=False, timeout=30) as client:
        assert client.get(url).status_code == 303
        page = client.get(f"/runs/{first}").text
        csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page)
        assert csrf is not None
        resp = client.post(f"/runs/{first}/rerun", data={"csrf": csrf.group(1)}, headers={"Origin": parts[0]})
    assert resp.status_code == 303, resp.text
    from_page = resp.headers["location"].rsplit("/", 1)[-1]
    assert re.fullmatch(r"[0-9a-f]{12}", from_page) and from_page not in (first, from_cli)
    js.cli("wait", from_page, "--timeout", "60s")

    cli_doc, page_doc = _submitted(js, from_cli), _submitted(js, from_page)
    assert cli_doc["rerun_of"] == page_doc["rerun_of"] == first
    assert cli_doc == page_doc
