"""Scheduler commands: ``queue``, ``hold``, ``release``, ``rerun``, and the
submit flags ``--gpus --queue --priority --after --after-any --hold``.

They talk to the daemon only through :class:`supervisord.client.api.Client`.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from supervisord.client.api import Client
from supervisord.client.cli.output import echo, emit, info, output_option, warn
from supervisord.client.cli.params import WholeNumber
from supervisord.client.cli.reads import connected_client, resolve_runs
from supervisord.shared.exceptions import DaemonUnreachableError, JobsupError, UsageError
from supervisord.shared.runref import check_run_refs
from supervisord.shared.task import parse_env_pairs

__all__ = ["hold", "queue", "release", "rerun", "scheduling_options", "take_scheduling"]

F = TypeVar("F", bound=Callable[..., Any])

_SCHED_PARAMS = ("gpus", "queue", "priority", "after", "after_any", "after_failed", "hold", "memory", "cpus", "retry")


def scheduling_options(fn: F) -> F:
    """Add ``--gpus N --queue Q --priority P --after RUN… --after-any RUN…
    --after-failed RUN… --hold --memory SIZE --cpus N --retry N`` to a command (their values arrive in its ``**kwargs``; take
    them out with :func:`take_scheduling`)."""
    options = [
        click.option("--gpus", type=WholeNumber(min=0), help="Local runs: whole GPUs of this machine (default 0)."),
        click.option("--queue", help="The scheduler queue (default `default`)."),
        click.option("--priority", type=WholeNumber(-1000, 1000), help="-1000..1000 (default 0); higher starts first."),
        click.option("--after", multiple=True, metavar="RUN", help="Start once RUN is COMPLETED (repeatable)."),
        click.option(
            "--after-any", "after_any", multiple=True, metavar="RUN", help="Start once RUN is terminal (repeatable)."
        ),
        click.option(
            "--after-failed",
            "after_failed",
            multiple=True,
            metavar="RUN",
            help="Start only if RUN ended ERROR (else CANCELED DependencyFailed; repeatable).",
        ),
        click.option("--hold", is_flag=True, help="Queue the run held; `jobsup release RUN` lets it start."),
        click.option(
            "--memory", metavar="SIZE", help="Local runs: memory limit of the whole process tree (16G, 512M)."
        ),
        click.option("--cpus", metavar="N", help="Local runs: CPUs it needs (and may use), e.g. 2 or 0.5."),
        click.option(
            "--retry",
            type=WholeNumber(1, 100),
            metavar="N",
            help="Retry up to N times (1..100) when an attempt fails with Lost, Evicted, Preempted, NodeFailure "
            "or OOMKilled (task `retry:` picks the reasons and backoff).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def take_scheduling(kwargs: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Pop the scheduling options out of a command's ``kwargs``: ``(the
    task's scheduling keys that were given, hold)``."""
    values = {k: kwargs.pop(k, None) for k in _SCHED_PARAMS}
    hold = bool(values.pop("hold"))
    sched = {k: (list(v) if isinstance(v, tuple) else v) for k, v in values.items()}
    return {k: v for k, v in sched.items() if v not in (None, [])}, hold


_WAIT_COLUMNS = ("position", "id", "name", "queue", "priority", "gpus", "reason", "message")
_GPU_COLUMNS = ("index", "uuid", "name", "holder", "since")


_QUEUE_COLUMNS = ("name", "max_parallel", "source", "running", "waiting")


@click.group("queue", invoke_without_command=True)
@output_option()
@click.pass_context
def queue(ctx: click.Context, output: str) -> None:
    """Waiting runs in start order with why they wait, then each queue's cap
    (and where it comes from) and each GPU and its holder. `jobsup queue set`
    changes a queue's cap."""
    if ctx.invoked_subcommand is not None:
        return
    doc = connected_client().queue()
    if output != "table":
        emit(doc, output)
        return
    if doc["waiting"]:
        emit(doc["waiting"], "table", columns=_WAIT_COLUMNS)
    else:
        echo("no run is waiting")
    echo("")
    rows = [{**q, "max_parallel": "none" if q["max_parallel"] is None else q["max_parallel"]} for q in doc["queues"]]
    emit(rows, "table", columns=_QUEUE_COLUMNS)
    reservation = doc.get("reservation") or {}
    reserved = set(reservation.get("gpus") or [])
    if doc["gpus"]:
        echo("")
        rows = [
            {
                "index": g["index"],
                "uuid": g["uuid"],
                "name": g["name"],
                "holder": f"{g['holder']['id']} ({g['holder']['name']})"
                if g["holder"]
                else f"free, reserved for {reservation['run_id']}"
                if g["index"] in reserved
                else "free",
                "since": g["holder"]["since"] if g["holder"] else None,
            }
            for g in doc["gpus"]
        ]
        emit(rows, "table", columns=_GPU_COLUMNS)
    else:
        info("no GPUs are managed by this daemon (see `jobsup doctor`)")
    if reservation:
        echo("")
        echo(reservation["message"])
    for note in doc.get("notes") or []:
        warn(note)


@queue.command("set")
@click.argument("name", metavar="Q")
@click.option(
    "--max-parallel",
    "max_parallel",
    required=True,
    metavar="N|none|config",
    help="At most N runs of queue Q started at once; none: no cap; config: the daemon config's cap again.",
)
@output_option()
def queue_set(name: str, max_parallel: str, output: str) -> None:
    """Set queue Q's cap now: it takes effect at once, outlives daemon
    restarts and beats the daemon config until set again. A queue that no
    config, run or earlier `queue set` named is created (with a note)."""
    from supervisord.shared.scheduling import QUEUE_NAME

    if not QUEUE_NAME.match(name):
        raise click.BadParameter(
            f"{name!r} is not a queue name (1-63 letters, digits, '.', '_' or '-', starting with a letter or digit)",
            param_hint="'Q'",
        )
    text = max_parallel.strip().lower()
    cap: int | None = None
    if text not in ("none", "config"):
        if not text.isdigit() or not 1 <= int(text) <= 100_000:
            raise click.BadParameter(
                f"{max_parallel!r}: use a whole number 1..100000, none or config", param_hint="'--max-parallel'"
            )
        cap = int(text)
    doc = connected_client().queue_set(name, cap, from_config=text == "config")
    if output != "table":
        emit(doc, output)
        return
    q = doc["queue"]
    if doc["new"]:
        info(f"note: queue {name!r} is new (no config, run or earlier `queue set` named it)")
    shown = "none" if q["max_parallel"] is None else q["max_parallel"]
    echo(f"queue {name}: max_parallel {shown} ({q['source']}); {q['running']} running, {q['waiting']} waiting")


def _hold_or_release(action: str, runs_: tuple[str, ...], output: str) -> None:
    """Hold or release ``runs_``: every ref is resolved, and each run checked
    to be QUEUED, before any is touched (UsageError, exit 2, naming each
    bad one; nothing done)."""
    from supervisord.shared.sweep import check_handles, is_sweep_ref

    check_handles(runs_)
    client = connected_client()
    # A sweep id: its runs still queued (the others cannot be held or released).
    queued = [
        r["id"] for ref in runs_ if is_sweep_ref(ref) for r in client.sweep(ref)["rows"] if r["phase"] == "QUEUED"
    ]
    singles = [ref for ref in runs_ if not is_sweep_ref(ref)]
    run_ids = [r["id"] for r in resolve_runs(client, singles, only_queued="held" if action == "hold" else "released")]
    run_ids += [rid for rid in queued if rid not in run_ids]
    if not run_ids:
        raise UsageError(f"no queued run in {', '.join(runs_)}: only a queued run can be {action}ed")
    done: list[dict[str, Any]] = []
    for run_id in run_ids:
        try:
            answer = client.hold_or_release(action, run_id)
            done.append(dict(answer["run"]))
            for note in answer.get("warnings") or []:
                info(f"note: {note}")
        except DaemonUnreachableError as err:
            raise DaemonUnreachableError(_cut_off(client, action, run_ids, len(done), err)) from None
        except JobsupError:
            if done:
                warn(f"{_PAST[action]} before this error: {', '.join(run_ids[: len(done)])}")
            raise
    if output != "table":
        emit(done, output)
        return
    for r in done:
        info(f"run {r['id']}: {r['phase']}" + (f" ({r['reason']})" if r.get("reason") else ""))


_PAST = {"hold": "held", "release": "released"}
#: How long a hold/release cut off by a lost daemon waits for one to answer again (seconds).
_LOST_WAIT_S = 30.0


def _cut_off(client: Client, action: str, run_ids: list[str], done: int, err: DaemonUnreachableError) -> str:
    """The error message of a hold/release of ``run_ids`` cut off by a lost
    daemon after ``done`` of them: which runs it was done to, whether the
    one in flight was (read from its events once a daemon answers again,
    for up to :data:`_LOST_WAIT_S`; else unknown), and which were not."""
    past = _PAST[action]
    parts = [str(err)]
    if done:
        parts.append(f"{past} before it went away: {', '.join(run_ids[:done])}")
    cut, rest = run_ids[done], run_ids[done + 1 :]
    info(f"the daemon went away during the {action} of run {cut}; checking whether it was {past}")
    from supervisord.shared.events import HELD, HOLD_RELEASED  # only here: it imports the store's types

    deadline = time.monotonic() + _LOST_WAIT_S
    took: bool | None = None
    while took is None:
        try:
            client.connect()
            types = [e["type"] for e in client.events(run=cut) if e["type"] in (HELD, HOLD_RELEASED)]
            took = bool(types) and types[-1] == (HELD if action == "hold" else HOLD_RELEASED)
        except DaemonUnreachableError:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
    if took is None:
        parts.append(f"whether run {cut} was {past} is unknown (no daemon answers since): see `jobsup queue`")
    elif took:
        parts.append(f"run {cut} was {past}")
    else:
        rest = [cut, *rest]
    if rest:
        parts.append(f"NOT {past}: {', '.join(rest)} (run `jobsup {action} {' '.join(rest)}` again)")
    return "; ".join(parts)


@click.command("hold")
@click.argument("runs_", metavar="RUN...", nargs=-1, required=True)
@output_option()
def hold(runs_: tuple[str, ...], output: str) -> None:
    """Keep queued runs from starting until `jobsup release`."""
    _hold_or_release("hold", runs_, output)


@click.command("release")
@click.argument("runs_", metavar="RUN...", nargs=-1, required=True)
@output_option()
def release(runs_: tuple[str, ...], output: str) -> None:
    """Let held runs start."""
    _hold_or_release("release", runs_, output)


@click.command("rerun")
@click.argument("run")
@click.argument("command", nargs=-1, metavar="[-- CMD...]")
@click.option("--rev", help="Run this commit (branch, tag) of the run's repository instead of the recorded one.")
@click.option(
    "--with-dependents",
    is_flag=True,
    help="Also submit again the runs canceled (DependencyFailed) because RUN failed, after the new run.",
)
@click.option(
    "--env", "env_pairs", multiple=True, metavar="K=V", help="A value for one of the run's env names (repeatable)."
)
@click.option("--hold", is_flag=True, help="Queue the new run held.")
@click.option("--force", is_flag=True, help="Submit even if the same project+name has a run in flight.")
def rerun(
    run: str,
    command: tuple[str, ...],
    rev: str | None,
    with_dependents: bool,
    env_pairs: tuple[str, ...],
    hold: bool,
    force: bool,
) -> None:
    """Submit RUN's task, commit, effective config and scheduling options again
    as a new run; print its id (then, with --with-dependents, the id of each
    dependent submitted again, one a line). Env values are not stored: each
    of the run's env names takes its value from --env, else from this
    environment; a local run started from its shell's environment starts
    from this one. `-- CMD...` runs another command; --rev another commit."""
    given = parse_env_pairs(env_pairs)
    check_run_refs([run])
    client = connected_client()
    names = sorted((client.show(run).get("submitted") or {}).get("env") or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        warn(f"--env {', '.join(unknown)}: not an env name of run {run}; ignored")
    env = {k: given[k] if k in given else os.environ[k] for k in names if k in given or k in os.environ}
    from supervisord.shared.shellenv import capture

    body: dict[str, Any] = {
        "env": env,
        "shell_env": capture(),
        "hold": hold,
        "force": force,
        "with_dependents": with_dependents,
    }
    if rev is not None:
        body["rev"] = rev
    if command:
        body["command"] = command[0] if len(command) == 1 else shlex.join(command)
    result = client.rerun(run, body)
    for line in result.get("warnings") or []:
        warn(line)
    if result.get("missing_env"):
        warn(
            f"no value for {', '.join(result['missing_env'])} (not in --env or this environment): "
            "the new run starts without them"
        )
    echo(result["run"]["id"])
    for dep in result.get("dependents") or []:
        info(f"dependent {dep['rerun_of']} submitted again as {dep['run']['id']}")
        echo(dep["run"]["id"])
