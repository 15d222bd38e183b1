"""The body of a submit request (``POST /v1/runs``), built one way for
``jobsup submit`` and the MCP ``submit`` tool: the task from a task file
and overrides, the client's config layers, and what the daemon records
about the request (``cwd``, ``rev``, ``request_id``, the caller's umask).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisord.shared.shellenv import capture
from supervisord.shared.task import Task, check_name, load_task, parse_duration

__all__ = ["build_task", "current_umask", "submit_body", "task_wire"]


def build_task(
    task_file: str | Path | None,
    command: Sequence[str] | str | None,
    *,
    name: str | None,
    backend: str | None,
    timeout: str | None,
    manifest: str | None,
    env: Mapping[str, str] | None = None,
    scheduling: Mapping[str, Any] | None = None,
    flag_prefix: str = "--",
    sweep: Mapping[str, list[str]] | None = None,
    max_parallel: int | None = None,
    labels: Mapping[str, str] | None = None,
) -> Task:
    """The task from an optional task file and the overrides (they win).
    ``command``: the words of ``-- CMD...`` (one word is taken as a shell
    command line, several are quoted and joined) or one command line.
    Errors name the flag as ``flag_prefix + "name"`` (``--name`` for the
    CLI, ``name`` for a tool argument). Raises TaskError naming the file or
    flag at fault."""
    task = load_task(task_file) if task_file else Task()
    run = None
    if isinstance(command, str):
        run = command
    elif command:
        import shlex

        run = command[0] if len(command) == 1 else shlex.join(command)
    return task.with_overrides(
        name=check_name(name, what=f"{flag_prefix}name") if name is not None else None,
        run=run,
        backend=backend,
        timeout_s=parse_duration(timeout, what=f"{flag_prefix}timeout") if timeout is not None else None,
        env=env,
        manifest=manifest,
        scheduling=scheduling,
        sweep=sweep,
        max_parallel=max_parallel,
        labels=labels,
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
        **_sweep_wire(task),
        **({"links": dict(task.links)} if task.links else {}),
    }


def _sweep_wire(task: Task) -> dict[str, Any]:
    """The task's sweep, max_parallel and labels, when it has them."""
    out: dict[str, Any] = {}
    if task.sweep:
        out["sweep"] = task.sweep
    if task.max_parallel is not None:
        out["max_parallel"] = task.max_parallel
    if task.labels:
        out["labels"] = task.labels
    return out


def current_umask() -> int:
    """This process's umask (that of the shell that ran jobsup): a local run
    creates its files with it, not with the daemon's private 077."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def submit_body(
    task: Task,
    *,
    config_args: Sequence[str],
    cwd: Path,
    rev: str,
    force: bool,
    hold: bool,
    on_done: list[str] | None = None,
    shell_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/runs`` for ``task`` submitted from
    ``cwd``: the config layers this client reads (user and project config,
    ``config_args`` overrides), a fresh ``request_id`` (to find the run
    again if the daemon goes away mid-submit), this process's umask, and
    ``shell_env``: the environment a local run starts from (default this
    process's, ``JOBSUP_*`` dropped: :func:`supervisord.shared.shellenv.capture`).
    Raises ConfigError naming the layer at fault."""
    from supervisord.shared import config as cfg

    layers = cfg.load_client_layers(task=task, cli_config=list(config_args), cwd=cwd)
    wire = task_wire(task)
    if on_done is not None:
        wire["on_done"] = on_done
    return {
        "task": wire,
        "layers": cfg.layers_to_wire(layers),
        "cwd": str(cwd),
        "rev": rev,
        "force": force,
        "hold": hold,
        "request_id": secrets.token_hex(8),
        "umask": f"{current_umask():04o}",
        "shell_env": capture() if shell_env is None else dict(shell_env),
    }
