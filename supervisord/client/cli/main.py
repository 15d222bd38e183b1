"""The root ``jobsup`` click group, composed from the command modules.

Command modules define plain ``click.Command`` objects and import nothing of
this module (no cycle); :data:`COMMANDS` says where each lives, and the
root group imports a module only when one of its commands runs (or for
``--help``), then composes it with ``add_command``. A ``jobsup runs``
therefore never imports what ``render`` (manifest rendering) or ``config``
(the config machinery) need: the CLI's start-up is what a script pays on
every call.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any, Final

import click

from supervisord.client.cli.output import writing
from supervisord.shared.exceptions import JobsupError

__all__ = ["COMMANDS", "LazyGroup", "cli", "main"]

#: command name -> "module:attribute" of its click command, in help order.
COMMANDS: Final[dict[str, str]] = {
    "submit": "supervisord.client.cli.runs_cmd:submit",
    "runs": "supervisord.client.cli.runs_cmd:runs",
    "show": "supervisord.client.cli.runs_cmd:show",
    "logs": "supervisord.client.cli.runs_cmd:logs",
    "wait": "supervisord.client.cli.runs_cmd:wait",
    "cancel": "supervisord.client.cli.runs_cmd:cancel",
    "events": "supervisord.client.cli.runs_cmd:events",
    "doctor": "supervisord.client.cli.runs_cmd:doctor",
    "render": "supervisord.client.cli.render_cmd:render_command",
    "config": "supervisord.client.cli.config_cmd:config_group",
    "queue": "supervisord.client.cli.queue_cmd:queue",
    "top": "supervisord.client.cli.top_cmd:top",
    "hold": "supervisord.client.cli.queue_cmd:hold",
    "release": "supervisord.client.cli.queue_cmd:release",
    "rerun": "supervisord.client.cli.queue_cmd:rerun",
    "update": "supervisord.client.cli.control_cmd:update",
    "pause": "supervisord.client.cli.control_cmd:pause",
    "resume": "supervisord.client.cli.control_cmd:resume",
    "outputs": "supervisord.client.cli.outputs_cmd:outputs",
    "which": "supervisord.client.cli.outputs_cmd:which",
    "ui": "supervisord.client.cli.ui_cmd:ui",
    "hooks": "supervisord.client.cli.hooks_cmd:hooks",
    "prune": "supervisord.client.cli.prune_cmd:prune",
    "schema": "supervisord.client.cli.schema_cmd:schema",
    "mcp": "supervisord.client.cli.mcp_cmd:mcp_command",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first lookup
    (``lazy``: name -> ``"module:attribute"``) and then added with
    :meth:`add_command`; commands added directly work as usual. The pattern
    of click's documentation, "Lazily Loading Subcommands"."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name: lazy ones in their given order, then the others."""
        return [*self.lazy, *sorted(set(self.commands) - set(self.lazy))]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, importing its module on first use."""
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, _, attr = self.lazy[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            if not isinstance(command, click.Command):
                raise TypeError(f"{self.lazy[cmd_name]} is not a click command")
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand. When stdout's reader has gone (``jobsup
        events | head -1``) it ends quietly with
        :data:`~supervisord.client.cli.reads.EXIT_OUTPUT_CLOSED`, not click's
        exit 1: a closed pipe is not an error of jobsup."""
        try:
            return super().invoke(ctx)
        except OSError as err:
            from supervisord.client.cli.reads import EXIT_OUTPUT_CLOSED, output_closed

            if not output_closed(err):
                raise
            raise click.exceptions.Exit(EXIT_OUTPUT_CLOSED) from None


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobsup")
def cli() -> None:
    """jobsup: an event-sourced job supervisor (local processes or Kubernetes Jobs)."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run ``cli``; a JobsupError becomes one
    ``error: ...`` line on stderr and exit 2 (bad input: usage, an unknown
    or ambiguous run id), 69 (no daemon) or 1 (any other)."""
    args = sys.argv[1:] if argv is None else argv
    bad = _non_utf8_argument(args)
    if bad is not None:
        click.echo(f"error: {bad}", err=True)
        sys.exit(2)
    try:
        rv = cli.main(args=args, standalone_mode=False)
        with writing():  # what the buffer still holds fails here, not at exit
            sys.stdout.flush()
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()  # `jobsup` alone: the help text
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        # One line naming the flag or value (click's own form adds a usage
        # line and a blank line before it), and where to read more.
        command = exc.ctx.command_path if exc.ctx is not None else "jobsup"
        if exc.ctx is None or exc.ctx.parent is None:
            # Raised while the subcommand's options were parsed (a missing
            # value), before its context: point at that command's help.
            sub = next((a for a in args if not a.startswith("-")), None)
            if sub in COMMANDS:
                command = f"jobsup {sub}"
        message = exc.format_message()
        message = message.removesuffix(".")
        click.echo(f"error: {message} (see `{command} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except JobsupError as exc:
        with contextlib.suppress(OSError):  # stderr may fail too
            click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    # With standalone_mode=False click returns ctx.exit()'s code.
    sys.exit(rv if isinstance(rv, int) else 0)


def _non_utf8_argument(args: list[str]) -> str | None:
    """A message naming the first argument that is not UTF-8 (Python hands
    such bytes over as lone surrogates, which no JSON request or file name
    can carry), or None. The argument's text is not shown, as it may be a
    secret (``--env TOKEN=...``): its position, and the option it belongs to."""
    for i, arg in enumerate(args):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            option = arg.split("=", 1)[0] if arg.startswith("-") else None
            if option is None and i > 0 and args[i - 1].startswith("-") and args[i - 1] != "--":
                option = args[i - 1]
            of = f" (the value of {option})" if option else ""
            return f"argument {i + 1}{of} is not valid UTF-8 text; jobsup takes arguments as UTF-8 only"
    return None
