"""The web page's HTTP application (starlette + Jinja2), served on TCP by
:class:`supervisord.daemon.ui.server.UiServer`.

Routes (every one needs the session cookie, see :mod:`supervisord.daemon.ui.auth`)::

    GET  /?token=T                  exchange a one-time token for the cookie
    GET  /                          runs, newest first, paged (?before=CURSOR),
                                    filters ?phase= &project= &backend= &name=GLOB
                                    &sweep=S &label=K=V (repeatable), as `jobsup runs`
    GET  /runs/{id}                 one run: facts, timeline, config, last lines
                                    (?before_line=N shows the lines before N)
    GET  /runs/{id}/lines           JSON {"lines": [[n, stream, text]...]}
                                    for ?after=A&limit=L (L <= 1000)
    GET  /runs/{id}/timeline        the timeline fragment (HTML)
    GET  /runs/{id}/stream          SSE: "run" (status) and "lines" events
    POST /runs/{id}/cancel          CSRF-checked; 303 to the run's page
    POST /runs/{id}/rerun           CSRF-checked; 303 to the new run's page
    GET  /sweeps/{ref}              a sweep's results table (?sort=[-]COLUMN),
                                    live from its stream until it ends
    GET  /sweeps/{ref}/stream       SSE: "rows" (the changed rows' HTML, counts)
    POST /runs/{id}/pause, /resume  CSRF-checked; 303 to the run's page (a running local run)
    POST /runs/{id}/priority        CSRF-checked, form ``priority``; 303 to the run's page (a queued run)
    GET  /events                    the audit trail, newest first: ?run= &type= &logs=1 (LogLines
                                    shown) &before=SEQ (paged backwards)
    GET  /stream                    SSE of run status changes (the runs page)
    GET  /queue                     waiting runs and GPUs, when the daemon
                                    has a scheduler
    GET  /static/{file}             our own CSS and JavaScript

Server-Sent Events carry ``id: <event seq>``: a browser that reconnects by
itself sends it back as ``Last-Event-ID`` and the stream resumes after it.
Log lines also carry their line number, and the page's script reconnects
with ``?line=N``, so a line is shown exactly once even across a daemon
restart. A comment line is sent every :data:`HEARTBEAT_S` seconds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

import anyio
import jinja2
import structlog
from markupsafe import escape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from store import (
    LOG_LINES,
    PHASE_CHANGED,
    PHASES,
    PROGRESS,
    SUBMITTED,
    TERMINAL_PHASES,
    EventStore,
    LogArchiveError,
    LogTextDeletedError,
    RunStatus,
    StoreClosedError,
)
from supervisord.daemon.api.query import int_param
from supervisord.daemon.api.streams import StreamCloser
from supervisord.daemon.readside import ReadSide
from supervisord.daemon.ui.auth import COOKIE_NAME, SESSION_TTL_S, UiAuth
from supervisord.shared.exceptions import JobsupError, UsageError
from supervisord.shared.progress import progress_text
from supervisord.shared.sweep import parse_labels
from supervisord.shared.sweeptable import flat_rows, sort_rows, table_columns

__all__ = ["HEARTBEAT_S", "PAGE_RUNS", "ROUTES", "TAIL_LINES", "UiActions", "create_ui_app"]

log = structlog.get_logger("jobsup.ui")

#: Seconds between SSE heartbeats (a comment line) on an idle stream.
HEARTBEAT_S = 15.0
#: Log lines a run's page shows (and "load earlier" adds) at once.
TAIL_LINES = 1000
#: Runs per page of the runs list.
PAGE_RUNS = 50
#: Events per page of the audit trail.
PAGE_EVENTS = 100
#: Seconds between two updates of a sweep's live table at most (each
#: reads the whole table: a sweep of 1,000 runs reporting progress must not
#: make an open page cost the daemon a core).
SWEEP_UPDATE_S = 1.0

_HERE = Path(__file__).parent


class UiActions(Protocol):
    """What the page may do besides reading the store (the daemon's
    supervisor and scheduler behind it)."""

    async def resolve(self, ref: str) -> str:
        """The run id for an id or unique prefix; raises RunNotFoundError."""

    async def cancel(self, run_id: str) -> RunStatus:
        """Cancel a run (idempotent); raises JobsupError."""

    async def rerun(self, run_id: str) -> RunStatus:
        """Submit the run's task again as a new run; raises JobsupError."""

    async def queue(self) -> Mapping[str, Any] | None:
        """``{"waiting": [...], "gpus": [...]}``, or None without a scheduler."""

    async def pause(self, run_id: str) -> RunStatus:
        """Pause a running local run; raises JobsupError (UsageError when it cannot be)."""

    async def resume(self, run_id: str) -> RunStatus:
        """Resume a paused run; raises JobsupError."""

    async def set_priority(self, run_id: str, priority: int) -> RunStatus:
        """``jobsup update RUN --priority P`` of a queued run; raises JobsupError."""


@dataclass(frozen=True)
class _Page:
    nonce: str
    csrf: str


def _sse(event: str | None, data: Any, id: int | None = None) -> bytes:
    out = []
    if id is not None:
        out.append(f"id: {id}")
    if event:
        out.append(f"event: {event}")
    out.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(out) + "\n\n").encode()


def _when(at: str | None) -> str:
    """``2026-11-29T15:27:52.123456Z`` -> ``2026-11-29 15:27:52``."""
    if not at:
        return ""
    return at.replace("T", " ")[:19]


def _seconds(start: str, end: str) -> float:
    def parse(s: str) -> datetime:
        return datetime.fromisoformat(s)  # 3.11 reads the Z suffix

    return max(0.0, (parse(end) - parse(start)).total_seconds())


def _duration(s: float) -> str:
    """``0.4s``, ``42s``, ``3m07s``, ``2h05m``."""
    if s < 10:
        return f"{s:.1f}s"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _size(n: float) -> str:
    """``1.5 GiB``, ``512 MiB``, ``900 B``."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _int_param(request: Request, name: str, default: int | None = None, lo: int = 0, hi: int = 2**62) -> int | None:
    """:func:`supervisord.daemon.api.query.int_param`, answered as the page's plain 400."""
    try:
        return int_param(request.query_params, name, default, minimum=lo, maximum=hi)
    except UsageError as err:
        raise _BadRequest(str(err)) from None


class _BadRequest(Exception):
    pass


@dataclass
class _UiState:
    """What the page's endpoints work with (``app.state.jobsup_ui``)."""

    reads: ReadSide
    actions: UiActions
    auth: UiAuth
    allowed_hosts: Callable[[], set[str]]
    secure_cookie: bool
    streams: StreamCloser | None
    templates: jinja2.Environment


def _state(request: Request) -> _UiState:
    state: _UiState = request.app.state.jobsup_ui
    return state


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_HERE / "templates")),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = _when
    env.filters["duration"] = _duration
    env.filters["size"] = _size
    env.filters["progress"] = progress_text
    env.globals["PHASES"] = PHASES
    env.globals["TERMINAL"] = TERMINAL_PHASES
    return env


def _render(request: Request, name: str, page: _Page, status: int = 200, **ctx: Any) -> HTMLResponse:
    html = _state(request).templates.get_template(name).render(csrf=page.csrf, **ctx)
    return HTMLResponse(html, status_code=status, headers=_SECURITY_HEADERS)


_PageHandler = Callable[[Request, _Page], Awaitable[Response]]


def _guard(fn: _PageHandler, *, post: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """``fn`` behind the page's checks: the ``Host`` header, the session
    cookie (or a one-time token to exchange for it), and for a ``post`` the
    same origin and the CSRF token; its errors answered as the page's 400
    or error page."""

    async def handler(request: Request) -> Response:
        st = _state(request)
        host = request.headers.get("host", "")
        if host not in st.allowed_hosts():
            return Response("unknown Host header\n", status_code=421, media_type="text/plain")
        token = request.query_params.get("token")
        if token is not None and request.method == "GET":
            return _redeem(request, st, token)
        nonce = st.auth.session(request.cookies.get(COOKIE_NAME))
        if nonce is None:
            return _unauthorized("open the address that `jobsup ui` prints")
        page = _Page(nonce, st.auth.csrf_token(nonce))
        if post:
            refused = await _refuse_cross_site(request, st, nonce, host)
            if refused is not None:
                return refused
        try:
            return await fn(request, page)
        except _BadRequest as err:
            return Response(f"{err}\n", status_code=400, media_type="text/plain")
        except JobsupError as err:
            return _render(request, "error.html", page, status=err.http_status, message=str(err))

    return handler


def _redeem(request: Request, st: _UiState, token: str) -> Response:
    """Exchange a one-time token for the session cookie and drop it from the address bar."""
    cookie = st.auth.redeem(token)
    if cookie is None:
        return _unauthorized("this link was already used or has expired: run `jobsup ui` for a new one")
    rest = {k: v for k, v in request.query_params.items() if k != "token"}
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(
        COOKIE_NAME, cookie, max_age=SESSION_TTL_S, httponly=True, samesite="strict",
        secure=st.secure_cookie, path="/",
    )  # fmt: skip
    return resp


async def _refuse_cross_site(request: Request, st: _UiState, nonce: str, host: str) -> Response | None:
    """The 403 for a post from another origin or without the right CSRF token, else None."""
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != host:
        return Response("cross-site request refused\n", status_code=403, media_type="text/plain")
    given = request.headers.get("x-csrf-token")
    if given is None:
        form = await request.form()
        value = form.get("csrf")
        given = value if isinstance(value, str) else None
    if not st.auth.csrf_ok(nonce, given):
        return Response("missing or wrong CSRF token\n", status_code=403, media_type="text/plain")
    return None


# -- runs ---------------------------------------------------------------


async def _run_filters(request: Request) -> tuple[dict[str, str], dict[str, str]]:
    """The runs list's filters (``jobsup runs``'s): ``phase``, ``project``,
    ``backend`` (exact), ``name`` (a glob), ``sweep`` (an id or prefix,
    resolved to the full id) and each ``label=K=V``. Returns ``(filters,
    labels)``; raises _BadRequest, JobsupError (a bad label, no such sweep)."""
    out = {}
    for key in ("phase", "project", "name", "backend", "sweep"):
        value = (request.query_params.get(key) or "").strip()
        if value:
            out[key] = value
    if "phase" in out:
        out["phase"] = out["phase"].upper()
        if out["phase"] not in PHASES:
            raise _BadRequest(f"query parameter phase={out['phase']!r}: use one of {', '.join(PHASES)}")
    if "sweep" in out:
        out["sweep"] = await _state(request).reads.resolve_sweep(out["sweep"])
    pairs = [v.strip() for v in request.query_params.getlist("label") if v.strip()]
    return out, parse_labels(pairs, what="query parameter label")


def _filter_query(filters: Mapping[str, str], labels: Mapping[str, str], **extra: Any) -> str:
    items = [*filters.items(), *(("label", f"{k}={v}") for k, v in labels.items()), *extra.items()]
    return urlencode(items)


async def runs_page(request: Request, page: _Page) -> Response:
    """``GET /``: runs, newest first, paged and filtered."""
    reads = _state(request).reads
    filters, labels = await _run_filters(request)
    before = _int_param(request, "before", None, lo=1)
    runs, cursor = await reads.page_runs(
        limit=PAGE_RUNS,
        before=before,
        project=filters.get("project"),
        name_glob=filters.get("name"),
        backend=filters.get("backend"),
        phases=[filters["phase"]] if "phase" in filters else None,
        labels=labels,
        sweep_id=filters.get("sweep"),
    )
    older = f"/?{_filter_query(filters, labels, before=cursor)}" if cursor is not None else None
    return _render(
        request, "runs.html", page, runs=runs, filters=filters, labels=labels, query=_filter_query(filters, labels),
        older=older, first_page=before is None, after_seq=await reads.last_seq(),
    )  # fmt: skip


async def runs_stream(request: Request, page: _Page) -> Response:
    """``GET /stream``: SSE of run status changes."""
    reads = _state(request).reads
    after = _resume_seq(request)

    async def stream() -> AsyncIterator[bytes]:
        cursor = after if after is not None else await reads.last_seq()
        yield f"retry: 2000\nid: {cursor}\n\n".encode()
        while True:
            got = await reads.wait_for_events(
                cursor, types=[SUBMITTED, PHASE_CHANGED], limit=200, timeout_s=HEARTBEAT_S
            )
            if not got:
                yield b": heartbeat\n\n"
                continue
            cursor = got[-1].seq
            for run in await reads.runs_by_id(list(dict.fromkeys(e.run_id for e in got))):
                yield _sse("run", _run_json(run), id=cursor)

    return _sse_response(stream(), _state(request).streams)


# -- one run ------------------------------------------------------------


async def _timeline(reads: ReadSide, run: RunStatus) -> list[dict[str, Any]]:
    changes = await reads.timeline(run.id)
    rows: list[dict[str, Any]] = []
    starts = [(run.created_at, "SUBMITTED", None)] + [
        (e.at, str(e.data.get("phase")), e.data.get("reason")) for e in changes
    ]
    end_of_all = run.updated_at if run.terminal else _now()
    total = max(_seconds(run.created_at, end_of_all), 0.001)
    for i, (at, phase, reason) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else end_of_all
        terminal = phase in TERMINAL_PHASES
        secs = 0.0 if terminal else _seconds(at, end)
        rows.append({
            "phase": phase, "reason": reason, "at": at, "seconds": secs, "terminal": terminal,
            "left": 100.0 * _seconds(run.created_at, at) / total, "width": 100.0 * secs / total,
        })  # fmt: skip
    return rows


async def run_page(request: Request, page: _Page) -> Response:
    """``GET /runs/{ref}``: facts, timeline, config, last lines."""
    st = _state(request)
    reads = st.reads
    run_id = await st.actions.resolve(request.path_params["ref"])
    run = await reads.get(run_id)
    submitted = await reads.submitted(run_id)
    total = run.log_lines
    before_line = _int_param(request, "before_line", None, lo=1)
    if before_line is None:
        after = await reads.tail_line_no(run_id, TAIL_LINES)
    else:
        after = max(0, before_line - 1 - TAIL_LINES)
    limit = TAIL_LINES if before_line is None else max(0, before_line - 1 - after)
    log_error = None
    try:
        lines = await reads.log_lines(run_id, after, limit) if limit else []
    except (LogArchiveError, LogTextDeletedError) as err:  # retention: shown, never silently empty
        lines, log_error = [], str(err)
    last_line = lines[-1].line_no if lines else after
    attempts = await reads.attempts(run)  # a retried run's (supervisord.shared.retry)
    return _render(
        request, "run.html", page, run=run, submitted=submitted, lines=lines, total_lines=total,
        first_line=after + 1, last_line=last_line, live=before_line is None, has_logs=await reads.has_logs(run_id),
        log_error=log_error,
        timeline=await _timeline(reads, run), after_seq=run.last_seq,
        config_yaml=_pretty(submitted.get("config")),
        handle_json=_pretty(run.handle), env_names=sorted(submitted.get("env") or {}),
        outputs=await reads.outputs(run_id), attempts=attempts,
        attempt_starts={a["first_line"]: a["attempt"] for a in attempts if a["attempt"] > 1},
    )  # fmt: skip


async def run_lines(request: Request, page: _Page) -> Response:
    """``GET /runs/{ref}/lines``: JSON log lines after ``after``."""
    st = _state(request)
    run_id = await st.actions.resolve(request.path_params["ref"])
    after = _int_param(request, "after", 0) or 0
    limit = _int_param(request, "limit", TAIL_LINES, lo=1, hi=TAIL_LINES) or TAIL_LINES
    lines = await st.reads.log_lines(run_id, after, limit)
    return JSONResponse({"lines": [[ln.line_no, ln.stream, ln.text] for ln in lines]})


async def run_timeline(request: Request, page: _Page) -> Response:
    """``GET /runs/{ref}/timeline``: the timeline fragment."""
    st = _state(request)
    run_id = await st.actions.resolve(request.path_params["ref"])
    run = await st.reads.get(run_id)
    return _render(request, "_timeline.html", page, timeline=await _timeline(st.reads, run), run=run)


async def run_stream(request: Request, page: _Page) -> Response:
    """``GET /runs/{ref}/stream``: SSE of the run's status and new lines."""
    st = _state(request)
    reads = st.reads
    run_id = await st.actions.resolve(request.path_params["ref"])
    after = _resume_seq(request)
    line = _int_param(request, "line", None)

    async def stream() -> AsyncIterator[bytes]:
        run = await reads.get(run_id)
        cursor = after if after is not None else run.last_seq
        sent = line if line is not None else await reads.tail_line_no(run_id, 0)
        yield f"retry: 2000\nid: {cursor}\n\n".encode()
        # Lines recorded before the cursor but after the page's last one.
        first = True
        while True:
            if not first:
                got = await reads.wait_for_events(cursor, run_ids=[run_id], limit=500, timeout_s=HEARTBEAT_S)
                if not got:
                    yield b": heartbeat\n\n"
                    continue
                cursor = got[-1].seq
                if any(e.type != LOG_LINES for e in got):
                    for status in await reads.runs_by_id([run_id]):
                        yield _sse("run", _run_json(status), id=cursor)
            first = False
            while True:
                lines = await reads.log_lines(run_id, sent, TAIL_LINES)
                if not lines:
                    break
                sent = lines[-1].line_no
                yield _sse("lines", [[ln.line_no, ln.stream, ln.text] for ln in lines], id=cursor)

    return _sse_response(stream(), st.streams)


async def _on_run(request: Request, act: Callable[[str], Awaitable[object]]) -> Response:
    """Resolve the path's run, ``act`` on it, and go back to its page."""
    run_id = await _state(request).actions.resolve(request.path_params["ref"])
    await act(run_id)
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


async def cancel(request: Request, page: _Page) -> Response:
    """``POST /runs/{ref}/cancel``."""
    return await _on_run(request, _state(request).actions.cancel)


async def rerun(request: Request, page: _Page) -> Response:
    """``POST /runs/{ref}/rerun``: to the new run's page."""
    actions = _state(request).actions
    run_id = await actions.resolve(request.path_params["ref"])
    new = await actions.rerun(run_id)
    return RedirectResponse(f"/runs/{new.id}", status_code=303)


async def pause(request: Request, page: _Page) -> Response:
    """``POST /runs/{ref}/pause``."""
    return await _on_run(request, _state(request).actions.pause)


async def resume(request: Request, page: _Page) -> Response:
    """``POST /runs/{ref}/resume``."""
    return await _on_run(request, _state(request).actions.resume)


async def priority(request: Request, page: _Page) -> Response:
    """``POST /runs/{ref}/priority``: form ``priority``."""
    actions = _state(request).actions
    run_id = await actions.resolve(request.path_params["ref"])
    raw = (await request.form()).get("priority")
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise _BadRequest(f"priority: {raw!r} is not a whole number -1000..1000") from None
    await actions.set_priority(run_id, value)
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


# -- events and queue ------------------------------------------------------


async def events_page(request: Request, page: _Page) -> Response:
    """``GET /events``: the audit trail, newest first, paged backwards
    (``?before=SEQ``); LogLines (one per block of output) hidden unless
    asked for (``?logs=1``) or filtered on."""
    st = _state(request)
    ref = (request.query_params.get("run") or "").strip()
    run_id = await st.actions.resolve(ref) if ref else None
    etype = (request.query_params.get("type") or "").strip() or None
    logs = request.query_params.get("logs") == "1"
    before = _int_param(request, "before", 0) or None
    got = await st.reads.recent_events(
        before=before,
        limit=PAGE_EVENTS + 1,
        run_id=run_id,
        types=[etype] if etype else None,
        exclude_types=None if logs or etype else [LOG_LINES],
    )
    more = len(got) > PAGE_EVENTS
    got = got[:PAGE_EVENTS]
    query = {k: v for k, v in (("run", run_id), ("type", etype), ("logs", "1" if logs else None)) if v}
    older = f"/events?{urlencode({**query, 'before': got[-1].seq})}" if more else None
    newest = f"/events?{urlencode(query)}"
    flipped = {k: v for k, v in query.items() if k != "logs"} | ({} if logs else {"logs": "1"})
    toggle = f"/events?{urlencode(flipped)}"
    rows = [{"event": e, "data": _excerpt(e.type, e.data)} for e in got]
    return _render(
        request, "events.html", page, rows=rows, run_id=run_id, etype=etype, older=older, newest=newest,
        before=before, logs=logs, toggle=toggle,
    )  # fmt: skip


async def queue_page(request: Request, page: _Page) -> Response:
    """``GET /queue``: waiting runs and GPUs."""
    return _render(request, "queue.html", page, queue=await _state(request).actions.queue())


def _sweep_table(doc: Mapping[str, Any], sort: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The results table of a sweep document: its columns and rows, sorted by ``sort``."""
    columns = table_columns(doc)
    rows = flat_rows(doc)
    if sort:
        try:
            rows = sort_rows(rows, sort, columns)
        except UsageError as err:
            raise _BadRequest(str(err)) from None
    return columns, rows


async def sweep_page(request: Request, page: _Page) -> Response:
    """``GET /sweeps/{ref}``: a sweep's results table, live (:func:`sweep_stream`)."""
    reads = _state(request).reads
    after_seq = await reads.last_seq()  # before the read: the stream misses nothing after it
    doc = await reads.sweep(request.path_params["ref"])
    sort = (request.query_params.get("sort") or "").strip()
    columns, rows = _sweep_table(doc, sort)
    by_id = {r["id"]: r for r in doc["rows"]}
    done = all(r["phase"] in TERMINAL_PHASES for r in doc["rows"])
    return _render(
        request, "sweep.html", page, doc=doc, sweep=doc["sweep"], columns=columns, rows=rows, by_id=by_id,
        sort=sort, done=done, params=doc["params"], after_seq=after_seq,
    )  # fmt: skip


async def sweep_stream(request: Request, page: _Page) -> Response:
    """``GET /sweeps/{ref}/stream``: SSE of a sweep's results table: a
    ``rows`` event (``{"columns", "rows": {run id: the row's HTML},
    "counts": HTML, "done"}``) each time runs of the sweep change phase or
    report progress, or one of it is submitted (a rerun), at most every
    :data:`SWEEP_UPDATE_S`. The page replaces those rows; when the columns
    changed (a first metric) it reloads."""
    st = _state(request)
    reads = st.reads
    sweep_id = await reads.resolve_sweep(request.path_params["ref"])
    after = _resume_seq(request)
    macros: Any = st.templates.get_template("_sweep_row.html").module

    async def stream() -> AsyncIterator[bytes]:
        cursor = after if after is not None else await reads.last_seq()
        members = {r["id"] for r in (await reads.sweep(sweep_id))["rows"]}
        yield f"retry: 2000\nid: {cursor}\n\n".encode()
        while True:
            got = await reads.wait_for_events(
                cursor, types=[SUBMITTED, PHASE_CHANGED, PROGRESS], limit=1000, timeout_s=HEARTBEAT_S
            )
            if not got:
                yield b": heartbeat\n\n"
                continue
            cursor = got[-1].seq
            changed = {
                e.run_id
                for e in got
                if e.run_id in members or (e.type == SUBMITTED and e.data.get("sweep_id") == sweep_id)
            }
            if not changed:
                continue
            doc = await reads.sweep(sweep_id)
            members = {r["id"] for r in doc["rows"]}
            columns, rows = _sweep_table(doc, "")
            by_id = {r["id"]: r for r in doc["rows"]}
            body = {
                "columns": columns,
                "rows": {
                    r["id"]: str(macros.sweep_row(r, by_id[r["id"]], columns)) for r in rows if r["id"] in changed
                },
                "counts": str(macros.sweep_counts(doc)),
                "done": all(r["phase"] in TERMINAL_PHASES for r in doc["rows"]),
            }
            yield _sse("rows", body, id=cursor)
            # What changes meanwhile waits in the log for the next read.
            await anyio.sleep(SWEEP_UPDATE_S)

    return _sse_response(stream(), st.streams)


def create_ui_app(
    *,
    store: EventStore,
    actions: UiActions,
    auth: UiAuth,
    allowed_hosts: Callable[[], set[str]],
    secure_cookie: bool = False,
    streams: StreamCloser | None = None,
) -> Starlette:
    """The page's application: the module's routes over ``store`` (read
    through :class:`~supervisord.daemon.readside.ReadSide`) and ``actions`` (the
    daemon's commands), kept on ``app.state.jobsup_ui``.

    ``allowed_hosts()`` gives the ``Host`` header values accepted (e.g.
    ``{"127.0.0.1:8123", "localhost:8123"}``): anything else is refused with
    421, which stops DNS-rebinding pages from reading ours. ``streams``
    ends the live-update streams cleanly when the daemon stops.
    """
    app = Starlette(routes=ROUTES)
    app.state.jobsup_ui = _UiState(
        reads=ReadSide(store),
        actions=actions,
        auth=auth,
        allowed_hosts=allowed_hosts,
        secure_cookie=secure_cookie,
        streams=streams,
        templates=_templates(),
    )
    return app


_SECURITY_HEADERS = {
    # Our own files only: no script, style or image from another host.
    "Content-Security-Policy": (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    # Not "no-referrer": with it browsers send "Origin: null" on our own form
    # posts, which the same-origin check must refuse.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _unauthorized(message: str) -> Response:
    body = (
        "<!doctype html><meta charset=utf-8><title>jobsup: sign in</title>"
        "<body style='font-family:sans-serif;margin:3em'><h1>jobsup</h1>"
        f"<p>{escape(message)}.</p></body>"
    )
    return HTMLResponse(body, status_code=401, headers=_SECURITY_HEADERS)


class _Guarded:
    """An ASGI wrapper that requires the session cookie (static files)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope)
        st = _state(request)
        if request.headers.get("host", "") not in st.allowed_hosts():
            await Response("unknown Host header\n", status_code=421)(scope, receive, send)
            return
        if st.auth.session(request.cookies.get(COOKIE_NAME)) is None:
            await _unauthorized("open the address that `jobsup ui` prints")(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _resume_seq(request: Request) -> int | None:
    raw = request.headers.get("last-event-id") or request.query_params.get("after")
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise _BadRequest(f"Last-Event-ID/after {raw!r} must be an event seq") from None
    if not 0 <= value < 2**62:
        raise _BadRequest(f"Last-Event-ID/after {value} is out of range")
    return value


async def _until_store_closes(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``body``, ended cleanly when the daemon closes its store (it is
    stopping): the browser reconnects to the next daemon."""
    try:
        async for chunk in body:
            yield chunk
    except StoreClosedError:
        return


def _sse_response(body: AsyncIterator[bytes], streams: StreamCloser | None) -> StreamingResponse:
    chunks = _until_store_closes(body)
    return StreamingResponse(
        streams.guard(chunks) if streams is not None else chunks,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no", **_SECURITY_HEADERS},
    )


def _run_json(run: RunStatus) -> dict[str, Any]:
    out = run.to_json()
    out.pop("handle", None)
    out["terminal"] = run.terminal
    return out


def _pretty(value: Any) -> str:
    if not value:
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _excerpt(etype: str, data: Mapping[str, Any]) -> str:
    """A one-line summary of an event's data for the audit page (log events
    show their range, not their text)."""
    if etype == LOG_LINES:
        keep = {k: v for k, v in data.items() if not isinstance(v, (list, str)) or len(str(v)) < 80}
        text = json.dumps(keep, ensure_ascii=False, sort_keys=True)
    else:
        text = json.dumps(dict(data), ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 400 else text[:399] + "…"


def _now() -> str:

    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


#: The page's routes (module docstring).
ROUTES = [
    Route("/", _guard(runs_page), methods=["GET"]),
    Route("/stream", _guard(runs_stream), methods=["GET"]),
    Route("/runs/{ref}", _guard(run_page), methods=["GET"]),
    Route("/runs/{ref}/lines", _guard(run_lines), methods=["GET"]),
    Route("/runs/{ref}/timeline", _guard(run_timeline), methods=["GET"]),
    Route("/runs/{ref}/stream", _guard(run_stream), methods=["GET"]),
    Route("/runs/{ref}/cancel", _guard(cancel, post=True), methods=["POST"]),
    Route("/runs/{ref}/rerun", _guard(rerun, post=True), methods=["POST"]),
    Route("/sweeps/{ref}", _guard(sweep_page), methods=["GET"]),
    Route("/sweeps/{ref}/stream", _guard(sweep_stream), methods=["GET"]),
    Route("/runs/{ref}/pause", _guard(pause, post=True), methods=["POST"]),
    Route("/runs/{ref}/resume", _guard(resume, post=True), methods=["POST"]),
    Route("/runs/{ref}/priority", _guard(priority, post=True), methods=["POST"]),
    Route("/events", _guard(events_page), methods=["GET"]),
    Route("/queue", _guard(queue_page), methods=["GET"]),
    Mount("/static", app=_Guarded(StaticFiles(directory=str(_HERE / "static")))),
]
