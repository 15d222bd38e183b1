"""``jobsup render``: print the Kubernetes objects a submit would create
(``--backend slurm``: the exact ``sbatch`` command and the wrapper script).

Needs no cluster and no daemon: the manifest is read from the recorded commit
of the local repository, the config layers from their files, and
:func:`supervisord.daemon.backends.kubernetes.render_run` does the rest. stdout gets
the objects only (YAML documents, or one JSON List); notes about overridden
values go to stderr. A manifest that breaks the contract (or cannot be read:
not committed, not valid YAML, over the YAML caps) is bad input: exit 2 with
every violation on stderr.
"""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import Callable
from pathlib import Path

import click

from supervisord.client.cli.output import echo, output_option, warn
from supervisord.client.cli.shape import reject_shape_flags, shape_flag_options
from supervisord.shared.config.effective import effective_config
from supervisord.shared.config.sources import current_kube_context, load_client_layers, load_daemon_layer
from supervisord.shared.exceptions import ManifestError, TaskError, UsageError
from supervisord.shared.manifest.inject import env_secret_name
from supervisord.shared.manifest.load import (
    DEFAULT_MANIFEST_PATH,
    check_run_id,
    load_manifest_at_commit,
    manifest_path_for,
)
from supervisord.shared.manifest.render import (
    DEFAULT_STAGING_TIMEOUT_S,
    RenderedRun,
    objects_to_json,
    objects_to_yaml,
    render_run,
)
from supervisord.shared.source import repo_root, resolve_commit
from supervisord.shared.task import DEFAULT_TIMEOUT_S, Task, check_name, load_task, parse_duration

__all__ = ["render_command", "render_task"]


def _is_task_file(arg: str) -> bool:
    return arg.endswith((".yaml", ".yml"))


@click.command("render")
@click.argument("args", nargs=-1, metavar="[TASK.yaml] [-- CMD...]")
@click.option(
    "--backend",
    type=click.Choice(["kubernetes", "slurm"]),
    default="kubernetes",
    show_default=True,
    help="What to render: the Kubernetes objects, or the sbatch command and wrapper.",
)
@click.option("--manifest", default=None, help=f"Repository-relative manifest path [default: {DEFAULT_MANIFEST_PATH}].")
@click.option("--rev", default="HEAD", show_default=True, help="The revision whose manifest is read.")
@click.option("--timeout", default=None, help="Run timeout: 90s, 30m, 4h, 1d [default: 4h].")
@click.option(
    "--run-id", "run_id", default=None, help="The run id to render with (12 lowercase hex) [default: random]."
)
@click.option("--name", default=None, help="The run's name, as for submit (default: first word of the command).")
@click.option(
    "--config",
    "config_items",
    multiple=True,
    metavar="KEY.PATH=VALUE|FILE",
    help="Config override (repeatable), as for submit.",
)
@output_option(default="yaml", choices=("yaml", "json"))
@shape_flag_options
@click.pass_context
def render_command(
    ctx: click.Context,
    args: tuple[str, ...],
    backend: str,
    manifest: str | None,
    rev: str,
    timeout: str | None,
    run_id: str | None,
    name: str | None,
    config_items: tuple[str, ...],
    output: str,
    image: str | None,
    gpus: str | None,
    cpus: str | None,
    memory: str | None,
) -> None:
    """Print the Kubernetes objects `submit --backend kubernetes` would create.

    The manifest comes from the recorded commit (--rev, default HEAD), never
    from the working tree. The command comes from the task file's `run:` or
    from the words after `--`. Exit 2 with every contract violation.
    """
    task_file = args[0] if args and _is_task_file(args[0]) else None
    words = list(args[1:] if task_file else args)
    if backend == "slurm":
        reject_shape_flags({"image": image})
        doc = render_slurm(
            task_file,
            words,
            timeout=timeout,
            run_id=run_id,
            gpus=gpus,
            memory=memory,
            cpus=cpus,
            config_items=list(config_items),
            cwd=Path.cwd(),
            warn=warn,
        )
        if output == "json":
            echo(json.dumps(doc, indent=2))
        else:
            echo(
                f"# on {doc['where']}, in the run folder {doc['run_dir']} (remote_dir as configured:"
                " a run uses its absolute path on the cluster):\n"
                f"{doc['command']}\n"
                f"# {doc['run_dir']}/job.sh:\n{doc['wrapper']}",
                nl=False,
            )
        return
    reject_shape_flags({"image": image, "gpus": gpus, "cpus": cpus, "memory": memory})
    try:
        rendered = render_task(
            task_file,
            words,
            manifest=manifest,
            rev=rev,
            timeout=timeout,
            run_id=run_id,
            name=name,
            config_items=list(config_items),
            cwd=Path.cwd(),
            warn=warn,
        )
    except ManifestError as exc:
        # Bad input, as every UsageError: README, "exit codes".
        click.echo(f"error: {exc}", err=True)
        ctx.exit(2)
    for note in rendered.notes:
        warn(note)
    text = objects_to_json(rendered.objects) if output == "json" else objects_to_yaml(rendered.objects)
    echo(text, nl=False)


def render_slurm(
    task_file: str | None,
    words: list[str],
    *,
    timeout: str | None,
    run_id: str | None,
    gpus: str | int | None,
    config_items: list[str],
    memory: str | None = None,
    cpus: str | float | None = None,
    cwd: Path | None = None,
    warn: Callable[[str], None] = warn,
) -> dict[str, object]:
    """What ``submit --backend slurm`` would run: ``{"where", "run_dir",
    "sbatch" (argv), "command" (one line), "wrapper"}`` (``jobsup render
    --backend slurm`` and the MCP ``render`` tool). ``run_dir`` keeps
    ``remote_dir`` as configured (the backend resolves ``~`` and relative
    paths on the cluster). ``gpus``/``memory``/``cpus``: as submit's flags
    (``--gpus``, ``--mem``, ``--cpus-per-task``). ``cwd``: where the
    project config is looked up (default: this process's). Config warnings
    go to ``warn``. Raises TaskError/UsageError/ConfigError."""
    from supervisord.shared.limits import parse_cpus, parse_memory
    from supervisord.shared.slurmscript import SlurmSettings, quote_argv, sbatch_argv, wrapper_script

    task = load_task(task_file) if task_file else Task()
    if words:
        task = task.with_overrides(run=words[0] if len(words) == 1 else shlex.join(words))
    command = task.run or ""
    if not command.strip():
        raise TaskError("no command: give `run:` in the task file or `-- CMD...` on the command line")
    if timeout is not None:
        task = task.with_overrides(timeout_s=parse_duration(timeout))
    if run_id is not None and not (len(run_id) == 12 and all(c in "0123456789abcdef" for c in run_id)):
        raise UsageError(f"--run-id: {run_id!r} is not a run id (12 lowercase hex)")
    gpu_count = 0
    if gpus is not None:
        if isinstance(gpus, bool) or not str(gpus).isdigit():
            raise UsageError(f"--gpus: must be a whole number >= 0, got {gpus!r}")
        gpu_count = int(gpus)
    memory_bytes = parse_memory(memory) if memory is not None else None
    cpu_count = parse_cpus(cpus) if cpus is not None else None
    the_run_id = run_id or secrets.token_hex(6)
    client_layers = load_client_layers(task=task, cli_config=list(config_items), cwd=cwd or Path.cwd())
    effective = effective_config(load_daemon_layer(), client_layers)
    for message in effective.warnings:
        warn(message)
    settings = SlurmSettings.of(effective.data)
    run_dir = f"{settings.remote_dir.rstrip('/')}/runs/{the_run_id}"
    argv = sbatch_argv(
        run_id=the_run_id,
        run_dir=run_dir,
        timeout_s=task.timeout_s or DEFAULT_TIMEOUT_S,
        settings=settings,
        gpus=gpu_count,
        memory_bytes=memory_bytes,
        cpus=cpu_count,
    )
    return {
        "where": settings.where,
        "run_dir": run_dir,
        "sbatch": argv,
        "command": quote_argv(argv),
        "wrapper": wrapper_script(run_id=the_run_id, run_dir=run_dir, command=command),
    }


def render_task(
    task_file: str | None,
    words: list[str],
    *,
    manifest: str | None,
    rev: str,
    timeout: str | None,
    run_id: str | None,
    name: str | None,
    config_items: list[str],
    cwd: Path,
    warn: Callable[[str], None],
) -> RenderedRun:
    """The objects `submit --backend kubernetes` would create for the task in
    ``task_file`` and/or the command ``words`` (``jobsup render`` and the MCP
    ``render`` tool). Config warnings go to ``warn``; the result's ``notes``
    are the caller's to show.

    Raises TaskError/UsageError/ConfigError naming the bad input, SourceError
    for the repository or revision, ManifestError with every contract violation.
    """
    task = load_task(task_file) if task_file else Task()
    if words:
        # Joined exactly as submit joins them.
        task = task.with_overrides(run=words[0] if len(words) == 1 else shlex.join(words))
    if name is not None:
        task = task.with_overrides(name=check_name(name))
    command = task.run or ""
    if not command.strip():
        raise TaskError("no command: give `run:` in the task file or `-- CMD...` on the command line")
    if timeout is not None:
        task = task.with_overrides(timeout_s=parse_duration(timeout))
    if manifest is not None:
        task = task.with_overrides(manifest=manifest)
    if run_id is not None:
        try:
            check_run_id(run_id)
        except ManifestError as exc:
            raise UsageError(f"--run-id: {exc}") from None
    the_run_id = run_id or secrets.token_hex(6)

    repo = repo_root(task.path.parent if task.path else cwd)
    commit = resolve_commit(repo, rev)
    # The layers a submit would send, merged as the daemon merges them (render
    # reads the daemon config file itself: it needs no daemon).
    daemon_layer = load_daemon_layer()
    client_layers = load_client_layers(task=task, cli_config=list(config_items), cwd=cwd)
    effective = effective_config(daemon_layer, client_layers, context=current_kube_context())
    for message in effective.warnings:
        warn(message)
    data = effective.data
    kube = data.get("kubernetes") or {}
    if not isinstance(kube, dict):
        raise UsageError("config: `kubernetes` must be a mapping")
    manifest_path = manifest_path_for(task.manifest, kube)
    return render_run(
        load_manifest_at_commit(repo, commit, manifest_path),
        run_id=the_run_id,
        project=str(data.get("project") or repo.name),
        name=task.default_name(),
        command=command,
        namespace=str(kube.get("namespace") or "default"),
        timeout_s=task.timeout_s or DEFAULT_TIMEOUT_S,
        staging_timeout_s=DEFAULT_STAGING_TIMEOUT_S,
        kube_config=kube,
        manifest_path=manifest_path,
        env_secret=env_secret_name(the_run_id),
    )
