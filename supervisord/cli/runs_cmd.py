"""Run commands: submit, runs, show, logs, wait, cancel, events, doctor.

They talk to the daemon only through :class:`supervisord.api.client.Client`.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from supervisord.api.client import Client
from supervisord.api.wire import EXIT_UNREACHABLE, EXIT_WAIT_TIMEOUT, PHASES, WAIT_EXIT_CODES, exit_code_for_phase
from supervisord.cli.output import emit, info, output_option, warn
from supervisord.cli.queue_cmd import scheduling_options, take_scheduling
from supervisord.cli.shape import reject_shape_flags, shape_flag_options_without
from supervisord.exceptions import AmbiguousRunError, DaemonUnreachableError, RunNotFoundError, TaskError, UsageError
from supervisord.hooks.config import parse_on_done
from supervisord.task import BACKENDS, Task, check_name, load_task, parse_duration, parse_env_pairs

__all__ = ["submit", "runs", "show", "logs", "wait", "cancel", "events", "doctor"]

RUN_COLUMNS = ("id", "project", "name", "backend", "phase", "reason", "exit_code", "created_at")


class _DashDashCommand(click.Command):
    """A command whose arguments after ``--`` are kept verbatim in
    ``ctx.meta["jobsup.command"]`` (the inline task command)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            i = args.index("--")
            ctx.meta["jobsup.command"] = args[i + 1 :]
            args = args[:i]
        return super().parse_args(ctx, args)


_RECONNECT_WINDOW_S = 120.0


def _reconnecting(client: Client, open_stream: Callable[[], Iterator[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
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


def _client() -> Client:
    client = Client()
    try:
        client.connect()
    except DaemonUnreachableError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    return client


def build_task(
    task_file: str | None,
    command: list[str] | None,
    *,
    name: str | None,
    backend: str | None,
    timeout: str | None,
    manifest: str | None,
    env_pairs: tuple[str, ...],
    scheduling: dict[str, Any] | None = None,
) -> Task:
    """The task from an optional task file and the flags (flags win).

    Raises TaskError naming the file or flag at fault.
    """
    task = load_task(task_file) if task_file else Task()
    run = None
    if command:
        import shlex

        run = command[0] if len(command) == 1 else shlex.join(command)
    return task.with_overrides(
        name=check_name(name) if name is not None else None,
        run=run,
        backend=backend,
        timeout_s=parse_duration(timeout, what="--timeout") if timeout is not None else None,
        env=parse_env_pairs(env_pairs),
        manifest=manifest,
        scheduling=scheduling,
    )


def task_wire(task: Task) -> dict[str, Any]:
    """The ``task`` object of a submit request."""
    return {
        "name": task.name,
        "run": task.run,
        "backend": task.backend,
        "timeout_s": task.timeout_s,
        "env": task.env,
        "manifest": task.manifest,
        "path": str(task.path) if task.path else None,
        **task.scheduling,
    }


@click.command("submit", cls=_DashDashCommand)
@click.argument("task_file", required=False, type=click.Path(dir_okay=False))
@click.option("--backend", type=click.Choice(list(BACKENDS)), help="Where to run (default: config, else local).")
@click.option("--name", help="The run's name (default: first word of the command).")
@click.option("--timeout", help="Wall-clock limit: 90s, 30m, 4h or 1d (default 4h).")
@click.option("--manifest", help="Kubernetes manifest path in the repository (default .jobsup/k8s.yaml).")
@click.option("--rev", default="HEAD", show_default=True, help="The commit to snapshot and run.")
@click.option("--env", "env_pairs", multiple=True, metavar="K=V", help="Environment for the run (repeatable).")
@click.option(
    "--config",
    "config_args",
    multiple=True,
    metavar="KEY.PATH=VALUE|FILE",
    help="Config override (repeatable) or one config file.",
)
@click.option("--force", is_flag=True, help="Submit even if the same project+name has a run in flight.")
@click.option("--follow", "-f", is_flag=True, help="Stream the logs, then exit like `jobsup wait`.")
@click.option(
    "--on-done",
    "on_done",
    metavar="CMD",
    help="Run CMD (split into words, no shell) when this run ends, like a command hook "
    "(JOBSUP_* variables, last log lines on stdin), from this folder.",
)
@scheduling_options
@shape_flag_options_without("gpus")
@click.pass_context
def submit(
    ctx: click.Context,
    /,
    task_file: str | None,
    backend: str | None,
    name: str | None,
    timeout: str | None,
    manifest: str | None,
    rev: str,
    env_pairs: tuple[str, ...],
    config_args: tuple[str, ...],
    force: bool,
    follow: bool,
    on_done: str | None,
    **shape: Any,
) -> None:
    """Queue a run of TASK.yaml and/or `-- CMD...`; print its id on stdout."""
    sched, hold = take_scheduling(shape)
    reject_shape_flags(shape)
    on_done_argv = parse_on_done(on_done) if on_done is not None else None
    command = ctx.meta.get("jobsup.command")
    task = build_task(
        task_file,
        command,
        name=name,
        backend=backend,
        timeout=timeout,
        manifest=manifest,
        env_pairs=env_pairs,
        scheduling=sched,
    )
    if not task.run:
        raise TaskError("no command: give `run:` in the task file or `-- CMD...` after the options")
    from supervisord import config as cfg

    layers = cfg.load_client_layers(task=task, cli_config=list(config_args), cwd=Path.cwd())
    client = _client()
    wire = task_wire(task)
    if on_done_argv is not None:
        wire["on_done"] = on_done_argv
    body = {
        "task": wire,
        "layers": cfg.layers_to_wire(layers),
        "cwd": os.getcwd(),
        "rev": rev,
        "force": force,
        "hold": hold,
        "request_id": secrets.token_hex(8),
        "umask": f"{_current_umask():04o}",
    }
    try:
        result = client.submit(body)
    except DaemonUnreachableError as err:
        result = {"run": _find_submitted(client, str(body["request_id"]), err), "warnings": []}
    for line in result.get("warnings") or []:
        warn(line)
    run_id = result["run"]["id"]
    if not follow:
        click.echo(run_id)
        return
    info(f"submitted run {run_id}")
    run = _follow_logs(client, run_id)
    ctx.exit(exit_code_for_phase(run["phase"]))


_LOST_SUBMIT_WAIT_S = 30.0


def _current_umask() -> int:
    """This process's umask (that of the shell that ran jobsup): a local run
    creates its files with it, not with the daemon's private 077."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _find_submitted(client: Client, request_id: str, err: DaemonUnreachableError) -> dict[str, Any]:
    """The daemon went away while a submit was in flight: reconnect (for up
    to :data:`_LOST_SUBMIT_WAIT_S`) and look for the run recorded with this
    submit's ``request_id``. Returns it (the run was recorded and will be
    supervised), or raises DaemonUnreachableError saying it was not
    recorded, or that this cannot be known without a daemon."""
    info(f"the daemon went away during the submit ({err}); checking whether the run was recorded")
    deadline = time.monotonic() + _LOST_SUBMIT_WAIT_S
    while True:
        try:
            client.connect()
            recent = client.runs(all=False)
            break
        except DaemonUnreachableError:
            if time.monotonic() > deadline:
                raise DaemonUnreachableError(
                    f"{err}; no daemon answers since, so whether the run was recorded is unknown: "
                    "see `jobsup runs` once a daemon is back"
                ) from None
            time.sleep(0.5)
    for run in recent:
        doc = client.show(run["id"])
        if (doc.get("submitted") or {}).get("request_id") == request_id:
            warn(f"the run was recorded (as {run['id']}) before the daemon went away; it will run")
            return dict(doc["run"])
    raise DaemonUnreachableError(f"{err}; the run was NOT recorded (nothing will run): submit it again")


def _print_line(obj: dict[str, Any], *, flush: bool = False) -> None:
    # sys.stdout directly: click.echo re-checks the stream on every call,
    # which dominated the CPU of a million-line replay.
    sys.stdout.write(obj["text"] + "\n")
    if flush:
        sys.stdout.flush()


def _follow_logs(client: Client, ref: str, *, tail: int | None = None, output: str = "text") -> dict[str, Any]:
    end: dict[str, Any] = {}
    # The cursor is a line number from the start, also with --tail: the
    # tail's first line is found once (lines are numbered 1..log_lines), so
    # a reconnect resumes from the line reached, never re-applies the tail
    # (which would skip every line written while the daemon was away).
    cursor: dict[str, Any] = {"after": _tail_start(client, ref, tail)}

    fmt = "ndjson" if output == "json" else "blocks"

    def open_stream() -> Iterator[dict[str, Any]]:
        stream = client.logs(ref, follow=True, after_line=cursor["after"], format=fmt)
        for obj in stream:
            yield obj
            if "end" in obj:
                return
        raise DaemonUnreachableError("the daemon closed the log stream before the run ended")

    for obj in _reconnecting(client, open_stream):
        if "last_line" in obj:
            cursor["after"] = obj["last_line"]
            sys.stdout.write(obj["text"])
            sys.stdout.flush()
        elif "line_no" in obj:
            cursor["after"] = obj["line_no"]
            if output == "json":
                emit_json_line(obj)
            else:
                _print_line(obj, flush=True)
        elif "end" in obj:
            end = obj["end"]
    if end:
        info(
            f"run {end['id']}: {end['phase']}" + (f" ({end['reason']}: {end['message']})" if end.get("reason") else "")
        )
    return end


def _tail_start(client: Client, ref: str, tail: int | None) -> int:
    """The line number after which the last ``tail`` lines of run ``ref``
    start (0: from the first line)."""
    if tail is None:
        return 0
    recorded = int(client.show(ref)["run"].get("log_lines") or 0)
    return max(0, recorded - tail)


def emit_json_line(obj: dict[str, Any]) -> None:
    """One JSON object on one stdout line."""
    import json

    click.echo(json.dumps(obj, ensure_ascii=False))


@click.command("runs")
@click.option("--all", "all_", is_flag=True, help="Include every finished run (default: in flight and the 20 newest).")
@click.option("--project", help="Only runs of this project.")
@click.option("--phase", type=click.Choice(list(PHASES), case_sensitive=False), help="Only runs in this phase.")
@output_option()
def runs(all_: bool, project: str | None, phase: str | None, output: str) -> None:
    """List runs, newest first."""
    client = _client()
    rows = client.runs(all=all_, project=project, phase=phase)
    if client.storage:
        click.echo(f"warning: {client.storage.get('summary') or client.storage}", err=True)
    if output == "table":
        if not rows:
            info("no runs")
            return
        emit(rows, output, columns=RUN_COLUMNS)
    else:
        emit(rows, output)


@click.command("show")
@click.argument("run")
@output_option()
def show(run: str, output: str) -> None:
    """One run: phase, reason, times, handle, effective config."""
    doc = _client().show(run)
    r = doc["run"]
    sub = doc.get("submitted") or {}
    full = {
        **r,
        "command": sub.get("command"),
        "timeout_s": sub.get("timeout_s"),
        "source": sub.get("source"),
        "env": sub.get("env"),
        "config": sub.get("config"),
    }
    if sub.get("on_done"):
        full["on_done"] = sub["on_done"]
    if doc.get("hooks"):
        # Each attempt of a hook at this run: HookDelivered / HookFailed data.
        full["hooks"] = [{"type": e["type"], "seq": e["seq"], "at": e["at"], **e["data"]} for e in doc["hooks"]]
    if output != "table":
        emit(full, output)
        return
    import yaml

    for key in (
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
    ):
        click.echo(f"{key + ':':<12} {'-' if full.get(key) is None else full.get(key)}")
    for h in full.get("hooks") or []:
        result = (
            h.get("error")
            or f"{'exit code' if h.get('kind') == 'command' else 'HTTP'} {h.get('exit_code', h.get('status'))}"
        )
        click.echo(
            f"{'hook:':<12} {h.get('hook')} {h['type']} for seq {h.get('event_seq')} (attempt {h.get('attempt')}): {result}"
        )
    for key in ("source", "handle", "env", "config"):
        value = full.get(key)
        click.echo(f"{key}:" + (" -" if not value else ""))
        if value:
            click.echo("  " + yaml.safe_dump(value, sort_keys=False).rstrip().replace("\n", "\n  "))


@click.command("logs")
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep following new lines until the run ends.")
@click.option("--tail", type=click.IntRange(min=0), help="Start with the last N lines.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def logs(run: str, follow: bool, tail: int | None, output: str) -> None:
    """Replay the run's stored log lines, then follow live ones with -f."""
    client = _client()
    if follow:
        _follow_logs(client, run, tail=tail, output=output)
        return
    if output == "json":
        for obj in client.logs(run, follow=False, tail=tail):
            if "line_no" in obj:
                emit_json_line(obj)
        return
    # Plain text: the daemon's bytes go to stdout as they come.
    out = sys.stdout.buffer
    for chunk in client.logs_text(run, tail=tail):
        out.write(chunk)
    out.flush()


#: ``wait --for PHASE`` with a terminal PHASE: the run ended COMPLETED instead.
EXIT_OTHER_PHASE = 5


def _wait_exit_code(cond: str, runs: list[dict[str, Any]]) -> int:
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


@click.command("wait")
@click.argument("runs_", metavar="RUN...", nargs=-1, required=True)
@click.option("--for", "for_", default="terminal", show_default=True, help="terminal, change, or a phase name.")
@click.option("--timeout", help="Give up after 90s, 30m, 4h or 1d (exit 124).")
@click.option("--after", type=click.IntRange(min=0), help="Event seq already seen: a change after it returns at once.")
@output_option()
@click.pass_context
def wait(
    ctx: click.Context, runs_: tuple[str, ...], for_: str, timeout: str | None, after: int | None, output: str
) -> None:
    """Block until the runs reach the condition.

    Exit codes: 0 COMPLETED (or the condition met), 1 ERROR, 3 CANCELED,
    4 DELETED, 124 timeout, 69 daemon unreachable.
    """
    timeout_s = parse_duration(timeout, what="--timeout") if timeout is not None else None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    client = _client()
    cursor: dict[str, Any] = {"after": after}

    def open_stream() -> Iterator[dict[str, Any]]:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        for obj in client.wait(list(runs_), for_=for_, after=cursor["after"], timeout=remaining):
            yield obj
            if "result" in obj:
                return
        raise DaemonUnreachableError("the daemon closed the wait stream before answering")

    result: dict[str, Any] = {}
    for obj in _reconnecting(client, open_stream):
        if "after" in obj and cursor["after"] is None:
            cursor["after"] = obj["after"]
        if "result" in obj:
            result = obj["result"]
    runs_out = result.get("runs") or []
    if output != "table":
        emit(runs_out, output)
    for r in runs_out:
        info(f"run {r['id']}: {r['phase']}" + (f" ({r['reason']})" if r.get("reason") else ""))
    if result.get("timed_out"):
        info("wait: timed out")
        ctx.exit(EXIT_WAIT_TIMEOUT)
    ctx.exit(_wait_exit_code(for_, runs_out))


@click.command("cancel")
@click.argument("runs_", metavar="RUN...", nargs=-1, required=True)
@output_option()
def cancel(runs_: tuple[str, ...], output: str) -> None:
    """Cancel runs; returns once each is stopped.

    Every id is resolved first: one that names no run (or several) exits 2
    naming it, and nothing is cancelled."""
    client = _client()
    run_ids = resolve_run_ids(client, runs_)
    done = [client.cancel(run_id) for run_id in run_ids]
    if output != "table":
        emit(done, output)
        return
    for r in done:
        info(f"run {r['id']}: {r['phase']}")


def resolve_run_ids(client: Client, refs: tuple[str, ...] | list[str]) -> list[str]:
    """The full run id of each of ``refs`` (ids or unique prefixes), in
    order and without duplicates, or UsageError naming every ref that
    matches no run or several (so a command on several runs does all or
    nothing, as kubectl does)."""
    ids: list[str] = []
    bad: list[str] = []
    for ref in refs:
        try:
            run_id = str(client.show(ref)["run"]["id"])
        except (RunNotFoundError, AmbiguousRunError, UsageError) as err:
            bad.append(str(err))
            continue
        if run_id not in ids:
            ids.append(run_id)
    if bad:
        raise UsageError("; ".join(bad) + ("" if len(refs) == 1 else "; nothing was done"))
    return ids


def _events(client: Client, run: str | None, after: int, follow: bool) -> Iterator[dict[str, Any]]:
    cursor = {"after": after}
    for obj in _reconnecting(client, lambda: client.events(run=run, after=cursor["after"], follow=follow)):
        if "seq" in obj:
            cursor["after"] = obj["seq"]
            yield obj


@click.command("events")
@click.argument("run", required=False)
@click.option("--after", type=click.IntRange(min=0), default=0, help="Only events with seq > SEQ.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events.")
@output_option()
def events(run: str | None, after: int, follow: bool, output: str) -> None:
    """The audit trail, oldest first: seq, time, run, version, type, data."""
    import json

    client = _client()
    for ev in _events(client, run, after, follow):
        if output == "json":
            emit_json_line(ev)
        elif output == "yaml":
            emit([ev], "yaml")
        else:
            data = json.dumps(ev["data"], ensure_ascii=False, separators=(",", ":"))
            if len(data) > 200:
                data = data[:197] + "..."
            click.echo(f"{ev['seq']:>8}  {ev['at']}  {ev['run_id']}  v{ev['version']:<4} {ev['type']:<16} {data}")


@click.command("doctor")
@output_option()
@click.pass_context
def doctor(ctx: click.Context, output: str) -> None:
    """Check the daemon, the store and (when configured) Kubernetes access."""
    client = Client()
    try:
        client.connect()
    except DaemonUnreachableError as err:
        emit([{"name": "daemon", "ok": False, "detail": str(err)}], output, columns=("name", "ok", "detail"))
        ctx.exit(1)
    checks = client.doctor()
    emit(checks, output, columns=("name", "ok", "detail"))
    ctx.exit(0 if all(c.get("ok") for c in checks) else 1)
