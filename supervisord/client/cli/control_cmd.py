"""Control while it runs: ``update`` (a queued run's priority, GPUs, queue,
timeout, memory and CPU limits), ``pause`` and ``resume`` (a running local run).

They talk to the daemon only through :class:`supervisord.client.api.Client`.
"""

from __future__ import annotations

from typing import Any

import click

from supervisord.client.cli.output import echo, emit, info, output_option
from supervisord.client.cli.reads import connected_client, resolve_runs
from supervisord.shared.limits import format_bytes
from supervisord.shared.runref import check_run_refs

__all__ = ["pause", "resume", "update"]


def _value(key: str, value: Any) -> str:
    if key == "memory_bytes":
        return "none" if value is None else format_bytes(value)
    return "none" if value is None and key == "cpus" else str(value)


def _changes_text(data: dict[str, Any]) -> str:
    old, new = data.get("old") or {}, data.get("new") or {}
    names = {"memory_bytes": "memory"}
    return ", ".join(f"{names.get(k, k)} {_value(k, old.get(k))} -> {_value(k, new.get(k))}" for k in new)


@click.command("update")
@click.argument("runs_", metavar="RUN...", nargs=-1, required=True)
@click.option("--priority", type=click.IntRange(-1000, 1000), help="-1000..1000; higher starts first.")
@click.option("--gpus", type=click.IntRange(min=0), help="Whole GPUs of this machine.")
@click.option("--queue", help="The scheduler queue.")
@click.option("--timeout", help="Wall-clock limit: 90s, 30m, 4h or 1d.")
@click.option("--memory", help="Memory limit of a local run: 16G, 512M.")
@click.option("--cpus", help="CPUs a local run claims: 2 or 0.5.")
@output_option()
def update(
    runs_: tuple[str, ...],
    priority: int | None,
    gpus: int | None,
    queue: str | None,
    timeout: str | None,
    memory: str | None,
    cpus: str | None,
    output: str,
) -> None:
    """Change queued runs: the scheduler decides again at once. All or
    nothing: a run past QUEUED refuses the whole command."""
    given = {"priority": priority, "gpus": gpus, "queue": queue, "timeout": timeout, "memory": memory, "cpus": cpus}
    changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if not changes:
        raise click.UsageError("give at least one of --priority, --gpus, --queue, --timeout, --memory, --cpus")
    check_run_refs(runs_)
    client = connected_client()
    run_ids = [r["id"] for r in resolve_runs(client, runs_, only_queued="updated")]
    doc = client.update(run_ids, changes)
    if output != "table":
        emit(doc, output)
        return
    for run in doc["runs"]:
        data = doc["updated"].get(run["id"])
        echo(f"run {run['id']}: " + (_changes_text(data) if data else "unchanged (already so)"))


def _pause_or_resume(action: str, runs_: tuple[str, ...], output: str) -> None:
    check_run_refs(runs_)
    client = connected_client()
    run_ids = [r["id"] for r in resolve_runs(client, runs_)]
    done = [client.pause(r) if action == "pause" else client.resume(r) for r in run_ids]
    if output != "table":
        emit(done, output)
        return
    for r in done:
        info(f"run {r['id']}: {r['phase']}" + (f" ({r['reason']})" if r.get("reason") else ""))


@click.command("pause")
@click.argument("runs_", metavar="RUN...", nargs=-1, required=True)
@output_option()
def pause(runs_: tuple[str, ...], output: str) -> None:
    """Stop running local runs' processes (SIGSTOP) until `jobsup resume`;
    they keep their GPUs and paused time does not count toward the timeout."""
    _pause_or_resume("pause", runs_, output)


@click.command("resume")
@click.argument("runs_", metavar="RUN...", nargs=-1, required=True)
@output_option()
def resume(runs_: tuple[str, ...], output: str) -> None:
    """Let paused runs go on (SIGCONT)."""
    _pause_or_resume("resume", runs_, output)
