"""The page's access rules over real HTTP: token, cookie, CSRF, Host, limits."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx
import psutil

from store import EventStore, NewEvent
from tests.supervisord.jobsup_env import JobsupEnv, jobsup_env
from tests.supervisord.ui.conftest import page_url


def _base(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _login(url: str) -> httpx.Client:
    client = httpx.Client(base_url=_base(url), follow_redirects=False, timeout=10)
    resp = client.get(url)
    assert resp.status_code == 303 and resp.headers["location"] == "/"
    cookie = resp.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "token" not in resp.headers["location"]
    return client


def test_every_request_needs_the_cookie(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "bash", "quick.sh")
    url = page_url(js)
    base = _base(url)
    for path in (
        "/",
        f"/runs/{run_id}",
        f"/runs/{run_id}/stream",
        f"/runs/{run_id}/lines",
        "/events",
        "/queue",
        "/static/ui.js",
        "/stream",
    ):
        assert httpx.get(base + path, timeout=10).status_code == 401, path
    assert httpx.post(base + f"/runs/{run_id}/cancel", timeout=10).status_code == 401
    # A forged cookie is refused too.
    forged = httpx.get(base + "/", cookies={"jobsup_session": "9999999999.abcd.00"}, timeout=10)
    assert forged.status_code == 401


def test_token_is_one_time_and_the_cookie_works(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "bash", "quick.sh")
    url = page_url(js)
    client = _login(url)
    assert client.get("/").status_code == 200
    assert run_id in client.get("/").text
    # The same token again: refused, whoever presents it.
    assert httpx.get(url, timeout=10).status_code == 401
    # A second `jobsup ui` gives a new token for the same port.
    again = page_url(js)
    assert _base(again) == _base(url) and again != url


def test_state_changes_need_the_csrf_token_and_same_origin(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "bash", "chatty.sh")
    client = _login(page_url(js))
    page = client.get(f"/runs/{run_id}").text
    csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page)
    assert csrf is not None
    # No token: refused, and the run keeps running.
    assert client.post(f"/runs/{run_id}/cancel").status_code == 403
    assert client.post(f"/runs/{run_id}/cancel", data={"csrf": "0" * 64}).status_code == 403
    # The right token from another origin (a cross-site form post): refused.
    cross = client.post(
        f"/runs/{run_id}/cancel", data={"csrf": csrf.group(1)}, headers={"Origin": "http://evil.example"}
    )
    assert cross.status_code == 403
    assert js.show(run_id)["phase"] not in ("CANCELED",)
    ok = client.post(
        f"/runs/{run_id}/cancel", data={"csrf": csrf.group(1)}, headers={"Origin": _base(str(client.base_url))}
    )
    assert ok.status_code == 303 and ok.headers["location"] == f"/runs/{run_id}"
    assert js.show(run_id)["phase"] == "CANCELED"


def test_foreign_host_header_is_refused(js: JobsupEnv) -> None:
    client = _login(page_url(js))
    # DNS rebinding: a page of evil.example resolving to 127.0.0.1.
    assert client.get("/", headers={"Host": "evil.example"}).status_code == 421


def test_bad_paging_parameters_are_400(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "bash", "quick.sh")
    client = _login(page_url(js))
    assert client.get("/?before=-1").status_code == 400
    assert client.get("/?phase=NOPE").status_code == 400
    assert client.get(f"/runs/{run_id}/lines?limit=100000").status_code == 400
    assert client.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": "x"}).status_code == 400
    assert client.get("/runs/ffffffffffff").status_code == 404


def _seed_runs(db: Path, n: int) -> list[str]:
    """``n`` finished runs written straight into a new database (real SQLite,
    the store's own append), oldest first."""

    async def seed() -> list[str]:
        store = await EventStore.open(db, synchronous="NORMAL")
        ids = [f"{i:012x}" for i in range(1, n + 1)]
        try:
            for chunk in range(0, n, 500):
                async with anyio.create_task_group() as tg:
                    for rid in ids[chunk : chunk + 500]:
                        events = [
                            NewEvent("Submitted", {"project": "p", "name": "n", "backend": "local"}),
                            NewEvent("PhaseChanged", {"phase": "COMPLETED", "exit_code": 0}),
                        ]
                        tg.start_soon(store.append, rid, 0, events)
        finally:
            await store.close()
        return ids

    return anyio.run(seed, backend="asyncio")


def test_runs_page_is_paged_on_the_server(tmp_path: Path) -> None:
    with jobsup_env(tmp_path) as env:
        env.state_dir.mkdir(mode=0o700, parents=True)
        ids = _seed_runs(env.state_dir / "jobsup.db", 10_000)
        # The order of a concurrent append is the commit order: read it back.
        env.start_daemon()
        client = _login(page_url(env))
        newest = [r["id"] for r in json.loads(env.cli("runs", "--all", "-o", "json").stdout)]
        assert sorted(newest) == sorted(ids)
        first = client.get("/").text
        shown = re.findall(r'data-run="([0-9a-f]{12})"', first)
        assert shown == newest[:50]
        seen = list(shown)
        link = re.search(r'href="(/\?before=\d+)"', first)
        for _ in range(3):
            assert link is not None
            page = client.get(link.group(1)).text
            seen += re.findall(r'data-run="([0-9a-f]{12})"', page)
            link = re.search(r'href="(/\?before=\d+)"', page)
        assert seen == newest[:200]
        # Filters page too, on the server.
        assert client.get("/?phase=RUNNING").text.count('data-run="') == 0


def test_page_state_is_private_and_stop_closes_the_port(js: JobsupEnv) -> None:
    url = page_url(js)
    port = urlsplit(url).port
    state = json.loads((js.state_dir / "ui.json").read_text())
    assert state == {"port": port}
    for name in ("ui.json", "ui.key"):
        mode = stat.S_IMODE(os.stat(js.state_dir / name).st_mode)
        assert mode == 0o600, (name, oct(mode))
    js.cli("ui", "--stop")
    assert not (js.state_dir / "ui.json").exists()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
        except httpx.ConnectError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"port {port} still answers after `jobsup ui --stop`")


def test_page_is_off_until_asked_for(js: JobsupEnv) -> None:
    assert js.daemon is not None
    daemon = psutil.Process(js.daemon.pid)
    assert [c for c in daemon.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN] == []
    url = page_url(js)
    listening = [c.laddr for c in daemon.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", urlsplit(url).port)]


def test_a_non_loopback_host_needs_tls(tmp_path: Path) -> None:
    with jobsup_env(tmp_path) as env:
        cfg = tmp_path / "daemon.yaml"
        cfg.write_text("ui:\n  host: 0.0.0.0\n")
        env.start_daemon(extra_env={"JOBSUP_DAEMON_CONFIG": str(cfg)}, wait=False)
        assert env.daemon is not None
        rc = env.daemon.wait(timeout=60)
        assert rc == 2
        log = env.daemon_log.read_text()
        assert "Traceback" not in log, log
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "ui.host" in errors[0] and "tls_cert" in errors[0], log


def test_a_run_whose_archived_log_is_gone_says_why(js: JobsupEnv, repo: Path) -> None:
    """Retention: the run page of a run whose archived text was deleted
    shows when and the digest, instead of failing or showing nothing."""
    run_id = js.submit(repo, "--", "bash", "quick.sh")
    js.cli("wait", run_id, "--timeout", "60s", check=False)
    assert js.show(run_id)["log_lines"] > 0
    js.cli("prune", "--older-than", "0s", "--delete-archives")
    url = page_url(js)
    client = _login(url)
    try:
        page = client.get(f"/runs/{run_id}")
    finally:
        client.close()
    assert page.status_code == 200
    assert 'id="logerror"' in page.text and "was deleted at" in page.text and "sha256:" in page.text


def test_the_sweep_view_and_a_sweep_runs_facts(js: JobsupEnv, repo: Path) -> None:
    progress = 'printf \'{"step": %s, "total": 4, "metrics": {"acc": 0.%s}}\' {n} {n} > $JOBSUP_PROGRESS_FILE'
    sweep = js.cli("submit", "--label", "team=ui", "--sweep", "n=1..3", "--", progress, cwd=repo).stdout.strip()
    js.cli("wait", sweep)
    client = _login(page_url(js))
    page = client.get(f"/sweeps/{sweep[:6]}?sort=-acc")
    assert page.status_code == 200, page.text
    assert 'http-equiv="refresh"' not in page.text  # every run has ended: no reload
    order = re.findall(r'<tr id="run-([0-9a-f]{12})">', page.text)
    doc = json.loads(js.cli("runs", "--sweep", sweep, "-o", "json").stdout)
    by_n = {r["params"]["n"]: r["id"] for r in doc["rows"]}
    assert order == [by_n["3"], by_n["2"], by_n["1"]]
    assert '<progress max="4" value="3"></progress>' in page.text and "team=ui" in page.text
    run = client.get(f"/runs/{by_n['2']}").text
    assert f'href="/sweeps/{sweep}"' in run and "n=2" in run and "acc=0.2" in run
    assert client.get(f"/sweeps/{sweep}?sort=nope").status_code == 400
    assert client.get("/sweeps/sffffffffff").status_code == 404


def test_page_buttons_pause_resume_and_priority(js: JobsupEnv, repo: Path) -> None:
    client = _login(page_url(js))
    origin = {"Origin": _base(str(client.base_url))}
    held = js.submit(repo, "--name", "held", "--hold", "--", "bash", "quick.sh")
    page = client.get(f"/runs/{held}").text
    csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page)
    assert csrf is not None and 'id="set-priority"' in page and 'id="pause"' not in page
    token = csrf.group(1)
    assert client.post(f"/runs/{held}/priority", data={"priority": "5"}, headers=origin).status_code == 403
    ok = client.post(f"/runs/{held}/priority", data={"csrf": token, "priority": "5"}, headers=origin)
    assert ok.status_code == 303
    assert json.loads(js.cli("queue", "-o", "json").stdout)["waiting"][0]["priority"] == 5
    bad = client.post(f"/runs/{held}/priority", data={"csrf": token, "priority": "lots"}, headers=origin)
    assert bad.status_code == 400
    run_id = js.submit(repo, "--name", "chatty", "--", "bash", "chatty.sh")
    deadline = time.monotonic() + 60
    while js.show(run_id)["phase"] != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert 'id="pause"' in client.get(f"/runs/{run_id}").text
    assert client.post(f"/runs/{run_id}/pause", data={"csrf": token}, headers=origin).status_code == 303
    assert js.show(run_id)["reason"] == "Paused"
    assert 'id="resume"' in client.get(f"/runs/{run_id}").text
    assert client.post(f"/runs/{run_id}/resume", data={"csrf": token}, headers=origin).status_code == 303
    assert js.show(run_id)["reason"] is None
    # A run that cannot be paused: the page says why (an error page), nothing changes.
    refused = client.post(f"/runs/{held}/pause", data={"csrf": token}, headers=origin)
    assert refused.status_code == 400 and "only a RUNNING run can be paused" in refused.text
    js.cli("cancel", run_id, held)


def test_events_page_shows_the_daemons_own_events_unlinked(js: JobsupEnv) -> None:
    js.cli("queue", "set", "pageq", "--max-parallel", "2")
    client = _login(page_url(js))
    page = client.get("/events?type=QueueChanged").text
    assert "QueueChanged" in page and "daemon" in page and 'href="/runs/daemon"' not in page


def test_events_page_opens_at_the_newest_with_loglines_hidden(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "bash", "quick.sh")
    js.cli("wait", run_id, "--timeout", "120s")
    client = _login(page_url(js))

    def seqs_and_types(html: str) -> list[tuple[int, str]]:
        rows = re.findall(r'<tr><td class="mono">(\d+)</td>.*?<td>(\w+)</td><td class="mono data">', html, re.S)
        return [(int(s), t) for s, t in rows]

    page = client.get(f"/events?run={run_id}").text
    rows = seqs_and_types(page)
    assert rows and [s for s, _ in rows] == sorted((s for s, _ in rows), reverse=True)  # newest first
    assert rows[-1][1] == "Submitted" and "LogLines" not in {t for _, t in rows}
    assert "LogLines hidden" in page and f"/events?run={run_id}&amp;logs=1" in page
    shown = client.get(f"/events?run={run_id}&logs=1").text
    assert "LogLines" in {t for _, t in seqs_and_types(shown)} and "LogLines shown" in shown
    assert "LogLines" in {t for _, t in seqs_and_types(client.get(f"/events?run={run_id}&type=LogLines").text)}
    # Paged backwards: the page before the newest event holds the older ones.
    newest = rows[0][0]
    older = seqs_and_types(client.get(f"/events?run={run_id}&before={newest}").text)
    assert [s for s, _ in older] == [s for s, _ in rows[1:]]


def test_runs_list_shows_started_elapsed_gpus_and_peak_memory(js: JobsupEnv, repo: Path) -> None:
    run_id = js.submit(repo, "--", "bash", "quick.sh")
    js.cli("wait", run_id, "--timeout", "120s")
    deadline = time.monotonic() + 30
    while not js.show(run_id).get("usage") and time.monotonic() < deadline:
        time.sleep(0.2)
    run = js.show(run_id)
    client = _login(page_url(js))
    page = client.get("/").text
    assert "<th>Started</th><th>Elapsed</th><th>GPUs</th><th>Peak memory</th>" in page
    row = re.search(rf'<tr id="run-{run_id}".*?</tr>', page, re.S)
    assert row is not None
    cells = dict(re.findall(r'<td class="(?:time )?(started|elapsed|gpus|usage)"[^>]*>([^<]*)</td>', row.group(0)))
    assert cells["started"].startswith(run["started_at"][:10]), cells
    assert re.fullmatch(r"\d+\.\ds|\d+s", cells["elapsed"]), cells
    assert cells["gpus"] == ""  # no GPU asked for
    assert cells["usage"].endswith("MiB"), (cells, run.get("usage"))
    assert f'data-ended="{run["ended_at"]}"' in row.group(0)  # what the page's script ticks from


def test_the_sweep_stream_sends_changed_rows_and_resumes_from_a_seq(js: JobsupEnv, repo: Path, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job = f"while [ ! -e {gate} ]; do sleep 0.05; done; echo {{n}}"
    sweep = js.cli("submit", "--sweep", "n=1..2", "--", job, cwd=repo).stdout.strip()
    client = _login(page_url(js))
    try:
        page = client.get(f"/sweeps/{sweep}")
        assert page.status_code == 200 and 'http-equiv="refresh"' not in page.text
        after = int(re.search(r'data-after="(\d+)"', page.text).group(1))  # type: ignore[union-attr]
        assert 'data-live="true"' in page.text
        gate.touch()
        js.cli("wait", sweep, "--timeout", "60s")
        # A stream opened later, from the page's seq, still gets every change since.
        rows: dict[str, str] = {}
        with client.stream("GET", f"/sweeps/{sweep[:6]}/stream?after={after}", timeout=30) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            event = None
            for line in resp.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "rows":
                    body = json.loads(line[6:])
                    assert body["columns"][0] == "id"
                    rows.update(body["rows"])
                    if body["done"]:
                        assert "2 COMPLETED" in body["counts"]
                        break
        assert len(rows) == 2 and all('class="badge COMPLETED"' in html for html in rows.values())
        assert client.get("/sweeps/sffffffffff/stream").status_code == 404
    finally:
        client.close()


def test_a_retried_runs_page_lists_its_attempts_and_separates_their_lines(
    js: JobsupEnv, repo: Path, tmp_path: Path
) -> None:
    mark = tmp_path / "tried"
    (repo / "task.yaml").write_text(
        f"run: if [ -e {mark} ]; then echo second; else touch {mark}; echo first; exit 9; fi\n"
        "retry: {attempts: 1, on: ['exit:9'], backoff: 0s}\n"
    )
    run_id = js.submit(repo, "task.yaml")
    assert js.cli("wait", run_id, "--timeout", "60s", check=False).returncode == 0
    client = _login(page_url(js))
    try:
        page = client.get(f"/runs/{run_id}").text
    finally:
        client.close()
    assert 'id="attempts"' in page and "NonZeroExit (exit code 9)" in page
    assert re.findall(r'<li data-attempt="(\d)">', page) == ["1", "2"]
    log = page.split('id="log">', 1)[1].split("</pre>", 1)[0]
    assert log.index("first") < log.index('data-attempt="2"') < log.index("second")
