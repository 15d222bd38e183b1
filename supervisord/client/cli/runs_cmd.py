"""Run commands: submit, runs, show, logs, wait, cancel, events, doctor.

They talk to the daemon only through :class:`supervisord.client.api.Client`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click

from store.types import PHASES
from supervisord.client.api import Client
from supervisord.client.cli.output import echo, emit, info, output_option
from supervisord.client.cli.params import WholeNumber
from supervisord.client.cli.queue_cmd import scheduling_options, take_scheduling
from supervisord.client.cli.reads import (
    EXIT_OTHER_PHASE,
    RUN_COLUMNS,
    check_output_open,
    connected_client,
    emit_json_line,
    logs_command,
    reconnecting,
    runs_command,
    show_command,
    wait_command,
    wait_timeout_s,
)
from supervisord.client.cli.shape import reject_shape_flags, shape_flag_options_without
from supervisord.shared.exceptions import DaemonUnreachableError, UsageError
from supervisord.shared.runref import check_run_refs
from supervisord.shared.sweep import check_handles
from supervisord.shared.task import BACKENDS
from supervisord.shared.wire import EXIT_UNREACHABLE

__all__ = ["EXIT_OTHER_PHASE", "RUN_COLUMNS", "cancel", "doctor", "events", "logs", "runs", "show", "submit", "wait"]


class _DashDashCommand(click.Command):
    """A command whose arguments after ``--`` are kept verbatim in
    ``ctx.meta["jobsup.command"]`` (the inline task command)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            i = args.index("--")
            ctx.meta["jobsup.command"] = args[i + 1 :]
            args = args[:i]
        return super().parse_args(ctx, args)


@click.command("submit", cls=_DashDashCommand)
@click.argument("task_file", required=False, type=click.Path(dir_okay=False))
@click.option("--backend", type=click.Choice(list(BACKENDS)), help="Where to run (default: config, else local).")
@click.option("--name", help="The run's name (default: the stem of the command's script, `python train.py` -> train).")
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
@click.option(
    "--sweep",
    "sweep_pairs",
    multiple=True,
    metavar="KEY=V1,V2|A..B",
    help="Submit one run per combination of values (repeatable); {KEY} in the command is replaced.",
)
@click.option("--max-parallel", "max_parallel", type=int, help="A sweep: at most N of its runs admitted at once.")
@click.option("--label", "label_pairs", multiple=True, metavar="K=V", help="A label for the run (repeatable).")
@scheduling_options
@shape_flag_options_without("gpus", "memory", "cpus")
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
    sweep_pairs: tuple[str, ...],
    max_parallel: int | None,
    label_pairs: tuple[str, ...],
    **shape: Any,
) -> None:
    """Queue a run of TASK.yaml and/or `-- CMD...`; print its id on stdout
    (a sweep: the sweep id)."""
    from supervisord.client.cli.submit_run import submit_command

    sched, hold = take_scheduling(shape)
    reject_shape_flags(shape)
    code = submit_command(
        task_file,
        ctx.meta.get("jobsup.command"),
        name=name,
        backend=backend,
        timeout=timeout,
        manifest=manifest,
        rev=rev,
        env_pairs=env_pairs,
        config_args=config_args,
        force=force,
        follow=follow,
        on_done=on_done,
        sweep_pairs=sweep_pairs,
        max_parallel=max_parallel,
        label_pairs=label_pairs,
        scheduling=sched,
        hold=hold,
    )
    if follow:
        ctx.exit(code)


@click.command("runs")
@click.option("--all", "all_", is_flag=True, help="Include every finished run (default: in flight and the 20 newest).")
@click.option("--project", help="Only runs of this project.")
@click.option("--phase", type=click.Choice(list(PHASES), case_sensitive=False), help="Only runs in this phase.")
@click.option("--label", "label_pairs", multiple=True, metavar="K=V", help="Only runs with this label (repeatable).")
@click.option("--name", help="Only runs whose name matches this glob (train*, *[lr=1e-4*).")
@click.option("--sweep", help="One sweep's results: a row per run with its params, phase, elapsed time, metrics.")
@click.option(
    "--sort", "sort_key", metavar="COLUMN", help="With --sweep: sort by a metric or param (-COLUMN: descending)."
)
@click.option("--csv", "as_csv", is_flag=True, help="With --sweep: print CSV.")
@output_option()
def runs(
    all_: bool,
    project: str | None,
    phase: str | None,
    label_pairs: tuple[str, ...],
    name: str | None,
    sweep: str | None,
    sort_key: str | None,
    as_csv: bool,
    output: str,
) -> None:
    """List runs, newest first (--sweep S: that sweep's results table)."""
    from supervisord.client.cli.sweep_table import sweep_command
    from supervisord.shared.sweep import check_sweep_ref, parse_labels

    labels = parse_labels(label_pairs)
    if sweep is None:
        if sort_key or as_csv:
            raise UsageError(f"{'--sort' if sort_key else '--csv'}: only with --sweep S")
        runs_command(
            connected_client(), all_=all_, project=project, phase=phase, output=output, labels=labels, name=name
        )
        return
    check_sweep_ref(sweep)
    sweep_command(
        connected_client(),
        sweep,
        phase=phase,
        labels=labels,
        name=name,
        sort_key=sort_key,
        as_csv=as_csv,
        output=output,
    )


@click.command("show")
@click.argument("run")
@output_option()
def show(run: str, output: str) -> None:
    """One run: phase, reason, times, handle, effective config."""
    check_run_refs([run])
    show_command(connected_client(), run, output)


@click.command("logs")
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep following new lines until the run ends.")
@click.option("--tail", type=WholeNumber(min=0), help="Start with the last N lines.")
@click.option(
    "--attempt", type=WholeNumber(min=1), help="A retried run: only the lines of attempt N (default: every attempt's)."
)
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def logs(run: str, follow: bool, tail: int | None, attempt: int | None, output: str) -> None:
    """Replay the run's stored log lines, then follow live ones with -f."""
    check_run_refs([run])
    logs_command(connected_client(), run, follow=follow, tail=tail, output=output, attempt=attempt)


@click.command("wait")
@click.argument("runs_", metavar="RUN...", nargs=-1, required=True)
@click.option("--for", "for_", default="terminal", show_default=True, help="terminal, change, or a phase name.")
@click.option("--timeout", help="Give up after 90s, 30m, 4h or 1d (exit 124).")
@click.option("--after", type=WholeNumber(min=0), help="Event seq already seen: a change after it returns at once.")
@output_option()
@click.pass_context
def wait(
    ctx: click.Context, runs_: tuple[str, ...], for_: str, timeout: str | None, after: int | None, output: str
) -> None:
    """Block until the runs reach the condition.

    Exit codes: 0 COMPLETED (or the condition met), 1 ERROR, 3 CANCELED,
    4 DELETED, 124 timeout, 69 daemon unreachable. A sweep id waits for
    all of its runs.
    """
    check_handles(runs_)
    timeout_s = wait_timeout_s(timeout)
    code = wait_command(connected_client(), list(runs_), for_=for_, timeout_s=timeout_s, after=after, output=output)
    ctx.exit(code)


@click.command("cancel")
@click.argument("runs_", metavar="RUN...", nargs=-1, required=True)
@output_option()
def cancel(runs_: tuple[str, ...], output: str) -> None:
    """Cancel runs (a sweep id: all of its runs); returns once each is stopped.

    Every id is resolved first: one that names no run (or several) exits 2
    naming it, and nothing is cancelled."""
    check_handles(runs_)
    # One request: the daemon resolves every ref first (all or nothing) and
    # stops the runs together, not one after the other.
    done = connected_client().cancel_many(list(runs_))
    if output != "table":
        emit(done, output)
        return
    for r in done:
        info(f"run {r['id']}: {r['phase']}")


def _events(client: Client, run: str | None, after: int, follow: bool) -> Iterator[dict[str, Any]]:
    """The events after ``after`` (of ``run``, when given), resuming after
    the last one seen when the daemon goes away; with ``follow`` that
    includes a stream the daemon ended (it does when it stops): a follow
    stream never ends while a daemon answers."""
    cursor = {"after": after}

    def open_stream() -> Iterator[dict[str, Any]]:
        yield from client.events(run=run, after=cursor["after"], follow=follow)
        if follow:
            raise DaemonUnreachableError("the daemon closed the event stream")

    for obj in reconnecting(client, open_stream):
        if "seq" in obj:
            cursor["after"] = obj["seq"]
            yield obj
        elif "heartbeat" in obj:
            check_output_open()


@click.command("events")
@click.argument("run", required=False)
@click.option("--after", type=WholeNumber(min=0), default=0, help="Only events with seq > SEQ.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events.")
@output_option()
def events(run: str | None, after: int, follow: bool, output: str) -> None:
    """The audit trail, oldest first: seq, time, run, version, type, data."""
    import json

    if run is not None:
        check_run_refs([run])
    client = connected_client()
    for ev in _events(client, run, after, follow):
        if output == "json":
            emit_json_line(ev)
        elif output == "yaml":
            emit([ev], "yaml")
        else:
            data = json.dumps(ev["data"], ensure_ascii=False, separators=(",", ":"))
            if len(data) > 200:
                data = data[:197] + "..."
            echo(f"{ev['seq']:>8}  {ev['at']}  {ev['run_id']}  v{ev['version']:<4} {ev['type']:<16} {data}")


@click.command("doctor")
@output_option()
@click.pass_context
def doctor(ctx: click.Context, output: str) -> None:
    """Check the daemon, the store and (when configured) Kubernetes access.

    Exits 0 when every check is ok, 1 when one is not, 69 when no daemon
    answers (the one check then is the daemon's, not ok)."""
    client = Client()
    try:
        client.connect()
    except DaemonUnreachableError as err:
        _emit_checks([{"name": "daemon", "ok": False, "detail": str(err)}], output)
        ctx.exit(EXIT_UNREACHABLE)
    checks = client.doctor()
    _emit_checks(checks, output)
    ctx.exit(0 if all(c.get("ok") for c in checks) else 1)


def _emit_checks(checks: list[dict[str, Any]], output: str) -> None:
    """The doctor ``checks`` in ``output``: as they are for json/yaml; in
    the table ``ok`` is the word ``yes`` or ``no``."""
    if output == "table":
        checks = [{**c, "ok": "yes" if c.get("ok") else "no"} for c in checks]
    emit(checks, output, columns=("name", "ok", "detail"))
