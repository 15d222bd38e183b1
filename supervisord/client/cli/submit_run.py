"""The body of ``jobsup submit``, shared by the click command
(:mod:`supervisord.client.cli.runs_cmd`) and the fast path
(:mod:`supervisord.client.cli.fast`): it imports neither click nor PyYAML (a
task file or a config file reads YAML when there is one).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisord.client.api import Client
from supervisord.client.cli.output import echo, info, warn
from supervisord.client.cli.reads import connected_client, follow_logs, output_closed, wait_command
from supervisord.shared.exceptions import DaemonUnreachableError, TaskError
from supervisord.shared.wire import exit_code_for_phase

__all__ = ["find_submitted", "submit_command"]


def submit_command(
    task_file: str | None,
    command: Sequence[str] | None,
    *,
    name: str | None = None,
    backend: str | None = None,
    timeout: str | None = None,
    manifest: str | None = None,
    rev: str = "HEAD",
    env_pairs: Sequence[str] = (),
    config_args: Sequence[str] = (),
    force: bool = False,
    follow: bool = False,
    on_done: str | None = None,
    sweep_pairs: Sequence[str] = (),
    max_parallel: int | None = None,
    label_pairs: Sequence[str] = (),
    scheduling: Mapping[str, Any] | None = None,
    hold: bool = False,
) -> int:
    """Submit a run of ``task_file`` and/or ``command`` (the words after
    ``--``) with the ``jobsup submit`` options; print its id (a sweep: the
    sweep id) on stdout. Returns the exit code: 0, or with ``follow`` the
    run's (as ``jobsup wait``). Raises TaskError, UsageError, ConfigError
    (exit 2) naming the flag, key or file at fault, with nothing recorded;
    DaemonUnreachableError."""
    from supervisord.client.cli.submit_request import build_task, submit_body
    from supervisord.shared.task import parse_env_pairs

    # Imported only when used: the hooks' module loads the store's types.
    grid = labels = on_done_argv = None
    if sweep_pairs or max_parallel is not None or label_pairs:
        from supervisord.shared.sweep import check_max_parallel, parse_labels, parse_sweep_pairs

        grid = parse_sweep_pairs(tuple(sweep_pairs)) if sweep_pairs else None
        check_max_parallel(max_parallel)
        labels = parse_labels(tuple(label_pairs))
    if on_done is not None:
        from supervisord.shared.hooksconfig import parse_on_done

        on_done_argv = parse_on_done(on_done)
    task = build_task(
        task_file,
        command,
        name=name,
        backend=backend,
        timeout=timeout,
        manifest=manifest,
        env=parse_env_pairs(tuple(env_pairs)),
        scheduling=dict(scheduling or {}),
        sweep=grid,
        max_parallel=max_parallel,
        labels=labels,
    )
    if not task.run:
        raise TaskError("no command: give `run:` in the task file or `-- CMD...` after the options")
    if task.sweep:
        from supervisord.shared.sweep import check_placeholders

        check_placeholders(task.run, task.name, task.sweep)  # errors now; the daemon sends the warnings
        if follow:
            raise TaskError(
                "--follow: a sweep has many runs; follow one with `jobsup logs RUN -f`, or `jobsup wait SWEEP`"
            )
    elif task.max_parallel is not None:
        raise TaskError("--max-parallel: only a sweep (--sweep KEY=V1,V2,... or task `sweep:`) has runs to limit")
    body = submit_body(
        task, config_args=list(config_args), cwd=Path.cwd(), rev=rev, force=force, hold=hold, on_done=on_done_argv
    )
    client = connected_client()
    try:
        result = client.submit(body)
    except DaemonUnreachableError as err:
        result = {"run": find_submitted(client, str(body["request_id"]), err), "warnings": []}
    for line in result.get("warnings") or []:
        warn(line)
    if task.sweep:
        sweep = result.get("sweep") or {"id": result["run"].get("sweep_id")}
        echo(sweep["id"])
        return 0
    run_id = result["run"]["id"]
    if not follow:
        echo(run_id)
        return 0
    info(f"submitted run {run_id}")
    try:
        run = follow_logs(client, run_id)
    except OSError as err:
        if not output_closed(err):
            raise
        # The log's reader went away: the exit code still says how the run ended.
        return wait_command(client, [run_id], for_="terminal", timeout_s=None, after=None, output="table")
    return exit_code_for_phase(run["phase"])


_LOST_SUBMIT_WAIT_S = 30.0


def find_submitted(client: Client, request_id: str, err: DaemonUnreachableError) -> dict[str, Any]:
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
