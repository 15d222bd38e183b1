"""The logs API stream (``GET /v1/runs/{id}/logs``): exact line framing and
heartbeats, against the real daemon over its socket."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from supervisord.client.api import Client
from supervisord.shared.paths import Paths
from tests.supervisord.jobsup_env import JobsupEnv, make_repo

pytestmark = [pytest.mark.timeout(180), pytest.mark.daemon]


def test_follow_from_a_line_still_to_come_gets_heartbeats(js: JobsupEnv, tmp_path: Path) -> None:
    # The run keeps appending LogLines events for ~9 s, but none of its lines
    # is past the cursor: the stream must still show it is alive (the
    # client gives up on a stream silent for 20 s).
    repo = make_repo(tmp_path / "proj", {"slow.sh": "for i in $(seq 45); do echo $i; sleep 0.2; done\n"})
    run_id = js.submit(repo, "--", "bash slow.sh")
    seen: list[str] = []
    with Client(Paths.from_env(js.env)) as client:
        for obj in client.logs(run_id, follow=True, after_line=1000):
            seen.append(next(iter(obj)))
            if "end" in obj:
                break
    assert "line_no" not in seen
    assert seen[-1] == "end"
    assert "heartbeat" in seen[:-1], seen


def test_replay_keeps_every_line_whole(js: JobsupEnv, tmp_path: Path) -> None:
    # U+2028, U+2029 and U+0085 stay raw inside JSON strings; str.splitlines
    # (and so httpx's iter_lines) would break an NDJSON line at them.
    texts = ["plain", 'quote " and backslash \\', "tab\there", "a\u2028b\u2029c\x85d", "é€𝄞", '{"json": true}', ""]
    repo = make_repo(tmp_path / "proj", {"out.txt": "".join(t + "\n" for t in texts)})
    run_id = js.submit(repo, "--", "cat out.txt")
    js.cli("wait", run_id, "--timeout", "60s")
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(js.socket)), base_url="http://jobsup/v1") as http:
        body = http.get(f"/runs/{run_id}/logs", params={"format": "ndjson"}).content.decode()
        plain = http.get(f"/runs/{run_id}/logs")
    framed = body.split("\n")
    assert framed[-1] == ""
    objs = [json.loads(line) for line in framed[:-1]]
    at = objs[0]["at"]
    assert at.endswith("Z")
    assert framed[:-1] == [
        json.dumps(
            {"line_no": i, "stream": "stdout", "at": at, "attempt": 1, "text": t},
            ensure_ascii=False,
            separators=(",", ":"),
        )
        for i, t in enumerate(texts, 1)
    ]
    # the default is plain text: the lines as they were written
    assert plain.headers["content-type"].startswith("text/plain")
    assert plain.content.decode() == "".join(t + "\n" for t in texts)
    assert js.cli("logs", run_id).stdout == "".join(t + "\n" for t in texts)


def test_a_text_page_is_cut_at_its_limit_inside_a_block(js: JobsupEnv, tmp_path: Path) -> None:
    # "lines 3-5" of a run whose 50 lines sit in one block: the page starts
    # after line 2 and is cut after its third line, also with tail.
    repo = make_repo(tmp_path / "proj", {"out.txt": "".join(f"line {i}\n" for i in range(1, 51))})
    run_id = js.submit(repo, "--", "cat out.txt")
    js.cli("wait", run_id, "--timeout", "60s")
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(js.socket)), base_url="http://jobsup/v1") as http:
        page = http.get(f"/runs/{run_id}/logs", params={"after_line": 2, "limit": 3})
        tail = http.get(f"/runs/{run_id}/logs", params={"tail": 10, "limit": 2})
    assert page.headers["x-jobsup-first-line"] == "3"
    assert page.text == "line 3\nline 4\nline 5\n"
    assert tail.text == "line 41\nline 42\n"
