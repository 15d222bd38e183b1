"""``jobsup config show`` and ``jobsup config validate``: the layered config,
computed here as the daemon would compute it for a submit (these commands read
the daemon config file themselves and need no daemon).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from supervisord.client.cli.output import emit, info, output_option, warn
from supervisord.shared.config import (
    EffectiveConfig,
    Layer,
    check_allowed,
    current_kube_context,
    effective_config,
    format_path,
    load_daemon_layer,
    read_client_layers,
)
from supervisord.shared.config.unimplemented import not_implemented_warnings
from supervisord.shared.exceptions import ConfigError, TaskError
from supervisord.shared.hooksconfig import hooks_from_layers
from supervisord.shared.paths import Paths
from supervisord.shared.secret import read_digest_key, redact
from supervisord.shared.task import Task, load_task

__all__ = ["config_group"]

_CONFIG_HELP = "FILE (alone) or KEY.PATH=VALUE (repeatable): the cli config layer."


@click.group("config")
def config_group() -> None:
    """Show and check the layered config: defaults < daemon < user < project
    < task `config:` < --config."""


def _load(
    task_file: str | None, cli_config: tuple[str, ...]
) -> tuple[Task | None, Layer | None, list[Layer], list[str]]:
    """Read every layer that can be read; return them with the errors of the
    others (a broken user file does not hide a broken project file)."""
    errors: list[str] = []
    task: Task | None = None
    if task_file is not None:
        try:
            task = load_task(task_file)
        except TaskError as exc:
            errors.append(str(exc))
    daemon: Layer | None = None
    try:
        daemon = load_daemon_layer()
    except ConfigError as exc:
        errors.extend(exc.errors)
    client, client_errors = read_client_layers(task=task, cli_config=list(cli_config), cwd=Path.cwd())
    errors.extend(client_errors)
    return task, daemon, client, errors


def _effective(daemon: Layer, client: list[Layer]) -> EffectiveConfig:
    return effective_config(daemon, client, context=current_kube_context())


def _annotate(value: Any, path: tuple[str | int, ...], origins: dict[str, tuple[str, str | None]]) -> Any:
    """Replace every leaf by ``{"value": v, "layer": name, "file": file}``."""
    if isinstance(value, dict) and value:
        return {k: _annotate(v, (*path, k), origins) for k, v in value.items()}
    if isinstance(value, list) and value:
        return [_annotate(v, (*path, i), origins) for i, v in enumerate(value)]
    layer, file = origins.get(format_path(path), (None, None))
    return {"value": value, "layer": layer, "file": file}


@config_group.command("show")
@click.argument("task_file", required=False, metavar="[TASK.yaml]")
@click.option("--config", "cli_config", multiple=True, metavar="FILE|KEY.PATH=VALUE", help=_CONFIG_HELP)
@click.option("--origin", is_flag=True, help="Annotate each value with the layer and file it came from.")
@output_option(default="yaml", choices=("yaml", "json"))
def show(task_file: str | None, cli_config: tuple[str, ...], origin: bool, output: str) -> None:
    """Print the effective config a submit would use (secret values redacted)."""
    _, daemon, client, errors = _load(task_file, cli_config)
    if errors or daemon is None:
        raise ConfigError.of(errors)
    eff = _effective(daemon, client)
    for message in eff.warnings:
        warn(message)
    # The daemon's own digest key, so that values compare with what runs
    # record; without one (no daemon ran yet) values show as <redacted>.
    data = redact(eff.data, read_digest_key(Paths.from_env().state_dir))
    emit(_annotate(data, (), eff.origins) if origin else data, output)


@config_group.command("validate")
@click.argument("task_file", required=False, metavar="[TASK.yaml]")
@click.option("--config", "cli_config", multiple=True, metavar="FILE|KEY.PATH=VALUE", help=_CONFIG_HELP)
def validate(task_file: str | None, cli_config: tuple[str, ...]) -> None:
    """Check every layer (daemon, user, project, task, cli) and their merge;
    print every error and exit 2 when there is one."""
    task, daemon, client, errors = _load(task_file, cli_config)
    # The layers that could be read are still checked, so that one run shows
    # every problem.
    try:
        eff = _effective(daemon or Layer("daemon", None, {}), client)
    except ConfigError as exc:
        errors.extend(exc.errors)
    else:
        for message in [*eff.warnings, *not_implemented_warnings(eff.data)]:
            warn(message)
        backend = (task.backend if task is not None else None) or str(eff.data.get("backend") or "local")
        try:
            check_allowed(eff, backend)
        except ConfigError as exc:
            errors.extend(exc.errors)
    # Hooks come from the daemon and user layers (the user's environment
    # stands in for the daemon's when checking webhook.secret_env).
    _, hook_errors = hooks_from_layers([layer for layer in (daemon, *client) if layer is not None])
    errors.extend(hook_errors)
    if errors:
        raise ConfigError.of(errors)
    assert daemon is not None
    checked = [f"{layer.name} ({layer.file})" if layer.file else layer.name for layer in (daemon, *client)]
    info(f"config OK: {', '.join(checked)}")
