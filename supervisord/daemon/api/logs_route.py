"""``GET /v1/runs/{ref}/logs``: a run's log lines, as plain text by default.

Query parameters:

* ``after_line=N`` (default 0): start after line N (lines are numbered 1,
  2, 3... per run and never renumbered, so ``after_line=999&limit=1001``
  is "lines 1000-2000");
* ``tail=N``: start with the last N lines (after ``after_line``);
* ``limit=N``: at most N lines (not with ``follow``);
* ``follow=1``: go on with new lines until the run is terminal and its
  output backlog recorded (``log_ingest`` not ``"pending"``);
* ``format``: ``text`` (default), ``ndjson`` or ``blocks``;
* ``attempt=N``: only the lines attempt N of a retried run wrote
  (supervisord.shared.retry; ``tail`` then counts from that attempt's end, and
  ``follow`` ends with it).

``text`` (``text/plain; charset=utf-8``): the lines, each ending with
``\\n``, copied from the stored blocks (no per-line work; replay runs at
the speed of reading the database). Header ``X-Jobsup-First-Line`` is the
number the first line sent will have, so a client that counts newlines
knows its cursor. With ``follow`` the body ends when the run is terminal
(no heartbeats: a client wanting them uses ``blocks``).

``ndjson`` (``application/x-ndjson``): one object per line,
``{"line_no": N, "stream": "stdout"|"stderr", "at": RFC 3339, "attempt": N, "text": T}``
(``at``: when the line was recorded); when following, ``{"heartbeat": seq}``
while nothing comes and ``{"end": Run}`` last.

``blocks`` (``application/x-ndjson``): one object per stored block part,
``{"first_line": N, "last_line": M, "text": T}`` (``T``: the lines, each
ending with ``\\n``), with the same heartbeats and ``{"end": Run}`` as
``ndjson``: how ``jobsup logs -f`` follows at replay speed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from json.encoder import encode_basestring as _json_str
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from store import LogLine, skip_offset
from supervisord.daemon.api.query import INT_MAX, flag_param, int_param
from supervisord.daemon.readside import LogReplay, ReadSide
from supervisord.shared.exceptions import UsageError
from supervisord.shared.retry import attempt_of_line

__all__ = ["FORMATS", "logs_response"]

FORMATS = ("text", "ndjson", "blocks")
_HEARTBEAT_S = 5.0
_NDJSON = "application/x-ndjson"
#: Blocks read per database query in a replay (each up to 8 MiB from the
#: local tailer: up to 16 MiB per query) ...
_BLOCKS_PER_READ = 2
#: ... except the first read of a response: one block, so the first line
#: leaves after one block is read, not two.
_FIRST_READ_BLOCKS = 1


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _line_json(line: LogLine, at: str, attempt: int = 1) -> str:
    """One ``ndjson`` object and its newline, without a JSON encoder per line."""
    return (
        f'{{"line_no":{line.line_no:d},"stream":{_json_str(line.stream)},"at":{_json_str(at)},'
        f'"attempt":{attempt:d},"text":{_json_str(line.text)}}}\n'
    )


async def logs_response(request: Request, reads: ReadSide) -> Response:
    """The response of ``GET /v1/runs/{ref}/logs`` (module docstring).
    Raises UsageError (400) for a bad parameter, RunNotFoundError."""
    run_id = await reads.resolve(request.path_params["ref"])
    await reads.get(run_id)
    follow = flag_param(request.query_params, "follow")
    fmt = request.query_params.get("format") or "text"
    if fmt not in FORMATS:
        raise UsageError(f"query parameter format={fmt!r}: use one of {', '.join(FORMATS)}")
    after = int_param(request.query_params, "after_line", 0) or 0
    tail = int_param(request.query_params, "tail")
    limit = int_param(request.query_params, "limit")
    if limit is not None and follow:
        raise UsageError("query parameter limit cannot be combined with follow")
    attempt = int_param(request.query_params, "attempt")
    first_run = await reads.get(run_id)
    tried = await reads.attempts(first_run) if attempt is not None or first_run.attempt > 1 else []
    end_line: int | None = None  # the asked-for attempt's last line, once it ended
    if attempt is not None:
        if not 1 <= attempt <= max(1, len(tried)):
            raise UsageError(f"--attempt {attempt}: run {run_id} has {max(1, len(tried))} attempt(s) so far")
        if tried:
            chosen = tried[attempt - 1]
            after = max(after, int(chosen["first_line"]) - 1)
            end_line = chosen["last_line"]
    if tail is not None:
        if end_line is not None:
            after = max(after, end_line - tail)
        else:
            after = max(after, await reads.tail_line_no(run_id, tail))
    # Archived text is checked against its recorded digest before the reply
    # starts: a changed or deleted archive is an error, never partial text.
    # The whole reply then reads it through the descriptor checked here: an
    # archive swapped or deleted meanwhile cannot cut the stream short.
    replay: LogReplay = {}
    await reads.check_log_text(run_id, after, replay=replay)
    stop = INT_MAX if limit is None else after + limit
    if end_line is not None:
        stop, follow = min(stop, end_line), False

    async def text_pages(cursor: int) -> AsyncIterator[tuple[int, int, bytes]]:
        """``(first_line, last_line, text)`` of what is stored after ``cursor``, up to ``stop``."""
        blocks = _FIRST_READ_BLOCKS
        while cursor < stop:
            last, text = await reads.log_text(run_id, cursor, blocks, replay=replay)
            blocks = _BLOCKS_PER_READ
            if last == cursor:
                return
            if last > stop:
                text, last = text[: skip_offset(text, stop - cursor)[0]], stop
            yield cursor + 1, last, text
            cursor = last

    async def line_pages(cursor: int) -> AsyncIterator[tuple[int, int, bytes]]:
        while cursor < stop:
            lines = await reads.log_lines(run_id, cursor, min(5000, stop - cursor), replay=replay)
            if not lines:
                return
            ats = await reads.event_times({ln.seq for ln in lines})
            yield (
                cursor + 1,
                lines[-1].line_no,
                "".join(
                    _line_json(ln, ats.get(ln.seq, ""), attempt_of_line(tried, ln.line_no) if tried else 1)
                    for ln in lines
                ).encode(),
            )
            cursor = lines[-1].line_no

    pages = line_pages if fmt == "ndjson" else text_pages

    async def stream() -> AsyncIterator[bytes]:
        cursor = after
        sent_at = anyio.current_time()
        while True:
            run = await reads.get(run_id)
            seq = run.last_seq
            if fmt == "ndjson" and run.attempt > 1 and len(tried) < run.attempt:
                tried[:] = await reads.attempts(run)  # a new attempt: its lines say so
            async for _first, last, text in pages(cursor):
                cursor = last
                if fmt == "blocks":
                    yield _dumps({"first_line": _first, "last_line": last, "text": text.decode("utf-8", "replace")})
                else:
                    yield text
                sent_at = anyio.current_time()
            if not follow:
                return
            if run.terminal and run.log_ingest != "pending":
                if fmt != "text":
                    yield _dumps({"end": run.to_json()})
                return
            got = await reads.wait_for_events(seq, run_ids=[run_id], limit=1, timeout_s=_HEARTBEAT_S)
            # A heartbeat also when the run's events bring no line past the
            # cursor for a while (following from a line still to come): the
            # client takes a silent stream for a dead daemon.
            if fmt != "text" and (not got or anyio.current_time() - sent_at >= _HEARTBEAT_S):
                yield _dumps({"heartbeat": seq})
                sent_at = anyio.current_time()

    media = "text/plain; charset=utf-8" if fmt == "text" else _NDJSON
    return StreamingResponse(stream(), media_type=media, headers={"X-Jobsup-First-Line": str(after + 1)})
