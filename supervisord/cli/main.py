"""The root ``jobsup`` click group; subcommands register themselves here."""

from __future__ import annotations

import sys

import click

from supervisord.exceptions import (
    AmbiguousRunError,
    DaemonUnreachableError,
    JobsupError,
    RunNotFoundError,
    UsageError,
)

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
    ``error: ...`` line on stderr and exit 2 (bad input: usage, an unknown
    or ambiguous run id), 69 (no daemon) or 1 (other)."""
    _register()
    args = sys.argv[1:] if argv is None else argv
    bad = _non_utf8_argument(args)
    if bad is not None:
        click.echo(f"error: {bad}", err=True)
        sys.exit(2)
    try:
        rv = cli.main(args=args, standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except DaemonUnreachableError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(69)
    except (UsageError, RunNotFoundError, AmbiguousRunError) as exc:
        # A run id that names no run, or several, is bad input too.
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except JobsupError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
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
