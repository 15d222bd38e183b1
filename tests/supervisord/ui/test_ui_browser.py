"""The page in a real browser: Debian's chromium driven by Playwright.

Screenshots of each page land in ``$JOBSUP_TEST_ARTIFACTS`` (default
``/tmp/jobsup-ui-artifacts``); they are for people to look at, not committed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.supervisord.jobsup_env import JobsupEnv
from tests.supervisord.ui.conftest import page_url

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("JOBSUP_TEST_ARTIFACTS", "/tmp/jobsup-ui-artifacts"))

if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("CI needs Debian's chromium for the page tests (.ci/run installs it)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _dom_lines(page: Any) -> list[tuple[int, str]]:
    rows = page.eval_on_selector_all(
        "#log .ln", "els => els.map(e => [Number(e.dataset.n), e.childNodes[1].textContent.replace(/\\n$/, '')])"
    )
    return [(int(n), str(t)) for n, t in rows]


def _stored_lines(js: JobsupEnv, run_id: str) -> list[tuple[int, str]]:
    out = js.cli("logs", run_id, "-o", "json").stdout
    return [(int(d["line_no"]), str(d["text"])) for d in map(json.loads, out.splitlines()) if "line_no" in d]


def _wait_lines(page: Any, n: int, *, exact: bool = False, timeout_s: float = 60.0) -> None:
    """Wait until the log shows ``n`` lines (at least ``n`` unless ``exact``),
    polling from Python: the page's CSP forbids the eval that
    ``wait_for_function`` with a string would need."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        count = page.locator("#log .ln").count()
        if count == n or (not exact and count >= n):
            return
        time.sleep(0.1)
    raise AssertionError(f"the log shows {page.locator('#log .ln').count()} lines, not {n}, after {timeout_s}s")


def _wait_for(pred: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_live_run_page_cancel_rerun_and_daemon_restart(js: JobsupEnv, repo: Path, browser: Any) -> None:
    url = page_url(js)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url)
    assert urlsplit(page.url).query == ""  # the token left the address bar
    # A run submitted while the list is open appears on it, live.
    run_id = js.submit(repo, "--", "bash", "chatty.sh")
    page.wait_for_selector(f"#run-{run_id} .badge.RUNNING", timeout=60_000)
    # Its started time and an elapsed time that ticks while it runs.
    elapsed = page.locator(f"#run-{run_id} td.elapsed")
    page.wait_for_function(
        "(sel) => /^\\d+(\\.\\d)?s$/.test(document.querySelector(sel).textContent)", arg=f"#run-{run_id} td.elapsed"
    )
    first = elapsed.inner_text()
    page.wait_for_function(
        "([sel, was]) => document.querySelector(sel).textContent !== was", arg=[f"#run-{run_id} td.elapsed", first]
    )
    assert page.locator(f"#run-{run_id} td.started").inner_text().startswith("20")
    _shot(page, "runs")

    page.click(f"#run-{run_id} a")
    page.wait_for_url(re.compile(f"/runs/{run_id}$"))
    # Lines arrive live, in order, each once.
    _wait_lines(page, 20, exact=False, timeout_s=60)
    lines = _dom_lines(page)
    assert [n for n, _ in lines] == list(range(1, len(lines) + 1))
    assert page.locator("#log .ln.stderr").count() > 0 and page.locator("#log .ln.stdout").count() > 0
    _shot(page, "run-live")

    # Restart the daemon under the open page: the run goes on, the page
    # comes back on the same port, the stream resumes with nothing missed or doubled.
    before = len(_dom_lines(page))
    assert js.stop_daemon() == 0
    time.sleep(1.0)
    js.start_daemon()
    _wait_lines(page, before + 40, exact=False, timeout_s=90)
    lines = _dom_lines(page)
    assert [n for n, _ in lines] == list(range(1, len(lines) + 1)), "a line is missing or doubled"
    stored = dict(_stored_lines(js, run_id))
    assert all(stored[n] == text for n, text in lines), "the page shows other text than the store"

    # Cancel with the button (after the confirmation) and see CANCELED.
    page.once("dialog", lambda d: d.accept())
    page.click("#cancel")
    page.wait_for_selector("#phase.CANCELED", timeout=60_000)
    assert js.show(run_id)["phase"] == "CANCELED"
    page.wait_for_selector("#timeline .seg.CANCELED", timeout=30_000)
    _shot(page, "run-canceled")

    # Rerun: a new run of the same task, and its page.
    page.once("dialog", lambda d: d.accept())
    page.click("#rerun")
    page.wait_for_url(re.compile(rf"/runs/(?!{run_id})[0-9a-f]{{12}}$"), timeout=60_000)
    new_id = page.url.rsplit("/", 1)[1]
    shown = js.show(new_id)
    assert shown["name"] == js.show(run_id)["name"]
    _wait_lines(page, 5, exact=False, timeout_s=60)
    page.once("dialog", lambda d: d.accept())
    page.click("#cancel")
    page.wait_for_selector("#phase.CANCELED", timeout=60_000)

    # The events page lists the run's audit trail.
    page.goto(urlsplit(page.url)._replace(path="/events", query=f"run={run_id}").geturl())
    assert page.locator("table.events tbody tr").count() >= 4
    assert "Submitted" in page.inner_text("table.events")
    page.goto(urlsplit(page.url)._replace(path="/events", query=f"run={run_id}&type=CancelRequested").geturl())
    assert page.locator("table.events tbody tr").count() == 1
    assert "CancelRequested" in page.inner_text("table.events")
    _shot(page, "events")
    page.goto(urlsplit(page.url)._replace(path="/queue", query="").geturl())
    _shot(page, "queue")


def test_long_log_shows_the_tail_and_loads_earlier_lines(js: JobsupEnv, repo: Path, browser: Any) -> None:
    run_id = js.submit(repo, "--", "bash", "many.sh")
    js.cli("wait", run_id, "--timeout", "120s")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(page_url(js))
    page.goto(urlsplit(page.url)._replace(path=f"/runs/{run_id}").geturl())
    lines = _dom_lines(page)
    assert [n for n, _ in lines] == list(range(1501, 2501))
    assert lines[-1] == (2500, "line 2500")
    page.click("#earlier")
    _wait_lines(page, 2000, exact=True, timeout_s=30)
    page.click("#earlier")
    _wait_lines(page, 2500, exact=True, timeout_s=30)
    lines = _dom_lines(page)
    assert lines == [(n, f"line {n}") for n in range(1, 2501)]
    assert page.locator("#earlier").count() == 0
    _shot(page, "run-long")


def test_a_cross_site_form_post_is_refused(js: JobsupEnv, repo: Path, browser: Any, tmp_path: Path) -> None:
    """A page of another site (here: another port, which is another origin)
    that auto-submits a form to our cancel URL, in the same browser that
    holds our session: refused, and the run keeps running."""
    import http.server
    import threading

    run_id = js.submit(repo, "--", "bash", "chatty.sh")
    url = page_url(js)
    base = f"{urlsplit(url).scheme}://{urlsplit(url).netloc}"
    context = browser.new_context()
    ours = context.new_page()
    ours.goto(url)  # the session cookie is now in this browser
    assert ours.locator(f"#run-{run_id}").count() == 1
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "index.html").write_text(
        f'<form id="f" method="post" action="{base}/runs/{run_id}/cancel"><input name="csrf" value="x"></form>'
        '<script>document.getElementById("f").submit()</script>'
    )

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(evil)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        attacker = context.new_page()
        with attacker.expect_response(re.compile(r"/cancel$")) as got:
            attacker.goto(f"http://localhost:{server.server_address[1]}/index.html")
        # SameSite=Strict keeps the cookie off a cross-site post: 401 before
        # the CSRF check is even reached.
        assert got.value.status in (401, 403)
    finally:
        server.shutdown()
    assert js.show(run_id)["phase"] == "RUNNING"
    js.cli("cancel", run_id)
