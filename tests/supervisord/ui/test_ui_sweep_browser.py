"""The runs list's filters (label, name glob, sweep: as ``jobsup runs``)
and the live sweep view, in a real browser (Debian's chromium driven by
Playwright, as test_ui_browser.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from tests.supervisord.jobsup_env import JobsupEnv
from tests.supervisord.ui.conftest import page_url
from tests.supervisord.ui.test_ui_browser import CHROMIUM, _shot, _wait_for, browser

__all__ = ["browser"]

pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium)")]


def _ids(page: Any) -> set[str]:
    return {str(x) for x in page.eval_on_selector_all("#runs tbody tr[data-run]", "els => els.map(e => e.dataset.run)")}


def _goto(page: Any, path: str, **query: Any) -> None:
    page.goto(urlsplit(page.url)._replace(path=path, query=urlencode(query, doseq=True)).geturl())


@pytest.mark.slow
def test_runs_list_filters_by_label_name_glob_and_sweep_and_stays_live(js: JobsupEnv, repo: Path, browser: Any) -> None:
    a = js.submit(repo, "--name", "train-a", "--label", "team=a", "--label", "kind=x", "--", "bash", "quick.sh")
    b = js.submit(repo, "--name", "eval-b", "--label", "team=b", "--", "bash", "quick.sh")
    sweep = js.cli("submit", "--label", "team=a", "--sweep", "n=1..2", "--", "echo {n}", cwd=repo).stdout.strip()
    js.cli("wait", a, b, sweep, "--timeout", "120s")
    members = {r["id"] for r in json.loads(js.cli("runs", "--sweep", sweep, "-o", "json").stdout)["rows"]}
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(page_url(js))
    everything = _ids(page)
    assert {a, b} <= everything and len(everything) == 4

    # label=K=V (repeatable): every label must match.
    _goto(page, "/", label="team=a")
    team_a = _ids(page)
    assert a in team_a and b not in team_a and len(team_a) == 3
    _goto(page, "/", label=["team=a", "kind=x"])
    assert _ids(page) == {a}
    # name: a glob, as `jobsup runs --name`.
    _goto(page, "/", name="train-*")
    assert _ids(page) == {a}
    _goto(page, "/", name="*-[!a]")
    assert _ids(page) == {b}
    # sweep: an id prefix; its runs only.
    _goto(page, "/", sweep=sweep[:6])
    in_sweep = _ids(page)
    assert len(in_sweep) == 2 and not {a, b} & in_sweep
    assert in_sweep == members
    assert page.input_value("input[name=sweep]") == sweep  # resolved to the full id
    _shot(page, "runs-filter-sweep")

    # A label cell links to its filter; a sweep cell to the sweep's runs.
    _goto(page, "/")
    page.click(f"#run-{b} td.labels a.label")
    _wait_for(lambda: "label=team%3Db" in page.url, "the label link")
    assert _ids(page) == {b}
    _goto(page, "/")
    page.click(f"#run-{next(iter(in_sweep))} td.sweep a >> nth=0")
    _wait_for(lambda: f"sweep={sweep}" in page.url, "the sweep link")
    assert _ids(page) == in_sweep

    # Live: with label=team=a open, a new team=a run appears and a team=b one does not.
    _goto(page, "/", label="team=a", name="live-*")
    assert _ids(page) == set()
    other = js.submit(repo, "--name", "live-b", "--label", "team=b", "--", "bash", "quick.sh")
    new = js.submit(repo, "--name", "live-a", "--label", "team=a", "--", "bash", "quick.sh")
    page.wait_for_selector(f"#run-{new}", timeout=60_000)
    page.wait_for_selector(f"#run-{new} td.labels a.label", timeout=10_000)
    js.cli("wait", other, new, "--timeout", "60s")
    time.sleep(0.5)
    assert page.locator(f"#run-{other}").count() == 0
    assert "team=a" in page.inner_text(f"#run-{new} td.labels")

    # A malformed label is a plain 400 naming it; an unknown sweep a 404.
    resp = page.goto(urlsplit(page.url)._replace(path="/", query="label=nolabel").geturl())
    assert resp is not None and resp.status >= 400 and "label" in page.inner_text("body")
    resp = page.goto(urlsplit(page.url)._replace(path="/", query="sweep=sffffffffff").geturl())
    assert resp is not None and resp.status == 404


@pytest.mark.slow
def test_the_sweep_view_updates_live_from_the_event_stream(
    js: JobsupEnv, repo: Path, browser: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    job = (
        'printf \'{"step": 1, "total": 2}\' > $JOBSUP_PROGRESS_FILE; '
        f"while [ ! -e {gate} ]; do sleep 0.05; done; echo {{n}}"
    )
    sweep = js.cli("submit", "--sweep", "n=1..3", "--max-parallel", "1", "--", job, cwd=repo).stdout.strip()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(page_url(js))
    navigations: list[str] = []
    _goto(page, f"/sweeps/{sweep}")
    page.wait_for_selector("#results .badge.RUNNING", timeout=60_000)
    assert page.locator("#results .badge.QUEUED").count() == 2
    assert page.locator("meta[http-equiv=refresh]").count() == 0  # no timed reload
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    _shot(page, "sweep-live-running")

    gate.touch()
    # Every row turns COMPLETED in place, from the stream: no reload.
    page.wait_for_selector("#results .badge.COMPLETED >> nth=2", timeout=90_000)
    _wait_for(lambda: "3 COMPLETED" in page.inner_text("#counts"), "the counts")
    _wait_for(lambda: "Every run has ended" in page.inner_text("#sweep-state"), "the end")
    assert page.locator("#results .badge.QUEUED, #results .badge.RUNNING").count() == 0
    assert navigations == [], f"the page reloaded: {navigations}"
    _shot(page, "sweep-live-done")
