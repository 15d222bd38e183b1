"""The root ``jobsup`` click group; subcommands register themselves here."""

from __future__ import annotations

import sys

import click

from supervisord.exceptions import DaemonUnreachableError, JobsupError, UsageError

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobsup")
def cli() -> None:
    """jobsup: an event-sourced job supervisor (local processes or Kubernetes Jobs)."""


def _register() -> None:
    # Each module adds its commands to ``cli``; imported here so that the
    # group is complete whenever supervisord.cli is imported.
    from supervisord.cli import commands  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run ``cli``; a JobsupError becomes one
    ``error: ...`` line on stderr and exit 2 (usage) or 1 (other)."""
    _register()
    try:
        rv = cli.main(args=argv, standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except DaemonUnreachableError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(69)
    except UsageError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except JobsupError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    # With standalone_mode=False click returns ctx.exit()'s code.
    sys.exit(rv if isinstance(rv, int) else 0)
