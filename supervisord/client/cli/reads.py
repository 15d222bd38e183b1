"""The bodies of the read commands ``runs``, ``show``, ``wait`` and ``logs``,
and what every command that talks to the daemon shares, without click.

The click commands in :mod:`supervisord.client.cli.runs_cmd` parse their options
and call these; so does :mod:`supervisord.client.cli.fast`, which parses the
common forms of these four commands itself (click's import costs more
than a whole ``jobsup runs`` may take). One implementation, whichever
parser ran: the same output and exit codes.

Each ``*_command`` function writes the command's output (machine output
on stdout, human messages on stderr) and returns its exit code; it raises
JobsupError for the caller to report (one ``error:`` line, the error's ``exit_code``).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from supervisord.client.api import Client
from supervisord.client.cli.output import echo, emit, info, writing
from supervisord.shared.exceptions import AmbiguousRunError, DaemonUnreachableError, RunNotFoundError, UsageError
from supervisord.shared.wire import EXIT_UNREACHABLE, EXIT_WAIT_TIMEOUT, WAIT_EXIT_CODES, exit_code_for_phase

__all__ = [
    "EXIT_OTHER_PHASE",
    "EXIT_OUTPUT_CLOSED",
    "RUN_COLUMNS",
    "check_output_open",
    "connected_client",
    "elapsed_text",
    "emit_json_line",
    "follow_logs",
    "logs_command",
    "output_closed",
    "reconnecting",
    "resolve_runs",
    "runs_command",
    "show_command",
    "show_document",
    "tail_start",
    "wait_command",
    "wait_exit_code",
    "wait_timeout_s",
    "write_stdout_bytes",
]

RUN_COLUMNS = (
    "id",
    "project",
    "name",
    "backend",
    "phase",
    "reason",
    "exit_code",
    "created_at",
    "started",
    "elapsed",
    "gpus",
)


def elapsed_text(seconds: Any) -> str | None:
    """``42s``, ``12m05s``, ``3h07m``, ``2d04h`` (None: not started)."""
    if not isinstance(seconds, (int, float)):
        return None
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def run_row(run: dict[str, Any]) -> dict[str, Any]:
    """A run object with the table's derived cells: ``started`` (its
    started_at), ``elapsed`` (``12m05s``) and ``gpus`` (``0,1``)."""
    gpus = run.get("gpus") or []
    return {
        **run,
        "started": run.get("started_at"),
        "elapsed": elapsed_text(run.get("elapsed_s")),
        "gpus": ",".join(str(g) for g in gpus) if gpus else None,
    }


#: ``wait --for PHASE`` with a terminal PHASE: the run ended COMPLETED instead.
EXIT_OTHER_PHASE = 5

#: The exit status of a command whose stdout's reader went away before it
#: was done (``jobsup logs RUN | head -1``): not an error of jobsup, so the
#: status of a command that succeeded (README, "Commands"). Commands whose
#: status reports an outcome (``wait``, ``submit --follow``) keep it.
EXIT_OUTPUT_CLOSED = 0

_RECONNECT_WINDOW_S = 120.0


def _reader_gone(fd: int) -> bool:
    """True when ``fd`` is a pipe (or socket) whose reading end is closed:
    ``poll`` reports POLLERR (POLLHUP for a socket) for it. False for a
    terminal, a file, an open pipe or a closed ``fd``."""
    import select

    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def output_closed(err: BaseException) -> bool:
    """True when ``err`` is the EPIPE of writing to a stdout or stderr
    whose reader has gone (``jobsup logs RUN | head -1``); those file
    descriptors then point at ``/dev/null``, so nothing written later (nor
    Python's flush at exit of what its buffers still hold) fails or says
    anything. False for any other error (an EPIPE of the daemon's socket
    included), which the caller re-raises."""
    if not isinstance(err, OSError) or err.errno != errno.EPIPE:
        return False
    gone = [fd for fd in (1, 2) if _reader_gone(fd)]
    if not gone:
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in gone:
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    return True


def check_output_open() -> None:
    """Raise BrokenPipeError when stdout's reader has gone: a following
    command (``logs -f``, ``events -f``) calls it on each heartbeat, so
    ``jobsup events -f | head -1`` ends once ``head`` has, instead of
    waiting for something new to fail to write."""
    if _reader_gone(1):
        raise BrokenPipeError(errno.EPIPE, "stdout's reader has gone")


def connected_client() -> Client:
    """A client whose daemon answers (one is started when none does and
    autostart is allowed); else one ``error:`` line and exit 69."""
    client = Client()
    try:
        client.connect()
    except DaemonUnreachableError as err:
        echo(f"error: {err}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    return client


def read_command(command: Callable[[Client], int]) -> int:
    """Run a read-only ``command`` (its calls are GETs: running them again
    is harmless) with a client that has not asked the daemon's health
    first; when its first call finds no daemon, connect as
    :func:`connected_client` does (waiting for a starting or stopping
    daemon, autostart) and run it again. One round trip less than
    :func:`connected_client` for every ``runs`` and ``show``: on a loaded
    machine each round trip waits for the daemon to be scheduled
    (bench/sweep_submit.py)."""
    try:
        return command(Client())
    except DaemonUnreachableError:
        return command(connected_client())


def reconnecting(client: Client, open_stream: Callable[[], Iterator[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """Items of ``open_stream()``; when the daemon goes away mid-stream (a
    restart, ``kill -9``), reconnect — autostarting one when allowed — and
    call ``open_stream()`` again, which resumes from the caller's cursor.
    Gives up with DaemonUnreachableError after two minutes without a daemon."""
    while True:
        try:
            yield from open_stream()
            return
        except DaemonUnreachableError as err:
            info(f"lost the jobsup daemon ({err}); reconnecting")
            deadline = time.monotonic() + _RECONNECT_WINDOW_S
            while True:
                try:
                    client.connect()
                    break
                except DaemonUnreachableError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)


def resolve_runs(
    client: Client, refs: tuple[str, ...] | list[str], *, only_queued: str | None = None
) -> list[dict[str, Any]]:
    """The run object of each of ``refs`` (ids or unique prefixes), in
    order and without duplicates, so that a command on several runs does
    all or nothing (as kubectl does): raises one UsageError naming every
    ref that matches no run or several and, with ``only_queued`` (the
    action: ``held``, ``released``), every run that is not QUEUED, ending
    ``nothing was done`` when several refs were given. Call it before
    acting on any of them."""
    found: dict[str, dict[str, Any]] = {}
    bad: list[str] = []
    for ref in refs:
        try:
            run = dict(client.show(ref)["run"])
        except (RunNotFoundError, AmbiguousRunError, UsageError) as err:
            bad.append(str(err))
            continue
        if only_queued and run["phase"] != "QUEUED":
            bad.append(f"run {run['id']} is {run['phase']}: only a queued run can be {only_queued}")
        found.setdefault(str(run["id"]), run)
    if bad:
        raise UsageError("; ".join(dict.fromkeys(bad)) + ("" if len(refs) == 1 else "; nothing was done"))
    return list(found.values())


def runs_command(
    client: Client,
    *,
    all_: bool,
    project: str | None,
    phase: str | None,
    output: str,
    labels: dict[str, str] | None = None,
    name: str | None = None,
) -> int:
    """``jobsup runs``: the runs, newest first (``phase`` already checked;
    ``labels``, a ``name`` glob: filters). The table gets a PROGRESS column
    when a run has reported progress."""
    rows = client.runs(all=all_, project=project, phase=phase, labels=labels, name=name)
    if client.storage:
        echo(f"warning: {client.storage.get('summary') or client.storage}", err=True)
    if client.output:
        echo(f"warning: {client.output.get('summary') or client.output}", err=True)
    if output == "table":
        if not rows:
            info("no runs")
            return 0
        rows = [run_row(r) for r in rows]
        if any(r.get("progress") for r in rows):
            from supervisord.shared.progress import progress_text

            rows = [{**r, "progress": progress_text(r.get("progress"))} for r in rows]
            emit(rows, output, columns=(*RUN_COLUMNS, "progress"))
            return 0
        emit(rows, output, columns=RUN_COLUMNS)
    else:
        emit(rows, output)
    return 0


def show_document(doc: dict[str, Any]) -> dict[str, Any]:
    """What ``jobsup show -o json`` prints (and the MCP ``show`` tool
    returns) for the daemon's ``GET /runs/{ref}`` document: the run, what
    was submitted (command, timeout, source, env, config, on_done) and the
    attempts of hooks at it (HookDelivered / HookFailed data)."""
    sub = doc.get("submitted") or {}
    full = {
        **doc["run"],
        "command": sub.get("command"),
        "timeout_s": sub.get("timeout_s"),
        "source": sub.get("source"),
        "env": sub.get("env"),
        "config": sub.get("config"),
    }
    if sub.get("on_done"):
        full["on_done"] = sub["on_done"]
    updates = doc.get("updates") or []
    if updates:
        # `jobsup update` while queued: the values in force, and each change.
        for e in updates:
            if "timeout_s" in (e["data"].get("new") or {}):
                full["timeout_s"] = e["data"]["new"]["timeout_s"]
        full["updates"] = [{"seq": e["seq"], "at": e["at"], **e["data"]} for e in updates]
    # A local run's world (supervisord.daemon.world): names and digests, never values.
    full.update({k: sub[k] for k in ("env_from", "shell_env", "links") if sub.get(k)})
    if sub.get("outputs_root"):
        full["outputs_dir"] = f"{sub['outputs_root']}/{sub.get('project')}/{doc['run']['id']}"
    retry = (sub.get("scheduling") or {}).get("retry")
    if retry:
        full["retry"] = retry
    if doc.get("attempts"):
        full["attempts"] = doc["attempts"]
    if doc.get("hooks"):
        full["hooks"] = [{"type": e["type"], "seq": e["seq"], "at": e["at"], **e["data"]} for e in doc["hooks"]]
    return full


_SHOW_FIELDS = (
    "id",
    "project",
    "name",
    "backend",
    "phase",
    "reason",
    "message",
    "exit_code",
    "created_at",
    "updated_at",
    "last_seq",
    "log_lines",
    "log_ingest",
    "command",
    "timeout_s",
    "queue",
    "priority",
    "after",
    "started_at",
    "ended_at",
    "elapsed_s",
    "gpus",
    "attempt",
)


def _size(n: Any) -> str:
    """``1.5G (1610612736 bytes)``; ``-`` for None."""
    if not isinstance(n, (int, float)):
        return "-"
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}{unit} ({int(n)} bytes)"
    return f"{int(n)} bytes"


def show_command(client: Client, run: str, output: str) -> int:
    """``jobsup show RUN``: one run, its facts one a line, then its source,
    handle, env and config as indented YAML (``-o json|yaml``: the whole
    :func:`show_document`)."""
    full = show_document(client.show(run))
    if output != "table":
        emit(full, output)
        return 0
    from supervisord.client.cli.blockyaml import dump

    for key in _SHOW_FIELDS:
        value = full.get(key)
        if isinstance(value, list):
            value = ", ".join(str(v) for v in value) or None
        echo(f"{key + ':':<12} {'-' if value is None else value}")
    usage = full.get("usage") or {}
    if usage:
        gmem = usage.get("gpu_memory_max_bytes") or {}
        echo(f"{'cpu_s:':<12} {usage.get('cpu_s', '-')}")
        echo(f"{'max_rss:':<12} {_size(usage.get('max_rss_bytes'))}")
        if gmem:
            echo(f"{'gpu_memory:':<12} " + ", ".join(f"GPU {k} {_size(v)} max" for k, v in sorted(gmem.items())))
    retry = full.get("retry")
    if retry:
        on = ", ".join(retry.get("on") or [])
        echo(
            f"{'retry:':<12} up to {retry.get('attempts')} time(s) on {on}, backoff {retry.get('backoff_s')}s doubling"
        )
    for a in full.get("attempts") or []:
        outcome = a.get("reason") or ("running" if a.get("ended_at") is None else "completed")
        if a.get("exit_code") is not None:
            outcome += f" (exit code {a['exit_code']})"
        lines = f"lines {a.get('first_line')}-{a['last_line'] if a.get('last_line') is not None else ''}"
        echo(
            f"{'attempt:':<12} {a['attempt']} started {a.get('started_at') or '-'} ended {a.get('ended_at') or '-'}: {outcome}; {lines}"
        )
    for h in full.get("hooks") or []:
        result = (
            h.get("error")
            or f"{'exit code' if h.get('kind') == 'command' else 'HTTP'} {h.get('exit_code', h.get('status'))}"
        )
        echo(
            f"{'hook:':<12} {h.get('hook')} {h['type']} for seq {h.get('event_seq')} (attempt {h.get('attempt')}): {result}"
        )
    for key in ("source", "handle", "env", "config"):
        value = full.get(key)
        echo(f"{key}:" + (" -" if not value else ""))
        if value:
            echo("  " + dump(value).rstrip().replace("\n", "\n  "))
    return 0


def wait_exit_code(cond: str, runs: list[dict[str, Any]]) -> int:
    """The exit code of ``wait --for cond`` once the daemon says it is over:
    0 only when every run reached what was asked (for a terminal PHASE,
    exactly that phase); else the code of the first run, in argument order,
    that did not: its own phase's code (1 ERROR, 3 CANCELED, 4 DELETED), or
    :data:`EXIT_OTHER_PHASE` when it ended COMPLETED but another terminal
    phase was asked for."""
    if cond == "change":
        return 0
    target = cond.upper()
    for r in runs:
        if cond == "terminal" or r["phase"] != target:
            code = exit_code_for_phase(r["phase"])
            if code == 0 and cond != "terminal" and target in WAIT_EXIT_CODES and r["phase"] in WAIT_EXIT_CODES:
                code = EXIT_OTHER_PHASE
            if code != 0:
                return code
    return 0


def wait_timeout_s(timeout: str | None) -> int | None:
    """``wait --timeout`` in seconds (None: none given). Raises TaskError
    naming ``--timeout`` for a bad duration: check it before connecting."""
    if timeout is None:
        return None
    from supervisord.shared.task import parse_duration

    return parse_duration(timeout, what="--timeout")


def wait_command(
    client: Client, refs: list[str], *, for_: str, timeout_s: int | None, after: int | None, output: str
) -> int:
    """``jobsup wait RUN...``: block until the runs reach ``for_``; the exit
    code of :func:`wait_exit_code`, or 124 when ``timeout_s``
    (:func:`wait_timeout_s`) passed first."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    cursor: dict[str, Any] = {"after": after}

    def open_stream() -> Iterator[dict[str, Any]]:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        for obj in client.wait(refs, for_=for_, after=cursor["after"], timeout=remaining):
            yield obj
            if "result" in obj:
                return
        raise DaemonUnreachableError("the daemon closed the wait stream before answering")

    result: dict[str, Any] = {}
    for obj in reconnecting(client, open_stream):
        if "after" in obj and cursor["after"] is None:
            cursor["after"] = obj["after"]
        if "result" in obj:
            result = obj["result"]
    runs_out = result.get("runs") or []
    code = EXIT_WAIT_TIMEOUT if result.get("timed_out") else wait_exit_code(for_, runs_out)
    never = [r for r in runs_out if r["id"] in (result.get("never") or [])]
    if never:
        # A phase before the end, asked of a run that has ended: its own
        # phase's exit code (COMPLETED: EXIT_OTHER_PHASE, not a success).
        code = exit_code_for_phase(never[0]["phase"]) or EXIT_OTHER_PHASE
    try:
        if output != "table":
            emit(runs_out, output)
    except OSError as err:
        # Stdout's reader went away: the outcome is still the exit code,
        # and the human lines still go to stderr.
        if not output_closed(err):
            raise
    for r in runs_out:
        info(f"run {r['id']}: {r['phase']}" + (f" ({r['reason']})" if r.get("reason") else ""))
    if result.get("timed_out"):
        info("wait: timed out")
    for r in never:
        info(f"wait: run {r['id']} ended {r['phase']} without being {for_.upper()}: it never will be")
    return code


def emit_json_line(obj: dict[str, Any], *, flush: bool = True) -> None:
    """``obj`` as one JSON object on one stdout line (``json.dumps`` with
    ``ensure_ascii=False``); flushed unless ``flush`` is False."""
    with writing():
        sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
        if flush:
            sys.stdout.flush()


def tail_start(client: Client, ref: str, tail: int | None) -> int:
    """The line number after which the last ``tail`` lines of run ``ref``
    start (0: from the first line; ``tail`` None: every line)."""
    if tail is None:
        return 0
    recorded = int(client.show(ref)["run"].get("log_lines") or 0)
    return max(0, recorded - tail)


def follow_logs(
    client: Client, ref: str, *, tail: int | None = None, output: str = "text", attempt: int | None = None
) -> dict[str, Any]:
    """Print run ``ref``'s log lines (the last ``tail`` first, when given)
    and then its new ones as they are recorded, until the run has ended and
    its output is recorded; ``output`` ``text`` (the lines) or ``json`` (one
    object per line, as ``GET /runs/{ref}/logs?format=ndjson``). When the
    daemon goes away it reconnects and resumes after the last line printed
    (:func:`reconnecting`). Returns the ended run (``{}`` if the stream
    ended without one); says on stderr why a run still QUEUED waits
    (``waiting to start: Held``) and how it ended. Raises OSError
    (``EPIPE``: :func:`output_closed`) when stdout's reader has gone,
    also while no line comes (:func:`check_output_open`)."""
    end: dict[str, Any] = {}
    now = client.show(ref)["run"]
    if now.get("phase") == "QUEUED" and now.get("reason"):
        # Nothing to show yet: say why, then follow as it starts.
        info(f"waiting to start: {now['reason']}" + (f" ({now['message']})" if now.get("message") else ""))
    # The cursor is a line number from the start, also with --tail: the
    # tail's first line is found once (lines are numbered 1..log_lines), so
    # a reconnect resumes from the line reached, never re-applies the tail
    # (which would skip every line written while the daemon was away).
    cursor: dict[str, Any] = {"after": tail_start(client, ref, tail)}

    fmt = "ndjson" if output == "json" else "blocks"

    def open_stream() -> Iterator[dict[str, Any]]:
        stream = client.logs(ref, follow=True, after_line=cursor["after"], format=fmt, attempt=attempt)
        for obj in stream:
            yield obj
            if "end" in obj:
                return
        raise DaemonUnreachableError("the daemon closed the log stream before the run ended")

    for obj in reconnecting(client, open_stream):
        if "last_line" in obj:
            cursor["after"] = obj["last_line"]
            write_stdout_bytes(obj["text"].encode())
        elif "line_no" in obj:  # -o json; or a daemon older than format=blocks
            cursor["after"] = obj["line_no"]
            if output == "json":
                emit_json_line(obj)
            else:
                write_stdout_bytes(obj["text"].encode() + b"\n")
        elif "end" in obj:
            end = obj["end"]
        elif "heartbeat" in obj:
            check_output_open()
    if end:
        info(
            f"run {end['id']}: {end['phase']}" + (f" ({end['reason']}: {end['message']})" if end.get("reason") else "")
        )
    return end


def logs_command(
    client: Client, run: str, *, follow: bool, tail: int | None, output: str, attempt: int | None = None
) -> int:
    """``jobsup logs RUN``: the run's stored lines (the last ``tail`` when
    given; ``output`` ``text``: the daemon's plain-text bytes copied to
    stdout as they arrive, ``json``: one object per line), then with
    ``follow`` the new ones until the run ends (:func:`follow_logs`).
    Raises JobsupError: RunNotFoundError, AmbiguousRunError, a StorageError
    when the run's archived text is missing, altered or deleted.
    ``attempt``: only the lines of that attempt of a retried run."""
    if follow:
        follow_logs(client, run, tail=tail, output=output, attempt=attempt)
        return 0
    if output == "json":
        for obj in client.logs(run, follow=False, tail=tail, attempt=attempt):
            if "line_no" in obj:
                emit_json_line(obj, flush=False)
        with writing():
            sys.stdout.flush()
        return 0
    # Plain text: the daemon's bytes go to stdout as they come, in the
    # large pieces the socket gives (no per-line work).
    for chunk in client.logs_text(run, tail=tail, attempt=attempt):
        write_stdout_bytes(chunk)
    return 0


def write_stdout_bytes(data: bytes) -> None:
    """Write all of ``data`` to stdout's binary layer now (after what the
    text layer holds). Also when that layer is unbuffered
    (``PYTHONUNBUFFERED``: a raw file, whose ``write`` may take only part
    of the bytes, e.g. when a signal interrupts a write to a full pipe).
    Raises BrokenPipeError when the reader has gone, OutputError when
    stdout cannot be written otherwise."""
    with writing():
        sys.stdout.flush()
        out = sys.stdout.buffer
        view = memoryview(data)
        while view:
            n = out.write(view)
            if n is None:  # a non-blocking stdout that is full
                import select

                select.select([], [out], [])
                continue
            view = view[n:]
        out.flush()
